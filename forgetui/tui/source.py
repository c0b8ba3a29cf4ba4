"""The TUI's one data module: where runs are (`RunCatalog`) and everything read from one (`RunSource`).

A `RunSource` is a run's store and its veRL agent-loop workers' shards (`runs/<id>/shards/*/store.duckdb`)
queried as one, or a standalone proxy store; every screen and tab reads through one: the Runs list, the Run
and Rollout screens, the Calls and Rollouts tabs and the SQL console. All of it is blocking I/O, called
from workers only. The rows it returns are `forgetui.tui.rows`.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from core import paths
from core.errors import ForgetuiError, StoreBusyError, StoreError
from core.eval.passk import pass_at_k
from core.eval.report import build_report
from core.registry import model_shown_for
from core.session.failure import KEY_PREFIX as FAILURE_PREFIX
from core.status import IN_SANDBOX, PASSED_SQL, SCORED_SQL, TERMINAL_SQL, RunStatus
from core.store.bodies import REQUEST_COLUMNS_SQL, fill_requests
from core.store.query import SHARDS_DIR, last_written, run_query
from core.store.readonly import QueryCancel, QueryResult
from core.store.shard_query import run_query_shards
from core.store.sidecar import read_sidecar
from core.store.tokens import id_list
from forgetui.tui.launcher import LaunchRecord, find_launch, read_launches
from forgetui.tui.rows import (
    CallDetail,
    CallRow,
    RolloutDetail,
    RolloutRow,
    RunDetail,
    RunInfo,
    SampleView,
    one_line,
    text,
)
from forgetui.tui.samples import decode_pieces, rollout_log, stored_samples, tokenizer_for

log = logging.getLogger(__name__)

DEFAULT_KS = (1, 2, 4, 8)
CALLS_LIMIT = 1000  # the Calls tab shows a source's last calls; all of them are in SQL
SQL_MAX_ROWS = 100_000  # the console keeps this many rows of a result (shown a page at a time)


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


def rows_of(result: QueryResult) -> list[dict[str, Any]]:
    return [dict(zip(result.columns, r, strict=False)) for r in result.rows]


def _time(value: Any) -> str:
    if isinstance(value, dt.datetime):
        return value.strftime("%Y-%m-%d %H:%M")
    return text(value).replace("T", " ")[:16]


# ---------------------------------------------------------------------- the queries
RUNS_SQL = f"""
WITH agg AS (
    SELECT run_id, count(*) AS total,
           count(*) FILTER (WHERE status IN {TERMINAL_SQL}) AS done,
           count(*) FILTER (WHERE {PASSED_SQL}) AS passed,
           count(*) FILTER (WHERE status IN {SCORED_SQL}) AS scored,
           avg(coalesce(reward, 0)) FILTER (WHERE status IN {SCORED_SQL}) AS mean_reward,
           any_value(env) AS env, any_value(harness) AS harness,
           -- an error written before any time was (a rollout refused before it started) still counts, as the oldest
           arg_max(error, coalesce(ended_at, started_at, TIMESTAMP '-infinity')) FILTER (WHERE error IS NOT NULL) AS last_error
    FROM rollouts GROUP BY run_id
), steps AS (SELECT run_id, max(step) AS step FROM train_steps GROUP BY run_id)
SELECT r.run_id, r.status, r.created_at, r.config, a.total, a.done, a.passed, a.scored, a.mean_reward,
       a.env, a.harness, a.last_error, s.step
FROM runs r LEFT JOIN agg a USING (run_id) LEFT JOIN steps s USING (run_id)
ORDER BY r.created_at DESC
"""

# per task: scored rollouts and how many passed (the Runs list's pass@k)
PER_TASK_SQL = f"""
SELECT run_id, task_id, count(*) AS n, count(*) FILTER (WHERE {PASSED_SQL}) AS c
FROM rollouts WHERE status IN {SCORED_SQL} GROUP BY run_id, task_id
"""

ROLLOUTS_SQL = """
SELECT o.rollout_id, o.run_id, o.task_id, o.sample_index, o.step, o.status, o.reward, o.passed, o.attempt, o.error,
       o.env, o.harness, o.meta, epoch(o.ended_at) - epoch(o.started_at) AS duration_s,
       coalesce(c.n, 0) AS n_calls, coalesce(c.tokens, 0) AS tokens
