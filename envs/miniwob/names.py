"""Selecting tasks by name or glob (shared by the GUI envs: miniwob, desktop)."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Selection:
    """The options every GUI env takes: which tasks, how many seeded instances of each, the episode clock."""

    patterns: list[str] | None
    instances: int
    seed: int
    timeout: float

    @classmethod
    def of(cls, options: dict[str, Any], env: str, default_timeout: float) -> Selection:
        """Read and check `names`, `instances` (≥ 1), `seed`, `timeout` (> 0 s)."""
        chosen = cls(as_list(options.get("names")), int(options.get("instances", 1)), int(options.get("seed", 0)), float(options.get("timeout", default_timeout)))
        if chosen.instances < 1:
            raise ConfigError(f"{env}: instances must be >= 1, got {chosen.instances}")
        if chosen.timeout <= 0:
            raise ConfigError(f"{env}: timeout must be > 0 seconds, got {chosen.timeout:g}")
        return chosen
