"""A run: the proxy, the sandboxes and the engine for one config, with its store and summary."""

from __future__ import annotations

import asyncio
import fnmatch
import json
import logging
import secrets
import tomllib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from core.config import RunConfig, dump_toml
from core.env import Environment, Task
from core.errors import ConfigError, SandboxError
from core.eval_report import pass_metrics
from core.harness import Harness
from core.paths import runs_dir
from core.proxy.app import ProxyApp
from core.proxy.factory import make_policy
from core.proxy.policy import DeferredPolicy
from core.proxy.server import BackgroundServer
from core.proxy.sessions import SessionRegistry
from core.registry import load_env, load_harness
from core.rollout.attempt import RolloutItem, RunContext
from core.rollout.engine import RolloutEngine, RolloutEvent
from core.rollout.orphans import reap_dead_runs, remove_pid_file, write_pid_file
from core.rollout.status import TERMINAL, Status
from core.runtime import make_runtime
from core.runtime.base import Runtime
from core.store.writer import Store

log = logging.getLogger(__name__)


@dataclass
class RunSummary:
    run_id: str
    rollouts: int
    passed: int
    failed: int
    timeouts: int
    infra_errors: int
    mean_reward: float | None
    pass_at_k: dict[str, float]
    pass_hat_k: dict[str, float]
    store: str
    status: str = "done"
    extra: dict[str, Any] = field(default_factory=dict)
    report: dict[str, Any] | None = None  # the eval report (also written to eval.json), not part of the JSON summary

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k not in ("extra", "report")}
        out.update(self.extra)
        return out


def new_run_id() -> str:
    return f"{datetime.now():%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def select_tasks(env: Environment, patterns: list[str] | None, limit: int | None) -> list[Task]:
    """Tasks whose id matches any pattern (exact id or glob), in the env's order, at most `limit`."""
    tasks = env.tasks()
    if patterns:
        tasks = [t for t in tasks if any(t.id == p or fnmatch.fnmatchcase(t.id, p) for p in patterns)]
        if not tasks:
            raise ConfigError(f"no task of env {env.name!r} matches {patterns}")
    return tasks[:limit] if limit else tasks


def pick_runtime(config: RunConfig) -> Runtime:
    rc = config.runtime
    if rc.kind == "kubernetes":
        return make_runtime("kubernetes", namespace=rc.namespace, kubeconfig=rc.kubeconfig, image_pull_policy=rc.image_pull_policy, proxy_public_url=config.proxy.public_url)
    if rc.kind in ("docker", "auto"):
        docker = make_runtime("docker")
        if docker.available():
            return docker
        if rc.kind == "docker":
            raise SandboxError("runtime.kind = docker but no Docker engine answers: start dockerd (see .ci/docker-up.sh) or use runtime.kind = local")
        log.warning("no Docker engine answers: falling back to the LOCAL runtime, which is NOT isolated")
    return make_runtime("local")


class RunImages:
    """The run's images: env + harness layers on the configured base, or on a task's own Dockerfile image.

    Each distinct image is built once (cached by content hash on the engine) and never twice at once.
    """

    def __init__(self, runtime: Runtime, config: RunConfig, env: Environment, harness: Harness) -> None:
        self.runtime = runtime
        self.config = config
        self.layers = [layer for layer in (env.image_layer(), harness.image_layer()) if layer is not None]
        self.ca = Path(config.runtime.ca_bundle) if config.runtime.ca_bundle else None
        self._built: dict[str, str] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def default_blocking(self) -> str:
        return self._on_base(self.config.runtime.base_image)

    def _on_base(self, base: str) -> str:
        from core.runtime import images

        if self.runtime.name == "local":
            return "local"
        if self.runtime.name == "kubernetes":
            return images.image_tag(base, self.layers, self.ca.read_bytes() if self.ca else None) if self.layers else base
        client = self.runtime.client  # type: ignore[attr-defined]
        if not images.image_exists(client, base):
            raise SandboxError(f"base image {base} is not present: run `forgetui images bootstrap` (no registry needed) or pull/build it")
        return images.ensure_image(client, base, self.layers, self.ca) if self.layers or self.ca else base

    def _for_task_blocking(self, task: Task) -> str:
        from core.runtime import images

        assert task.image is not None
        if self.runtime.name != "docker":
            raise SandboxError(f"task {task.id} brings its own Dockerfile: only the docker runtime builds those (build and push it for {self.runtime.name})")
        base = images.ensure_dockerfile_image(self.runtime.client, task.id, task.image.dockerfile, task.image.context)  # type: ignore[attr-defined]
        return self._on_base(base)

    async def for_task(self, task: Task) -> str:
        key = "" if task.image is None else task.image.dockerfile + str(task.image.context)
        if key in self._built:
            return self._built[key]
        async with self._locks.setdefault(key, asyncio.Lock()):
            if key not in self._built:
                build = self.default_blocking if task.image is None else (lambda: self._for_task_blocking(task))
                self._built[key] = await asyncio.to_thread(build)
        return self._built[key]


