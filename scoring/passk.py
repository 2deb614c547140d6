"""pass@k and pass^k from n runs with c passes (SPEC §7), with the unbiased estimators.

pass@k is the chance that at least one of k runs drawn without replacement passes (what a system
that retries gets); pass^k the chance that all k pass (what a user who runs it once relies on).
Exact integer arithmetic with ``math.comb``, one division at the end: no float drift for large n.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import comb


def _check(n: int, c: int, k: int) -> None:
    if not (isinstance(n, int) and isinstance(c, int) and isinstance(k, int)):
        raise TypeError("n, c and k are integers")
    if n < 1 or not 0 <= c <= n:
        raise ValueError(f"need n >= 1 and 0 <= c <= n (n={n}, c={c})")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n (k={k}, n={n})")


def pass_at_k(n: int, c: int, k: int) -> float:
    """1 − C(n−c, k)/C(n, k): at least one of k runs passes."""
    _check(n, c, k)
    total = comb(n, k)
    return (total - comb(n - c, k)) / total


def pass_hat_k(n: int, c: int, k: int) -> float:
    """C(c, k)/C(n, k): all k runs pass."""
    _check(n, c, k)
    return comb(c, k) / comb(n, k)


@dataclass(frozen=True)
class PassK:
    k: int
    pass_at_k: float
    pass_hat_k: float


def pass_k_table(n: int, c: int) -> list[PassK]:
    """Both estimators for k = 1..n (k = n reads as "any passed" and "all passed")."""
    return [PassK(k, pass_at_k(n, c, k), pass_hat_k(n, c, k)) for k in range(1, n + 1)]
