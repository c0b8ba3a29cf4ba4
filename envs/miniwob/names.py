"""Selecting tasks by name or glob, and the options that do it (shared by the GUI envs: miniwob, desktop)."""

from __future__ import annotations

import fnmatch

from pydantic import Field

from core.adapter import AdapterOptions, ConfigError, Names


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


class GuiOptions(AdapterOptions):
    """The options every GUI env takes: which tasks, how many seeded instances of each, the episode clock.

    Each env subclasses it to set its own `timeout` default (and add options of its own)."""

    names: Names | None = Field(None, description="task names or globs, a list or one comma-separated string (unset: all)")
    instances: int = Field(1, ge=1, description="seeded instances of each task")
    seed: int = Field(0, description="fixes every instance's parameters")
    timeout: float = Field(gt=0, description="the episode's clock in s")
