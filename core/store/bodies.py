"""Request bodies stored as deltas: a body that repeats an earlier one keeps only what is new.

Harnesses resend their whole history on every call, so call n's body is call n-1's with the new turns
spliced in (and sometimes a marker moved, like Claude Code's `cache_control`). The writer stores such a
body as a splice on an earlier body (its base): the base's first `request_head` characters, then
`request_new`, then the base's last `request_tail` characters. Offsets count characters (Unicode code
points), as Python slices and DuckDB's `substring`/`right` do, so the store's views rebuild the exact
text; `request` is NULL on such rows. A base is an earlier body of the same rollout, or the first body
of an earlier rollout stored whole (every rollout of a run starts with the same tools and system
prompt), so rebuilding a rollout needs its own rows and at most one row outside it.

A body is stored whole (`request` as before, `request_form` says why) when it is the first of its
kind, when it shares too little with every candidate base (re-ordered or rewritten history: the
delta would not save half), when it is not JSON (the `request` column then refuses it as before and
the row is kept in `store_errors`), or when its chain reached `MAX_DEPTH` (bounds a rebuild).

A single common-prefix/common-suffix splice, rather than a general diff (difflib, bsdiff): harness
bodies change in one place (the end of the history array, followed by the unchanged tools and
settings), the splice is found with a few C-level slice comparisons, and SQL can rebuild it with
`substring` and `right`; a general diff would need a patch language in SQL.
"""

from __future__ import annotations

import logging
from bisect import bisect_left, bisect_right
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

log = logging.getLogger(__name__)

MIN_BODY_CHARS = 1024  # smaller bodies are stored whole: a delta would save little and cost a rebuild
MAX_DEPTH = 1000  # a chain this long gets a whole body again (a rebuild walks the chain)
KEEP_PER_ROLLOUT = 3  # candidate bases per rollout attempt: the latest bodies (side calls interleave)
KEEP_ROOTS = 4  # candidate bases from earlier rollouts: the latest whole first bodies
MAX_KEPT_CHARS = 64_000_000  # bodies remembered in all (the least recently written rollouts are forgotten first)

WHOLE = "whole"
DELTA = "delta"
DIVERGED = "whole:diverged"
NOT_JSON = "whole:not_json"
DEEP = "whole:deep"


@dataclass(frozen=True)
class Body:
    """A body the writer stored: its call, text, chain depth (0 = whole) and rollout."""

    call_id: str
    text: str
    depth: int
    rollout: tuple[str, int]


def common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix (binary search over slice comparisons, each one memcmp)."""
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while lo < hi:  # invariant: a[:lo] == b[:lo] and a[:hi] != b[:hi]
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def common_suffix(a: str, b: str, limit: int) -> int:
    """Length of the longest common suffix, at most `limit`."""
    lo, hi = 0, min(len(a), len(b), limit)
    if hi == 0 or a[len(a) - hi :] == b[len(b) - hi :]:
        return hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[len(a) - mid :] == b[len(b) - mid :]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def splice(base: str, body: str) -> tuple[int, int]:
    """(head, tail): body == base[:head] + body[head:len(body) - tail] + base[len(base) - tail:]."""
    head = common_prefix(base, body)
    return head, common_suffix(base, body, min(len(base), len(body)) - head)


def rebuild(base: str, head: int, new: str, tail: int) -> str:
    """A delta-stored body from its base's text (what the store's views do in SQL)."""
    return base[:head] + new + (base[len(base) - tail :] if tail else "")


Piece = tuple[str, int, int]  # text[start:end] of some stored string


def _cut(pieces: list[Piece], starts: list[int], a: int, b: int) -> list[Piece]:
    """Characters [a, b) of the text `pieces` spell (`starts`: where each piece begins)."""
    if a >= b:
        return []
    i, j = bisect_right(starts, a) - 1, bisect_left(starts, b)
    out = pieces[i:j]
    src, s, e = pieces[i]
    out[0] = (src, s + a - starts[i], e)
    src, s, e = out[-1]
    last = pieces[j - 1][1]  # the last piece's own start, before any cut above
    out[-1] = (src, s, last + b - starts[j - 1])
    return out


def compose(base: str, steps: list[tuple[int, str, int]]) -> str:
    """`base` spliced by each (head, new, tail) in turn, as one join at the end: a chain of n splices costs the
    final text's length plus n cuts of a piece list, not n copies of the growing text (what `rebuild` in a loop costs)."""
    pieces: list[Piece] = [(base, 0, len(base))]
    starts, total = [0], len(base)
    for head, new, tail in steps:
        pieces = _cut(pieces, starts, 0, head) + ([(new, 0, len(new))] if new else []) + _cut(pieces, starts, total - tail, total)
        total = head + len(new) + tail
        starts = [0]
        for _, s, e in pieces[:-1]:
            starts.append(starts[-1] + e - s)
    return "".join(src[s:e] for src, s, e in pieces)


