"""Running a coroutine so that SIGINT/SIGTERM cancel it: its `finally` blocks (sandboxes, proxy, store) run before exit."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def cancel_on_signals(coro: Awaitable[T]) -> T:
    """Await `coro`; SIGINT or SIGTERM cancels it, and once it has cleaned up, KeyboardInterrupt is raised here.

    Without this a SIGTERM ends the process at once and a run's sandboxes outlive it until the next
    run reaps them (`core.rollout.orphans`). The handlers are removed again when `coro` ends.
    """
    task = asyncio.ensure_future(coro)
    loop = asyncio.get_running_loop()
    received: list[int] = []

    def stop(sig: int) -> None:
        received.append(sig)
        task.cancel()

    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals here
            loop.add_signal_handler(sig, stop, sig)
            installed.append(sig)
    try:
        return await task
    except asyncio.CancelledError:
        if received:
            raise KeyboardInterrupt(f"stopped by {signal.Signals(received[0]).name}") from None
        raise
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
