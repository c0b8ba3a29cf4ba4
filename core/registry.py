"""Find harnesses and environments by name through entry points, so core never imports them.

A package adds one by declaring an entry point in the group `forgetui.harnesses` or `forgetui.envs`
(name = "package.module:Class"); a config may also name a class directly as `module:Class`.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any, Literal

from core.env import Environment
from core.errors import ConfigError
from core.harness import Harness
from core.plugins import Registry
from core.proxy.no_model import NO_MODEL
from core.secrets import redact_text

HARNESS_GROUP = "forgetui.harnesses"
ENV_GROUP = "forgetui.envs"
HARNESSES = Registry(HARNESS_GROUP, "harness")
ENVS = Registry(ENV_GROUP, "env")


def available(group: str) -> list[str]:
    """Every registered name in `group` (`HARNESS_GROUP` or `ENV_GROUP`), built in or installed."""
    return {HARNESS_GROUP: HARNESSES, ENV_GROUP: ENVS}[group].names()


def harness_class(name: str) -> type[Harness]:
    """The registered harness class `name` (its class attributes, without building one)."""
    return HARNESSES.load(name)


def env_class(name: str) -> type[Environment]:
    """The registered environment class `name` (its class attributes, without loading tasks)."""
    return ENVS.load(name)


def load_harness(name: str, **options: Any) -> Harness:
    """The harness `name` built with `options` (checked against its `Options`: a bad one is a ConfigError naming it)."""
    return harness_class(name)(**options)


def load_env(name: str, **options: Any) -> Environment:
    """The environment `name` with `options`; an option it does not take is an error naming those it does."""
    cls = env_class(name)
    if cls.Options is None:  # typed options are checked when the env is built; a list of names only here
        cls.check_options(options)
    return cls(**options)


def check_options(kind: Literal["harness", "env"], name: str, options: Mapping[str, Any]) -> None:
    """Check the options a config gives harness/env `name` without building it (nothing installed, no task read).

    The same ConfigError building it would raise, naming the option (`harness.options.max_steps: ...`, an
    unknown one with those it takes); a form (the TUI's New run) validates its fields with it. For a harness,
    `options` is what `HarnessConfig.adapter_options()` gives: `[harness.options]` plus `binary` and `version`.
    """
    if kind == "harness":
        harness_class(name).check_options(options)
    elif kind == "env":
        env_class(name).check_options(options)
    else:
        raise ConfigError(f"check_options: kind must be 'harness' or 'env', not {kind!r}")


def calls_model(harness: Harness | type[Harness] | None) -> bool:
    """Whether a harness (instance or class; None: unknown, taken to) talks to the policy at all (`oracle`, `noop` speak no protocol)."""
    return harness is None or bool(harness.protocols)


def model_shown(backend: str, harness: Harness | type[Harness] | None) -> str:
    """The model a run evaluates as reports and progress name it: `none` when the harness calls no model, keys redacted."""
    return redact_text(backend) if calls_model(harness) else NO_MODEL


@lru_cache(maxsize=64)
def _harness_named(harness: str) -> type[Harness] | None:
    """The registered harness class, or None (unknown: `calls_model` takes it to call one)."""
    try:
        return harness_class(harness) if harness else None
    except Exception:  # noqa: BLE001 - a harness not installed here
        return None


def model_shown_for(backend: str, harness: str) -> str:
    """`model_shown` for a recorded run, from its harness's name (reports and the TUI read runs by name)."""
    return model_shown(backend, _harness_named(harness))
