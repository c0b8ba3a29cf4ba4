"""Headless data access for the TUI: store discovery, summaries, calls and SQL, all through core.store.query."""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from core import paths
from core.errors import StoreError
from core.rollout.status import TERMINAL_VALUES, Tally
from core.store.bodies import REQUEST_COLUMNS_SQL, fill_requests
from core.store.query import last_written, read_sidecar, run_query
from core.store.tokens import id_list

log = logging.getLogger(__name__)

EMPTY_HOME_HINT = ("No runs yet under {home}.\n\n"
                   "Start one: `forgetui run examples/demo.toml` (or `make demo`), or record a harness by hand "
                   "through `forgetui proxy`. Runs appear here as they write their stores.")
CALLS_LIMIT = 1000  # the store browser shows the last calls; a run's whole record is on its Run screen and in SQL
CALL_COLUMNS = (
    "seq", "rollout", "api", "model", "status", "prompt tok", "compl tok", "latency_ms", "branch", "extends",
)


@dataclass(frozen=True)
class RunRow:
    """One row of a store's `runs` table."""

    run_id: str
    status: str
    created_at: str


@dataclass(frozen=True)
class StoreInfo:
    """A store file under FORGETUI_HOME with its runs and row counts (or why it could not be read)."""

    path: Path
    kind: str  # "run" or "proxy"
    name: str
    modified: float
    live: bool
    runs: tuple[RunRow, ...] = ()
    n_rollouts: int = 0
    n_calls: int = 0
    error: str | None = None


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

    def cells(self) -> tuple[str, ...]:
        """Display values, in CALL_COLUMNS order."""
        return (
            _text(self.seq), rollout_label(self.rollout_id), _text(self.api), _text(self.model), _text(self.status),
            _text(self.prompt_tokens), _text(self.completion_tokens),
            "" if self.latency_ms is None else f"{self.latency_ms:.0f}",
            _text(self.branch), {True: "yes", False: "no"}.get(self.extends_parent, ""),  # type: ignore[arg-type]
        )


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


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def cell_text(value: Any) -> str:
    """A result cell as text: timestamps ISO, lists and dicts as JSON."""
    if value is None:
        return ""
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat(sep=" ") if isinstance(value, dt.datetime) else value.isoformat()
    if isinstance(value, (list, dict, tuple)):
        return json.dumps(value, default=str, ensure_ascii=False)
    return str(value)


def rollout_label(rollout_id: str | None, n: int = 32) -> str:
    """A rollout id without the run id every row shares (`run/task/0/s1` → `task/0/s1`), cut from the left."""
    if not rollout_id:
        return ""
    head, sep, rest = rollout_id.partition("/")
    label = rest if sep and rest else rollout_id
    return label if len(label) <= n else "…" + label[-(n - 1):]


def sql_str(value: str) -> str:
    """A SQL string literal (run_query takes no parameters)."""
    return "'" + value.replace("'", "''") + "'"


