"""What lenient reading passed over, counted by dialect and reason, and logged once per dialect and field.

``normalize`` (lenient, the default) never raises on telemetry: a dialect's ``extract`` that raises on a span
is passed over, and a field it returns that ``SpanRecord`` does not take is dropped; ``read_messages`` passes
over a dialect whose ``messages`` raises. Each is a fault of the dialect's code (a misspelled field, input it
did not expect), so each is counted here and logged the first time it happens for that dialect and field (or
exception type), naming the span; the collector's ``/metrics`` shows the counts (``dialect_reads_dropped``).

The tally is the process's: ``semconv`` reports to nothing above it. Its keys are names from dialect code
(dialects, reasons, field names, exception types), never values from telemetry, so it stays small.
"""

from __future__ import annotations

import logging
import threading

EXTRACT_ERROR = "extract_error"  # a dialect's extract raised on a span: its fields for that span are lost
UNKNOWN_FIELD = "unknown_field"  # a dialect returned a field SpanRecord does not take (a misspelling): dropped
MESSAGES_ERROR = "messages_error"  # a dialect's messages raised on a span: the next dialect was asked
REASONS = (EXTRACT_ERROR, UNKNOWN_FIELD, MESSAGES_ERROR)
# (dialect, reason, field) triples remembered as logged: names from dialect code, so few; the bound holds should
# a faulty dialect return keys taken from telemetry (past it, drops are still counted, no longer logged).
MAX_LOGGED = 1024

log = logging.getLogger("agentfunnel.semconv")


class Dropped:
    """Thread-safe counts by (dialect, reason), and the (dialect, reason, field) triples already logged."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], int] = {}
        self._logged: set[tuple[str, str, str]] = set()

    def add(self, dialect: str, reason: str, field: str, detail: str) -> None:
        """Count one; log ``detail`` (what happened, on which span) the first time for this dialect and field."""
        with self._lock:
            key = (dialect, reason)
            self._counts[key] = self._counts.get(key, 0) + 1
            first = (dialect, reason, field) not in self._logged and len(self._logged) < MAX_LOGGED
            if first:
                self._logged.add((dialect, reason, field))
        if first:
            log.warning("dialect %s: %s (%s; logged once for this dialect and %s, counted in "
                        "dialect_reads_dropped)", dialect, detail, reason, field)

    def counts(self) -> dict[str, int]:
        """The counts by ``<dialect>:<reason>``."""
        with self._lock:
            return {f"{dialect}:{reason}": n for (dialect, reason), n in sorted(self._counts.items())}


DROPPED = Dropped()

__all__ = ["DROPPED", "EXTRACT_ERROR", "MAX_LOGGED", "MESSAGES_ERROR", "REASONS", "UNKNOWN_FIELD", "Dropped"]
