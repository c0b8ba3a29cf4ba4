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


def harness_class(name: str) -> type[Harness]:
    """The registered harness class `name` (its class attributes, without building one)."""
    return _load(HARNESS_GROUP, name)


def load_harness(name: str, **options: Any) -> Harness:
    return harness_class(name)(**options)


def load_env(name: str, **options: Any) -> Environment:
    """The environment `name` with `options`; an option it does not declare is an error naming those it takes."""
    cls = _load(ENV_GROUP, name)
    accepted = getattr(cls, "accepted_options", None)
    unknown = sorted(set(options) - set(accepted)) if accepted is not None else []
    if unknown:
        raise ConfigError(
            f"env {name!r} has no option {', '.join(map(repr, unknown))}; it accepts: {', '.join(sorted(accepted)) or 'none'} "
            "(remove the option from [env.options], or set it for the env it was meant for)"
        )
    return cls(**options)
