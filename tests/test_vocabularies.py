"""Run statuses come from one vocabulary (core.status.RunStatus), not bare strings (issue 46, item 3)."""

from __future__ import annotations

import ast
from pathlib import Path

from core.status import RunStatus

REPO = Path(__file__).resolve().parents[1]
WORDS = {str(s) for s in RunStatus}


def _bare_run_statuses(path: Path) -> list[str]:
    """Places that write a run status as a string literal: `status=...`, `x.status = ...`, `status = ...`, `finish(...)`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        values: list[ast.AST] = []
        if isinstance(node, ast.keyword) and node.arg == "status":
            values = [node.value]
        elif isinstance(node, ast.Assign) and any(
            (isinstance(t, ast.Name) and t.id == "status") or (isinstance(t, ast.Attribute) and t.attr == "status") for t in node.targets
        ):
            values = [node.value]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "finish":
            values = list(node.args)
        for value in values:
            for leaf in ast.walk(value):
                if isinstance(leaf, ast.Constant) and leaf.value in WORDS:
                    found.append(f"{path.relative_to(REPO)}:{leaf.lineno} {leaf.value!r}")
    return found


def test_run_statuses_are_written_from_the_vocabulary() -> None:
    found = [hit for root in ("core", "forgetui") for path in sorted((REPO / root).rglob("*.py")) for hit in _bare_run_statuses(path)]
    assert not found, f"write run statuses as core.status.RunStatus members: {found}"


def test_run_status_values_are_what_the_store_holds() -> None:
    assert [str(s) for s in RunStatus] == ["running", "done", "failed", "interrupted"]
    assert RunStatus.DONE == "done"  # a StrEnum: compares and stores as its word
