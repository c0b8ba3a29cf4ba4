"""Kept only for `core/train/loop.py`'s `Tally` import while the trainers are refactored (issue 46): the vocabulary
lives in `core.status`, the state machine in `core.rollout.transitions`. Delete this module once loop.py imports
`Tally` from `core.status`."""

from __future__ import annotations

from core.status import Tally

__all__ = ["Tally"]
