#!/usr/bin/env python3
"""Known-good scripted actions for the desktop tasks, acting only through the `gui` CLI an agent has."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

HOME = "/root/work"


def gui(*args: Any) -> str:
    out = subprocess.run(["gui", *map(str, args)], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"gui {' '.join(map(str, args))} failed ({out.returncode}): {out.stderr.strip()}")
    return out.stdout.strip()


def keys(*names: str) -> None:
    for name in names:
        gui("key", name)


def terminal(command: str) -> None:
    gui("type", command, "--into", gui("find", "xterm"))
    gui("key", "Return")
    time.sleep(0.5)


def editor(*steps: tuple[str, str]) -> None:
    gui("click", gui("find", "Mousepad"))
    for kind, value in steps:
        gui(kind, value)
    gui("key", "ctrl+s")
    time.sleep(1.0)


def spreadsheet(moves: list[str], text: str) -> None:
    gui("click", gui("find", "Gnumeric"))
    keys("ctrl+Home", *moves)
    gui("type", text)
    keys("Return", "ctrl+s")
    time.sleep(1.5)


def solve(task: str, p: dict[str, Any]) -> None:
    if task == "term-write-file":
        terminal(f"echo '{p['text']}' > {HOME}/out/hello.txt")
    elif task == "term-make-folders":
        terminal(f"mkdir -p {HOME}/out/projects/{p['a']} {HOME}/out/projects/{p['b']}")
    elif task == "term-count-lines":
        terminal(f"wc -l < {HOME}/data.txt > {HOME}/out/count.txt")
    elif task == "term-copy-file":
        terminal(f"mkdir -p {HOME}/out/backup && cp {HOME}/report.txt {HOME}/out/backup/report.txt")
    elif task == "term-exit":
        terminal("exit")
    elif task == "editor-write-note":
        editor(("type", p["text"]))
    elif task == "editor-append-line":
        editor(("key", "ctrl+End"), ("type", p["add"]))
    elif task == "editor-replace-word":
        editor(("key", "ctrl+Home"), ("key", "shift+End"), ("type", "status: final"))
    elif task == "editor-clear-file":
        editor(("key", "ctrl+a"), ("key", "Delete"))
    elif task == "editor-line-numbers":
        gui("click", gui("find", "Mousepad"))
        keys("alt+v", "u")  # View > Line Numbers (its mnemonic)
        time.sleep(1.0)
    elif task == "sheet-fill-cell":
        spreadsheet(["Right", "Down", "Down"], str(p["n"]))
    elif task == "sheet-sum-column":
        spreadsheet(["Down"] * 4, "=SUM(A1:A4)")
    elif task == "sheet-header":
        spreadsheet(["Right", "Right"], p["word"])
    else:
        raise RuntimeError(f"no scripted solution for {task}")


def main() -> int:
    state = json.loads(gui("status", "--json"))
    solve(state["task"], state.get("params") or {})
    print(f"oracle: {state['task']} done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
