"""What each harness's tools do: a per-harness table of tool names → classes, and a generic fallback by name.

Classes: `shell` (runs commands), `read` (reads or lists files), `write` (creates or edits files),
`search` (finds files or text), `browse` (web fetch and search), `plan` (todo lists, plans, goals),
`other` (known tools of none of those kinds: subagents, skills, user questions, scheduling).
A tool found in neither table is `unknown` and reported as such (never guessed into a class).
"""

from __future__ import annotations

CLASSES = ("shell", "read", "write", "search", "browse", "plan", "other")
UNKNOWN = "unknown"
ANY_HARNESS = "*"

# The names each harness offered in its recorded requests (tests/fixtures/harness-requests and real runs here).
HARNESS_TOOLS: dict[str, dict[str, str]] = {
    "react": {"bash": "shell", "read_file": "read", "write_file": "write", "edit_file": "write"},
    "codex": {
        "exec_command": "shell", "write_stdin": "shell", "shell": "shell", "local_shell": "shell",
        "apply_patch": "write", "view_image": "read", "update_plan": "plan", "create_goal": "plan",
        "get_goal": "plan", "update_goal": "plan", "web_search": "browse", "request_user_input": "other",
        "multi_agent_v1": "other",
    },
    "claude-code": {
        "Bash": "shell", "BashOutput": "shell", "KillShell": "shell", "Read": "read", "Write": "write",
        "Edit": "write", "MultiEdit": "write", "NotebookEdit": "write", "Glob": "search", "Grep": "search",
        "LS": "read", "WebFetch": "browse", "WebSearch": "browse", "TodoWrite": "plan", "TaskCreate": "plan",
        "TaskGet": "plan", "TaskList": "plan", "TaskUpdate": "plan", "TaskStop": "plan", "TaskOutput": "plan",
        "ExitPlanMode": "plan", "Agent": "other", "Task": "other", "Skill": "other", "SendMessage": "other",
        "CronCreate": "other", "CronDelete": "other", "CronList": "other", "ScheduleWakeup": "other",
        "EnterWorktree": "other", "ExitWorktree": "other", "ReportFindings": "other", "Workflow": "other",
    },
    "openclaw": {
        "exec": "shell", "process": "shell", "read": "read", "ls": "read", "write": "write", "edit": "write",
        "apply_patch": "write", "tool_search": "other", "tool_describe": "other", "tool_call": "other",
        "sessions_yield": "other", "web_search": "browse", "web_fetch": "browse",
    },
    "opencode": {
        "bash": "shell", "read": "read", "list": "read", "write": "write", "edit": "write", "patch": "write",
        "glob": "search", "grep": "search", "webfetch": "browse", "todowrite": "plan", "todoread": "plan",
        "task": "other", "skill": "other",
    },
    "pi": {"bash": "shell", "read": "read", "write": "write", "edit": "write", "ls": "read", "find": "search", "grep": "search"},
    "gemini-cli": {
        "run_shell_command": "shell", "list_background_processes": "shell", "read_background_output": "shell",
        "read_file": "read", "read_many_files": "read", "list_directory": "read", "write_file": "write",
        "replace": "write", "glob": "search", "grep_search": "search", "search_file_content": "search",
        "google_web_search": "browse", "web_fetch": "browse", "write_todos": "plan", "enter_plan_mode": "plan",
        "update_topic": "plan", "invoke_agent": "other", "activate_skill": "other", "save_memory": "other",
    },
    "mini-swe-agent": {"bash": "shell"},
    "zeroclaw": {"shell": "shell", "file_read": "read", "file_write": "write", "memory_store": "other", "memory_recall": "other"},
}  # fmt: skip

# Lower-cased names any harness (or a standalone proxy session) may use: the fallback when a harness's table lacks one.
GENERIC_TOOLS: dict[str, str] = {
    **{n: "shell" for n in ("bash", "shell", "exec", "exec_command", "run_shell_command", "execute_command", "terminal",
                            "run_command", "execute_bash", "shell_command", "local_shell", "cmd", "run")},
    **{n: "read" for n in ("read", "read_file", "view", "cat", "open_file", "ls", "list", "list_dir", "list_directory",
                           "list_files", "view_file")},
    **{n: "write" for n in ("write", "write_file", "edit", "edit_file", "create_file", "str_replace", "replace",
                            "apply_patch", "patch", "str_replace_editor", "str_replace_based_edit_tool", "multiedit",
                            "insert", "file_write", "write_to_file")},
    **{n: "search" for n in ("grep", "glob", "find", "search", "grep_search", "find_files", "search_files", "ripgrep")},
    **{n: "browse" for n in ("web_search", "web_fetch", "webfetch", "websearch", "fetch", "browse", "browser",
                             "google_web_search", "open_url")},
    **{n: "plan" for n in ("todo", "todowrite", "todo_write", "update_plan", "plan", "write_todos", "think")},
}  # fmt: skip


def classify(harness: str | None, tool: str) -> str:
    """The class of `tool` as `harness` offers it (the generic table by lower-cased name as fallback), else `unknown`."""
    own = HARNESS_TOOLS.get(harness or "", {})
    return own.get(tool) or GENERIC_TOOLS.get(tool.lower()) or UNKNOWN


def table_rows() -> list[tuple[str, str, str]]:
    """(harness, tool, class) for every entry: the per-harness tables, then the generic one under `*`."""
    rows = [(h, t, c) for h, tools in HARNESS_TOOLS.items() for t, c in tools.items()]
    rows += [(ANY_HARNESS, t, c) for t, c in GENERIC_TOOLS.items()]
    for harness, tool, cls in rows:
        assert cls in CLASSES, f"{harness}/{tool}: class {cls!r} is not one of {CLASSES}"
    return rows


def values_sql() -> str:
    """The table as a SQL VALUES list (the `tool_classes` view's body)."""

    def lit(s: str) -> str:
        return "'" + s.replace("'", "''") + "'"

    body = ",\n    ".join(f"({lit(h)}, {lit(t)}, {lit(c)})" for h, t, c in table_rows())
    return f"SELECT * FROM (VALUES\n    {body}\n) AS t(harness, tool, class)"
