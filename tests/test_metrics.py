"""pass@k / pass^k against brute-force enumeration of every k-subset, and the run summary."""

from __future__ import annotations

import math
from itertools import combinations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.eval.passk import mean, pass_at_k, pass_hat_k, summarize


def outcomes(n: int, c: int) -> list[bool]:
    return [True] * c + [False] * (n - c)


def enum_any(n: int, c: int, k: int) -> float:
    subsets = list(combinations(outcomes(n, c), k))
    return sum(any(s) for s in subsets) / len(subsets)


def enum_all(n: int, c: int, k: int) -> float:
    subsets = list(combinations(outcomes(n, c), k))
    return sum(all(s) for s in subsets) / len(subsets)


@st.composite
def nck(draw) -> tuple[int, int, int]:
    n = draw(st.integers(1, 8))
    c = draw(st.integers(0, n))
    k = draw(st.integers(1, n))
    return n, c, k


@given(nck())
def test_pass_at_k_matches_enumeration(args: tuple[int, int, int]) -> None:
    n, c, k = args
    assert pass_at_k(n, c, k) == pytest.approx(enum_any(n, c, k), abs=1e-12)


@given(nck())
def test_pass_hat_k_matches_enumeration(args: tuple[int, int, int]) -> None:
    n, c, k = args
    assert pass_hat_k(n, c, k) == pytest.approx(enum_all(n, c, k), abs=1e-12)


@given(nck())
def test_monotone_in_k(args: tuple[int, int, int]) -> None:
    n, c, _ = args
    at = [pass_at_k(n, c, k) for k in range(1, n + 1)]
    hat = [pass_hat_k(n, c, k) for k in range(1, n + 1)]
    assert all(a <= b + 1e-12 for a, b in zip(at, at[1:], strict=False))
    assert all(a + 1e-12 >= b for a, b in zip(hat, hat[1:], strict=False))
    assert all(h <= a + 1e-12 for h, a in zip(hat, at, strict=True))


@given(st.integers(1, 8), st.data())
def test_pass_at_1_is_success_rate(n: int, data) -> None:
    c = data.draw(st.integers(0, n))
    assert pass_at_k(n, c, 1) == pytest.approx(c / n)
    assert pass_hat_k(n, c, 1) == pytest.approx(c / n)


def test_edge_cases() -> None:
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_hat_k(5, 0, 3) == 0.0
    assert pass_at_k(5, 5, 3) == 1.0
    assert pass_hat_k(5, 5, 3) == 1.0
    assert pass_at_k(4, 1, 4) == 1.0  # k = n: the one success is always drawn
    assert pass_hat_k(4, 3, 4) == 0.0
    assert pass_hat_k(4, 4, 4) == 1.0
    assert pass_at_k(10, 2, 9) == 1.0  # n - c < k


def test_large_n_is_stable() -> None:
    n, c, k = 1000, 7, 100
    exact = 1 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-9)
    assert pass_hat_k(n, 900, 50) == pytest.approx(math.comb(900, 50) / math.comb(n, 50), rel=1e-9)


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError, match="more successes"):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError, match="at least k attempts"):
        pass_at_k(2, 1, 3)


def test_summarize_averages_over_eligible_tasks() -> None:
    per_task = {
        "a": [True, False, False, True],  # n=4, c=2
        "b": [False, False],  # n=2, c=0
        "c": [True],  # n=1
    }
    out = summarize(per_task, ks=[1, 2, 4, 8])
    assert out["tasks"] == 3
    assert out["attempts"] == 7
    assert out["mean"] == pytest.approx((0.5 + 0.0 + 1.0) / 3)
    assert out["ks"] == [1, 2, 4]
    assert out["skipped_ks"] == [8]
    assert out["per_k"][1]["tasks"] == 3
    assert out["per_k"][1]["pass@k"] == pytest.approx(out["mean"])
    assert out["per_k"][2]["tasks"] == 2
    assert out["per_k"][2]["pass@k"] == pytest.approx((enum_any(4, 2, 2) + 0.0) / 2)
    assert out["per_k"][2]["pass^k"] == pytest.approx((enum_all(4, 2, 2) + 0.0) / 2)
    assert out["per_k"][4] == {"pass@k": 1.0, "pass^k": 0.0, "tasks": 1}


def test_summarize_empty_and_mean() -> None:
    out = summarize({}, ks=[1])
    assert out["tasks"] == 0 and out["mean"] is None and out["skipped_ks"] == [1] and out["per_k"] == {}
    assert mean([]) is None
    assert mean([1, 2, 3]) == 2.0
