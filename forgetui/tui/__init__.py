"""The forgetui Textual TUI: stores and runs, live calls, a call inspector and a SQL console."""
