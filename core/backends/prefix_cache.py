"""Automatic prefix caching for the built-in backend: KV states keyed by the token ids that produced them.

A radix tree over token ids (the idea of vLLM's automatic prefix caching and SGLang's
RadixAttention): each node holds a run of tokens and their keys and values for every layer, a path
from the root is a cached sequence, and sequences that share a start share its nodes. A harness's
later call starts with its earlier prompt + completion, and every rollout of a run starts with the
harness's system prompt and tool schema: both are found here and prefilled once.

Bounded two ways: at most `max_bytes` of KV states and at most `max_leaves` cached sequences; when
over, the least recently used leaves go first (a node used by a lookup or an insert is "used").
KV states depend on the weights: the owner clears the tree when they change. Prompts whose ids do
not say everything the model saw (images: the pixels are not in the ids) must never be inserted.
Written here (not a library) because transformers has no prefix cache for its own generation loop.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from core.tokens.ids import common_prefix

log = logging.getLogger(__name__)

# kv: a tensor [layers, 2 (keys, values), kv_heads, tokens, head_dim] for the node's tokens
Fetch = Callable[[int, int], Any]  # (start, end) → the kv of the sequence's tokens start..end-1


class _Node:
    __slots__ = ("children", "ids", "kv", "parent", "used")

    def __init__(self, ids: np.ndarray, kv: Any, parent: _Node | None) -> None:
        self.ids = ids
        self.kv = kv
        self.parent = parent
        self.children: dict[int, _Node] = {}
        self.used = 0

    @property
    def nbytes(self) -> int:
        return 0 if self.kv is None else self.kv.numel() * self.kv.element_size()


class PrefixCache:
    """A bounded radix tree of KV states keyed by token ids (see the module docstring)."""

    def __init__(self, max_bytes: int, max_leaves: int = 256) -> None:
        self.max_bytes = int(max_bytes)
        self.max_leaves = max(1, int(max_leaves))
        self._root = _Node(np.zeros(0, dtype=np.int64), None, None)
        self._clock = itertools.count(1)
        self.bytes = 0
        self.leaves = 0  # cached sequences (kept as a count: another thread may read it while the tree changes)
        self.hits = 0  # tokens found cached by lookups
        self.evicted = 0  # leaves dropped to stay within bounds

    # ------------------------------------------------------------------ reading

    def _walk(self, ids: np.ndarray, limit: int) -> tuple[int, list[tuple[_Node, int]]]:
        """The cached length of `ids[:limit]` and the path: (node, tokens of it used) from the root down."""
        node, pos, path = self._root, 0, []
        while pos < limit:
            child = node.children.get(int(ids[pos]))
            if child is None:
                break
            take = common_prefix(child.ids, ids[pos:limit])
            if take == 0:
                break
            path.append((child, take))
            pos += take
            if take < len(child.ids):
                break
            node = child
        return pos, path

    def match_length(self, ids: Sequence[int], limit: int | None = None) -> int:
        """How many leading tokens of `ids` (at most `limit`) are cached; marks nothing as used."""
        arr = np.asarray(ids, dtype=np.int64)
        return self._walk(arr, len(arr) if limit is None else min(limit, len(arr)))[0]

    def lookup(self, ids: Sequence[int], limit: int | None = None) -> tuple[int, list[Any]]:
        """(n, segments): the longest cached start of `ids` (at most `limit` tokens) and its kv, in pieces along the tokens."""
        arr = np.asarray(ids, dtype=np.int64)
        found, path = self._walk(arr, len(arr) if limit is None else min(limit, len(arr)))
        tick = next(self._clock)
        segments = []
        for node, take in path:
            node.used = tick
            segments.append(node.kv if take == len(node.ids) else node.kv[:, :, :, :take])
        self.hits += found
        return found, segments

    def _nodes(self) -> list[_Node]:
        out, stack = [], list(self._root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    # ------------------------------------------------------------------ writing

    def insert(self, ids: Sequence[int], fetch: Fetch) -> int:
        """Cache `ids`; `fetch(start, end)` gives the kv of the tokens not cached yet. Returns the tokens added."""
        arr = np.asarray(ids, dtype=np.int64)
        found, path = self._walk(arr, len(arr))
        tick = next(self._clock)
        parent = self._root
        for node, take in path:
            node.used = tick
            parent = node if take == len(node.ids) else self._split(node, take)
        added = len(arr) - found
        if added <= 0:
            return 0
        kv = fetch(found, len(arr))
        size = kv.numel() * kv.element_size()
        if size > self.max_bytes:  # on its own over the bound: keep the tree as it is
            log.debug("prefix cache: %d tokens (%d bytes) exceed the %d-byte bound; not cached", added, size, self.max_bytes)
            return 0
        leaf = _Node(arr[found:].copy(), kv, parent)
        leaf.used = tick
        if parent.children or parent is self._root:  # else the parent was a leaf and the new one takes its place
            self.leaves += 1
        parent.children[int(arr[found])] = leaf
        self.bytes += size
        self._evict(keep=leaf)
        return added

    def _split(self, node: _Node, at: int) -> _Node:
        """Cut `node` after `at` tokens; the head keeps the node's place and the tail becomes its only child."""
        tail = _Node(node.ids[at:], node.kv[:, :, :, at:].clone(), node)
        tail.children, tail.used = node.children, node.used
        for child in tail.children.values():
            child.parent = tail
        node.ids, node.kv = node.ids[:at], node.kv[:, :, :, :at].clone()
        node.children = {int(tail.ids[0]): tail}
        return node

    def _evict(self, keep: _Node) -> None:
        """Drop least recently used leaves until both bounds hold (`keep`, the newest, only when nothing else is left)."""
        leaves = [n for n in self._nodes() if not n.children]
        while (self.bytes > self.max_bytes or len(leaves) > self.max_leaves) and leaves:
            victim = min([n for n in leaves if n is not keep] or leaves, key=lambda n: n.used)
            leaves.remove(victim)
            parent = victim.parent
            assert parent is not None
            del parent.children[int(victim.ids[0])]
            self.bytes -= victim.nbytes
            self.evicted += 1
            self.leaves -= 1
            if parent is not self._root and not parent.children:
                leaves.append(parent)
                self.leaves += 1

    def clear(self) -> None:
        """Forget everything (the weights changed: every cached state is stale)."""
        self._root.children.clear()
        self.bytes = self.leaves = 0
