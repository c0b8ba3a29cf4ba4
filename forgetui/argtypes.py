"""Bounded argparse types: every numeric flag of the CLI takes a finite value in a stated range, or is refused at parse time."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

INT64_MAX = 2**63 - 1  # what a store's BIGINT (and most libraries' C integers) can hold


class Bounded:
    """An argparse `type`: int or float text within [low, high] (finite; no nan/inf); the bounds are kept for tests and help."""

    def __init__(self, kind: type, low: float, high: float, what: str) -> None:
        self.kind, self.low, self.high, self.what = kind, low, high, what
        self.__name__ = what  # argparse names the type in its message

    def __call__(self, text: str) -> int | float:
        try:
            value = self.kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if self.kind is int else 'a number'}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if not self.low <= value <= self.high:
            raise argparse.ArgumentTypeError(f"{text} is out of range: {self.what} must be between {self.low:g} and {self.high:g}")
        return value


def int_range(low: int, high: int = INT64_MAX, what: str = "integer") -> Callable[[str], int]:
    """An integer flag within [low, high]."""
    return Bounded(int, low, high, what)  # type: ignore[return-value]


def float_range(low: float, high: float, what: str = "number") -> Callable[[str], float]:
    """A finite number flag within [low, high]."""
    return Bounded(float, low, high, what)  # type: ignore[return-value]


PORT = int_range(0, 65535, "a TCP port (0 = any free port)")
SECONDS = float_range(0.001, 7 * 24 * 3600.0, "seconds")
