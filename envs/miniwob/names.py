"""Selecting tasks by name or glob (shared by the GUI envs: miniwob, desktop)."""

from __future__ import annotations

import fnmatch
from typing import Any

from core.errors import ConfigError


def as_list(value: Any) -> list[str] | None:
    """An option given as a list or a comma-separated string; None when unset."""
    if value is None:
        return None
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return [str(v) for v in value]


def select(known: list[str], patterns: list[str] | None, env: str) -> list[str]:
    """The names in `known` that `patterns` (names or globs) select, in `known`'s order; all when unset.

    A pattern that matches nothing is a ConfigError naming it.
    """
    if not patterns:
        return list(known)
    for pattern in patterns:
        if not any(n == pattern or fnmatch.fnmatchcase(n, pattern) for n in known):
            raise ConfigError(f"{env}: no task matches {pattern!r} ({len(known)} tasks, e.g. {', '.join(known[:3])})")
    return [n for n in known if any(n == p or fnmatch.fnmatchcase(n, p) for p in patterns)]
