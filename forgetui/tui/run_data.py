"""Headless data for the Runs, Run and Rollout screens: a run's store (or its veRL shards) read as one."""

from __future__ import annotations

import datetime as dt
import logging
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from core import paths
from core.errors import StoreError
from core.eval.report import build_report
from core.registry import model_shown_for
from core.rollout.status import TERMINAL_VALUES
from core.store.bodies import REQUEST_COLUMNS_SQL, fill_requests
from core.store.query import (
    SHARDS_DIR,
    QueryCancel,
    QueryResult,
    last_written,
    read_sidecar,
    run_query,
    run_query_shards,
)
from core.store.tokens import id_list
from forgetui.tui.data import parse_json, sql_str

log = logging.getLogger(__name__)

SCORED = "('done', 'failed', 'timeout')"
TERMINAL_SQL = "(" + ", ".join(sql_str(s) for s in sorted(TERMINAL_VALUES)) + ")"
DEFAULT_KS = (1, 2, 4, 8)


# ---------------------------------------------------------------------- where a run's rows are
@dataclass(frozen=True)
class RunSource:
    """A run's store and its veRL agent-loop workers' shards (`runs/<id>/shards/*/store.duckdb`), queried as one."""

    run_dir: Path
    store_file: Path | None = None  # a standalone proxy store (stores/NAME.duckdb) instead of runs/<id>/store.duckdb

    @property
    def run_id(self) -> str:
        return self.store_file.stem if self.store_file is not None else self.run_dir.name

    @property
    def store(self) -> Path:
        return self.store_file if self.store_file is not None else self.run_dir / "store.duckdb"

    def shards(self) -> list[Path]:
        if self.store_file is not None:
            return []
        return sorted((self.run_dir / SHARDS_DIR).glob("*/store.duckdb"))

    def files(self) -> list[Path]:
        return ([self.store] if self.store.exists() else []) + self.shards()

    def stamp(self) -> float:
        return max((last_written(p) for p in self.files()), default=0.0)

    def live(self) -> bool:
        return any(read_sidecar(p) is not None for p in self.files())

    def query(self, sql: str, max_rows: int = 100_000, cancel: QueryCancel | None = None) -> QueryResult:
        """Read-only SQL on the run: its one store (live endpoint or file), or every shard as one view."""
        shards = self.shards()
        if not shards:
            return run_query(self.store, sql, max_rows=max_rows, cancel=cancel)
        return run_query_shards(self.files(), sql, max_rows=max_rows, cancel=cancel)


def store_source(path: Path) -> RunSource:
    """What a store file is part of: a run (runs/<id>/store.duckdb, or a shard of one: read with its siblings),
    or a standalone proxy store."""
    path = Path(path)
    if path.name == "store.duckdb" and path.parent.parent.name == SHARDS_DIR:
        return RunSource(path.parent.parent.parent)
    if path.name == "store.duckdb" and path.parent.parent.name == "runs":
        return RunSource(path.parent)
    return RunSource(path.parent, store_file=path)


def query_store(path: Path, sql: str, max_rows: int = 100_000, cancel: QueryCancel | None = None) -> QueryResult:
    """SQL on a store file; a run's store reads together with its shards."""
    return store_source(path).query(sql, max_rows, cancel)


def rows_of(result: QueryResult) -> list[dict[str, Any]]:
    return [dict(zip(result.columns, r, strict=False)) for r in result.rows]


def fmt(value: float | None, spec: str = ".3f") -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


# ---------------------------------------------------------------------- the Runs screen
@dataclass(frozen=True)
class RunInfo:
    """One line of the Runs screen."""

    run_id: str
    kind: str  # "run" or "proxy"
    path: Path  # the run folder, or a proxy store file
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
    train_step: int | None = None
    train_steps: int = 0
    live: bool = False
    shards: int = 0
    error: str | None = None

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
            "run": self.run_id, "status": self.shown_status, "env": self.env, "harness": self.harness,
            "model": self.model, "progress": f"{self.done}/{self.total}" if self.total else "",
            "pass rate": fmt(self.pass_rate), "reward": fmt(self.mean_reward), "step": step,
            "created": self.created_at,
        }


RUN_COLUMNS = ("run", "status", "env", "harness", "model", "progress", "pass rate", "reward", "step", "created")

