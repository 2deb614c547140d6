"""Numbers in plain words: a count with the noun that agrees with it, a float with fixed decimals.

Below the report and the judge audit, so the audit's gates and the commands' lines read as the report
does without importing the report (which loads its data and rich).
"""

from __future__ import annotations


def plural(n: int, one: str, many: str | None = None) -> str:
    """``n`` and the noun that agrees with it: "1 session", "2 sessions", "1 criterion", "3 criteria"."""
    return f"{n} {one if n == 1 else many or one + 's'}"


def fixed(x: float, digits: int = 2) -> str:
    """``x`` with ``digits`` decimals, never a negative zero: -0.001 reads 0.00, not -0.00."""
    out = f"{x:.{digits}f}"
    return out[1:] if out.startswith("-") and not out.strip("-0.") else out
