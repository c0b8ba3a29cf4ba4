"""Token ids as the store keeps them: text with one character per token, compressed by DuckDB's zstd.

Token id `i` is the character U+(i+1), or U+(i+1+0x800) from i = 0xD7FF on (characters can be neither
NUL nor a UTF-16 surrogate, U+D800–U+DFFF), so ids 0–1,112,062 fit: every vocabulary there is. Why text
rather than DuckDB's `INTEGER[]`: DuckDB compresses integer lists by bit-packing at best (12 bits a token
for a 4,096-token vocabulary, 32 with 16 KB blocks, where it does not bit-pack at all), while zstd takes
a harness's token stream, which repeats as much as its text does, to about half a byte a token; SQL still
reads it (`len()` counts tokens, `||` concatenates sequences, the `token_ids(text)` macro gives
`INTEGER[]`), and Python turns it into an array with one C-level codec call (`ids_of`).
Stores before schema 6 hold `INTEGER[]` lists; `ids_of` reads both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from core.errors import StoreError

MAX_ID = 0x10FFFF - 0x801  # the largest id a character can hold
_SHIFT_FROM = 0xD7FF  # ids from here skip the surrogates
_SURROGATES = 0x800



def token_ids_sql(text: str) -> str:
    """SQL reading token text back as INTEGER[] (NULL stays NULL, '' is [])."""
    return f"list_transform(string_split({text}, ''), lambda ch: (unicode(ch) - CASE WHEN unicode(ch) >= 57344 THEN 2049 ELSE 1 END)::INTEGER)"


# The store's SQL macro for it, created with the views
TOKEN_IDS_MACRO = f"CREATE OR REPLACE MACRO token_ids(t) AS {token_ids_sql('t')};"


def token_text_sql(column: str) -> str:
    """SQL turning an `INTEGER[]` column into the stored text (the migration of older stores)."""
    chars = f"list_transform({column}, lambda i: chr(i + CASE WHEN i >= {_SHIFT_FROM} THEN {_SURROGATES + 1} ELSE 1 END))"
    return f"CASE WHEN {column} IS NOT NULL THEN coalesce(list_aggr({chars}, 'string_agg', ''), '') END"


def ids_text(ids: Sequence[int] | np.ndarray | None) -> str | None:
    """The stored text of a token id sequence (None stays None); StoreError for an id no character can hold."""
    if ids is None:
        return None
    if isinstance(ids, str):  # stored text already (a row read back and written again)
        return ids
    try:
        arr = np.asarray(ids)
    except (TypeError, ValueError, OverflowError) as exc:
        raise StoreError(f"token ids must be integers: {exc}") from exc
    if arr.ndim != 1 or arr.size and arr.dtype.kind not in "iu":
        raise StoreError(f"token ids must be a flat sequence of integers, not {arr.dtype} of shape {arr.shape}")
    arr = arr.astype(np.int64, copy=False)
    if arr.size and (arr.min() < 0 or arr.max() > MAX_ID):
        bad = int(arr.min()) if arr.min() < 0 else int(arr.max())
        raise StoreError(f"token id {bad} is outside 0..{MAX_ID}, the ids a store can hold")
    codes = (arr + 1 + (arr >= _SHIFT_FROM) * _SURROGATES).astype("<u4")
    return codes.tobytes().decode("utf-32-le")


def ids_of(value: Any) -> np.ndarray | None:
    """Token ids as an int32 array from a token column's value: stored text (schema 6 on), or a list/array
    (older stores, or rows not stored yet); None stays None."""
    if value is None:
        return None
    if isinstance(value, str):
        ids = np.frombuffer(value.encode("utf-32-le"), dtype="<i4") - 1  # code points fit int32
        if ids.size and ids.max() >= 0xE000 - 1:  # past the surrogates (vocabularies over 55,294 tokens)
            ids[ids >= 0xE000 - 1] -= _SURROGATES
        return ids
    return np.asarray(value, dtype=np.int32)


def ids_column(values: Sequence[Any]) -> list[np.ndarray | None]:
    """`ids_of` of every value of a fetched token column, the texts decoded together (one codec call, then a
    slice each: decoding them one by one costs ~5 us a row in Python overhead alone)."""
    texts = [v for v in values if isinstance(v, str)]
    flat, at, out = ids_of("".join(texts)), 0, []
    for value in values:
        if isinstance(value, str):
            out.append(flat[at : at + len(value)])
            at += len(value)
        else:
            out.append(None if value is None else ids_of(value))
    return out


def id_list(value: Any) -> list[int] | None:
    """`ids_of` as a list of Python ints (JSON, the TUI)."""
    ids = ids_of(value)
    return None if ids is None else ids.tolist()