def build_image(runtime: Runtime, config: RunConfig, env: Environment, harness: Harness) -> str:
    """The env+harness image on the configured base (what `forgetui images build` prints)."""
    return RunImages(runtime, config, env, harness).default_blocking()


def image_identity(runtime: Runtime, image: str) -> str:
    """`tag@sha256:…` for Docker images (what the rollout row records), the tag elsewhere."""
    if runtime.name != "docker":
        return image
    try:
        return f"{image}@{runtime.client.images.get(image).id}"  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - the tag alone still identifies it
        return image


def proxy_url_for_sandboxes(config: RunConfig, runtime: Runtime, local_url: str) -> str:
    if config.proxy.public_url:
        return config.proxy.public_url.rstrip("/")
    if runtime.name == "kubernetes":
        raise ConfigError("runtime.kind = kubernetes needs proxy.public_url: the proxy's address as pods see it")
    if runtime.name == "docker" and config.runtime.network == "bridge":
        return "http://host.docker.internal:" + local_url.rsplit(":", 1)[1]
    return local_url


def load_run_config(run_id: str) -> RunConfig:
    path = runs_dir() / run_id / "config.toml"
    if not path.exists():
        raise ConfigError(f"no run {run_id!r} to resume (no {path})")
    return RunConfig.model_validate(tomllib.loads(path.read_text()))


async def execute_run(
    config: RunConfig,
    *,
    resume: str | None = None,
    on_event: Callable[[RolloutEvent], None] | None = None,
    on_start: Callable[[str, int], None] | None = None,
    ks: list[int] | None = None,
) -> RunSummary:
    """Run (or resume) every rollout of a config; the summary is computed from the store."""
    if config.train.steps:
        raise ConfigError("train.steps > 0: training lands with the training issue; this version evaluates only (train.steps = 0)")
    # sandbox calls (docker SDK, kubernetes client) block a thread each, and a harness exec holds one for
    # the whole rollout: the default pool (cores + 4) would cap concurrency far below run.concurrency
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=max(32, 4 * config.run.concurrency + 8), thread_name_prefix="forgetui-io"))
    run_id = resume or new_run_id()
    run_dir = runs_dir() / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.toml").write_text(dump_toml(config))
    store_path = run_dir / "store.duckdb"
    store = Store.open(store_path)
    write_pid_file(run_dir)
    status = "failed"
    server: BackgroundServer | None = None
    runtime: Runtime | None = None
    policy = None
    try:
        store.insert_run(run_id, config.model_dump(), status="running")
        store.serve_queries()
        policy = DeferredPolicy(  # loads while the sandboxes start; the first model call waits for it
            lambda: make_policy(config.policy.backend, parser=config.policy.parser, tokenizer=config.policy.tokenizer, default_max_tokens=config.policy.max_tokens)
        )
        runtime = pick_runtime(config)
        await reap_dead_runs(runtime)
        env = load_env(config.env.name, **({"path": config.env.path} if config.env.path else {}), **config.env.options)
        harness = load_harness(config.harness.name, **({"binary": config.harness.binary} if config.harness.binary else {}), **config.harness.options)
        tasks = select_tasks(env, config.env.tasks, config.env.limit)
        images = RunImages(runtime, config, env, harness)
        image = await images.for_task(Task(id="", instruction=""))  # the shared image, built before any sandbox starts
        items, done = _plan(run_id, tasks, config.run.n_samples, store, resume is not None)
        _insert_pending(store, run_id, items, env, harness, image_identity(runtime, image), config)
        if on_start is not None:
            on_start(run_id, len(items) + done)
        sessions = SessionRegistry(run_id=run_id, adhoc=False)
        app = ProxyApp(policy, sessions, store, max_body_bytes=config.proxy.max_body_bytes, call_timeout_s=config.run.call_timeout_s, served_model=config.policy.model_name)
        server = BackgroundServer(app, host=config.proxy.host, port=config.proxy.port)
        await asyncio.to_thread(server.start)
        ctx = RunContext(
            run_id=run_id,
            env=env,
            harness=harness,
            runtime=runtime,
            image_for=images.for_task,
            proxy_url=proxy_url_for_sandboxes(config, runtime, server.url),
            sessions=sessions,
            update=store.upsert_rollout,
            model_name=config.policy.model_name,
            workdir=config.runtime.workdir,
            timeout_s=config.run.timeout_s,
            sandbox={"cpus": config.runtime.cpus, "memory": config.runtime.memory, "pids_limit": config.runtime.pids_limit, "network": config.runtime.network},
            logs_dir=run_dir / "logs",
        )
        engine = RolloutEngine(ctx, concurrency=config.run.concurrency, max_retries=config.run.max_retries, on_event=on_event)
        try:
            await _run_engine(engine, items, policy)
        except asyncio.CancelledError:
            status = "interrupted"
            raise
        status = "done"
        summary = summarize(store, run_id, store_path, ks or list(range(1, config.run.n_samples + 1)))
        summary.extra["max_concurrent_sandboxes"] = engine.max_active
        summary.extra.update(write_eval_report(store, run_id, run_dir, summary, config))
        return summary
    finally:
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
                await asyncio.shield(runtime.reap(run_id=run_id))  # nothing of this run outlives it
            except Exception:  # noqa: BLE001
                log.warning("could not reap the sandboxes of run %s; `forgetui gc` will", run_id, exc_info=True)
        store.update_run_status(run_id, status)
        store.close()
        remove_pid_file(run_dir)
        if policy is not None:
            await policy.aclose()


