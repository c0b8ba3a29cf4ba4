"""Removing sandboxes left behind by crashed or interrupted runs (`forgetui gc`, run start-up)."""

from __future__ import annotations

import asyncio
import logging

from core.errors import SandboxError
from core.runtime.base import Runtime

log = logging.getLogger(__name__)


async def reap_orphans(runtime: Runtime, run_id: str | None = None, owner: str | None = None) -> int:
    """Remove the runtime's labelled sandboxes (of one run and/or owner, or all of ours); returns how many.

    A runtime that is not available reaps nothing (logged), so a run start-up never fails here.
    """
    if not await asyncio.to_thread(runtime.available):  # may block on the network
        log.info("runtime %s is not available; nothing to reap", getattr(runtime, "name", runtime))
        return 0
    try:
        count = await runtime.reap(run_id=run_id, owner=owner)
    except SandboxError:
        raise
    except Exception as exc:
        raise SandboxError(
            f"could not list/remove leftover sandboxes on {getattr(runtime, 'name', runtime)}: {exc}"
        ) from exc
    if count:
        log.info("removed %d leftover sandbox(es)%s", count, f" of run {run_id}" if run_id else "")
    return count
