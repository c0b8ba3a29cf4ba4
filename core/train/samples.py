"""Recorded calls → training samples: one sample per rollout branch, merged on token ids.

A call extends an open sample when its prompt starts, token for token, with that sample's
sequence so far (the last merged call's prompt + completion); its new prompt tokens join with
loss mask 0 and its completion with mask 1 and its logprobs. Among the open samples the longest
match wins (harnesses interleave subagent, title and compaction branches); otherwise the call
starts a new sample. The proxy's `branch` / `extends_parent` columns are only a cross-check.

Sequences are compared as whole slices (lists, or numpy arrays as `samples_for_run` reads them),
never token by token in Python. `samples_for_run` builds each sample's sequence, mask and logprobs as
numpy arrays (int32, int32, float64) in one query and one pass: no Python object per token, which is
what bounded it on busy cores (`benchmarks/store_scale.py`); `build_samples` gives lists unless asked.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np

from core.errors import StoreError, TrainingDataError
from core.status import SCORED, TERMINAL_VALUES, Status
from core.store.tokens import ids_column, ids_of
from core.train.types import Sample

log = logging.getLogger(__name__)

Ids = Sequence[int] | np.ndarray
NO_SAMPLES = frozenset({str(Status.INFRA_ERROR)})  # not a score: nothing to learn from
UNFINISHED = frozenset(str(s) for s in Status) - TERMINAL_VALUES  # reward not final yet
TRAINABLE_STATUSES = tuple(str(s) for s in SCORED)


@dataclass(eq=False, slots=True)
class _Call:
    """One call's tokens, checked; a compact prompt stays a parent reference + new ids until it is needed whole."""

    call_id: str
    prompt: Ids | None  # the whole prompt; None until rebuilt for a compact call
    completion: Ids
    logprobs: Ids
    weights_version: int | None
    extends_parent: bool | None
    n_prompt: int = 0
    parent: _Call | None = None  # compact: the call whose prompt + completion this prompt starts with
    new: Ids | None = None  # compact: the ids after the parent's prompt + completion
    ok: bool = True
    # from its row, for the checks: the parent it names, the prefix length it claims, what was NULL
    parent_id: str | None = None
    prefix: int = 0
    no_completion: bool = False
    no_logprobs: bool = False

    def token(self, i: int) -> int:
        """Prompt token `i` (0 <= i < n_prompt) without rebuilding the prompt."""
        call = self
        while call.prompt is None:
            parent = call.parent
            start = parent.n_prompt + len(parent.completion)
            if i >= start:
                return call.new[i - start]
            if i >= parent.n_prompt:
                return parent.completion[i - parent.n_prompt]
            call = parent
        return call.prompt[i]

    def prompt_parts(self) -> list[Ids]:
        """The pieces the whole prompt is made of, in order (no copy; the prompt itself once rebuilt)."""
        if self.prompt is not None:
            return [self.prompt]
        parts, call = [], self
        while call.prompt is None:
            parts += [call.new, call.parent.completion]
            call = call.parent
        parts.append(call.prompt)
        return [p for p in reversed(parts) if len(p)]

    def full_prompt(self) -> Ids:
        """The whole prompt (a compact one is rebuilt once, in one concatenation along its parents)."""
        if self.prompt is None:
            whole = self.prompt_parts()
            # arrays as read from the store concatenate without a cast; lists become int64
            self.prompt = np.concatenate(whole) if whole else np.empty(0, dtype=np.int64)
        return self.prompt


@dataclass(slots=True)
class _Branch:
    """An open sample while calls merge into it."""

    branch: int
    last: _Call  # the last merged call: the branch's sequence is its prompt + completion
    touched: int  # when it last took a call (ties go to the most recent)
    calls: list[_Call] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)

    @property
    def length(self) -> int:
        """Tokens so far: the last merged call's prompt + completion."""
        return self.last.n_prompt + len(self.last.completion)

    def take(self, call: _Call, touched: int) -> None:
        """Merge `call` (its prompt already checked to start with this branch's sequence)."""
        self.calls.append(call)
        self.starts.append(call.n_prompt)
        self.ends.append(call.n_prompt + len(call.completion))
        self.last, self.touched = call, touched


@dataclass(frozen=True)
class SampleDiagnostics:
    """How well a set of samples merged: the share of calls that joined an existing sample, branches per rollout."""

    rollouts: int
    samples: int
    calls: int
    merged_calls: int
    merge_rate: float  # merged_calls / calls (0.0 with no calls)
    branches_per_rollout: float
    max_branches: int
    tokens: int
    trainable_tokens: int

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return dict(self.__dict__)


