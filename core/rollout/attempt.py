"""One attempt at one rollout: sandbox up, workspace in, harness run against the proxy, verifier, sandbox down."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from core.env import Environment, Task
from core.errors import SandboxError
from core.harness import Endpoint, Harness
from core.proxy.sessions import Session, SessionRegistry
from core.rollout import trajectory_formats
from core.rollout.transitions import can_move
from core.runtime.base import Entry, Runtime, SandboxFile, SandboxSpec, as_bytes
from core.status import Status
from core.store.writer import utcnow

if TYPE_CHECKING:
    from core.session.setup import SandboxImage

log = logging.getLogger(__name__)

SETUP_TIMEOUT_S = 300.0
VERIFY_TIMEOUT_S = 600.0
DEFAULT_TIMEOUT_S = 600.0  # a task that sets no timeout, with no run.timeout_s
# the recorded conversation, written before the verifier runs (and, beside it, in harbor's ATIF and as
# Claude Code and OpenClaw sessions: trajectory_formats.trajectory_files)
TRAJECTORY_PATH = trajectory_formats.TRAJECTORY_PATH


def rollout_timeout(task_timeout_s: float | None, run_timeout_s: float | None, scale: float = 1.0) -> float:
    """The harness's wall clock: the task's own timeout × `scale`, capped by `run_timeout_s`.

    A task that sets none gets `run_timeout_s` (600 s when that is unset too).
    """
    own = task_timeout_s * scale if task_timeout_s else (run_timeout_s or DEFAULT_TIMEOUT_S)
    return min(own, run_timeout_s) if run_timeout_s else own


class Stopwatch:
    """Named laps in seconds (what rollouts.meta.timings holds)."""

    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = round(now - self._last, 4)
        self._last = now


class InfraError(Exception):
    """An infrastructure failure (image, sandbox start, exec, lost sandbox): retried, then excluded from scores."""


@dataclass
class RolloutItem:
    rollout_id: str
    task: Task
    sample_index: int
    step: int = 0  # the training step whose batch it belongs to
    first_attempt: int = 0  # > 0 when resuming a rollout an earlier process had started (its calls keep their attempt)


@dataclass
class RolloutResult:
    status: Status
    reward: float | None = None
    passed: bool | None = None
    error: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunContext:
    """What every rollout of a run shares."""

    run_id: str
    env: Environment
    harness: Harness
    runtime: Runtime
    image_for: Callable[[Task], Awaitable[SandboxImage]]  # the image a task's sandbox runs (built once per recipe)
    proxy_url: str  # the proxy as sandboxes see it
    sessions: SessionRegistry
    update: Callable[[dict[str, Any]], None]  # writes a (partial) rollouts row
    model_name: str = "policy"
    workdir: str = "/workspace"
    timeout_s: float | None = None  # run.timeout_s: caps every rollout (see rollout_timeout)
    timeout_scale: float = 1.0
    sandbox: dict[str, Any] = field(default_factory=dict)  # cpus, memory, pids_limit, network
    # the rollout attempt's recorded conversation as OpenAI chat messages (None: nothing recorded)
    trajectory: Callable[[str, int], Awaitable[list[dict[str, Any]] | None]] | None = None
    logs_dir: Path | None = None
    removals: set[asyncio.Future] = field(default_factory=set)  # sandbox removals still in flight
    sandbox_scope: str | None = None  # the run label its sandboxes carry (default run_id; a veRL worker has its own)


class Attempt:
    """Drives one attempt through the status machine, recording each step."""

    def __init__(self, ctx: RunContext, item: RolloutItem, attempt_no: int) -> None:
        self.ctx = ctx
        self.item = item
        self.attempt_no = attempt_no
        self.status = Status.PENDING

    def _move(self, new: Status, **fields: Any) -> None:
        if not can_move(self.status, new):
            raise RuntimeError(f"rollout {self.item.rollout_id}: illegal status change {self.status} → {new}")
        self.status = new
        self.ctx.update({"rollout_id": self.item.rollout_id, "status": str(new), **fields})

    async def run(self) -> RolloutResult:
        ctx, task = self.ctx, self.item.task
        item = self.item
        draw_key = (task.id, str(item.step), str(item.sample_index), str(self.attempt_no))  # no two rollouts of a run draw alike
        session = ctx.sessions.register(item.rollout_id, attempt=self.attempt_no, draw_key=draw_key)
        timeout = rollout_timeout(task.timeout_s, ctx.timeout_s, ctx.timeout_scale)
        clock = Stopwatch()
        self._move(Status.STARTING, attempt=self.attempt_no, token=session.token, error=None)
        try:
            image = await ctx.image_for(task)
        except SandboxError as exc:
            ctx.sessions.unregister(session.token)
            raise InfraError(str(exc)) from exc
        clock.lap("build_s")  # building (or finding) the image is its own phase, before the rollout starts
        # the image this rollout really runs in (a task's own image, not the run's shared one)
        ctx.update({"rollout_id": self.item.rollout_id, "started_at": utcnow(), "image_digest": image.identity})
        spec = SandboxSpec(
            image=image.tag,
            run_id=ctx.sandbox_scope or ctx.run_id,
            rollout_id=self.item.rollout_id,
            workdir=task.workdir or ctx.workdir,
            timeout_s=timeout + SETUP_TIMEOUT_S + VERIFY_TIMEOUT_S,
            env=dict(image.env),
            volumes=dict(image.volumes),
            **ctx.sandbox,
        )
        sandbox = ctx.runtime.create(spec)
        try:
            return await self._run_in(sandbox, session, timeout, clock, image)
        except SandboxError as exc:
            raise InfraError(str(exc)) from exc
        finally:
            ctx.sessions.unregister(session.token)
            if session.tools_hash:
                ctx.update({"rollout_id": self.item.rollout_id, "tool_schema_hash": session.tools_hash})
            await self._save_logs(sandbox)
            # removal runs off the critical path: the rollout's slot goes to the next one at once;
            # the engine awaits every removal before the run ends (also on Ctrl-C)
            removal = asyncio.ensure_future(self._remove(sandbox))
            ctx.removals.add(removal)
            removal.add_done_callback(ctx.removals.discard)

    async def _remove(self, sandbox: Any) -> None:
        try:
            await sandbox.stop()
        except Exception:  # noqa: BLE001 - the reaper removes what stop could not
            log.warning("could not stop sandbox of %s; the reaper will remove it", self.item.rollout_id, exc_info=True)

    async def _run_in(self, sandbox: Any, session: Session, timeout: float, clock: Stopwatch, image: SandboxImage) -> RolloutResult:
        ctx, task = self.ctx, self.item.task
        workdir = task.workdir or ctx.workdir
        endpoint = Endpoint(base_url=f"{ctx.proxy_url}/r/{session.token}", token=session.token, model=ctx.model_name)
        launch = ctx.harness.launch(task, endpoint, workdir)
        files = [SandboxFile(str(PurePosixPath(workdir) / rel), as_bytes(data)) for rel, data in task.files.items()]
        files += [SandboxFile(path, as_bytes(data), 0o755) for path, data in launch.files.items()]
        harness_workdir = launch.workdir or workdir
        # Without a setup step the harness starts with the sandbox (Docker runs it as the container's
        # own process: no exec). A setup step must finish first, so then the harness is an exec.
        entry = None if task.setup else Entry(launch.command, timeout, dict(launch.env), harness_workdir)
        await sandbox.start(files=files, entry=entry)
        clock.lap("sandbox_start_s")
        if task.setup:
            setup = await sandbox.exec(task.setup, timeout_s=SETUP_TIMEOUT_S, workdir=workdir)
            if not setup.ok:
                raise InfraError(f"task setup failed (exit {setup.exit_code}): {(setup.stderr or setup.stdout)[-500:]}")
            clock.lap("setup_s")
        self._move(Status.RUNNING)
        if entry is not None:
            result = await sandbox.wait_entry()
        else:
            result = await sandbox.exec(launch.command, timeout_s=timeout, env=launch.env, workdir=harness_workdir)
        clock.lap("harness_s")
        meta: dict[str, Any] = {
            "task_meta": task.meta,
            "exit_code": result.exit_code,
            "stdout_tail": result.stdout[-4000:],
            "stderr_tail": result.stderr[-4000:],
            "timings": clock.laps,
            "timeout_s": timeout,
        }
        if image.harness_volume:
            meta["harness_volume"] = image.harness_volume
        if session.refused:
            meta["calls_refused"] = session.refused  # calls past run.max_calls: the harness ended on its cap
        if result.timed_out:
            self._backend_failed(session)
            self._move(Status.TIMEOUT, ended_at=utcnow(), reward=0.0, passed=False, error=f"rollout exceeded its {timeout:g} s wall clock", meta=meta)
            return RolloutResult(Status.TIMEOUT, 0.0, False, f"timeout after {timeout:g} s", meta)
        if result.exit_code != 0:
            await self._require_alive(sandbox, result.exit_code)
        outcome = ctx.harness.outcome(result)
        self._move(Status.VERIFYING)
        meta["trajectory_messages"] = await self._write_trajectory(sandbox, harness_workdir)
        try:
            score = await asyncio.wait_for(ctx.env.verify(sandbox, task, workdir), VERIFY_TIMEOUT_S)
        except TimeoutError:
            raise InfraError(f"the verifier did not finish within {VERIFY_TIMEOUT_S:g} s") from None
        clock.lap("verify_s")
        meta["verifier"] = score.detail[-4000:]
        if score.checks:  # what plan completion is computed from (the rollout_behaviour view)
            meta["checks"] = score.checks
        if not score.passed:
            self._backend_failed(session)
        status = Status.DONE if outcome.ok else Status.FAILED
        error = None if outcome.ok else f"harness failed (exit {result.exit_code}): {outcome.detail[-500:]}"
        self._move(status, ended_at=utcnow(), reward=score.score, passed=score.passed, error=error, meta=meta)
        return RolloutResult(status, score.score, score.passed, error, meta)

    @staticmethod
    def _backend_failed(session: Session) -> None:
        """Raise InfraError when the model backend failed any of this rollout's calls: a rollout that did not pass after
        that says nothing about the policy (a dead or crashing server would otherwise score every rollout 0); it is
        retried, and after its retries it is an infra error, outside every pass rate and every training batch."""
        if session.backend_failures:
            raise InfraError(f"the model backend failed {session.backend_failures} of this rollout's calls "
                             f"(last: {session.last_backend_failure[-300:]}); not scored as the policy's failure")

    async def _write_trajectory(self, sandbox: Any, cwd: str) -> int:
        """Put the recorded conversation in the sandbox for graders (`trajectory_formats.trajectory_files`); how many messages."""
        if self.ctx.trajectory is None or not self.ctx.env.graders_read_trajectory:
            return 0  # (a query and a copy into the sandbox: only for suites whose graders read the transcript)
        messages = await self.ctx.trajectory(self.item.rollout_id, self.attempt_no) or []
        meta = trajectory_formats.TrajectoryMeta(
            rollout_id=self.item.rollout_id, attempt=self.attempt_no, agent_name=self.ctx.harness.name,
            agent_version=str(self.ctx.harness.version), model_name=self.ctx.model_name, cwd=cwd,
            written_at=trajectory_formats.now_iso(),
        )  # fmt: skip
        try:
            files = trajectory_formats.trajectory_files(messages, meta)
        except Exception:  # noqa: BLE001 - a converter's bug must not cost the rollout its score: the JSONL still goes in
            log.warning("rollout %s: could not convert its trajectory", self.item.rollout_id, exc_info=True)
            files = {TRAJECTORY_PATH: trajectory_formats.chat_jsonl(messages)}
        for path, data in files.items():
            await sandbox.put_file(path, data, 0o644)
        return len(messages)

    async def _require_alive(self, sandbox: Any, exit_code: int) -> None:
        """A harness that died with its sandbox (killed, OOM, evicted) is an infrastructure error, not an agent failure."""
        probe = await sandbox.exec(["true"], timeout_s=30)  # raises SandboxError when the sandbox is gone
        if not probe.ok:
            raise InfraError(f"the sandbox stopped answering after the harness exited with {exit_code}")

    async def _save_logs(self, sandbox: Any) -> None:
        if self.ctx.logs_dir is None:
            return
        try:
            text = await asyncio.wait_for(sandbox.logs(), 30)
        except Exception:  # noqa: BLE001 - a gone sandbox has no logs; that is already an error elsewhere
            return
        step = f".s{self.item.step}" if self.item.step else ""
        path = self.ctx.logs_dir / f"{self.item.task.id}.{self.item.sample_index}{step}.attempt{self.attempt_no}.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
