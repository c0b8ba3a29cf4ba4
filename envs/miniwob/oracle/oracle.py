#!/usr/bin/env python3
"""Known-good scripted actions for a few MiniWoB++ tasks, acting only through the `gui` CLI an agent has.

Each solver reads the page (`gui observe --json`) the way an agent would and acts with `gui click`,
`gui type`, `gui select`. The task and its instance come from the running server (`gui status`).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any


def gui(*args: str) -> str:
    out = subprocess.run(["gui", *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"gui {' '.join(args)} failed ({out.returncode}): {out.stderr.strip()}")
    return out.stdout


def observe() -> dict[str, Any]:
    return json.loads(gui("observe", "--json", "--no-screenshot"))


def quoted(utterance: str) -> str:
    match = re.search(r'"([^"]*)"', utterance)
    if not match:
        raise RuntimeError(f"no quoted text in the task {utterance!r}")
    return match.group(1)


def tag(node: dict[str, Any]) -> str:
    return str(node.get("tag", "")).upper()


def find(obs: dict[str, Any], pred: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
    for node in obs["elements"]:
        if pred(node):
            return node
    raise RuntimeError(f"no {what} on the page")


def submit(obs: dict[str, Any]) -> None:
    button = find(obs, lambda n: tag(n) == "BUTTON" and str(n.get("text", "")).strip().lower() == "submit", "Submit button")
    gui("click", str(button["ref"]))


def click_button(obs: dict[str, Any]) -> None:
    want = quoted(obs["utterance"])
    gui("click", str(find(obs, lambda n: tag(n) == "BUTTON" and n.get("text") == want, f"button {want!r}")["ref"]))


def click_link(obs: dict[str, Any]) -> None:
    want = quoted(obs["utterance"])
    gui("click", str(find(obs, lambda n: tag(n) == "SPAN" and "alink" in str(n.get("classes", "")) and n.get("text") == want, f"link {want!r}")["ref"]))


def click_test(obs: dict[str, Any]) -> None:
    gui("click", str(find(obs, lambda n: tag(n) == "BUTTON", "button")["ref"]))


def focus_text(obs: dict[str, Any]) -> None:
    gui("click", str(find(obs, lambda n: tag(n) == "INPUT_TEXT", "text field")["ref"]))


def enter_text(obs: dict[str, Any]) -> None:
    want = quoted(obs["utterance"])
    field = find(obs, lambda n: tag(n) == "INPUT_TEXT", "text field")
    gui("type", want, "--into", str(field["ref"]))
    submit(observe())


def choose_list(obs: dict[str, Any]) -> None:
    want = re.match(r"Select (.*) from the list and click Submit\.", obs["utterance"])
    if not want:
        raise RuntimeError(f"unexpected task text {obs['utterance']!r}")
    chooser = find(obs, lambda n: tag(n) == "SELECT", "list")
    gui("select", str(chooser["ref"]), want.group(1))
    submit(observe())


def click_checkboxes(obs: dict[str, Any]) -> None:
    want = re.match(r"Select (.*) and click Submit\.", obs["utterance"])
    if not want:
        raise RuntimeError(f"unexpected task text {obs['utterance']!r}")
    names = set() if want.group(1) == "nothing" else {n.strip() for n in want.group(1).split(",")}
    elements = obs["elements"]
    for i, node in enumerate(elements):
        if tag(node) != "LABEL":
            continue
        box = next((c for c in elements[i + 1 :] if tag(c) == "INPUT_CHECKBOX"), None)
        text = " ".join(str(c.get("text", "")) for c in elements[i + 1 : i + 3] if c.get("tag") == "t").strip() or str(node.get("text", ""))
        if box is not None and (text in names) != bool(box.get("value")):
            gui("click", str(box["ref"]))
    submit(observe())


def navigate_tree(obs: dict[str, Any]) -> None:
    want = quoted(obs["utterance"])
    opened: set[int] = set()
    for _ in range(20):
        hit = next((n for n in obs["elements"] if tag(n) == "SPAN" and n.get("text") == want), None)
        if hit is not None:
            gui("click", str(hit["ref"]))
            return
        folder = next((n for n in obs["elements"] if tag(n) == "SPAN" and "folder" in str(n.get("classes", "")) and n["ref"] not in opened), None)
        if folder is None:
            raise RuntimeError(f"{want!r} is in no folder")
        opened.add(folder["ref"])
        gui("click", str(folder["ref"]))
        obs = observe()
    raise RuntimeError(f"did not find {want!r}")


SOLVERS: dict[str, Callable[[dict[str, Any]], None]] = {
    "click-button": click_button,
    "click-link": click_link,
    "click-test": click_test,
    "focus-text": focus_text,
    "enter-text": enter_text,
    "choose-list": choose_list,
    "click-checkboxes": click_checkboxes,
    "navigate-tree": navigate_tree,
}


def main() -> int:
    status = json.loads(gui("status", "--json"))
    solver = SOLVERS.get(status["task"])
    if solver is None:
        print(f"oracle: no scripted solution for {status['task']}", file=sys.stderr)
        return 1
    solver(observe())
    final = json.loads(gui("status", "--json"))
    print(f"oracle: {status['task']} done={final['done']} reward={final['raw_reward']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