# ----------------------------------------------------------------------------- token checks
def _same(a: Ids, b: Ids) -> bool:
    """Whether two token sequences are equal (one C-level comparison, lists or arrays)."""
    if len(a) != len(b):
        return False
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return bool(np.array_equal(a, b))
    return a == b


def _last(branch: _Branch) -> int:
    """The branch sequence's last token."""
    last = branch.last
    return last.completion[-1] if len(last.completion) else last.token(last.n_prompt - 1)


def _continues(call: _Call, branch: _Branch) -> bool:
    """Whether `call` is stored as a continuation of the branch's last call (its prompt extends it by construction)."""
    return call.parent is not None and call.parent is branch.last


def _extends(call: _Call, branch: _Branch) -> bool:
    """Whether `call`'s prompt starts with the branch's whole sequence (cheap boundary checks first)."""
    if _continues(call, branch):
        return True
    last = branch.last
    n_prompt, total = last.n_prompt, branch.length
    if total == 0:
        return True
    if call.n_prompt < total or call.token(total - 1) != _last(branch):
        return False
    if n_prompt and call.token(n_prompt - 1) != last.token(n_prompt - 1):
        return False
    prompt, head = call.full_prompt(), last.full_prompt()
    return _same(prompt[:n_prompt], head) and _same(prompt[n_prompt:total], last.completion)


def _ids(value: Any) -> Ids | None:
    """Token ids as given (list or array; token text as stored since schema 6 becomes an array); None stays None."""
    if value is None or isinstance(value, np.ndarray | list):
        return value
    if isinstance(value, str):
        return ids_of(value)
    return list(value)


def _no_ids(call_id: str, rollout_id: str, missing: str) -> TrainingDataError:
    """The error for a call without the token ids training needs."""
    return TrainingDataError(
        f"call {call_id} of rollout {rollout_id} has no {missing} token ids: training needs the exact token ids "
        "and one logprob per sampled token; a passthrough backend that returns no token ids cannot be trained on "
        "(use a token backend: builtin, vllm or scripted, or a litellm backend that returns token ids and logprobs)"
    )


_EMPTY = np.empty(0, dtype=np.int32)


def _make(call_id: Any, status: Any, prompt: Ids | None, new: Ids | None, parent_id: Any, prefix: Any, completion: Ids | None,
          logprobs: Ids | None, weights_version: Any, extends_parent: Any) -> _Call:
    """An unchecked `_Call` from one row's values (compact prompts not linked yet)."""
    compact = prompt is None and new is not None
    prefix = int(prefix or 0)
    return _Call(
        call_id=str(call_id),
        prompt=prompt,
        completion=completion if completion is not None else _EMPTY,
        logprobs=logprobs if logprobs is not None else _EMPTY,
        weights_version=weights_version,
        extends_parent=extends_parent,
        n_prompt=(prefix + len(new)) if compact else len(prompt) if prompt is not None else 0,
        new=new if compact else None,
        ok=status == "ok",
        parent_id=None if parent_id is None else str(parent_id),
        prefix=prefix,
        no_completion=completion is None,
        no_logprobs=logprobs is None,
    )


def _node(row: Mapping[str, Any]) -> _Call:
    """A `calls` row as an unchecked `_Call`."""
    return _make(
        row.get("call_id"), row.get("status", "ok"), _ids(row.get("prompt_token_ids")), _ids(row.get("prompt_new_token_ids")),
        row.get("parent_call_id"), row.get("prefix_tokens"), _ids(row.get("completion_token_ids")), row.get("completion_logprobs"),
        row.get("weights_version"), row.get("extends_parent"),
    )


def _link(call: _Call, nodes: Mapping[str, _Call]) -> bool:
    """Point a compact call at its parent; False when the parent is missing or its length disagrees."""
    parent = nodes.get(str(call.parent_id))
    if parent is None or parent is call or (parent.prompt is None and parent.new is None):
        return False
    call.parent = parent
    return call.prefix == parent.n_prompt + len(parent.completion)


