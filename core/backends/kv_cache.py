"""KV-cache layers for the built-in backend's batch: appends written in place into buffers with spare room.

transformers' `DynamicLayer` concatenates the whole cache with each new token (`torch.cat` per layer
per decode step: at 3,000 tokens × 8 rows that copies about a gigabyte per step for SmolLM2). A
`GrowingLayer` keeps its keys and values in buffers with spare columns and writes new tokens into
them; `keys`/`values` are views of the filled part, so the model sees exactly what a DynamicLayer
would hold. It grows by a quarter when full (amortised copies).
"""

from __future__ import annotations

from typing import Any

from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

MIN_SPARE = 64


class GrowingLayer(DynamicLayer):
    """A `DynamicLayer` whose appends write into spare room instead of reallocating the cache."""

    def __init__(self) -> None:
        super().__init__()
        self.length = 0
        self._keys: Any = None
        self._values: Any = None

    def fill(self, keys: Any, values: Any, spare: int = MIN_SPARE) -> None:
        """Hold these [batch, heads, seq, dim] keys and values (copied), with `spare` free columns after them."""
        import torch

        batch, heads, seq, dim = keys.shape
        self._keys = torch.empty(batch, heads, seq + spare, dim, dtype=keys.dtype, device=keys.device)
        self._values = torch.empty_like(self._keys)
        self._keys[:, :, :seq] = keys
        self._values[:, :, :seq] = values
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True
        self._expose(seq)

    def reserve(self, batch: int, heads: int, seq: int, dim: int, spare: int, dtype: Any, device: Any) -> None:
        """Start as `seq` zero columns (left padding, to be written over where a row has states) with `spare` room after."""
        import torch

        self._keys = torch.zeros(batch, heads, seq + spare, dim, dtype=dtype, device=device)
        self._values = torch.zeros_like(self._keys)
        self.dtype, self.device = dtype, device
        self.is_initialized = True
        self._expose(seq)

    def stack(self, other: GrowingLayer, spare: int = MIN_SPARE) -> None:
        """Add `other`'s rows below these, both aligned on their last column (the shorter left-padded with zeros)."""
        import torch

        mine, theirs = self.keys.shape, other.keys.shape
        width = max(mine[2], theirs[2])
        keys = torch.zeros(mine[0] + theirs[0], mine[1], width + spare, mine[3], dtype=self.dtype, device=self.device)
        values = torch.zeros_like(keys)
        for target, a, b in ((keys, self.keys, other.keys), (values, self.values, other.values)):
            target[: mine[0], :, width - mine[2] : width] = a
            target[mine[0] :, :, width - theirs[2] : width] = b
        self._keys, self._values = keys, values
        self._expose(width)

    def truncate(self, length: int) -> None:
        """Forget every column from `length` on (drafts the model rejected); the room stays for the next appends."""
        self._expose(min(length, self.length))

    def _expose(self, length: int) -> None:
        self.length = length
        self.keys = self._keys[:, :, :length]
        self.values = self._values[:, :, :length]

    def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        """Append [batch, heads, new, dim] states; return the keys and values of every cached position."""
        new = key_states.shape[-2]
        if not self.is_initialized:
            self.fill(key_states, value_states, max(MIN_SPARE, new // 4))
            return self.keys, self.values
        need = self.length + new
        if need > self._keys.shape[2]:
            self.fill(self.keys, self.values, max(MIN_SPARE, need // 4) + new)
            need = self.length + new
        self._keys[:, :, self.length : need] = key_states
        self._values[:, :, self.length : need] = value_states
        self._expose(need)
        return self.keys, self.values


def growing_cache(layers: int) -> Cache:
    """An empty cache of `layers` growing layers (what `model(..., past_key_values=...)` fills)."""
    return Cache(layers=[GrowingLayer() for _ in range(layers)])


def batchable(config: Any) -> bool:
    """Whether every attention layer of the model keeps a plain growing cache (no sliding window, no recurrent state)."""
    layers = DynamicCache(config=config).layers
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)