def is_json(text: str) -> bool:
    """Whether `text` parses as JSON (orjson; nesting deeper than it takes counts as not JSON here)."""
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return True


class BodyDeltas:
    """The writer thread's memory of recent bodies, and the encoder that turns a `calls` row's body into a delta.

    `encode` returns the row's body columns; `commit` makes the bodies of a committed batch candidate bases
    (a body whose row failed must never become one); `discard` forgets an uncommitted batch.
    """

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled
        self._rollouts: OrderedDict[tuple[str, int], deque[Body]] = OrderedDict()
        self._kept = 0  # characters of the bodies in `_rollouts`
        self._roots: dict[str, deque[Body]] = {}  # per api: whole first bodies of earlier rollouts
        self._pending: list[tuple[Body, str | None, bool]] = []

    def encode(self, row: dict[str, Any], text: str | None) -> dict[str, Any]:
        """The body columns for `row` (`request` as JSON text, or NULL and the splice columns)."""
        if text is None or not self.enabled:
            return {"request": text}
        rollout = (str(row.get("rollout_id")), int(row.get("attempt") or 0))
        call_id = str(row.get("call_id"))
        api = row.get("api")
        mine = self._candidates(rollout)
        roots = [*self._roots.get(api, ()), *(b for b, a, first in self._pending if first and a == api and b.depth == 0)]
        roots = [r for r in roots if r.rollout != rollout][-KEEP_ROOTS:] if api else []
        form = WHOLE
        out: dict[str, Any] = {"request": text}
        if len(text) >= MIN_BODY_CHARS and (mine or roots):
            if not is_json(text):
                form = NOT_JSON
            else:
                best = self._best(text, mine, roots)
                if best is None:
                    form = DIVERGED if mine else WHOLE  # no earlier rollout's first body fits: a first body, whole
                elif best[0].depth + 1 > MAX_DEPTH:
                    form = DEEP
                else:
                    base, head, tail = best
                    out = {
                        "request": None,
                        "request_base": base.call_id,
                        "request_head": head,
                        "request_tail": tail,
                        "request_new": text[head : len(text) - tail],
                    }
                    form = DELTA
                    self._pending.append((Body(call_id, text, base.depth + 1, rollout), api, False))
        if form != DELTA:
            self._pending.append((Body(call_id, text, 0, rollout), api, not mine))
        out["request_form"] = form
        return out

    def _candidates(self, rollout: tuple[str, int]) -> list[Body]:
        """This rollout attempt's latest bodies, those of the batch being written included."""
        kept = list(self._rollouts.get(rollout, ()))
        kept += [b for b, _, _ in self._pending if b.rollout == rollout]
        return kept[-KEEP_PER_ROLLOUT:]

    @staticmethod
    def _best(text: str, mine: list[Body], roots: list[Body]) -> tuple[Body, int, int] | None:
        """The base that leaves the least new text, when that saves at least half the body."""
        best: tuple[Body, int, int] | None = None
        saved = len(text) // 2
        # the rollout's own bodies first, latest first; then earlier rollouts' whole first bodies
        for base in [*reversed(mine), *reversed(roots)]:
            head, tail = splice(base.text, text)
            if head + tail > saved:
                best, saved = (base, head, tail), head + tail
        return best

    def commit(self) -> None:
        """The pending bodies were committed: they may be bases now."""
        for body, api, first in self._pending:
            kept = self._rollouts.get(body.rollout)
            if kept is None:
                kept = self._rollouts[body.rollout] = deque()
            else:
                self._rollouts.move_to_end(body.rollout)
            kept.append(body)
            self._kept += len(body.text)
            if len(kept) > KEEP_PER_ROLLOUT:
                self._kept -= len(kept.popleft().text)
            if first and body.depth == 0 and api:
                self._roots.setdefault(api, deque(maxlen=KEEP_ROOTS)).append(body)
        self._pending.clear()
        while self._kept > MAX_KEPT_CHARS and len(self._rollouts) > 1:  # a finished rollout's bodies go first
            _, gone = self._rollouts.popitem(last=False)
            self._kept -= sum(len(b.text) for b in gone)

    def discard(self) -> None:
        """The batch was rolled back: none of its bodies may be a base."""
        self._pending.clear()


