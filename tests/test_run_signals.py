"""SIGTERM/SIGINT during a run cancel it: its cleanup runs, then KeyboardInterrupt (not a process killed mid-run)."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from core.run.signals import cancel_on_signals


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_cancels_the_run_after_its_cleanup_and_the_handlers_go(sig: int) -> None:
    cleaned: list[str] = []
    before = signal.getsignal(sig)

    async def run() -> None:
        try:
            asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), sig)
            await asyncio.sleep(30)
        finally:
            await asyncio.sleep(0)  # cleanup may itself await (removing sandboxes does)
            cleaned.append("sandboxes removed")

    with pytest.raises(KeyboardInterrupt, match=signal.Signals(sig).name):
        asyncio.run(cancel_on_signals(run()))
    assert cleaned == ["sandboxes removed"]
    assert signal.getsignal(sig) == before  # the run's handler is gone: a later signal acts as it did before


def test_a_run_that_ends_returns_its_value_and_a_plain_cancel_stays_a_cancel() -> None:
    async def value() -> int:
        return 7

    assert asyncio.run(cancel_on_signals(value())) == 7

    async def cancelled() -> None:
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(cancel_on_signals(cancelled()))