RUNS_SQL = f"""
WITH agg AS (
    SELECT run_id, count(*) AS total,
           count(*) FILTER (WHERE status IN {TERMINAL_SQL}) AS done,
           count(*) FILTER (WHERE status IN ('done', 'failed') AND passed) AS passed,
           count(*) FILTER (WHERE status IN {SCORED}) AS scored,
           avg(coalesce(reward, 0)) FILTER (WHERE status IN {SCORED}) AS mean_reward,
           any_value(env) AS env, any_value(harness) AS harness
    FROM rollouts GROUP BY run_id
), steps AS (SELECT run_id, max(step) AS step FROM train_steps GROUP BY run_id)
SELECT r.run_id, r.status, r.created_at, r.config, a.total, a.done, a.passed, a.scored, a.mean_reward,
       a.env, a.harness, s.step
FROM runs r LEFT JOIN agg a USING (run_id) LEFT JOIN steps s USING (run_id)
ORDER BY r.created_at DESC
"""


def _time(value: Any) -> str:
    if isinstance(value, dt.datetime):
        return value.strftime("%Y-%m-%d %H:%M")
    return ("" if value is None else str(value)).replace("T", " ")[:16]


def _from_row(row: dict[str, Any], kind: str, path: Path, live: bool, shards: int) -> RunInfo:
    config = parse_json(row.get("config")) or {}
    config = config if isinstance(config, dict) else {}
    env, harness, policy, train = (config.get(k) or {} for k in ("env", "harness", "policy", "train"))
    harness_name = str(row.get("harness") or harness.get("name") or "")
    return RunInfo(
        run_id=str(row["run_id"]), kind=kind, path=path, status=str(row.get("status") or ""),
        created_at=_time(row.get("created_at")), env=str(row.get("env") or env.get("name") or ""),
        harness=harness_name, model=model_shown_for(str(policy.get("backend") or ""), harness_name),
        total=int(row.get("total") or 0), done=int(row.get("done") or 0), passed=int(row.get("passed") or 0),
        scored=int(row.get("scored") or 0),
        mean_reward=None if row.get("mean_reward") is None else float(row["mean_reward"]),
        train_step=row.get("step"), train_steps=int(train.get("steps") or 0), live=live, shards=shards,
    )


def summarize_run_dir(run_dir: Path) -> list[RunInfo]:
    """The runs a run folder's store (and shards) hold; one RunInfo with `error` when it cannot be read."""
    source = RunSource(run_dir)
    shards = len(source.shards())
    live = source.live()
    try:
        rows = rows_of(source.query(RUNS_SQL))
    except StoreError as exc:
        return [RunInfo(run_id=run_dir.name, kind="run", path=run_dir, live=live, shards=shards, error=str(exc))]
    # a store holds its own run; shards each repeat it: one line per run id
    infos: dict[str, RunInfo] = {}
    for row in rows:
        info = _from_row(row, "run", run_dir, live, shards)
        infos.setdefault(info.run_id, info)
    return list(infos.values()) or [RunInfo(run_id=run_dir.name, kind="run", path=run_dir, live=live, shards=shards,
                                            status="starting")]


def summarize_proxy_store(path: Path) -> list[RunInfo]:
    try:
        rows = rows_of(run_query(path, RUNS_SQL))
    except StoreError as exc:
        return [RunInfo(run_id=path.stem, kind="proxy", path=path, error=str(exc))]
    live = read_sidecar(path) is not None
    return [_from_row(r, "proxy", path, live, 0) for r in rows]


class RunCatalog:
    """Every run under FORGETUI_HOME (and proxy sessions apart); a folder is re-read only when it changed or is live."""

    def __init__(self, home: Path | None = None) -> None:
        self.home = home
        self._cache: dict[Path, tuple[float, list[RunInfo]]] = {}

    def home_path(self) -> Path:
        return Path(self.home) if self.home is not None else paths.home()

    def _places(self) -> list[tuple[Path, float, str]]:
        home = self.home_path()
        places = []
        for run_dir in (home / "runs").glob("*"):
            source = RunSource(run_dir)
            if source.files():
                places.append((run_dir, source.stamp(), "run"))
        places += [(p, last_written(p), "proxy") for p in (home / "stores").glob("*.duckdb")]
        return places

    def list(self) -> list[RunInfo]:
        out: list[RunInfo] = []
        seen = set()
        for place, stamp, kind in sorted(self._places(), key=lambda t: t[1], reverse=True):
            seen.add(place)
            cached = self._cache.get(place)
            if cached is not None and cached[0] == stamp and not any(i.live or i.error for i in cached[1]):
                out += cached[1]
                continue
            infos = summarize_run_dir(place) if kind == "run" else summarize_proxy_store(place)
            self._cache[place] = (stamp, infos)
            out += infos
        for gone in set(self._cache) - seen:
            del self._cache[gone]
        return out


