"""What the TUI's tables show, one dataclass per kind of row (a run, a rollout, a call), and how cells read.

Every row comes from `forgetui.tui.source`; the statuses and outcomes are core's (`core.status`), named
the same in every table, count and summary.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from core.status import TERMINAL_VALUES, Outcome, Status, outcome_of
from forgetui.tui.launcher import LaunchRecord


class RunLocation(Protocol):
    """Where a run's data lives (`forgetui.tui.source.RunSource` is one): rows need only this, so they do not
    import the source that builds them."""

    @property
    def run_dir(self) -> Path: ...

    @property
    def store_file(self) -> Path | None: ...

ERROR_CHARS = 160  # an error cell's length in a table (the whole text is on the rollout's screen)


def text(value: Any) -> str:
    return "" if value is None else str(value)


def fmt(value: float | None, spec: str = ".3f") -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def cell_text(value: Any) -> str:
    """A result cell as text: timestamps ISO, lists and dicts as JSON."""
    if value is None:
        return ""
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat(sep=" ") if isinstance(value, dt.datetime) else value.isoformat()
    if isinstance(value, (list, dict, tuple)):
        return json.dumps(value, default=str, ensure_ascii=False)
    return str(value)


def one_line(value: str | None, n: int = ERROR_CHARS) -> str:
    """`value` on one line, cut to `n` characters with an ellipsis."""
    flat = (value or "").replace("\n", " ")
    return flat if len(flat) <= n else flat[: n - 1] + "…"


def rollout_label(rollout_id: str | None, n: int = 32) -> str:
    """A rollout id without the run id every row shares (`run/task/0/s1` → `task/0/s1`), cut from the left."""
    if not rollout_id:
        return ""
    head, sep, rest = rollout_id.partition("/")
    label = rest if sep and rest else rollout_id
    return label if len(label) <= n else "…" + label[-(n - 1):]


PASSED_HARNESS_FAILED = "passed (h.fail)"  # 15 cells: the outcome column's width


def shown_outcome(status: str, passed: bool | None) -> str:
    """What a rollout's outcome column says: core's outcome once it finished (passed, below_threshold,
    harness_failed, timeout, infra_error), its status before (pending, running, ...); a rollout whose harness
    failed but whose workspace the verifier passed counts as passed (as in pass@k) and says both."""
    outcome = outcome_of(status, passed)
    if outcome == Outcome.PASSED and status == Status.FAILED:
        return PASSED_HARNESS_FAILED
    return str(outcome) if outcome is not None else status


def outcome_sentence(status: str, passed: bool | None) -> str:
    """The outcome in words, for a rollout's own screen."""
    outcome = outcome_of(status, passed)
    if outcome == Outcome.PASSED and status == Status.FAILED:
        return "passed: the verifier passed the workspace, though the harness failed (exit non-zero)"
    return {Outcome.PASSED: "passed", Outcome.BELOW_THRESHOLD: "below threshold: the harness finished, the score is under the task's threshold",
            Outcome.HARNESS_FAILED: "harness failed, and the workspace did not pass",
            Outcome.TIMEOUT: "timeout: the rollout hit its wall clock (reward 0)",
            Outcome.INFRA_ERROR: "infra error: image, sandbox or exec failure (not a score)"}.get(outcome, status)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- the Runs list
