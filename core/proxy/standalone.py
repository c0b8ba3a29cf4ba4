"""`forgetui proxy`: the recorder on its own, for harnesses run by hand."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from core.backends.spec import PolicySpec
from core.paths import stores_dir
from core.proxy.app import DEFAULT_MAX_BODY, ProxyApp
from core.proxy.factory import make_policy
from core.proxy.server import serve_forever
from core.proxy.sessions import Session, SessionRegistry
from core.status import RunStatus
from core.store.writer import Store, utcnow

log = logging.getLogger(__name__)


def default_store_path(run_id: str) -> Path:
    return stores_dir() / f"{run_id}.duckdb"


def open_adhoc_store(store_path: Path, run_id: str, config: dict) -> tuple[Store, SessionRegistry]:
    """A store with a `runs` row for this proxy, and a registry that gives each ad-hoc session a rollout row."""
    store = Store.open(store_path)
    store.insert_run(run_id, config, status=RunStatus.RUNNING)

    def on_new(session: Session) -> None:
        store.upsert_rollout(
            {
                "rollout_id": session.rollout_id,
                "run_id": run_id,
                "env": "adhoc",
                "task_id": session.token,
                "harness": None,
                "sample_index": 0,
                "status": RunStatus.RUNNING,
                "started_at": utcnow(),
                "token": session.token,
                "attempt": 0,
            }
        )

    return store, SessionRegistry(run_id=run_id, adhoc=True, on_new_adhoc=on_new)


async def run_standalone_proxy(
    spec: PolicySpec,
    *,
    host: str,
    port: int,
    store_path: Path | None,
    on_ready: Callable[[str, Path], None],
    tokenizer: str | None = None,
    parser: str = "hermes",
    max_body_bytes: int = DEFAULT_MAX_BODY,
    call_timeout_s: float | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM, then mark sessions ended and close the store (every call flushed)."""
    run_id = "proxy-" + utcnow().strftime("%Y%m%d-%H%M%S-%f")
    store_path = store_path or default_store_path(run_id)
    policy = make_policy(spec, parser=parser, tokenizer=tokenizer)
    config = {"kind": "proxy", "backend": spec.raw, "host": host, "port": port, "parser": parser, "tokenizer": tokenizer, "call_timeout_s": call_timeout_s}
    store, sessions = open_adhoc_store(store_path, run_id, config)
    store.serve_queries()
    app = ProxyApp(policy, sessions, store, max_body_bytes=max_body_bytes, call_timeout_s=call_timeout_s, served_model=spec.public_name)
    try:
        await serve_forever(app, host, port, lambda url: on_ready(url, store_path))
    finally:
        for session in sessions.all():
            store.upsert_rollout({"rollout_id": session.rollout_id, "status": "done", "ended_at": utcnow()})
        store.update_run_status(run_id, "stopped")
        _warn_problems(store)
        store.close()
        await policy.aclose()
        log.info("proxy stopped; store closed at %s", store_path)


def _warn_problems(store: Store) -> None:
    """Say at shutdown when some rows could only be kept in `store_errors` or `dead_letters`."""
    try:
        counts = store.problem_counts()
    except Exception as exc:  # noqa: BLE001 - a report on the way out must not stop the close
        log.warning("could not count the store's kept rows: %s", exc)
        return
    for table, n in counts.items():
        if n:
            log.warning("%d row(s) could not be stored as given and are kept in %s (SELECT * FROM %s)", n, table, table)