# ----------------------------------------------------------------------------- reading bodies back
DELTA_COLUMNS = ("request_base", "request_head", "request_tail", "request_new")
# the body columns a store has: schema 5's splice columns, or `request` alone in an older store opened read-only
REQUEST_COLUMNS_SQL = "COLUMNS(lambda c: c IN ('request', 'request_base', 'request_head', 'request_tail', 'request_new'))"


def fill_requests(rows: Sequence[dict[str, Any]], fetch: Callable[[list[str]], list[dict[str, Any]]]) -> None:
    """Put each row's whole request body (JSON text) in `row["request"]`, rebuilding delta-stored ones.

    `rows` hold `call_id` and the columns `REQUEST_COLUMNS_SQL` selects; `fetch(call_ids)` returns the same
    columns for bases outside `rows` (another rollout's first body). A body whose base row is missing stays
    None (logged). In Python rather than through the store's SQL macros: a slice and a join per step, about
    ten times faster than DuckDB's recursive query on long histories, and it reads stores of either layout.
    """
    known: dict[str, dict[str, Any]] = {str(r["call_id"]): r for r in rows}
    missing = _missing_bases(known.values(), known)
    while missing:
        more = {str(r["call_id"]): r for r in fetch(sorted(missing))}
        known.update(more)
        missing = _missing_bases(more.values(), known) - missing
    texts: dict[str, str | None] = {}
    wanted = {str(r["call_id"]) for r in rows}
    for row in rows:
        row["request"] = _text(str(row["call_id"]), known, texts, wanted)
        for column in DELTA_COLUMNS:
            row.pop(column, None)


def _missing_bases(rows: Any, known: dict[str, Any]) -> set[str]:
    return {str(r["request_base"]) for r in rows if r.get("request_base") is not None and str(r["request_base"]) not in known}


def _text(call_id: str, known: dict[str, dict[str, Any]], texts: dict[str, str | None], wanted: set[str]) -> str | None:
    """One body, walking up to a whole (or already rebuilt) body, then splicing back down (no recursion); of the
    bodies on the way, only the `wanted` ones are built (whatever order the rows come in, each is built once)."""
    chain: list[dict[str, Any]] = []
    cid: str | None = call_id
    while cid is not None and cid not in texts:
        row = known.get(cid)
        if row is None:
            log.warning("request body of call %s: its base %s is not in the store; read as NULL", call_id, cid)
            texts[cid] = None
            break
        if row.get("request_base") is None:
            request = row.get("request")
            texts[cid] = request if request is None or isinstance(request, str) else str(request)
            break
        chain.append(row)
        cid = str(row["request_base"])
    if chain:
        base = texts[str(chain[-1]["request_base"])]
        steps: list[tuple[int, str, int]] = []
        for row in reversed(chain):
            steps.append((int(row["request_head"]), str(row["request_new"] or ""), int(row["request_tail"])))
            cid = str(row["call_id"])
            if cid == call_id or cid in wanted:
                base = None if base is None else compose(base, steps)
                texts[cid], steps = base, []
    return texts[call_id]


def _dicts(result: Any) -> list[dict[str, Any]]:
    names = [d[0] for d in result.description]
    return [dict(zip(names, values, strict=True)) for values in result.fetchall()]


def _fetch_from(cur: Any) -> Callable[[list[str]], list[dict[str, Any]]]:
    sql = f"SELECT call_id, {REQUEST_COLUMNS_SQL} FROM calls WHERE list_contains(?, call_id)"
    return lambda ids: _dicts(cur.execute(sql, [ids]))


def select_calls(cur: Any, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
    """The rows of `sql` as dicts, whole request bodies in `request`: `sql` selects `call_id` and names the body
    columns as `{request}` (e.g. `SELECT call_id, api, {request} FROM calls WHERE ...`), on either layout."""
    rows = _dicts(cur.execute(sql.format(request=REQUEST_COLUMNS_SQL), list(params)))
    fill_requests(rows, _fetch_from(cur))
    return rows


def request_of(cur: Any, call_id: str) -> str | None:
    """One call's whole request body (JSON text; None when it has none or it is not in the store)."""
    sql = f"SELECT call_id, {REQUEST_COLUMNS_SQL} FROM calls WHERE rollout_id = (SELECT rollout_id FROM calls WHERE call_id = ?)"
    rows = _dicts(cur.execute(sql, [call_id]))
    mine = [r for r in rows if r["call_id"] == call_id]
    if not mine:
        return None
    context = {str(r["call_id"]): r for r in rows}  # the chain walks up through the rollout's rows, fetched once
    fetch = _fetch_from(cur)
    fill_requests(mine, lambda ids: [context[i] for i in ids if i in context] + (fetch(rest) if (rest := [i for i in ids if i not in context]) else []))
    return mine[0]["request"]
