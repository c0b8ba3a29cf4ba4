"""A run session: the store, policy, proxy, runtime and images of one run, and `run_rollouts(tasks, step)`.

An eval opens a session and runs one batch (step 0); a trainer opens one and runs a batch per
step, swapping the policy's weights in between. Everything the session started is stopped on
any exit (error, Ctrl-C, SIGTERM): the proxy, the policy's connections, every sandbox of the run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any

from core.config import RunConfig, dump_toml
from core.env import Environment, Task
from core.harness import Harness
from core.paths import runs_dir
from core.proxy.app import ProxyApp
from core.proxy.factory import make_policy
from core.proxy.no_model import NoModelPolicy
from core.proxy.policy import DeferredPolicy, Policy
from core.proxy.server import BackgroundServer
from core.proxy.sessions import SessionRegistry
from core.registry import calls_model, load_env, load_harness, model_shown
from core.rollout.attempt import RolloutItem, RolloutResult, RunContext
from core.rollout.engine import RolloutEngine, RolloutEvent
from core.rollout.orphans import reap_dead_runs, remove_pid_file, write_pid_file
from core.rollout.trajectory import recorded_trajectory
from core.runtime.base import Runtime
from core.session.failure import failure_text, record_failure
from core.session.setup import (
    RunImages,
    env_kwargs,
    new_run_id,
    pick_runtime,
    proxy_url_for_sandboxes,
    select_tasks,
)
from core.status import TERMINAL_VALUES, RunStatus, Status
from core.store.query import SHARDS_DIR
from core.store.writer import Store

log = logging.getLogger(__name__)


def rollout_id_for(run_id: str, step: int, task_id: str, sample_index: int) -> str:
    """Unique across steps: `run/task/i` for step 0 (an eval), `run/task/i/sN` for training step N."""
    return f"{run_id}/{task_id}/{sample_index}" + (f"/s{step}" if step else "")


class RunSession:
    """One run's resources, opened with `async with RunSession(config) as session:`.

    `policy` is an already-built policy (a trainer builds the backend itself to swap its weights);
    without one, the config's backend loads on a thread while the first sandboxes start.
    """

    def __init__(
        self,
        config: RunConfig,
        *,
        run_id: str | None = None,
        resume: bool = False,
        policy: Policy | None = None,
        on_event: Callable[[RolloutEvent], None] | None = None,
        worker: str | None = None,
    ) -> None:
        self.config = config
        self.run_id = run_id or new_run_id()
        self.resuming = resume
        self.run_dir: Path = runs_dir() / self.run_id
        self.store_path = self.run_dir / "store.duckdb"
        # one process among several of a run (a veRL agent-loop worker): its own pid file and sandbox scope,
        # so its exit or death removes its sandboxes only (core.rollout.orphans)
        self.sandbox_scope = f"{self.run_id}@{worker}" if worker else self.run_id
        self.pid_dir = self.run_dir / SHARDS_DIR / worker if worker else self.run_dir
        self.on_event = on_event
        self.policy: Policy | DeferredPolicy | None = policy
        self.store: Store | None = None
        self.runtime: Runtime | None = None
        self.server: BackgroundServer | None = None
        self.env: Environment | None = None
        self.harness: Harness | None = None
        self.images: RunImages | None = None
        self.image = ""
        self.ctx: RunContext | None = None
        self.max_concurrent_sandboxes = 0
        self.status = RunStatus.FAILED  # what the run row says if the session ends before `finish`
        self.failure: str | None = None  # why it failed, recorded in the store on close

    async def __aenter__(self) -> RunSession:
        try:
            await self.open()
        except BaseException as exc:
            self._failed(exc)
            await self.close()
            raise
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc is not None:
            self._failed(exc)
        elif exc_type is not None:
            self.status = RunStatus.INTERRUPTED if issubclass(exc_type, asyncio.CancelledError | KeyboardInterrupt) else RunStatus.FAILED
        await self.close()

    def _failed(self, exc: BaseException) -> None:
        """The session ends on `exc`: interrupted (cancelled, Ctrl-C) or failed, and then why."""
        if isinstance(exc, asyncio.CancelledError | KeyboardInterrupt):
            self.status = RunStatus.INTERRUPTED
        else:
            self.status, self.failure = RunStatus.FAILED, failure_text(exc)

    async def open(self) -> None:
        config = self.config
        # sandbox calls (docker SDK, kubernetes client) block a thread each, and a harness exec holds one for
        # the whole rollout: the default pool (cores + 4) would cap concurrency far below run.concurrency
        asyncio.get_running_loop().set_default_executor(
            ThreadPoolExecutor(max_workers=max(32, 4 * config.run.concurrency + 8), thread_name_prefix="forgetui-io")
        )
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.toml").write_text(dump_toml(config))
        self.store = Store.open(self.store_path)
        self.pid_dir.mkdir(parents=True, exist_ok=True)
        write_pid_file(self.pid_dir, self.sandbox_scope)
        self.store.insert_run(self.run_id, config.model_dump(), status=RunStatus.RUNNING)
        self.store.serve_queries()
        self.runtime = pick_runtime(config)
        await reap_dead_runs(self.runtime)
        self.env = load_env(config.env.name, **env_kwargs(config))
        self.harness = load_harness(config.harness.name, **config.harness.adapter_options())
        self.images = RunImages(self.runtime, config, self.env, self.harness)
        if self.policy is None and not calls_model(self.harness):
            self.policy = NoModelPolicy(self.harness.name)  # oracle/noop: no model is loaded, none is reported
        if self.policy is None:
            self.policy = DeferredPolicy(  # loads while the sandboxes start; the first model call waits for it
                lambda: make_policy(config.policy.spec.with_server_log(self.run_dir), parser=config.policy.parser, tokenizer=config.policy.tokenizer, default_max_tokens=config.policy.max_tokens)
            )
        sessions = SessionRegistry(run_id=self.run_id, adhoc=False, max_calls=config.run.max_calls, seed=config.run.seed)
        app = ProxyApp(self.policy, sessions, self.store, max_body_bytes=config.proxy.max_body_bytes, call_timeout_s=config.run.call_timeout_s, served_model=config.policy.model_name)
        self.server = BackgroundServer(app, host=config.proxy.host, port=config.proxy.port)
        await asyncio.to_thread(self.server.start)
        self.ctx = RunContext(
            run_id=self.run_id,
            env=self.env,
            harness=self.harness,
            runtime=self.runtime,
            image_for=self.images.for_task,
            proxy_url=proxy_url_for_sandboxes(config, self.runtime, self.server.url),
            sessions=sessions,
            update=self._update_rollout,
            model_name=config.policy.model_name,
            workdir=config.runtime.workdir,
            timeout_s=config.run.timeout_s,
            timeout_scale=config.run.timeout_scale,
            trajectory=self._trajectory,
            sandbox={"cpus": config.runtime.cpus, "memory": config.runtime.memory, "pids_limit": config.runtime.pids_limit, "network": config.runtime.network, "proxy": self.server.url,
                     "egress_allow": list(config.runtime.egress_allow), "egress_allow_private": list(config.runtime.egress_allow_private)},
            logs_dir=self.run_dir / "logs",
            sandbox_scope=self.sandbox_scope,
        )

    def _update_rollout(self, row: dict[str, Any]) -> None:
        """Write a rollout row; one that carries meta (a finished attempt) also gets `meta.egress`, what its
        sandbox asked of the egress proxy (runtime.egress_allow), when it asked anything."""
        assert self.store is not None
        egress_counts = getattr(self.runtime, "egress_counts", None)  # the Docker runtime's egress proxy
        if egress_counts is not None and isinstance(row.get("meta"), dict) and (counts := egress_counts(row["rollout_id"])):
            row = {**row, "meta": {**row["meta"], "egress": counts}}
        self.store.upsert_rollout(row)

    async def _trajectory(self, rollout_id: str, attempt: int) -> list[dict[str, Any]] | None:
        """The attempt's recorded conversation (what graders read at /logs/agent/trajectory.jsonl)."""
        if self.store is None:
            return None
        return await recorded_trajectory(self.store, rollout_id, attempt)

    @property
    def model_name(self) -> str:
        """The model the run evaluates, as reports name it: `none` when the harness calls no model."""
        return model_shown(self.config.policy.backend, self.harness)

    def tasks(self) -> list[Task]:
        """The config's tasks (env.tasks filter and env.limit applied)."""
        assert self.env is not None, "open the session first"
        return select_tasks(self.env, self.config.env.tasks, self.config.env.limit)

    def plan(self, tasks: list[Task], step: int = 0, n_samples: int | None = None) -> tuple[list[RolloutItem], int]:
        """The rollouts of `tasks` × n for `step` still to run (on resume: those not finished) and how many are done."""
        assert self.store is not None
        n = n_samples or self.config.run.n_samples
        items = [
            RolloutItem(rollout_id=rollout_id_for(self.run_id, step, task.id, i), task=task, sample_index=i, step=step)
            for task in tasks
            for i in range(n)
        ]
        if not self.resuming:
            return items, 0
        known = self.known_rollouts()
        todo = [item for item in items if known.get(item.rollout_id, ("", 0, False))[0] not in TERMINAL_VALUES]
        for item in todo:
            _, attempt, started = known.get(item.rollout_id, ("", 0, False))
            # an attempt an earlier process started (crash, Ctrl-C) keeps its calls: the rerun is a new attempt
            item.first_attempt = (attempt or 0) + (1 if started else 0)
        return todo, len(items) - len(todo)

    def known_rollouts(self) -> dict[str, tuple[str, int | None, bool]]:
        """rollout id → (status, attempt, whether it ever started) as the store has them."""
        assert self.store is not None
        rows = store_rows(self.store, "SELECT rollout_id, status, attempt, started_at IS NOT NULL FROM rollouts WHERE run_id = ?", [self.run_id])
        return {rid: (status, attempt, started) for rid, status, attempt, started in rows}

    def add_pending(self, items: list[RolloutItem]) -> None:
        """Write the planned rollouts as `pending` rows (what the TUI and `--resume` see first)."""
        assert self.store is not None and self.env is not None and self.harness is not None
        for item in items:  # image_digest is set when the rollout starts: the image it really runs in
            self.store.upsert_rollout(
                {
                    "rollout_id": item.rollout_id,
                    "run_id": self.run_id,
                    "env": self.env.name,
                    "task_id": item.task.id,
                    "harness": self.harness.name,
                    "sample_index": item.sample_index,
                    "step": item.step,
                    "status": str(Status.PENDING),
                    "attempt": item.first_attempt,
                    "harness_version": self.harness.version,
                    "env_version": self.env.version,
                    "task_hash": item.task.content_hash,
                    "meta": {"task_meta": item.task.meta},
                }
            )

    async def run_rollouts(self, items: list[RolloutItem]) -> dict[str, RolloutResult]:
        """Run planned rollouts to a terminal status; a policy that fails to load stops them with its error."""
        assert self.ctx is not None and self.policy is not None and self.images is not None
        if any(item.task.image is None for item in items):  # the shared image: built (or its absence reported) before any sandbox starts
            self.image = (await self.images.for_task(Task(id="", instruction=""))).tag
        self.add_pending(items)
        if isinstance(self.policy, DeferredPolicy) and self.config.policy.spec.managed:
            await self.policy.ready()  # a server the run starts (vllm:MODEL, 30-90 s): up before a harness's client starts its clock
        engine = RolloutEngine(self.ctx, concurrency=self.config.run.concurrency, max_retries=self.config.run.max_retries, on_event=self.on_event)
        try:
            return await _run_engine(engine, items, self.policy)
        finally:
            self.max_concurrent_sandboxes = max(self.max_concurrent_sandboxes, engine.max_active)

    def finish(self, status: str = RunStatus.DONE) -> None:
        """Mark the run's outcome (written on close)."""
        self.status = status

    async def close(self) -> None:
        """Stop the proxy and the policy, remove every sandbox of the run, record the run's status."""
        policy, server, runtime, store = self.policy, self.server, self.runtime, self.store
        self.server = None
        if server is not None:
            if policy is not None and server.loop is not None and server.loop.is_running():
                # the policy's HTTP sessions live on the proxy's loop: close them there, before it stops
                try:
                    await asyncio.wait_for(asyncio.wrap_future(asyncio.run_coroutine_threadsafe(policy.aclose(), server.loop)), 30)
                except Exception:  # noqa: BLE001
                    log.warning("could not close the policy backend cleanly", exc_info=True)
                policy = None
            await asyncio.to_thread(server.stop)
        if runtime is not None:
            try:
                await asyncio.shield(runtime.reap(run_id=self.sandbox_scope))  # nothing of this run (or worker) outlives it
            except Exception:  # noqa: BLE001
                log.warning("could not reap the sandboxes of %s; `forgetui gc` will", self.sandbox_scope, exc_info=True)
        if store is not None:
            if self.status == RunStatus.FAILED and self.failure or self.resuming:  # a resumed run: an earlier reason goes
                record_failure(store, self.run_id, self.failure if self.status == RunStatus.FAILED else None)
            store.update_run_status(self.run_id, self.status)
            store.close()
            self.store = None
        remove_pid_file(self.pid_dir)
        if policy is not None:
            await policy.aclose()
        self.policy = None


async def _run_engine(engine: RolloutEngine, items: list[RolloutItem], policy: Policy | DeferredPolicy) -> dict[str, RolloutResult]:
    """Run the rollouts; a policy that fails to load stops the run with its own error."""
    if not isinstance(policy, DeferredPolicy):
        return await engine.run(items)
    rollouts = asyncio.ensure_future(engine.run(items))
    loading = asyncio.ensure_future(policy.ready())
    try:
        await asyncio.wait({rollouts, loading}, return_when=asyncio.FIRST_EXCEPTION)
        if loading.done() and loading.exception() is not None:
            rollouts.cancel()
            await asyncio.gather(rollouts, return_exceptions=True)
            raise loading.exception()  # type: ignore[misc]
        return await rollouts
    finally:
        for task in (rollouts, loading):
            if not task.done():
                task.cancel()
        await asyncio.gather(rollouts, loading, return_exceptions=True)


def store_rows(store: Store, sql: str, params: list[Any] | None = None) -> list[tuple]:
    """Rows of a query on the session's store (after flushing what is queued)."""
    store.flush()
    return store.cursor().execute(sql, params or []).fetchall()
