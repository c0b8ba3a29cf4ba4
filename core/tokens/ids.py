"""Token-id sequences compared: the helpers the prefix cache, the batch and the trainer's packing share."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def common_prefix(a: Sequence[int] | np.ndarray, b: Sequence[int] | np.ndarray) -> int:
    """Length of the common start of two token-id sequences (lists or arrays; int64 arrays are not copied)."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.flatnonzero(np.asarray(a[:n], dtype=np.int64) != np.asarray(b[:n], dtype=np.int64))
    return int(differ[0]) if differ.size else n