def parse_json(value: Any) -> Any:
    """JSON columns come back as text (file or live endpoint); parse them, keep anything unparsable as is."""
    if isinstance(value, (str, bytes)):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _fmt_time(value: Any) -> str:
    if isinstance(value, dt.datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    return _text(value).replace("T", " ")[:19]


def find_stores(home: Path | None = None) -> list[tuple[Path, str, str]]:
    """(path, kind, name) of every store under FORGETUI_HOME, newest first."""
    home = Path(home) if home is not None else paths.home()
    found = [(p, "run", p.parent.name) for p in home.glob("runs/*/store.duckdb")]
    found += [(p, "proxy", p.stem) for p in home.glob("stores/*.duckdb")]
    found.sort(key=lambda t: last_written(t[0]), reverse=True)
    return found


def summarize_store(path: Path, kind: str = "run", name: str | None = None) -> StoreInfo:
    """Runs and counts of one store; a store that cannot be read yields a StoreInfo with `error` set."""
    base = StoreInfo(path=path, kind=kind, name=name or path.stem, modified=last_written(path),
                     live=read_sidecar(path) is not None)
    try:
        runs = run_query(path, "SELECT run_id, status, created_at FROM runs ORDER BY created_at DESC")
        counts = run_query(path, "SELECT (SELECT count(*) FROM rollouts), (SELECT count(*) FROM calls)")
    except StoreError as exc:
        return replace(base, error=str(exc))
    n_rollouts, n_calls = counts.rows[0] if counts.rows else (0, 0)
    rows = tuple(RunRow(_text(r[0]), _text(r[1]), _fmt_time(r[2])) for r in runs.rows)
    return replace(base, runs=rows, n_rollouts=int(n_rollouts or 0), n_calls=int(n_calls or 0))


class StoreCatalog:
    """Lists stores, re-reading a store's summary only when its file changed or it is live."""

    def __init__(self, home: Path | None = None) -> None:
        self.home = home
        self._cache: dict[Path, tuple[float, StoreInfo]] = {}

    def home_path(self) -> Path:
        return Path(self.home) if self.home is not None else paths.home()

    def list(self) -> list[StoreInfo]:
        out = []
        seen = set()
        for path, kind, name in find_stores(self.home):
            seen.add(path)
            stamp = last_written(path)
            cached = self._cache.get(path)
            if cached is not None and cached[0] == stamp and not cached[1].live and cached[1].error is None:
                out.append(cached[1])
                continue
            info = summarize_store(path, kind, name)
            self._cache[path] = (stamp, info)
            out.append(info)
        for gone in set(self._cache) - seen:
            del self._cache[gone]
        return out


# a compact prompt's length without rebuilding it (schema 3); older stores have full prompts only
PROMPT_LEN = "coalesce(len(prompt_token_ids), prefix_tokens + len(prompt_new_token_ids))"


def _calls_sql(prompt_len: str, limit: int) -> str:
    """The calls table's query, with `prompt_len` as the prompt length's expression."""
    return f"""
        SELECT * FROM (
            SELECT call_id, seq, rollout_id, api, model, status,
                   {prompt_len}, len(completion_token_ids), latency_ms, branch, extends_parent, started_at
            FROM calls ORDER BY started_at DESC NULLS LAST, rollout_id DESC, seq DESC LIMIT {int(limit)}
        ) ORDER BY started_at NULLS FIRST, rollout_id, seq
    """


def load_calls(path: Path, limit: int = CALLS_LIMIT) -> list[CallRow]:
    """The last `limit` calls of a store, oldest first."""
    try:
        result = run_query(path, _calls_sql(PROMPT_LEN, limit))
    except StoreError as exc:
        if "prompt_new_token_ids" not in str(exc):
            raise
        result = run_query(path, _calls_sql("len(prompt_token_ids)", limit))  # a store older than schema 3
    return [
        CallRow(
            call_id=_text(r[0]), seq=r[1], rollout_id=_text(r[2]), api=_text(r[3]), model=_text(r[4]),
            status=_text(r[5]), prompt_tokens=r[6], completion_tokens=r[7], latency_ms=r[8], branch=r[9],
            extends_parent=r[10],
        )
        for r in result.rows
    ]


def load_call(path: Path, call_id: str) -> CallDetail:
    """One call in full; StoreError if it is not there."""
    result = run_query(path, f"SELECT * FROM calls WHERE call_id = {sql_str(call_id)}")
    if not result.rows:
        raise StoreError(f"call {call_id} is not in {path}")
    row = dict(zip(result.columns, result.rows[0], strict=False))
    if row.get("request_base") is not None:  # a body stored as a delta: rebuilt through its rollout's rows
        rollout = run_query(path, f"SELECT call_id, {REQUEST_COLUMNS_SQL} FROM calls WHERE rollout_id = {sql_str(_text(row.get('rollout_id')))}")
        context = {str(r[0]): dict(zip(rollout.columns, r, strict=False)) for r in rollout.rows}
        fill_requests([row], lambda ids: [context[i] for i in ids if i in context] or _rows_by_id(path, ids))
    if row.get("prompt_token_ids") is None and row.get("prompt_new_token_ids") is not None:
        row["prompt_token_ids"] = _full_prompt(path, call_id)
    return CallDetail(
        call_id=_text(row.get("call_id")), rollout_id=_text(row.get("rollout_id")), api=_text(row.get("api")),
        model=_text(row.get("model")), status=_text(row.get("status")), error=row.get("error"),
        finish_reason=row.get("finish_reason"), request=parse_json(row.get("request")),
        response=parse_json(row.get("response")),
        prompt_token_ids=id_list(row.get("prompt_token_ids")) or [],  # token text (schema 6 on) or a list
        completion_token_ids=id_list(row.get("completion_token_ids")) or [],
        completion_logprobs=[float(x) if x is not None else math.nan for x in row.get("completion_logprobs") or []],
        prefix_tokens=row.get("prefix_tokens"), branch=row.get("branch"), extends_parent=row.get("extends_parent"),
        latency_ms=row.get("latency_ms"),
    )


def _rows_by_id(path: Path, ids: list[str]) -> list[dict[str, Any]]:
    """Calls' body columns by id (a delta's base in another rollout)."""
    result = run_query(path, f"SELECT call_id, {REQUEST_COLUMNS_SQL} FROM calls WHERE call_id IN ({', '.join(map(sql_str, ids))})")
    return [dict(zip(result.columns, r, strict=False)) for r in result.rows]


def _full_prompt(path: Path, call_id: str) -> list[int] | None:
    """A compact prompt rebuilt along its parents by the store's `full_prompt` macro."""
    result = run_query(path, f"SELECT prompt_token_ids FROM full_prompt({sql_str(call_id)})")
    return result.rows[0][0] if result.rows else None


SQL_MAX_ROWS = 100_000  # the console keeps this many rows of a result (shown a page at a time)


def is_live(path: Path) -> bool:
    """Whether a writer serving live queries holds the store now."""
    return read_sidecar(path) is not None


# ---------------------------------------------------------------------- rollouts and the live run dashboard
ROLLOUT_COLUMNS = ("task", "sample", "status", "reward", "attempt", "error")
STORE_ROLLOUT_COLUMNS = ("run", "task", "sample", "status", "reward", "passed", "attempt", "error")
ROLLOUTS_LIMIT = 1000  # the store browser's Rollouts tab
RUN_ROLLOUTS_LIMIT = 5000  # the live run dashboard (its progress counts these)
TERMINAL_STATUSES = TERMINAL_VALUES
ERROR_CHARS = 160


@dataclass(frozen=True)
class RolloutRow:
    """One row of a store's `rollouts` table (what the rollouts tables show)."""

    rollout_id: str
    run_id: str = ""
    task_id: str = ""
    sample_index: int | None = None
    status: str = ""
    reward: float | None = None
    passed: bool | None = None
    attempt: int | None = None
    error: str | None = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    def cells(self, columns: tuple[str, ...] = ROLLOUT_COLUMNS) -> tuple[str, ...]:
        """Display values for `columns` (names from ROLLOUT_COLUMNS / STORE_ROLLOUT_COLUMNS)."""
        error = (self.error or "").replace("\n", " ")
        values = {
            "run": self.run_id, "rollout": self.rollout_id, "task": self.task_id, "sample": _text(self.sample_index),
            "status": self.status, "reward": "" if self.reward is None else f"{self.reward:.3g}",
            "passed": {True: "yes", False: "no"}.get(self.passed, ""),  # type: ignore[arg-type]
            "attempt": _text(self.attempt),
            "error": error if len(error) <= ERROR_CHARS else error[: ERROR_CHARS - 1] + "…",
        }
        return tuple(values[c] for c in columns)


def rollout_from_event(rollout_id: str, task_id: str, status: str, reward: float | None, passed: bool | None,
                       error: str | None) -> RolloutRow:
    """A row from an engine event; the run and sample come from the id (`run/task/sample`)."""
    run_id, _, rest = rollout_id.partition("/")
    head, _, sample = rest.rpartition("/")
    return RolloutRow(rollout_id=rollout_id, run_id=run_id, task_id=task_id or head,
                      sample_index=int(sample) if sample.isdigit() else None, status=str(status),
                      reward=reward, passed=passed, error=error)


def load_rollouts(path: Path, run_id: str | None = None, limit: int = ROLLOUTS_LIMIT) -> list[RolloutRow]:
    """Rollouts of a store (of one run when `run_id` is given), by run, task and sample."""
    where = f"WHERE run_id = {sql_str(run_id)}" if run_id else ""
    result = run_query(path, f"""
        SELECT rollout_id, run_id, task_id, sample_index, status, reward, passed, attempt, error
        FROM rollouts {where} ORDER BY run_id, task_id, sample_index, rollout_id LIMIT {int(limit)}
    """)
    return [
        RolloutRow(rollout_id=_text(r[0]), run_id=_text(r[1]), task_id=_text(r[2]), sample_index=r[3],
                   status=_text(r[4]), reward=None if r[5] is None else float(r[5]), passed=r[6], attempt=r[7],
                   error=r[8])
        for r in result.rows
    ]


def count_calls(path: Path) -> int:
    """How many calls a store holds (the dashboard turns successive counts into calls/s)."""
    result = run_query(path, "SELECT count(*) FROM calls")
    return int(result.rows[0][0] or 0) if result.rows else 0


@dataclass(frozen=True)
class RunCounts:
    done: int
    total: int
    passed: int
    failed: int
    timeouts: int
    infra_errors: int


class RunProgress:
    """The run dashboard's state, merged from engine events and store polls; `now` is any monotonic clock."""

    def __init__(self) -> None:
        self.run_id: str | None = None
        self.store: Path | None = None
        self.total = 0
        self.rows: dict[str, RolloutRow] = {}
        self.rewards: list[float] = []  # reward of each finished (scored) rollout, in finish order
        self.finished_here: set[str] = set()  # rollouts the engine reported finished since the run started
        self.started: float | None = None
        self.n_calls: int | None = None
        self.calls_per_s: float | None = None
        self._calls_seen: tuple[float, int] | None = None
        self._counted: set[str] = set()

    def start(self, run_id: str, store: Path, total: int, now: float) -> None:
        self.run_id, self.store, self.total, self.started = run_id, Path(store), total, now

    def _merge(self, new: RolloutRow) -> RolloutRow:
        old = self.rows.get(new.rollout_id)
        if old is not None and old.terminal and not new.terminal:  # a poll older than the event: keep the result
            new = replace(old, attempt=new.attempt if new.attempt is not None else old.attempt)
        elif old is not None:
            new = replace(new, attempt=new.attempt if new.attempt is not None else old.attempt,
                          sample_index=new.sample_index if new.sample_index is not None else old.sample_index)
        self.rows[new.rollout_id] = new
        if new.terminal and new.rollout_id not in self._counted:
            self._counted.add(new.rollout_id)
            if new.status != "infra_error":  # infra errors are not scores
                self.rewards.append(float(new.reward or 0.0))
        return new

    def apply_event(self, row: RolloutRow) -> RolloutRow:
        """A rollout reached a terminal status (from the engine)."""
        self.finished_here.add(row.rollout_id)
        return self._merge(row)

    def apply_rows(self, rows: list[RolloutRow]) -> None:
        """The run's rows as the store has them now (on resume, some finished in an earlier session)."""
        for row in rows:
            self._merge(row)
        self.total = max(self.total, len(self.rows))

    def apply_calls(self, n_calls: int, now: float) -> None:
        """A fresh count of the store's calls: calls/s over the interval since the previous count."""
        if self._calls_seen is not None and now > self._calls_seen[0]:
            self.calls_per_s = max(0, n_calls - self._calls_seen[1]) / (now - self._calls_seen[0])
        self._calls_seen = (now, n_calls)
        self.n_calls = n_calls

    def counts(self) -> RunCounts:
        tally = Tally()
        for row in self.rows.values():
            tally.add(row.status, row.passed)
        done = tally.finished
        return RunCounts(done, max(self.total, done), tally.passed, tally.failed, tally.timeout, tally.infra_error)

    def reward_curve(self) -> list[float]:
        """Mean reward of the finished rollouts after each one finished."""
        out, total = [], 0.0
        for i, r in enumerate(self.rewards, 1):
            total += r
            out.append(total / i)
        return out

    def rollouts_per_min(self, now: float) -> float | None:
        if self.started is None or now <= self.started:
            return None
        return len(self.finished_here) / ((now - self.started) / 60.0)

    def sorted_rows(self) -> list[RolloutRow]:
        return sorted(self.rows.values(), key=lambda r: (r.task_id, r.sample_index or 0, r.rollout_id))