FROM rollouts o LEFT JOIN (
    SELECT rollout_id, count(*) AS n, sum(coalesce(len(completion_token_ids), 0)) AS tokens FROM calls GROUP BY rollout_id
) c USING (rollout_id)
WHERE o.run_id = {run}
ORDER BY o.step NULLS FIRST, o.task_id, o.sample_index, o.rollout_id
"""

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


def rollout_row(r: dict[str, Any]) -> RolloutRow:
    return RolloutRow(
        rollout_id=str(r["rollout_id"]), run_id=text(r.get("run_id")), task_id=text(r.get("task_id")),
        sample_index=r.get("sample_index"), step=r.get("step"), status=text(r.get("status")),
        reward=None if r.get("reward") is None else float(r["reward"]), passed=r.get("passed"), attempt=r.get("attempt"),
        n_calls=None if r.get("n_calls") is None else int(r["n_calls"]),
        tokens=None if r.get("tokens") is None else int(r["tokens"]),
        duration_s=None if r.get("duration_s") is None else float(r["duration_s"]), error=r.get("error"))


def largest_pass_k(per_task: list[tuple[int, int]], ks: tuple[int, ...] = DEFAULT_KS) -> tuple[int, float] | None:
    """(k, mean pass@k over tasks) at the largest of `ks` every task has that many scored samples for."""
    if not per_task:
        return None
    fewest = min(n for n, _ in per_task)
    usable = [k for k in ks if k <= fewest]
    if not usable:
        return None
    k = usable[-1]
    return k, sum(pass_at_k(n, c, k) for n, c in per_task) / len(per_task)


# ---------------------------------------------------------------------- one run's rows
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

    @property
    def exports_dir(self) -> Path:
        """Where the SQL console's exports go: the run folder's exports/, or beside a proxy store."""
        return (self.run_dir if self.store_file is None else self.store_file.parent) / "exports"

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

    def failures(self) -> dict[str, str]:
        """run id → why it failed, as the run recorded it in its store's meta table (core.session.failure)."""
        try:
            rows = self.query(f"SELECT key, value FROM meta WHERE key LIKE {sql_str(FAILURE_PREFIX + '%')}").rows
        except StoreError:  # a store of an older forgetui, a shard view without meta: no recorded reasons
            return {}
        return {str(key)[len(FAILURE_PREFIX):]: str(value) for key, value in rows if value}

    # -- the Runs list
    def run_infos(self, launches: dict[str, LaunchRecord] | None = None) -> list[RunInfo]:
        """The runs this source holds (a run folder holds its own; a proxy store one per session), one line each."""
        kind = "proxy" if self.store_file is not None else "run"
        shards = len(self.shards())
        live = self.live()
        blank = RunInfo(run_id=self.run_id, kind=kind, source=self, live=live, shards=shards)
        launch = (launches or {}).get(self.run_id) if kind == "run" else None
        try:
            rows = rows_of(self.query(RUNS_SQL))
            per_task = rows_of(self.query(PER_TASK_SQL))
            failures = self.failures()
        except StoreBusyError:  # its writer is opening (or closing) it: a moment later it answers
            return [replace(blank, status="starting" if launch is None or not launch.ended else "ending")]
        except StoreError as exc:
            return [replace(blank, status="unreadable", reason=str(exc))]
        tasks: dict[str, list[tuple[int, int]]] = {}
        for row in per_task:
            tasks.setdefault(str(row["run_id"]), []).append((int(row["n"]), int(row["c"])))
        infos: dict[str, RunInfo] = {}
        for row in rows:  # a store holds its own run; shards each repeat it: one line per run id
            info = self._info(row, kind, live, shards, largest_pass_k(tasks.get(str(row["run_id"]), [])))
            if info.status != RunStatus.DONE and failures.get(info.run_id):  # the run's own word on why comes first
                info = replace(info, reason=one_line(failures[info.run_id], 300))
            infos.setdefault(info.run_id, info)
        if not infos and failures.get(self.run_id):  # it failed before it wrote its row
            return [replace(blank, status=RunStatus.FAILED, reason=one_line(failures[self.run_id], 300))]
        if not infos:
            return [replace(blank, status="starting")]
        return [with_launch(i, launch) for i in infos.values()]

    def _info(self, row: dict[str, Any], kind: str, live: bool, shards: int, pass_k: tuple[int, float] | None) -> RunInfo:
        config = parse_json(row.get("config")) or {}
        config = config if isinstance(config, dict) else {}
        env, harness, policy, train = (config.get(k) or {} for k in ("env", "harness", "policy", "train"))
        harness_name = str(row.get("harness") or harness.get("name") or "")
        status = text(row.get("status"))
        # a run that stopped short (or whose writer died) says why with its last rollout error, if it has one
        stopped = stopped_short(status, live, kind == "run", shards)
        return RunInfo(
            run_id=str(row["run_id"]), kind=kind, source=self, status=status,
            created_at=_time(row.get("created_at")), env=str(row.get("env") or env.get("name") or ""),
            harness=harness_name, model=model_shown_for(str(policy.get("backend") or ""), harness_name),
            total=int(row.get("total") or 0), done=int(row.get("done") or 0), passed=int(row.get("passed") or 0),
            scored=int(row.get("scored") or 0),
            mean_reward=None if row.get("mean_reward") is None else float(row["mean_reward"]), pass_k=pass_k,
            train_step=row.get("step"), train_steps=int(train.get("steps") or 0), live=live, shards=shards,
            reason=(one_line(row.get("last_error"), 300) or None) if stopped else None,
        )

    # -- the Run screen, the Rollouts tab
    def rollouts(self, run_id: str | None = None) -> list[RolloutRow]:
        """Every rollout of the run, with its calls, sampled tokens and duration, by step, task and sample."""
        return [rollout_row(r) for r in rows_of(self.query(ROLLOUTS_SQL.format(run=sql_str(run_id or self.run_id)),
                                                          max_rows=1_000_000))]

    def run_detail(self, run_id: str | None = None, ks: tuple[int, ...] = DEFAULT_KS,
                   launch: LaunchRecord | None = None) -> RunDetail:
        """Everything the Run screen shows, in four queries; `launch`: the launch that made it (why it failed),
        looked up among the TUI's launches when not given."""
        run_id = run_id or self.run_id
        if launch is None and self.store_file is None:
            launch = find_launch(self.run_dir.parent.parent, run_id)
        run = sql_str(run_id)
        runs = rows_of(self.query(f"SELECT status, config FROM runs WHERE run_id = {run} LIMIT 1"))
        if not runs:
            raise StoreError(f"run {run_id} is not in {self.run_dir}")
        config = parse_json(runs[0]["config"]) or {}
        config = config if isinstance(config, dict) else {}
        lines = rows_of(self.query(ROLLOUTS_SQL.format(run=run), max_rows=1_000_000))
        steps = train_step_rows(self.query(
            f"SELECT step, loss, reward_mean, metrics FROM train_steps WHERE run_id = {run} ORDER BY step, created_at"))
        n_calls = self.query(f"SELECT count(*) FROM calls WHERE rollout_id IN (SELECT rollout_id FROM rollouts WHERE run_id = {run})")
        for row in lines:
            row["meta"] = parse_json(row.get("meta"))
        model = str((config.get("policy") or {}).get("backend") or "")
        rollouts = [rollout_row(r) for r in lines]
        status = text(runs[0]["status"])
        recorded = self.failures().get(run_id) if status != RunStatus.DONE else None
        return RunDetail(
            run_id=run_id, status=status, config=config, report=build_report(lines, list(ks), model),
            train_steps=steps, rollouts=rollouts,
            errors=[f"{r.task_id}/{r.sample_index}: {r.error}" for r in rollouts if r.error][-5:],
            n_calls=int(n_calls.rows[0][0] or 0), busy=sum(1 for r in rollouts if r.status in IN_SANDBOX),
            reason=(launch.reason() if launch is not None and status != "done" else None) or recorded
            or (last_error(rollouts) if status not in ("done", "running", "starting")
                or stopped_short(status, self.live(), self.store_file is None, len(self.shards())) else None))

    def count_calls(self, run_id: str | None = None) -> int:
        """How many calls the run recorded (the live dashboard turns successive counts into calls/s)."""
        run = sql_str(run_id or self.run_id)
        result = self.query(f"SELECT count(*) FROM calls WHERE rollout_id IN (SELECT rollout_id FROM rollouts WHERE run_id = {run})")
        return int(result.rows[0][0] or 0) if result.rows else 0

    # -- the Calls tab
    def calls(self, limit: int = CALLS_LIMIT) -> list[CallRow]:
        """The last `limit` calls of the source, oldest first."""
        try:
            result = self.query(_calls_sql(PROMPT_LEN, limit))
        except StoreError as exc:
            if "prompt_new_token_ids" not in str(exc):
                raise
            result = self.query(_calls_sql("len(prompt_token_ids)", limit))  # a store older than schema 3
        return [
            CallRow(call_id=text(r[0]), seq=r[1], rollout_id=text(r[2]), api=text(r[3]), model=text(r[4]),
                    status=text(r[5]), prompt_tokens=r[6], completion_tokens=r[7], latency_ms=r[8], branch=r[9],
                    extends_parent=r[10])
            for r in result.rows
        ]

    def call(self, call_id: str) -> CallDetail:
        """One call in full; StoreError if it is not there."""
        result = self.query(f"SELECT * FROM calls WHERE call_id = {sql_str(call_id)}")
        if not result.rows:
            raise StoreError(f"call {call_id} is not in {self.store}")
        row = dict(zip(result.columns, result.rows[0], strict=False))
        if row.get("request_base") is not None:  # a body stored as a delta: rebuilt through its rollout's rows
            context = {str(r["call_id"]): r for r in rows_of(self.query(
                f"SELECT call_id, {REQUEST_COLUMNS_SQL} FROM calls WHERE rollout_id = {sql_str(text(row.get('rollout_id')))}"))}
            fill_requests([row], lambda ids: [context[i] for i in ids if i in context] or self._bodies(ids))
        if row.get("prompt_token_ids") is None and row.get("prompt_new_token_ids") is not None:
            full = self.query(f"SELECT prompt_token_ids FROM full_prompt({sql_str(call_id)})")  # along its parents
            row["prompt_token_ids"] = full.rows[0][0] if full.rows else None
        return CallDetail(
            call_id=text(row.get("call_id")), rollout_id=text(row.get("rollout_id")), api=text(row.get("api")),
            model=text(row.get("model")), status=text(row.get("status")), error=row.get("error"),
            finish_reason=row.get("finish_reason"), request=parse_json(row.get("request")),
            response=parse_json(row.get("response")),
            prompt_token_ids=id_list(row.get("prompt_token_ids")) or [],  # token text (schema 6 on) or a list
            completion_token_ids=id_list(row.get("completion_token_ids")) or [],
            completion_logprobs=[float(x) if x is not None else math.nan for x in row.get("completion_logprobs") or []],
            prefix_tokens=row.get("prefix_tokens"), branch=row.get("branch"), extends_parent=row.get("extends_parent"),
            latency_ms=row.get("latency_ms"),
        )

    # -- the Rollout screen
    def rollout(self, rollout_id: str, *, decode: bool = True, tokenizer: Any | None = None) -> RolloutDetail:
        """A rollout in full: its row, its final attempt's calls in order, its samples (decoded when possible)."""
        rid = sql_str(rollout_id)
        rows = rows_of(self.query(f"SELECT * FROM rollouts WHERE rollout_id = {rid}"))
        if not rows:
            raise StoreError(f"rollout {rollout_id} is not in {self.run_dir}")
        rollout = rows[0]
        rollout["meta"] = parse_json(rollout.get("meta"))
        calls = rows_of(self.query(
            f"SELECT call_id, seq, attempt, api, model, status, error, finish_reason, {REQUEST_COLUMNS_SQL}, response, "
            "branch, extends_parent, prefix_tokens, latency_ms, completion_token_ids, completion_logprobs, tool_parse_error "
            f"FROM calls WHERE {final_attempt_calls(rollout)} ORDER BY seq, started_at"))
        for call in calls:  # token text (schema 6 on) or a list
            call["completion_token_ids"] = id_list(call.get("completion_token_ids"))
        fill_requests(calls, self._bodies)  # bodies stored as deltas rebuilt (core.store.bodies); a base elsewhere asked for
        # request/response stay JSON text: a 200-call rollout resends its history each call, and parsed that is
        # ~100,000 long-lived dicts for Python's GC to walk on every full collection (visible stalls). Parse on use.
        samples = stored_samples(rows_of(self.query(f"SELECT * FROM samples WHERE rollout_id = {rid} ORDER BY branch")))
        note = None
        if not samples:  # an eval run stores no samples: build them from the calls as the trainer would
            samples, note = self._built_samples(rollout)
        if decode and samples:
            if tokenizer is None:
                config = rows_of(self.query(f"SELECT config FROM runs WHERE run_id = {sql_str(str(rollout['run_id']))}"))
                tokenizer = tokenizer_for(parse_json(config[0]["config"]) or {}) if config else None
            if tokenizer is None:
                note = "no local tokenizer for this run's policy: token ids shown undecoded"
            else:
                samples = [replace(s, pieces=decode_pieces(tokenizer, s.token_ids)) for s in samples]
        return RolloutDetail(rollout=rollout, calls=calls, samples=samples,
                             log_text=rollout_log(self.run_dir, rollout), tokenizer_note=note)

    def _bodies(self, call_ids: list[str]) -> list[dict[str, Any]]:
        """Calls' body columns by id (a delta's base in another rollout)."""
        return rows_of(self.query(
            f"SELECT call_id, {REQUEST_COLUMNS_SQL} FROM calls WHERE call_id IN ({', '.join(map(sql_str, call_ids))})"))

    def _built_samples(self, rollout: dict[str, Any]) -> tuple[list[SampleView], str | None]:
        """Samples of a rollout built from its final attempt's calls (core.train.samples); why not, when it cannot."""
        from core.train.samples import CALL_COLS, build_samples  # ~60 ms to import: only when a rollout opens

        calls = rows_of(self.query(f"SELECT {', '.join(CALL_COLS)} FROM calls WHERE {final_attempt_calls(rollout)} ORDER BY seq, started_at"))
        try:
            built = build_samples(rollout, calls)
        except ForgetuiError as exc:
            return [], f"no token view: {exc}"
        return [SampleView(sample_id=s.sample_id, branch=s.branch, token_ids=s.token_ids, loss_mask=s.loss_mask,
                           logprobs=s.logprobs, call_ids=s.call_ids, completion_starts=s.completion_starts,
                           completion_ends=s.completion_ends, reward=s.reward, advantage=None) for s in built], None