def _check(call: _Call, rollout_id: str) -> _Call:
    """`call` when its tokens can be trained on, else TrainingDataError."""
    if call.prompt is None and call.new is None or call.no_completion:
        raise _no_ids(call.call_id, rollout_id, "prompt" if call.prompt is None and call.new is None else "completion")
    if len(call.completion) and (call.no_logprobs or len(call.logprobs) != len(call.completion)):
        got = "no logprobs" if call.no_logprobs else f"{len(call.logprobs)} logprobs"
        raise TrainingDataError(
            f"call {call.call_id} of rollout {rollout_id} has {len(call.completion)} completion tokens but {got}: training needs "
            "one logprob per sampled token; a passthrough backend without token ids/logprobs cannot be trained on "
            "(use a token backend: builtin, vllm or scripted, or a litellm backend that returns logprobs)"
        )
    return call


def _calls(nodes: list[_Call], rollout_id: str) -> list[_Call]:
    """The rollout's ok calls, checked, compact prompts linked to their parents (any status) in one pass."""
    by_id = {call.call_id: call for call in nodes}
    broken: set[str] = set()
    for call in nodes:
        if call.new is not None and not _link(call, by_id):
            broken.add(call.call_id)
    checked, whole = [], set()
    for call in nodes:
        if not call.ok:
            continue
        if call.new is not None and _chain_broken(call, broken, whole):
            raise TrainingDataError(
                f"call {call.call_id} of rollout {rollout_id} stores its prompt as a continuation of a call whose row "
                "is missing or disagrees in length: its prompt cannot be rebuilt"
            )
        checked.append(_check(call, rollout_id))
    return checked


def _chain_broken(call: _Call, broken: set[str], whole: set[str]) -> bool:
    """Whether any compact prompt on the way up from `call` lacks its parent (`whole`: calls whose chain was
    checked already, so a rollout's chains are walked once in all, not once per call)."""
    seen, walked = 0, []
    while call is not None and call.prompt is None and call.call_id not in whole:
        if call.new is None or call.call_id in broken or seen > 1_000_000:
            return True
        walked.append(call.call_id)
        call, seen = call.parent, seen + 1
    if call is None:
        return True
    whole.update(walked)
    return False


# ----------------------------------------------------------------------------- merging
def _best_branch(call: _Call, branches: list[_Branch]) -> _Branch | None:
    """The open branch with the longest sequence that `call`'s prompt starts with (latest on a tie)."""
    for branch in sorted(branches, key=lambda b: (b.length, b.touched), reverse=True):
        if _extends(call, branch):
            return branch
    return None


def _cross_check(call: _Call, merged: bool, rollout_id: str) -> None:
    """Log where the proxy's own prefix flag disagrees with the token ids (diagnostic only)."""
    if call.extends_parent is None or bool(call.extends_parent) == merged:
        return
    if call.extends_parent:
        log.warning(
            "rollout %s call %s: the proxy says it extends its parent, the token ids say not; a new sample starts",
            rollout_id,
            call.call_id,
        )
    else:
        log.debug(
            "rollout %s call %s: merged on token ids although the proxy started a new branch",
            rollout_id,
            call.call_id,
        )


def _merge(calls: Iterable[_Call], rollout_id: str) -> list[_Branch]:
    """Merge checked calls, in order, into branches (in order of creation)."""
    branches: list[_Branch] = []
    for i, call in enumerate(calls):
        branch = _best_branch(call, branches)
        _cross_check(call, branch is not None, rollout_id)
        if branch is None:
            branch = _Branch(branch=len(branches), last=call, touched=i)
            branches.append(branch)
        branch.take(call, i)
    return branches


# ----------------------------------------------------------------------------- samples
def _as_list(a: Ids, b: Ids) -> list[int]:
    """`a + b` as a list of Python ints."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        out = _pylist(a)
        out.extend(_pylist(b))  # no copy of the (long) prompt
        return out
    return [*a, *b]


def _pylist(ids: Ids) -> list[int]:
    """Ids as a list of Python ints."""
    return ids.tolist() if isinstance(ids, np.ndarray) else list(map(int, ids))


def _floats(values: Ids) -> list[float]:
    """Logprobs as a list of Python floats."""
    return (
        np.asarray(values, dtype=np.float64).tolist()
        if isinstance(values, np.ndarray)
        else list(map(float, values))
    )


def _arrays(branch: _Branch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The branch's sequence (int32), loss mask (int32) and logprobs (float64) as arrays."""
    last = branch.last
    token_ids = np.concatenate([*last.prompt_parts(), last.completion], dtype=np.int32)  # one copy of the sequence
    mask, logprobs = np.zeros(len(token_ids), dtype=np.int32), np.zeros(len(token_ids), dtype=np.float64)
    for call, start, end in zip(branch.calls, branch.starts, branch.ends, strict=True):
        mask[start:end] = 1
        logprobs[start:end] = call.logprobs
    return token_ids, mask, logprobs


