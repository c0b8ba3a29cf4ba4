"""Why a pod did not start or went away, in words: its Events, its containers' terminated reasons, known causes."""

from __future__ import annotations

import logging
from typing import Any

from core.errors import SandboxError
from core.runtime.k8s.api import describe, status_of

log = logging.getLogger(__name__)

EVENTS_SHOWN = 6
EXEC_FORMAT = "exec format error"
EXEC_FORMAT_HINT = (
    "the image holds binaries for another CPU architecture than the node's (an arm64 image on amd64 nodes, or the "
    "reverse): build and push it for the nodes' platform, `forgetui images build CONFIG --push --platform linux/amd64` "
    "(`kubectl get nodes -L kubernetes.io/arch` lists theirs)"
)


def terminated_detail(statuses: Any) -> str:
    """``container NAME REASON (exit N): message`` for each terminated container of ``statuses`` that failed."""
    parts = []
    for cs in statuses or []:
        done = cs.state.terminated if cs.state else None
        if done is None or (done.exit_code == 0 and done.reason in (None, "Completed")):
            continue
        message = (done.message or "").strip()
        parts.append(f"container {cs.name} {done.reason or 'ended'} (exit {done.exit_code}){': ' + message[-500:] if message else ''}")
    return "; ".join(parts)


def hint_for(text: str) -> str:
    """A sentence about a cause recognised in ``text`` (a terminated message, log lines), or ""."""
    return EXEC_FORMAT_HINT if EXEC_FORMAT in text.lower() else ""


def events_text(api: Any, namespace: str, name: str) -> str:
    """The pod's latest Events as ``Type Reason: message; …`` (blocking; "" when there are none or they cannot be read)."""
    try:
        listing = api.call(
            f"reading the events of pod {name}", api.core.list_namespaced_event, namespace,
            field_selector=f"involvedObject.name={name},involvedObject.kind=Pod",
        )
    except SandboxError as exc:  # RBAC without events: said, and the error still says what else it knows
        log.info("%s", exc)
        if status_of(exc.__cause__ or exc) in (401, 403):
            return f"[the pod's Events are unreadable: {describe(exc.__cause__ or exc)}; grant list on events (examples/kubernetes-rbac.yaml)]"
        return f"[the pod's Events are unreadable: {exc}]"
    items = sorted(listing.items if listing else [], key=_when)
    lines = [f"{e.type or 'Normal'} {e.reason or '?'}: {(e.message or '').strip()}" for e in items[-EVENTS_SHOWN:]]
    return "; ".join(lines)


def _when(event: Any) -> Any:
    stamp = event.last_timestamp or event.event_time or event.first_timestamp
    return (stamp is not None, stamp.timestamp() if stamp is not None else 0.0)


__all__ = ["EXEC_FORMAT_HINT", "events_text", "hint_for", "terminated_detail"]