def stopped_short(status: str, live: bool, is_run: bool, shards: int) -> bool:
    """A run that ended without finishing: failed, interrupted, or marked running by a writer that is gone."""
    return status in ("failed", "interrupted") or (status == "running" and not live and is_run and not shards)


def last_error(rollouts: list[RolloutRow]) -> str | None:
    """The last rollout error, as the reason of a run that failed with no word of its own."""
    errors = [r.error for r in rollouts if r.error]
    return errors[-1] if errors else None


def final_attempt_calls(rollout: dict[str, Any]) -> str:
    """The WHERE clause of a rollout's final attempt's calls: the attempt its row's verdict is about (an
    earlier attempt's calls are another conversation)."""
    attempt = rollout.get("attempt")
    return f"rollout_id = {sql_str(str(rollout['rollout_id']))}" + (
        f" AND coalesce(attempt, {int(attempt)}) = {int(attempt)}" if attempt is not None else "")


def train_step_rows(result: QueryResult) -> list[dict[str, Any]]:
    """train_steps rows, one per step (the last written wins), their metrics JSON merged in."""
    by_step: dict[int, dict[str, Any]] = {}
    for row in rows_of(result):
        metrics = parse_json(row.pop("metrics", None))
        merged = {**(metrics if isinstance(metrics, dict) else {}), **{k: v for k, v in row.items() if v is not None}}
        by_step[int(row["step"])] = merged
    return [by_step[s] for s in sorted(by_step)]