def _lists(branch: _Branch) -> tuple[list[int], list[int], list[float]]:
    """The branch's sequence, loss mask and logprobs as Python lists."""
    token_ids = _as_list(branch.last.full_prompt(), branch.last.completion)
    mask, logprobs = [0] * len(token_ids), [0.0] * len(token_ids)
    for call, start, end in zip(branch.calls, branch.starts, branch.ends, strict=True):
        mask[start:end] = [1] * (end - start)
        logprobs[start:end] = _floats(call.logprobs)
    return token_ids, mask, logprobs


def _sample(branch: _Branch, rollout: Mapping[str, Any], arrays: bool = False) -> Sample:
    """The `Sample` of one finished branch (its token columns numpy arrays when `arrays`, else lists)."""
    token_ids, mask, logprobs = _arrays(branch) if arrays else _lists(branch)
    versions = {c.weights_version for c in branch.calls}
    if len(versions) > 1:
        log.debug(
            "rollout %s branch %d mixes weights versions %s",
            rollout["rollout_id"],
            branch.branch,
            sorted(versions, key=str),
        )
    rollout_id = str(rollout["rollout_id"])
    return Sample(
        sample_id=f"{rollout_id}#{branch.branch}",
        run_id=str(rollout["run_id"]),
        rollout_id=rollout_id,
        task_id=str(rollout["task_id"]),
        branch=branch.branch,
        step=int(rollout.get("step") or 0),
        token_ids=token_ids,
        loss_mask=mask,
        logprobs=logprobs,
        prompt_tokens=branch.starts[0],
        call_ids=[c.call_id for c in branch.calls],
        completion_starts=list(branch.starts),
        completion_ends=list(branch.ends),
        weights_version=branch.calls[0].weights_version,
        reward=float(rollout.get("reward") or 0.0),
        advantage=0.0,
    )


def build_samples(rollout: Mapping[str, Any], calls: Iterable[Mapping[str, Any]], *, arrays: bool = False) -> list[Sample]:
    """Samples of one finished rollout from its `calls` rows in seq order (non-ok calls are skipped); their
    token_ids, loss_mask and logprobs are numpy arrays when `arrays`, else lists."""
    return _samples(rollout, lambda: [_node(row) for row in calls], arrays)


def _samples(rollout: Mapping[str, Any], nodes: Callable[[], list[_Call]], arrays: bool) -> list[Sample]:
    """The samples of one rollout whose calls `nodes()` gives, in seq order (none for an unfinished or infra-failed one)."""
    rollout_id, status = str(rollout["rollout_id"]), rollout.get("status")
    if status in NO_SAMPLES:
        return []
    if status in UNFINISHED:
        log.warning("rollout %s is still %s: its reward is not final, no samples", rollout_id, status)
        return []
    return [_sample(b, rollout, arrays) for b in _merge(_calls(nodes(), rollout_id), rollout_id)]


# ----------------------------------------------------------------------------- the store
ROLLOUT_COLS = ("rollout_id", "run_id", "task_id", "step", "reward", "status")
CALL_COLS = (
    "call_id",
    "status",
    "prompt_token_ids",
    "prompt_new_token_ids",
    "parent_call_id",
    "prefix_tokens",
    "completion_token_ids",
    "completion_logprobs",
    "weights_version",
    "extends_parent",
)


TOKEN_COLS = ("c_prompt_token_ids", "c_prompt_new_token_ids", "c_completion_token_ids")
MAKE_COLS = ("call_id", "status", "prompt_token_ids", "prompt_new_token_ids", "parent_call_id", "prefix_tokens",
             "completion_token_ids", "completion_logprobs", "weights_version", "extends_parent")  # _make's arguments


def _cursor(store_or_cursor: Any) -> Any:
    """A DuckDB cursor from a `Store` (flushed first, so queued calls are read) or a connection/cursor."""
    if hasattr(store_or_cursor, "flush") and hasattr(store_or_cursor, "cursor"):
        store_or_cursor.flush()
        return store_or_cursor.cursor()
    return store_or_cursor


