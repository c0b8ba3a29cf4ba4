"""Why a run failed, kept in its store's `meta` table (`failure:<run_id>` → the error), so every reader — the
TUI's Runs list and Run screen, the SQL console — can say why whichever entry point ran it (`forgetui run`,
`--no-ui`, a launch from the TUI, a learning stage)."""

from __future__ import annotations

import logging

import duckdb

from core.errors import ForgetuiError
from core.store.writer import Store

log = logging.getLogger(__name__)

KEY_PREFIX = "failure:"
MAX_CHARS = 2000  # a traceback-sized message is cut: the process's own log keeps the rest


def failure_key(run_id: str) -> str:
    return KEY_PREFIX + run_id


def failure_text(exc: BaseException) -> str:
    """What a user reads: a forgetui error's own message, anything else with its type."""
    said = str(exc).strip()
    text = said if isinstance(exc, ForgetuiError) and said else f"{type(exc).__name__}: {said}" if said else type(exc).__name__
    return text[:MAX_CHARS]


def record_failure(store: Store, run_id: str, reason: str | None) -> None:
    """Write `reason` (None: forget an earlier one, a resumed run's) under `failure:<run_id>`: the run's last write
    before its store closes."""
    try:
        store.set_meta(failure_key(run_id), reason)
    except (duckdb.Error, ForgetuiError) as exc:  # the run's status still gets written; its log has the reason
        log.warning("could not record why run %s failed in its store: %s", run_id, exc)