def filter_runs(runs: list[RunInfo], text: str) -> list[RunInfo]:
    """Runs any of whose cells contains every word of `text` (case-insensitive)."""
    words = text.lower().split()
    if not words:
        return list(runs)
    return [r for r in runs if all(any(w in v.lower() for v in r.cells().values()) for w in words)]


SORT_KEYS = ("created", "run", "status", "pass rate", "reward", "progress")


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


# ---------------------------------------------------------------------- the Run screen
@dataclass(frozen=True)
class RolloutLine:
    """One row of the Run screen's rollouts table."""

    rollout_id: str
    task_id: str
    sample_index: int | None
    step: int | None
    status: str
    reward: float | None
    passed: bool | None
    n_calls: int
    tokens: int
    duration_s: float | None
    error: str | None

    def cells(self) -> dict[str, str]:
        err = (self.error or "").replace("\n", " ")
        return {
            "status": self.status, "task": self.task_id, "sample": "" if self.sample_index is None else str(self.sample_index),
            "step": "" if self.step is None else str(self.step), "reward": fmt(self.reward, ".3g"),
            "calls": str(self.n_calls), "tokens": str(self.tokens),
            "duration": "" if self.duration_s is None else f"{self.duration_s:.1f}s",
            "error": err if len(err) <= 120 else err[:119] + "…",
        }


ROLLOUT_LINE_COLUMNS = ("status", "task", "sample", "step", "reward", "calls", "tokens", "duration", "error")


@dataclass
class RunDetail:
    """A run as the Run screen shows it: config, counts, pass@k/pass^k report, training steps, rollouts."""

    run_id: str
    status: str
    config: dict[str, Any]
    report: dict[str, Any]
    train_steps: list[dict[str, Any]]
    rollouts: list[RolloutLine]
    errors: list[str] = field(default_factory=list)
    n_calls: int = 0
    busy: int = 0  # rollouts in a sandbox now (starting, running, verifying)


ROLLOUT_LINES_SQL = """
SELECT o.rollout_id, o.task_id, o.sample_index, o.step, o.status, o.reward, o.passed, o.error, o.env, o.harness,
       o.meta, epoch(o.ended_at) - epoch(o.started_at) AS duration_s,
       coalesce(c.n, 0) AS n_calls, coalesce(c.tokens, 0) AS tokens
FROM rollouts o LEFT JOIN (
    SELECT rollout_id, count(*) AS n, sum(coalesce(len(completion_token_ids), 0)) AS tokens FROM calls GROUP BY rollout_id
) c USING (rollout_id)
WHERE o.run_id = {run}
ORDER BY o.step NULLS FIRST, o.task_id, o.sample_index, o.rollout_id
"""


def train_step_rows(result: QueryResult) -> list[dict[str, Any]]:
    """train_steps rows, one per step (the last written wins), their metrics JSON merged in."""
    by_step: dict[int, dict[str, Any]] = {}
    for row in rows_of(result):
        metrics = parse_json(row.pop("metrics", None))
        merged = {**(metrics if isinstance(metrics, dict) else {}), **{k: v for k, v in row.items() if v is not None}}
        by_step[int(row["step"])] = merged
    return [by_step[s] for s in sorted(by_step)]


