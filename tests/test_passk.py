"""pass@k and pass^k: the unbiased estimators and the properties a reader relies on (SPEC §7)."""

from __future__ import annotations

from fractions import Fraction
from math import comb

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentfunnel.scoring.passk import pass_at_k, pass_hat_k, pass_k_table


@st.composite
def runs(draw, max_n: int = 40):
    n = draw(st.integers(1, max_n))
    c = draw(st.integers(0, n))
    k = draw(st.integers(1, n))
    return n, c, k


@pytest.mark.parametrize("n,c,k,at,hat", [
    (5, 4, 1, 0.8, 0.8),
    (5, 4, 5, 1.0, 0.0),       # 4 of 5: recoverable, not reliable
    (5, 5, 5, 1.0, 1.0),
    (5, 0, 3, 0.0, 0.0),
    (10, 6, 2, 1 - comb(4, 2) / comb(10, 2), comb(6, 2) / comb(10, 2)),
    (3, 1, 2, 2 / 3, 0.0),
])
def test_known_values(n, c, k, at, hat):
    assert pass_at_k(n, c, k) == pytest.approx(at)
    assert pass_hat_k(n, c, k) == pytest.approx(hat)


@pytest.mark.parametrize("args", [(0, 0, 1), (3, 4, 1), (3, -1, 1), (3, 1, 0), (3, 1, 4)])
def test_out_of_range_is_an_error(args):
    with pytest.raises(ValueError):
        pass_at_k(*args)
    with pytest.raises(ValueError):
        pass_hat_k(*args)


def test_exact_for_large_n():
    """Exact combinatorics, one division: matches rational arithmetic."""
    n, c, k = 500, 250, 100
    expected = 1 - Fraction(comb(n - c, k), comb(n, k))
    assert pass_at_k(n, c, k) == float(expected)
    assert isinstance(pass_hat_k(n, c, k), float)


@given(runs())
def test_bounds_around_the_pass_rate(r):
    n, c, k = r
    at, hat = pass_at_k(n, c, k), pass_hat_k(n, c, k)
    assert 0.0 <= hat <= c / n + 1e-12
    assert c / n <= at + 1e-12 <= 1.0 + 1e-12


@given(runs())
def test_k1_is_the_pass_rate(r):
    n, c, _ = r
    assert pass_at_k(n, c, 1) == pytest.approx(c / n)
    assert pass_hat_k(n, c, 1) == pytest.approx(c / n)


@given(runs())
def test_monotone_in_k(r):
    n, c, _ = r
    table = pass_k_table(n, c)
    assert [row.k for row in table] == list(range(1, n + 1))
    for a, b in zip(table, table[1:]):
        assert b.pass_at_k >= a.pass_at_k - 1e-12
        assert b.pass_hat_k <= a.pass_hat_k + 1e-12


@given(runs())
def test_k_equals_n_is_any_and_all(r):
    n, c, _ = r
    assert pass_at_k(n, c, n) == (1.0 if c > 0 else 0.0)
    assert pass_hat_k(n, c, n) == (1.0 if c == n else 0.0)


@given(runs(max_n=30), st.integers(1, 10))
def test_added_passing_runs_never_lower_either_estimate(r, extra):
    n, c, k = r
    assert pass_at_k(n + extra, c + extra, k) >= pass_at_k(n, c, k) - 1e-12
    assert pass_hat_k(n + extra, c + extra, k) >= pass_hat_k(n, c, k) - 1e-12


@given(runs(max_n=30), st.integers(1, 10))
def test_added_failing_runs_never_raise_either_estimate(r, extra):
    n, c, k = r
    assert pass_at_k(n + extra, c, k) <= pass_at_k(n, c, k) + 1e-12
    assert pass_hat_k(n + extra, c, k) <= pass_hat_k(n, c, k) + 1e-12


@given(runs())
def test_more_passes_among_the_same_runs_never_lower_pass_at_k(r):
    n, c, k = r
    if c < n:
        assert pass_at_k(n, c + 1, k) >= pass_at_k(n, c, k)
        assert pass_hat_k(n, c + 1, k) >= pass_hat_k(n, c, k)


def test_copies_of_the_same_outcomes_can_lower_pass_at_k():
    """Not a monotone property: with one pass in two runs, any 2 of them include the pass;
    with two in four, 1 draw in 6 picks both failures."""
    assert pass_at_k(2, 1, 2) == 1.0
    assert pass_at_k(4, 2, 2) == pytest.approx(5 / 6)