@dataclass(frozen=True)
class RunInfo:
    """One line of the Runs list: a run of a run folder or of a proxy store, or a launch that made no run."""

    run_id: str
    kind: str  # "run", "proxy" or "launch" (a process started here that stopped before it created its run)
    source: RunLocation
    status: str = ""
    created_at: str = ""
    env: str = ""
    harness: str = ""
    model: str = ""
    total: int = 0
    done: int = 0
    passed: int = 0
    scored: int = 0
    mean_reward: float | None = None
    pass_k: tuple[int, float] | None = None  # (k, pass@k) at the largest k every scored task has samples for
    train_step: int | None = None
    train_steps: int = 0
    live: bool = False
    shards: int = 0
    reason: str | None = None  # why it failed (or could not be read), when known
    launch: LaunchRecord | None = None  # the launch from the TUI that made it, if one did

    @property
    def path(self) -> Path:
        """The run folder, or the proxy store file."""
        return self.source.store_file or self.source.run_dir

    @property
    def key(self) -> str:
        return f"{self.path}::{self.run_id}"

    @property
    def pass_rate(self) -> float | None:
        return self.passed / self.scored if self.scored else None

    @property
    def shown_status(self) -> str:
        """The stored status, or `stale` for a run marked running whose writer is gone (killed: resume it)."""
        if self.status == "running" and not self.live and self.kind == "run" and not self.shards:
            return "stale"
        return self.status

    def cells(self) -> dict[str, str]:
        # steps done of the configured: train_steps.step counts from 0, so a finished 3-step run reads 3/3
        step = "" if self.train_step is None else f"{self.train_step + 1}" + (f"/{self.train_steps}" if self.train_steps else "")
        return {
            "run": self.run_id + (" (proxy)" if self.kind == "proxy" else ""), "status": self.shown_status,
            "pass rate": fmt(self.pass_rate), "reward": fmt(self.mean_reward),
            "pass@k": "" if self.pass_k is None else f"{self.pass_k[1]:.3f} @{self.pass_k[0]}",
            "progress": f"{self.done}/{self.total}" if self.total else "", "step": step,
            "env": self.env, "harness": self.harness, "model": self.model, "created": self.created_at,
            "why": one_line(self.reason, 200),
        }


# scores first: at 80 columns the run, its status and its scores are what must show
RUN_COLUMNS = ("run", "status", "pass rate", "reward", "pass@k", "progress", "step", "env", "harness", "model",
               "created", "why")
SORT_KEYS = ("created", "run", "status", "pass rate", "reward", "progress")


def filter_rows(rows: list[Any], words_text: str) -> list[Any]:
    """Rows any of whose cells contains every word of `words_text` (case-insensitive); rows have `cells()`."""
    words = words_text.lower().split()
    if not words:
        return list(rows)
    return [r for r in rows if all(any(w in v.lower() for v in r.cells().values()) for w in words)]


def sort_runs(runs: list[RunInfo], key: str) -> list[RunInfo]:
    """Runs by `key` (one of SORT_KEYS); numbers highest first, text A→Z, created newest first."""
    if key == "pass rate":
        return sorted(runs, key=lambda r: -1 if r.pass_rate is None else r.pass_rate, reverse=True)
    if key == "reward":
        return sorted(runs, key=lambda r: -1 if r.mean_reward is None else r.mean_reward, reverse=True)
    if key == "progress":
        return sorted(runs, key=lambda r: r.done / r.total if r.total else -1, reverse=True)
    if key == "created":
        return sorted(runs, key=lambda r: r.created_at, reverse=True)
    return sorted(runs, key=lambda r: r.cells()[key])


# ---------------------------------------------------------------------- rollouts
@dataclass(frozen=True)
class RolloutRow:
    """One rollout as the tables show it (the Run screen's list, the Rollouts tab, the live run's list).

    `n_calls`, `tokens` and `duration_s` are None where they are not known (a rollout reported by the engine
    before its row was read back)."""

    rollout_id: str
    run_id: str = ""
    task_id: str = ""
    sample_index: int | None = None
    step: int | None = None
    status: str = ""
    reward: float | None = None
    passed: bool | None = None
    attempt: int | None = None
    n_calls: int | None = None
    tokens: int | None = None
    duration_s: float | None = None
    error: str | None = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_VALUES

    @property
    def outcome(self) -> str:
        return shown_outcome(self.status, self.passed)

    def cells(self) -> dict[str, str]:
        return {
            "outcome": self.outcome, "task": self.task_id, "sample": text(self.sample_index), "step": text(self.step),
            "reward": fmt(self.reward, ".3g"), "calls": text(self.n_calls), "tokens": text(self.tokens),
            "duration": "" if self.duration_s is None else f"{self.duration_s:.1f}s", "attempt": text(self.attempt),
            "error": one_line(self.error),
        }


ROLLOUT_COLUMNS = ("outcome", "task", "sample", "step", "reward", "calls", "tokens", "duration", "error")


