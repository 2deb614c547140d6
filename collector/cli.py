"""The ``agentfunnel`` console script: the process's own settings, then the command (``collector.commands``)."""

from __future__ import annotations

import gc
import os
import sys

from . import commands
from .telemetry import COLLECTOR_PAUSES

# Assembly and scoring allocate many short-lived containers; with CPython's default thresholds
# (700, 10, 10) the cyclic collector ran often enough to take about a third of the session
# stage's time, rescanning long-lived state (duplicate window, open traces) each full pass.
# Fewer, larger young collections keep that small; reference counting still frees most objects.
GC_THRESHOLDS = (50_000, 20, 20)


def main(argv: list[str] | None = None) -> int:
    gc.set_threshold(*GC_THRESHOLDS)
    COLLECTOR_PAUSES.install()  # /metrics: gc_passes, gc_pause_microseconds
    # Databases, their WAL, sidecars, archives and reports hold what agents and users said: every
    # file agentfunnel creates is readable by its owner only, from the moment it exists.
    os.umask(0o077)
    return commands.main(argv)


if __name__ == "__main__":
    sys.exit(main())