def load_run(source: RunSource, run_id: str | None = None, ks: tuple[int, ...] = DEFAULT_KS) -> RunDetail:
    """Everything the Run screen shows, in three queries."""
    run_id = run_id or source.run_id
    run = sql_str(run_id)
    runs = rows_of(source.query(f"SELECT status, config FROM runs WHERE run_id = {run} LIMIT 1"))
    if not runs:
        raise StoreError(f"run {run_id} is not in {source.run_dir}")
    config = parse_json(runs[0]["config"]) or {}
    lines = rows_of(source.query(ROLLOUT_LINES_SQL.format(run=run), max_rows=1_000_000))
    steps = train_step_rows(source.query(
        f"SELECT step, loss, reward_mean, metrics FROM train_steps WHERE run_id = {run} ORDER BY step, created_at"))
    n_calls = source.query(f"SELECT count(*) FROM calls WHERE rollout_id IN (SELECT rollout_id FROM rollouts WHERE run_id = {run})")
    for row in lines:
        row["meta"] = parse_json(row.get("meta"))
    model = str((config.get("policy") or {}).get("backend") or "") if isinstance(config, dict) else ""
    report = build_report(lines, list(ks), model)
    rollouts = [
        RolloutLine(rollout_id=str(r["rollout_id"]), task_id=str(r["task_id"] or ""), sample_index=r["sample_index"],
                    step=r["step"], status=str(r["status"] or ""),
                    reward=None if r["reward"] is None else float(r["reward"]), passed=r["passed"],
                    n_calls=int(r["n_calls"]), tokens=int(r["tokens"]),
                    duration_s=None if r["duration_s"] is None else float(r["duration_s"]), error=r["error"])
        for r in lines
    ]
    errors = [f"{r.task_id}/{r.sample_index}: {r.error}" for r in rollouts if r.error][-5:]
    busy = sum(1 for r in rollouts if r.status in ("starting", "running", "verifying"))
    return RunDetail(run_id=run_id, status=str(runs[0]["status"] or ""), config=config if isinstance(config, dict) else {},
                     report=report, train_steps=steps, rollouts=rollouts, errors=errors,
                     n_calls=int(n_calls.rows[0][0] or 0), busy=busy)


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


# ---------------------------------------------------------------------- the Rollout screen
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


def tokenizer_for(config: dict[str, Any]) -> Any | None:
    """The policy's tokenizer when it is a local or built-in model (never a hub download); None otherwise."""
    from core.models.resolve import BUILTIN_MODELS, load_tokenizer, resolve_model
    from core.train.sft import teacher_tokenizer_name

    name = teacher_tokenizer_name(config)
    if not name:
        return None
    if name not in BUILTIN_MODELS and not Path(name).expanduser().is_dir():
        return None
    try:
        folder = Path(resolve_model(name))
        if (folder / "tokenizer.json").exists():
            # the Rust tokenizer alone: importing transformers' tokenizer classes holds the GIL ~150 ms,
            # a visible freeze of the screen the first time a rollout opens; decoding needs nothing more
            from tokenizers import Tokenizer

            return Tokenizer.from_file(str(folder / "tokenizer.json"))
        return load_tokenizer(folder)
    except Exception:  # noqa: BLE001 - no tokenizer means ids without text, not a broken screen
        log.info("no tokenizer for %s: token ids are shown undecoded", name, exc_info=True)
        return None


def decode_pieces(tokenizer: Any, ids: list[int]) -> list[str]:
    """Each token's own text (special tokens kept, so a template's markers show)."""
    return [tokenizer.decode([i], skip_special_tokens=False) for i in ids]


def rollout_log(run_dir: Path, rollout: dict[str, Any]) -> str | None:
    """The sandbox's saved log of the rollout's last attempt (runs/<id>/logs/<task>.<sample>[.sN].attemptN.log)."""
    step = f".s{rollout['step']}" if rollout.get("step") else ""
    stem = f"{rollout.get('task_id')}.{rollout.get('sample_index')}{step}.attempt"
    def attempt_no(path: Path) -> int:  # numerically: attempt10 comes after attempt2
        digits = path.name[len(stem) : -len(".log")]
        return int(digits) if digits.isdigit() else -1

    found = sorted((run_dir / "logs").glob(f"{stem}*.log"), key=attempt_no)
    if not found:
        return None
    try:
        return found[-1].read_text(errors="replace")[-20_000:]
    except OSError:
        return None


def final_attempt_calls(rollout: dict[str, Any]) -> str:
    """The WHERE clause of a rollout's final attempt's calls: the attempt its row's verdict is about (an
    earlier attempt's calls are another conversation)."""
    attempt = rollout.get("attempt")
    return f"rollout_id = {sql_str(str(rollout['rollout_id']))}" + (
        f" AND coalesce(attempt, {int(attempt)}) = {int(attempt)}" if attempt is not None else "")