def rollout_from_event(rollout_id: str, task_id: str, status: str, reward: float | None, passed: bool | None,
                       error: str | None) -> RolloutRow:
    """A row from an engine event; the run and sample come from the id (`run/task/sample`)."""
    run_id, _, rest = rollout_id.partition("/")
    head, _, sample = rest.rpartition("/")
    return RolloutRow(rollout_id=rollout_id, run_id=run_id, task_id=task_id or head,
                      sample_index=int(sample) if sample.isdigit() else None, status=str(status),
                      reward=reward, passed=passed, error=error)


# ---------------------------------------------------------------------- calls
@dataclass(frozen=True)
class CallRow:
    """One line of the calls table."""

    call_id: str
    seq: int | None
    rollout_id: str
    api: str
    model: str
    status: str
    prompt_tokens: int | None
    completion_tokens: int | None
    latency_ms: float | None
    branch: int | None
    extends_parent: bool | None

    def cells(self) -> dict[str, str]:
        return {
            "seq": text(self.seq), "rollout": rollout_label(self.rollout_id), "api": self.api, "model": self.model,
            "status": self.status, "prompt_token_ids": text(self.prompt_tokens),
            "completion_token_ids": text(self.completion_tokens),
            "latency_ms": "" if self.latency_ms is None else f"{self.latency_ms:.0f}", "branch": text(self.branch),
            "extends_parent": {True: "yes", False: "no"}.get(self.extends_parent, ""),  # type: ignore[arg-type]
        }


# the SQL console's column names (the two token columns count the ids)
CALL_COLUMNS = ("seq", "rollout", "api", "model", "status", "prompt_token_ids", "completion_token_ids", "latency_ms",
                "branch", "extends_parent")


@dataclass(frozen=True)
class CallDetail:
    """Everything the inspector shows about one call."""

    call_id: str
    rollout_id: str
    api: str
    model: str
    status: str
    error: str | None
    finish_reason: str | None
    request: Any
    response: Any
    prompt_token_ids: list[int] = field(default_factory=list)
    completion_token_ids: list[int] = field(default_factory=list)
    completion_logprobs: list[float] = field(default_factory=list)
    prefix_tokens: int | None = None
    branch: int | None = None
    extends_parent: bool | None = None
    latency_ms: float | None = None


# ---------------------------------------------------------------------- a run, a rollout
@dataclass
class RunDetail:
    """A run as the Run screen shows it: config, counts, pass@k/pass^k report, training steps, rollouts, and
    why it failed when it did."""

    run_id: str
    status: str
    config: dict[str, Any]
    report: dict[str, Any]
    train_steps: list[dict[str, Any]]
    rollouts: list[RolloutRow]
    errors: list[str] = field(default_factory=list)
    n_calls: int = 0
    busy: int = 0  # rollouts in a sandbox now (starting, running, verifying)
    reason: str | None = None


@dataclass
class SampleView:
    """One training sample: token ids, loss mask, logprobs, decoded pieces (when a tokenizer is at hand)."""

    sample_id: str
    branch: int
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    call_ids: list[str]
    completion_starts: list[int]
    completion_ends: list[int]
    reward: float | None = None
    advantage: float | None = None
    pieces: list[str] | None = None

    def call_at(self, index: int) -> int | None:
        """Which merged call (0-based) the token at `index` belongs to: its prompt part or completion."""
        for n, end in enumerate(self.completion_ends):
            if index < end:
                return n
        return None


@dataclass
class RolloutDetail:
    """A rollout with its calls (in order) and its samples."""

    rollout: dict[str, Any]
    calls: list[dict[str, Any]]
    samples: list[SampleView]
    log_text: str | None = None
    tokenizer_note: str | None = None


CURVES = (("reward_mean", "reward"), ("pass_rate", "pass rate"), ("loss", "loss"), ("kl", "KL"),
          ("logprob_diff_max", "logprob diff max"))


def curve(steps: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of one metric over the training steps that have it."""
    xs, ys = [], []
    for row in steps:
        value = row.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            xs.append(int(row["step"]))
            ys.append(float(value))
    return xs, ys
