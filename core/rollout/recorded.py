"""Recorded calls read back as chat: each wire protocol's request and answer in canonical messages, per branch.

What SFT re-tokenizes, what `forgetui export --format sft` writes and what graders read as a rollout's
trajectory all start here: a call's recorded request body parsed by its protocol into (messages, tools),
its response into the assistant message it carried, and a rollout's calls grouped into the conversations
no later call carried on (one per branch: the main line, subagents, title calls, compactions).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import duckdb

from core.chat import exported_message
from core.errors import TrainingDataError
from core.protocols.registry import get_protocol
from core.store.bodies import select_calls
from core.tokens.continuation import normalize_message


def json_value(value: Any) -> Any:
    """A JSON column's value, parsed."""
    return json.loads(value) if isinstance(value, str) else (value or {})


def request_chat(
    api: str, request: Any, model: str | None = None, *, exported: bool = True
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(messages, tools) of a recorded request body, parsed by its wire protocol.

    Images are blob references: as JSON holds them (`exported_message`), or with `exported=False`
    as the canonical `parts` (ImageParts without their bytes).
    """
    parsed = get_protocol(api).parse_request(json_value(request), model=model or "recorded")
    return ([exported_message(m) for m in parsed.messages] if exported else parsed.messages), parsed.tools


def answer_message(api: str, response: Any) -> dict[str, Any]:
    """The assistant message (content, tool_calls) a recorded response body carried, in canonical form:
    the protocol puts the answer back into a request, as a harness would send it in its history, and parses it."""
    try:
        protocol = get_protocol(api)
    except ValueError:
        raise TrainingDataError(f"calls recorded on the {api!r} protocol cannot be read back as chat") from None
    return protocol.answer_message(json_value(response))


CALLS_SQL = (
    "SELECT r.rollout_id, r.run_id, r.task_id, r.step, r.reward, r.status, c.call_id, c.api, c.model, {request}, c.response, "
    "c.weights_version FROM rollouts r JOIN calls c ON c.rollout_id = r.rollout_id AND c.status = 'ok' "
    "AND coalesce(c.attempt, 0) = coalesce(r.attempt, 0) WHERE r.run_id = ? AND list_contains(?, r.rollout_id) "
    "ORDER BY r.rollout_id, c.seq"
)


def recorded_calls(
    con: duckdb.DuckDBPyConnection, run_id: str, rollout_ids: Sequence[str]
) -> dict[str, list[dict[str, Any]]]:
    """The ok calls (request, response, protocol) of the rollouts' last attempts, in order, per rollout."""
    out: dict[str, list[dict[str, Any]]] = {}
    for row in select_calls(con, CALLS_SQL, [run_id, list(rollout_ids)]):  # bodies stored as deltas rebuilt
        out.setdefault(row["rollout_id"], []).append(row)
    return out


def _norm(messages: list[dict[str, Any]]) -> tuple:
    return tuple(normalize_message(m) for m in messages)


def conversations(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One conversation per branch: each call whose messages + answer no later call's request carries on."""
    convs = []
    for row in calls:
        messages, tools = request_chat(row["api"], row["request"], row.get("model"))
        convs.append(
            {
                "call_id": row["call_id"],
                "messages": [*messages, answer_message(row["api"], row["response"])],
                "tools": tools,
            }
        )
    keys = [_norm(c["messages"]) for c in convs]
    finals = []
    for i, conv in enumerate(convs):
        n = len(keys[i])
        continued = any(
            len(later) >= n and later[:n] == keys[i]
            for later in (_norm(c["messages"][:-1]) for c in convs[i + 1 :])
        )
        if not continued:
            finals.append(conv)
    return finals