def store_source(path: Path) -> RunSource:
    """What a store file is part of: a run (runs/<id>/store.duckdb, or a shard of one: read with its siblings),
    or a standalone proxy store."""
    path = Path(path)
    if path.name == "store.duckdb" and path.parent.parent.name == SHARDS_DIR:
        return RunSource(path.parent.parent.parent)
    if path.name == "store.duckdb" and path.parent.parent.name == "runs":
        return RunSource(path.parent)
    return RunSource(path.parent, store_file=path)


# ---------------------------------------------------------------------- every run under FORGETUI_HOME
class RunCatalog:
    """Every run under FORGETUI_HOME, proxy sessions, stores opened by path, and launches that made no run.

    A source is re-read only when its files changed, it is live, or it was not readable."""

    def __init__(self, home: Path | None = None) -> None:
        self.home = home
        self.opened: list[Path] = []  # store files opened by path (anywhere on disk)
        self._cache: dict[Path, tuple[float, list[RunInfo]]] = {}

    def home_path(self) -> Path:
        return Path(self.home) if self.home is not None else paths.home()

    def open_store(self, path: Path) -> RunSource:
        """Add a store file to the list (it stays for this session); its source."""
        source = store_source(path)
        runs_dir = self.home_path() / "runs"
        if source.store_file is not None or source.run_dir.parent != runs_dir:
            if path not in self.opened:
                self.opened.append(path)
        return source

    def sources(self) -> list[RunSource]:
        home = self.home_path()
        found = [RunSource(d) for d in (home / "runs").glob("*") if RunSource(d).files()]
        found += [RunSource(p.parent, store_file=p) for p in (home / "stores").glob("*.duckdb")]
        found += [store_source(p) for p in self.opened if p.exists()]
        return found

    def launches(self) -> list[LaunchRecord]:
        return read_launches(self.home_path())

    def list(self) -> list[RunInfo]:
        """Every run, newest first, then launches still starting or refused before they made a run."""
        launches = self.launches()
        by_run = {r.run_id: r for r in launches if r.run_id}
        out: list[RunInfo] = []
        seen = set()
        stamped = [(s, s.stamp()) for s in self.sources()]
        for source, stamp in sorted(stamped, key=lambda t: t[1], reverse=True):
            key = source.store
            seen.add(key)
            cached = self._cache.get(key)
            if cached is not None and cached[0] == stamp and not any(i.live or i.status in ("starting", "unreadable", "ending")
                                                                      for i in cached[1]):
                infos = cached[1]
            else:
                infos = source.run_infos(by_run)
                self._cache[key] = (stamp, infos)
            # the launch may have ended (and said why) after the store last changed
            out += [with_launch(i, by_run.get(i.run_id)) for i in infos]
        for gone in set(self._cache) - seen:
            del self._cache[gone]
        runs = {i.run_id for i in out}
        out += [launch_info(r) for r in reversed(launches)
                if (r.run_id is None or r.run_id not in runs) and (r.alive() or r.exit_code not in (0, 130))]
        return out


def with_launch(info: RunInfo, launch: LaunchRecord | None) -> RunInfo:
    """`info` with the launch that made it: its words on why the run failed come first."""
    if launch is None or launch.run_id != info.run_id or info.kind != "run":
        return info
    why = launch.reason() if info.status != "done" else None
    return replace(info, launch=launch, reason=why or info.reason)


def launch_info(record: LaunchRecord) -> RunInfo:
    """A launch with no run (yet): starting, or refused (it ended before it created one) with why."""
    alive = record.alive()
    when = dt.datetime.fromtimestamp(record.started_at)
    return RunInfo(run_id=f"launch {when:%H:%M:%S}", kind="launch", source=RunSource(record.path.parent),
                   status="starting" if alive else "refused", created_at=f"{when:%Y-%m-%d %H:%M}",
                   reason=None if alive else record.reason(), live=alive, launch=record)
