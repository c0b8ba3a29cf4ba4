"""A rollout's recorded conversation as graders read it: OpenAI chat messages (with tool calls), one per line.

Every harness keeps its transcript its own way (JSONL files, SQLite, nothing at all); the proxy has
recorded every call, whatever the protocol. The trajectory is the rollout attempt's main branch: of
the conversations no later call carried on (`core.rollout.recorded.conversations`, one per branch:
subagents, title calls, compactions), the one with the most messages — its final request's messages
plus the assistant's last answer, tool calls as ``{"id", "type": "function", "function": {"name",
"arguments"}}`` and tool results as ``{"role": "tool", "tool_call_id", "content"}``.
`core.rollout.trajectory_formats` turns it into the files graders read (the JSONL, harbor's ATIF, a
Claude Code session, an OpenClaw session).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from core.rollout.recorded import conversations
from core.store.bodies import select_calls
from core.store.writer import Store

log = logging.getLogger(__name__)

CALLS_SQL = (
    "SELECT call_id, api, model, {request}, response FROM calls "
    "WHERE rollout_id = ? AND coalesce(attempt, 0) = ? AND status = 'ok' ORDER BY seq"
)


def main_conversation(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The longest branch's messages (the latest of equally long ones); [] without calls."""
    if not calls:
        return []
    branches = conversations(calls)
    best = max(enumerate(branches), key=lambda ib: (len(ib[1]["messages"]), ib[0]))[1]
    return best["messages"]


def recorded_trajectory_blocking(store: Store, rollout_id: str, attempt: int) -> list[dict[str, Any]]:
    """The attempt's main conversation from `store` (its queued calls flushed first)."""
    store.flush()
    calls = select_calls(store.cursor(), CALLS_SQL, [rollout_id, attempt])
    try:
        return main_conversation(calls)
    except Exception:  # noqa: BLE001 - a grader without a trajectory still scores the workspace
        log.warning("rollout %s: could not read its recorded calls back as chat", rollout_id, exc_info=True)
        return []


async def recorded_trajectory(store: Store, rollout_id: str, attempt: int) -> list[dict[str, Any]]:
    """`recorded_trajectory_blocking` off the event loop."""
    return await asyncio.to_thread(recorded_trajectory_blocking, store, rollout_id, attempt)
