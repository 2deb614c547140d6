"""The tests a rule must pass before it fires: pure functions, no database.

- A share (a step's conversion, an outcome's or drop-off reason's share, the judged pass rate,
  judge-human agreement) against a baseline: the pooled two-proportion z-test. Against a
  threshold: the one-sample score test (z with the threshold as the null proportion).
- A tail quantile (p95/p99 cost or latency) against a baseline: the quantile test (Mood's median
  test at the quantile q): values above the pooled q-quantile, as shares of each side, compared
  with the two-proportion z-test. Against a threshold: the binomial test of the quantile, as the
  score test that the share above the threshold exceeds 1 - q.
- pass^k: a parametric bootstrap (each case's passes redrawn from its binomial, seeded), whose
  p-value is the share of resampled differences (or values) on the other side of zero (the threshold).

A p-value is one-sided for a direction (increase, decrease; above, below) and two-sided for ``any``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass


def normal_sf(z: float) -> float:
    """P(Z > z) for a standard normal Z."""
    return 0.5 * math.erfc(z / math.sqrt(2))


def _p_from_z(z: float, direction: str) -> float:
    """``direction``: increase (z > 0 is evidence), decrease (z < 0), any (both)."""
    if direction == "increase":
        return normal_sf(z)
    if direction == "decrease":
        return normal_sf(-z)
    return min(1.0, 2 * normal_sf(abs(z)))


def two_proportion_p(k1: int, n1: int, k0: int, n0: int, direction: str = "any") -> float:
    """p-value that share k1/n1 (current) differs from k0/n0 (baseline) in ``direction`` (pooled z-test)."""
    if n1 <= 0 or n0 <= 0:
        return 1.0
    pooled = (k1 + k0) / (n1 + n0)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n0))
    diff = k1 / n1 - k0 / n0
    if se == 0:  # both sides all-or-nothing: identical, or as different as they can be
        return 1.0 if diff == 0 else (0.0 if _agrees(diff, direction) else 1.0)
    return _p_from_z(diff / se, direction)


def one_proportion_p(k: int, n: int, p0: float, direction: str) -> float:
    """p-value that the share k/n is above (``increase``) or below (``decrease``) ``p0`` (score test)."""
    if n <= 0:
        return 1.0
    diff = k / n - p0
    if p0 <= 0 or p0 >= 1:  # a bound no share can cross the other way: any share past it is certain
        return 0.0 if _agrees(diff, direction) else 1.0
    return _p_from_z(diff / math.sqrt(p0 * (1 - p0) / n), direction)


def _agrees(diff: float, direction: str) -> bool:
    return diff > 0 if direction == "increase" else diff < 0 if direction == "decrease" else diff != 0


def pass_hat_k(n: int, c: int, k: int) -> float:
    """Unbiased pass^k of one case: C(c, k) / C(n, k)."""
    return math.comb(c, k) / math.comb(n, k) if n >= k else float("nan")


def mean_pass_hat_k(cases: Sequence[tuple[int, int]], k: int) -> float | None:
    """Mean pass^k over the cases (runs, passes) with at least k runs; None when none has."""
    values = [pass_hat_k(n, c, k) for n, c in cases if n >= k]
    return sum(values) / len(values) if values else None


def _redraw(cases: Sequence[tuple[int, int]], rng: random.Random) -> list[tuple[int, int]]:
    out = []
    for n, c in cases:
        p = c / n
        out.append((n, sum(1 for _ in range(n) if rng.random() < p)))
    return out


def bootstrap_pass_hat_k_p(current: Sequence[tuple[int, int]], baseline: Sequence[tuple[int, int]] | None,
                           k: int, direction: str, resamples: int = 2000, threshold: float | None = None,
                           seed: int = 0) -> float:
    """p-value that pass^k of ``current`` moved in ``direction`` from ``baseline`` (or from ``threshold``).

    Each resample redraws every case's passes from Binomial(runs, passes/runs); the p-value is
    the share of resampled differences that do not agree with ``direction`` (doubled for ``any``),
    at least 1 / (resamples + 1).
    """
    rng = random.Random(seed)
    cur = [(n, c) for n, c in current if n >= k]
    base = [(n, c) for n, c in (baseline or []) if n >= k]
    if not cur or (baseline is not None and not base):
        return 1.0
    against_up = against_down = 0
    for _ in range(resamples):
        value = mean_pass_hat_k(_redraw(cur, rng), k) or 0.0
        ref = threshold if baseline is None else (mean_pass_hat_k(_redraw(base, rng), k) or 0.0)
        diff = value - (ref or 0.0)
        against_up += diff <= 0  # evidence against an increase
        against_down += diff >= 0
    one = {"increase": against_up, "decrease": against_down}
    if direction in one:
        p = (one[direction] + 1) / (resamples + 1)
    else:
        p = 2 * (min(against_up, against_down) + 1) / (resamples + 1)
    return min(1.0, p)


@dataclass(frozen=True)
class Verdict:
    """What a test concluded: whether the rule fires, how sure it is, and why not when it does not."""

    fires: bool
    p_value: float | None
    reason: str  # fired, quiet, too_few, too_small (a change below min_change)
