"""The TUI's drill-down screens: a run, a rollout."""
