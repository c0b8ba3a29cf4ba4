"""Find harnesses and environments by name through entry points, so core never imports them."""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Any

from core.env import Environment
from core.errors import ConfigError
from core.harness import Harness

HARNESS_GROUP = "forgetui.harnesses"
ENV_GROUP = "forgetui.envs"


def _load(group: str, name: str) -> Any:
    if ":" in name:  # "package.module:Class" — handy for one-off harnesses and tests
        module, _, attr = name.partition(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"cannot import {name!r}: {exc}") from None
    found = {ep.name: ep for ep in entry_points(group=group)}
    if name not in found:
        known = ", ".join(sorted(found)) or "none installed"
        raise ConfigError(f"no {group.split('.')[-1][:-1]} named {name!r} (known: {known}); a third-party one registers the entry point group {group!r}")
    return found[name].load()


def available(group: str) -> list[str]:
    return sorted(ep.name for ep in entry_points(group=group))


def load_harness(name: str, **options: Any) -> Harness:
    cls = _load(HARNESS_GROUP, name)
    return cls(**options)


def load_env(name: str, **options: Any) -> Environment:
    cls = _load(ENV_GROUP, name)
    return cls(**options)
