"""Where things are on a lake: which replica owns a session, its schema, the catalog's name, and how a commit
that lost a race with another replica's is tried again."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import TypeVar

import duckdb

from ...config import LakeSettings
from ..tables import Placement, owner_of

__all__ = ["CATALOG", "READERS", "LakeUnavailable", "lake_placement", "owner_of", "retry_conflicts", "schema_of"]

log = logging.getLogger(__name__)
T = TypeVar("T")
CATALOG = "lake"
READERS = f"{CATALOG}.main"
RACED = re.compile(r"already exists|duplicate key|conflict", re.IGNORECASE)


class LakeUnavailable(RuntimeError):
    """The lake cannot be opened here (extension wheels missing, catalog unreachable)."""


def schema_of(replica: int) -> str:
    return f"r{replica}"


def lake_placement(lake: LakeSettings) -> Placement:
    """A replica's placement: the sessions ``owner_of`` gives it; it follows the others' assemblies at
    ``follow_interval_seconds`` and lets idle traces wait up to a shipment's interval for a fuller job; another
    replica may (re)assemble a trace of a session it owns."""
    return Placement(replica=lake.replica, replicas=lake.replicas, poll_interval_seconds=lake.follow_interval_seconds,
                     job_wait_seconds=lake.ship_interval_seconds, assembles_every_trace=False)


def retry_conflicts(fn: Callable[[], T], attempts: int = 20) -> T:
    """Run catalog changes again when another replica committed a conflicting one first."""
    for attempt in range(attempts):
        try:
            return fn()
        except (duckdb.TransactionException, duckdb.CatalogException) as exc:
            if attempt == attempts - 1 or not RACED.search(str(exc)):
                raise
            log.info("lake catalog conflict, retrying: %s", str(exc).splitlines()[-1])
            time.sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")
