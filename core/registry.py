"""Find harnesses and environments by name through entry points, so core never imports them."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

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
    return {HARNESS_GROUP: HARNESSES, ENV_GROUP: ENVS}[group].names()


def harness_class(name: str) -> type[Harness]:
    """The registered harness class `name` (its class attributes, without building one)."""
    return HARNESSES.load(name)


def load_harness(name: str, **options: Any) -> Harness:
    return harness_class(name)(**options)


def load_env(name: str, **options: Any) -> Environment:
    """The environment `name` with `options`; an option it does not declare is an error naming those it takes."""
    cls = ENVS.load(name)
    accepted = getattr(cls, "accepted_options", None)
    unknown = sorted(set(options) - set(accepted)) if accepted is not None else []
    if unknown:
        raise ConfigError(
            f"env {name!r} has no option {', '.join(map(repr, unknown))}; it accepts: {', '.join(sorted(accepted)) or 'none'} "
            "(remove the option from [env.options], or set it for the env it was meant for)"
        )
    return cls(**options)


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
