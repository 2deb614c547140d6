"""Regular expressions written by a user and run on telemetry, matched in linear time.

A case file's pattern or a redaction rule is the user's, but the text it is matched against came
from telemetry: on Python's backtracking ``re``, a crafted value (``aaaa…!`` against ``(a+)+$``)
holds the thread for seconds or hours. RE2 matches in time linear in the text. What it cannot
compile (backreferences, lookaround) is refused where the pattern is configured, with RE2's reason,
never quietly run on ``re``.

Syntax is Python's for everything RE2 shares with it (groups, classes, ``(?P<name>…)``, ``\\1`` in
a replacement); ``\\d``, ``\\w`` and ``\\b`` are ASCII, as in RE2.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import re2

_HEX = frozenset("0123456789abcdefABCDEF")


def _options(*, ignore_case: bool, capture: bool) -> re2.Options:
    options = re2.Options()
    options.log_errors = False  # a refused pattern is reported by the caller, not printed by RE2
    options.never_capture = not capture
    options.case_sensitive = not ignore_case
    return options


def _re2_syntax(pattern: str) -> str:
    """ECMA-262's and Python's ``\\uXXXX`` as RE2's ``\\x{XXXX}``; one pass, so a long pattern costs linear
    time here too."""
    if "\\u" not in pattern:
        return pattern
    out, i, n = [], 0, len(pattern)
    while i < n:
        if pattern[i] != "\\" or i + 1 == n:
            out.append(pattern[i])
            i += 1
        elif pattern[i + 1] == "u" and len(digits := pattern[i + 2:i + 6]) == 4 and _HEX.issuperset(digits):
            out.append("\\x{" + digits + "}")
            i += 6
        else:
            out.append(pattern[i:i + 2])  # any other escape, kept whole
            i += 2
    return "".join(out)


@lru_cache(maxsize=1024)
def linear(pattern: str, *, ignore_case: bool = False, capture: bool = False) -> Any:
    """The compiled pattern (``search``, ``fullmatch``, ``sub`` as in ``re``); ValueError saying why RE2
    refuses it. Cached: the same few patterns are matched against every span."""
    try:
        return re2.compile(_re2_syntax(pattern), _options(ignore_case=ignore_case, capture=capture))
    except re2.error as e:
        why = e.args[0].decode(errors="replace") if e.args and isinstance(e.args[0], bytes) else str(e)
        raise ValueError(f"{pattern[:80]!r} cannot be matched in linear time ({why})") from None