async def _run_engine(engine: RolloutEngine, items: list[RolloutItem], policy: DeferredPolicy) -> None:
    """Run the rollouts; a policy that fails to load stops the run with its own error."""
    rollouts = asyncio.ensure_future(engine.run(items))
    loading = asyncio.ensure_future(policy.ready())
    try:
        await asyncio.wait({rollouts, loading}, return_when=asyncio.FIRST_EXCEPTION)
        if loading.done() and loading.exception() is not None:
            rollouts.cancel()
            await asyncio.gather(rollouts, return_exceptions=True)
            raise loading.exception()  # type: ignore[misc]
        await rollouts
    finally:
        for task in (rollouts, loading):
            if not task.done():
                task.cancel()
        await asyncio.gather(rollouts, loading, return_exceptions=True)


def _plan(run_id: str, tasks: list[Task], n_samples: int, store: Store, resuming: bool) -> tuple[list[RolloutItem], int]:
    """The rollouts still to run (all, or on resume those not in a terminal status) and how many are done."""
    finished: set[str] = set()
    if resuming:
        store.flush()
        rows = store.handle_query(f"SELECT rollout_id, status FROM rollouts WHERE run_id = '{run_id}'")["rows"]
        finished = {rid for rid, st in rows if st in {str(s) for s in TERMINAL}}
    items = [
        RolloutItem(rollout_id=f"{run_id}/{task.id}/{i}", task=task, sample_index=i)
        for task in tasks
        for i in range(n_samples)
    ]
    todo = [item for item in items if item.rollout_id not in finished]
    return todo, len(items) - len(todo)


def _insert_pending(store: Store, run_id: str, items: list[RolloutItem], env: Environment, harness: Harness, image: str, config: RunConfig) -> None:
    for item in items:
        store.upsert_rollout(
            {
                "rollout_id": item.rollout_id,
                "run_id": run_id,
                "env": env.name,
                "task_id": item.task.id,
                "harness": harness.name,
                "sample_index": item.sample_index,
                "status": str(Status.PENDING),
                "attempt": 0,
                "harness_version": harness.version,
                "image_digest": image,
                "env_version": env.version,
                "task_hash": item.task.content_hash,
                "meta": {"task_meta": item.task.meta},
            }
        )


def write_eval_report(store: Store, run_id: str, run_dir: Path, summary: RunSummary, config: RunConfig) -> dict[str, Any]:
    """eval.json (per env × harness × model, with level/domain breakdowns) and eval.png in the run folder."""
    from core.eval_report import build_report, report_rows, write_plot

    ks = [int(k) for k in summary.pass_at_k] or [1]
    report = build_report(report_rows(store, run_id), ks, model=config.policy.backend)
    report["run_id"] = run_id
    summary.report = report
    out = {"eval_json": str(run_dir / "eval.json")}
    (run_dir / "eval.json").write_text(json.dumps(report, indent=2))
    try:
        out["eval_plot"] = str(write_plot(report, run_dir / "eval.png"))
    except Exception:  # noqa: BLE001 - a missing plot must not fail the run
        log.warning("could not draw the eval plot", exc_info=True)
    return out


def summarize(store: Store, run_id: str, store_path: Path, ks: list[int] | None = None) -> RunSummary:
    """Counts, mean reward, pass@k and pass^k from the store (infra errors excluded from the metrics)."""
    store.flush()
    rows = store.handle_query(f"SELECT task_id, status, reward, passed FROM rollouts WHERE run_id = '{run_id}'")["rows"]
    per_task: dict[str, list[bool]] = {}
    rewards: list[float] = []
    counts = {s: 0 for s in ("passed", "failed", "timeouts", "infra_errors")}
    for task_id, status, reward, passed in rows:
        if status == Status.INFRA_ERROR:
            counts["infra_errors"] += 1
            continue
        if status not in {str(s) for s in TERMINAL}:
            continue
        if status == Status.TIMEOUT:
            counts["timeouts"] += 1
        elif passed:
            counts["passed"] += 1
        else:
            counts["failed"] += 1
        rewards.append(float(reward or 0.0))
        per_task.setdefault(task_id, []).append(bool(passed))
    max_n = max((len(v) for v in per_task.values()), default=0)
    metrics = pass_metrics(per_task, rewards, ks or range(1, max_n + 1))
    return RunSummary(
        run_id=run_id,
        rollouts=len(rows),
        mean_reward=metrics["mean_score"],
        pass_at_k=metrics["pass_at_k"],
        pass_hat_k=metrics["pass_hat_k"],
        store=str(store_path),
        **counts,
    )


__all__ = ["RunSummary", "execute_run", "load_run_config", "summarize"]