def built_samples(source: RunSource, rollout: dict[str, Any]) -> tuple[list[SampleView], str | None]:
    """Samples of a rollout built from its final attempt's calls (core.train.samples); why not, when it cannot."""
    from core.errors import ForgetuiError
    from core.train.samples import CALL_COLS, build_samples

    calls = rows_of(source.query(f"SELECT {', '.join(CALL_COLS)} FROM calls WHERE {final_attempt_calls(rollout)} ORDER BY seq, started_at"))
    try:
        built = build_samples(rollout, calls)
    except ForgetuiError as exc:
        return [], f"no token view: {exc}"
    return [SampleView(sample_id=s.sample_id, branch=s.branch, token_ids=s.token_ids, loss_mask=s.loss_mask,
                       logprobs=s.logprobs, call_ids=s.call_ids, completion_starts=s.completion_starts,
                       completion_ends=s.completion_ends, reward=s.reward, advantage=None) for s in built], None


def load_rollout(source: RunSource, rollout_id: str, *, decode: bool = True, tokenizer: Any | None = None) -> RolloutDetail:
    """A rollout in full: its row, its final attempt's calls in order, its samples (decoded when possible)."""
    rid = sql_str(rollout_id)
    rows = rows_of(source.query(f"SELECT * FROM rollouts WHERE rollout_id = {rid}"))
    if not rows:
        raise StoreError(f"rollout {rollout_id} is not in {source.run_dir}")
    rollout = rows[0]
    rollout["meta"] = parse_json(rollout.get("meta"))
    calls = rows_of(source.query(
        f"SELECT call_id, seq, attempt, api, model, status, error, finish_reason, {REQUEST_COLUMNS_SQL}, response, branch, "
        "extends_parent, prefix_tokens, latency_ms, completion_token_ids, completion_logprobs, tool_parse_error "
        f"FROM calls WHERE {final_attempt_calls(rollout)} ORDER BY seq, started_at"))
    for call in calls:  # token text (schema 6 on) or a list
        call["completion_token_ids"] = id_list(call.get("completion_token_ids"))
    # bodies stored as deltas are rebuilt here (core.store.bodies); a base in another rollout is asked for
    fill_requests(calls, lambda ids: rows_of(source.query(
        f"SELECT call_id, {REQUEST_COLUMNS_SQL} FROM calls WHERE call_id IN ({', '.join(map(sql_str, ids))})")))
    # request/response stay JSON text: a 200-call rollout resends its history each call, and parsed that is
    # ~100,000 long-lived dicts for Python's GC to walk on every full collection (visible stalls). Parse on use.
    samples = [
        SampleView(sample_id=str(s["sample_id"]), branch=int(s["branch"] or 0), token_ids=list(s["token_ids"] or []),
                   loss_mask=[int(m) for m in s["loss_mask"] or []],
                   logprobs=[float(x) if x is not None else math.nan for x in s["logprobs"] or []],
                   call_ids=list(s["call_ids"] or []), completion_starts=list(s["completion_starts"] or []),
                   completion_ends=list(s["completion_ends"] or []), reward=s["reward"], advantage=s["advantage"])
        for s in rows_of(source.query(f"SELECT * FROM samples WHERE rollout_id = {rid} ORDER BY branch"))
    ]
    note = None
    if not samples:  # an eval run stores no samples: build them from the calls as the trainer would
        samples, note = built_samples(source, rollout)
    if decode and samples:
        if tokenizer is None:
            config = rows_of(source.query(f"SELECT config FROM runs WHERE run_id = {sql_str(str(rollout['run_id']))}"))
            tokenizer = tokenizer_for(parse_json(config[0]["config"]) or {}) if config else None
        if tokenizer is None:
            note = "no local tokenizer for this run's policy: token ids shown undecoded"
        else:
            samples = [replace(s, pieces=decode_pieces(tokenizer, s.token_ids)) for s in samples]
    return RolloutDetail(rollout=rollout, calls=calls, samples=samples,
                         log_text=rollout_log(source.run_dir, rollout), tokenizer_note=note)
