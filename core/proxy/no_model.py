"""The policy of a run whose harness calls no model (`oracle`, `noop`): nothing is loaded, any call is refused."""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import lru_cache
from typing import Any

from core.errors import BackendError

NO_MODEL = "none"  # what such a run reports as its model


class NoModelPolicy:
    """Serves no model: an eval of a reference harness must not load (or report) a policy it never uses."""

    name = NO_MODEL

    def __init__(self, harness: str) -> None:
        self.harness = harness

    def _refuse(self) -> BackendError:
        return BackendError(f"harness {self.harness!r} calls no model, so this run loaded none; use a harness that does to evaluate a policy")

    async def stream(self, request: Any, session: Any, call_id: str, trace: Any) -> AsyncIterator[Any]:
        raise self._refuse()
        yield  # pragma: no cover - makes this an async generator

    async def count_tokens(self, request: Any) -> int:
        raise self._refuse()

    async def aclose(self) -> None:
        return None


def calls_model(harness: Any) -> bool:
    """Whether a harness (instance or class; None: unknown, taken to) talks to the policy at all (`oracle`, `noop` speak no protocol)."""
    return bool(getattr(harness, "protocols", ("chat",)))


def model_shown(backend: str, harness: Any) -> str:
    """The model a run evaluates as reports and progress name it: `none` when the harness calls no model, keys redacted."""
    from core.secrets import redact_text

    return redact_text(backend) if calls_model(harness) else NO_MODEL


@lru_cache(maxsize=64)
def _harness_named(harness: str) -> Any:
    """The registered harness class, or None (unknown: `calls_model` takes it to call one)."""
    from core.registry import harness_class

    try:
        return harness_class(harness) if harness else None
    except Exception:  # noqa: BLE001 - a harness not installed here
        return None


def model_shown_for(backend: str, harness: str) -> str:
    """`model_shown` for a recorded run, from its harness's name (reports and the TUI read runs by name)."""
    return model_shown(backend, _harness_named(harness))
