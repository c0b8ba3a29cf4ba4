"""The policy of a run whose harness calls no model (`oracle`, `noop`): nothing is loaded, any call is refused."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from core.errors import BackendError

NO_MODEL = "none"  # what such a run reports as its model


class NoModelPolicy:
    """Serves no model: an eval of a reference harness must not load (or report) a policy it never uses."""

    name = NO_MODEL
    backend = None

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