def _run_sql(run_id: str, step: int | None, rollout_ids: Sequence[str] | None) -> tuple[str, list[Any]]:
    """The one query for a run's trainable rollouts and the calls of their last attempt (compact prompts as stored:
    calls of any status are read, as the parents a compact prompt may name)."""
    # no ORDER BY: sorting the token columns in DuckDB costs as much as reading them; seq orders them in Python
    cols = [f"r.{c}" for c in ROLLOUT_COLS] + [f"c.{c} AS c_{c}" for c in ("seq", *CALL_COLS)]
    where, params = ["r.run_id = ?", "list_contains(?, r.status)"], [run_id, list(TRAINABLE_STATUSES)]
    if step is not None:
        where.append("coalesce(r.step, 0) = ?")
        params.append(step)
    if rollout_ids is not None:
        where.append("list_contains(?, r.rollout_id)")
        params.append(list(rollout_ids))
    sql = (
        f"SELECT {', '.join(cols)} FROM rollouts r LEFT JOIN calls c "
        "ON c.rollout_id = r.rollout_id AND coalesce(c.attempt, 0) = coalesce(r.attempt, 0) "
        f"WHERE {' AND '.join(where)}"
    )
    return sql, params


def _column(values: Any) -> list[Any]:
    """One fetched column as a list, None where NULL."""
    if not isinstance(values, np.ma.MaskedArray):
        return list(values.tolist() if values.dtype != object else values)
    mask = np.ma.getmaskarray(values)
    data = values.data.tolist() if values.data.dtype != object else list(values.data)
    return [None if m else v for v, m in zip(data, mask.tolist(), strict=True)]


def samples_for_run(
    store_or_cursor: Any, run_id: str, *, step: int | None = None, rollout_ids: Sequence[str] | None = None
) -> list[Sample]:
    """Samples of a run's finished rollouts (optionally one step's, or the given rollouts), read in one query."""
    cur = _cursor(store_or_cursor)
    sql, params = _run_sql(run_id, step, rollout_ids)
    try:
        fetched = cur.execute(sql, params).fetchnumpy()
    except duckdb.Error as exc:
        raise StoreError(f"cannot read the calls of run {run_id}: {exc}") from exc
    cols = {name: _column(values) for name, values in fetched.items()}
    for name in TOKEN_COLS:  # token text (or older stores' lists) to int32 arrays, a column at a time
        cols[name] = ids_column(cols[name])
    rollout_ids, seqs, call_ids = cols["rollout_id"], cols["c_seq"], cols["c_call_id"]
    by_rollout: dict[str, list[int]] = {}
    for i, rollout_id in enumerate(rollout_ids):
        by_rollout.setdefault(rollout_id, []).append(i)
    # a call's values straight from the columns, in _make's order (no dict per row)
    values = list(zip(*(cols[f"c_{c}"] for c in MAKE_COLS), strict=True))
    samples: list[Sample] = []
    for rollout_id in sorted(by_rollout):
        group = sorted(by_rollout[rollout_id], key=lambda i: -1 if seqs[i] is None else seqs[i])
        rollout = {c: cols[c][group[0]] for c in ROLLOUT_COLS}
        samples += _samples(rollout, lambda group=group: [_make(*values[i]) for i in group if call_ids[i] is not None], True)
    if log.isEnabledFor(logging.INFO):  # diagnostics sums every loss mask
        log.info("run %s: %s", run_id, diagnostics(samples).as_dict())
    return samples


def write_samples(store: Any, samples: Iterable[Sample]) -> int:
    """Queue the samples' rows on a `Store` (durable after its next commit); returns how many."""
    rows = [s.row() for s in samples]
    store.insert_samples(rows)
    return len(rows)


# ----------------------------------------------------------------------------- diagnostics
def diagnostics(samples: Sequence[Sample]) -> SampleDiagnostics:
    """Merge rate (calls merged into an existing sample / calls) and branches per rollout."""
    per_rollout: dict[str, int] = {}
    for s in samples:
        per_rollout[s.rollout_id] = per_rollout.get(s.rollout_id, 0) + 1
    calls = sum(s.n_calls for s in samples)
    merged = calls - len(samples)
    return SampleDiagnostics(
        rollouts=len(per_rollout),
        samples=len(samples),
        calls=calls,
        merged_calls=merged,
        merge_rate=merged / calls if calls else 0.0,
        branches_per_rollout=len(samples) / len(per_rollout) if per_rollout else 0.0,
        max_branches=max(per_rollout.values(), default=0),
        tokens=sum(len(s.token_ids) for s in samples),
        trainable_tokens=sum(s.trainable_tokens for s in samples),
    )
