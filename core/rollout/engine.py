"""Runs many rollouts: a concurrency limit, retries for infrastructure failures only, and a loop that never dies on one error."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from core.rollout.attempt import Attempt, InfraError, RolloutItem, RolloutResult, RunContext
from core.status import Status
from core.store.writer import utcnow

log = logging.getLogger(__name__)
RUNTIME_WAIT_S = 300.0  # after an infrastructure error, how long a retry waits for the runtime to answer again
RUNTIME_POLL_S = 1.0


@dataclass
class RolloutEvent:
    """Progress for the CLI and TUI: a rollout reached a terminal status."""

    rollout_id: str
    task_id: str
    result: RolloutResult


class RolloutEngine:
    """Schedules rollouts on `concurrency` sandboxes at once and retries infrastructure failures."""

    def __init__(self, ctx: RunContext, *, concurrency: int, max_retries: int, on_event: Callable[[RolloutEvent], None] | None = None, runtime_wait_s: float = RUNTIME_WAIT_S) -> None:
        self.ctx = ctx
        self.runtime_wait_s = runtime_wait_s
        self.concurrency = concurrency
        self.max_retries = max_retries
        self.on_event = on_event
        self.active = 0
        self.max_active = 0
        self._slots = asyncio.Semaphore(concurrency)

    async def run(self, items: list[RolloutItem]) -> dict[str, RolloutResult]:
        """Run every item; cancellation (Ctrl-C) stops the sandboxes and leaves unfinished rollouts pending."""
        tasks = {item.rollout_id: asyncio.create_task(self._one(item), name=item.rollout_id) for item in items}
        try:
            await asyncio.gather(*tasks.values())
        except asyncio.CancelledError:
            for task in tasks.values():
                task.cancel()
            await asyncio.gather(*tasks.values(), return_exceptions=True)
            await self.drain()
            raise
        await self.drain()
        return {rid: task.result() for rid, task in tasks.items()}

    async def drain(self) -> None:
        """Wait for every sandbox removal still in flight."""
        while self.ctx.removals:
            await asyncio.gather(*list(self.ctx.removals), return_exceptions=True)

    async def _one(self, item: RolloutItem) -> RolloutResult:
        async with self._slots:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            try:
                result = await self._with_retries(item)
            finally:
                self.active -= 1
        if self.on_event is not None:
            try:
                self.on_event(RolloutEvent(item.rollout_id, item.task.id, result))
            except Exception:  # noqa: BLE001 - a progress display must not stop the run
                log.exception("progress callback failed")
        return result

    async def _runtime_answers(self) -> bool:
        """Before a retry: wait (up to runtime_wait_s) until the runtime answers, so an engine restart costs no attempts."""
        runtime = self.ctx.runtime
        available = getattr(runtime, "available", None)
        if available is None:
            return True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.runtime_wait_s
        warned = False
        while True:
            try:
                if await asyncio.to_thread(available):
                    if warned:
                        log.info("runtime %s answers again; retrying", getattr(runtime, "name", runtime))
                    return True
            except Exception:  # noqa: BLE001 - an unreachable runtime is what we wait out
                pass
            if loop.time() >= deadline:
                log.warning("runtime %s still does not answer after %.0f s; retrying anyway", getattr(runtime, "name", runtime), self.runtime_wait_s)
                return False
            if not warned:
                warned = True
                log.warning("runtime %s does not answer; waiting up to %.0f s before retrying", getattr(runtime, "name", runtime), self.runtime_wait_s)
            await asyncio.sleep(RUNTIME_POLL_S)

    async def _with_retries(self, item: RolloutItem) -> RolloutResult:
        error = ""
        first = item.first_attempt
        for attempt_no in range(first, first + self.max_retries + 1):
            try:
                return await Attempt(self.ctx, item, attempt_no).run()
            except asyncio.CancelledError:
                self.ctx.update({"rollout_id": item.rollout_id, "status": str(Status.PENDING), "error": "interrupted; `forgetui run --resume` finishes it"})
                raise
            except InfraError as exc:
                error = str(exc)
                log.warning("rollout %s attempt %d: infrastructure error: %s", item.rollout_id, attempt_no, error)
            except Exception as exc:  # noqa: BLE001 - a bug in one rollout must not stop the others
                error = f"{type(exc).__name__}: {exc}"
                log.exception("rollout %s attempt %d failed unexpectedly", item.rollout_id, attempt_no)
            if attempt_no < first + self.max_retries:
                self.ctx.update({"rollout_id": item.rollout_id, "status": str(Status.PENDING), "error": f"retrying after: {error}", "attempt": attempt_no + 1})
                await self._runtime_answers()
        self.ctx.update(
            {"rollout_id": item.rollout_id, "status": str(Status.INFRA_ERROR), "ended_at": utcnow(), "reward": None, "passed": None, "error": error}
        )
        return RolloutResult(Status.INFRA_ERROR, error=error)
