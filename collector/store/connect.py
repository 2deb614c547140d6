"""Connections as every agentfunnel connection has them: UTC, no extension loaded behind our back, and locked
down before users' SQL runs."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from pathlib import Path
from typing import Any

import duckdb


class _NotInstalled(importlib.abc.MetaPathFinder):
    """Fails the import of modules known to be missing at once, instead of searching ``sys.path`` again."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name in self.names:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def settle_optional_imports() -> None:
    """Make a missing pandas fail to import at once, where it is missing.

    DuckDB 1.5 (the lake's) tries to import pandas for every statement with parameters, twice a
    parameter; without pandas each try searches ``sys.path`` again, which cost 0.1 ms for one
    parameter and 0.26 ms for a list, in a statement of 0.2 ms (about a fifth of a shipment's
    writer time). Where pandas is installed nothing changes: it is imported once and kept.
    """
    if any(isinstance(f, _NotInstalled) for f in sys.meta_path):
        return
    if "pandas" not in sys.modules and importlib.util.find_spec("pandas") is None:
        sys.meta_path.insert(0, _NotInstalled(frozenset({"pandas"})))


def connect(path: Path | str, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """A connection with the session settings every agentfunnel connection uses.

    Extensions are never installed or loaded behind our back: a query naming one is an error,
    not a download.
    """
    settle_optional_imports()
    con = duckdb.connect(str(path), read_only=read_only,
                         config={"autoinstall_known_extensions": "false", "autoload_known_extensions": "false"})
    con.execute("SET TimeZone = 'UTC'")
    return con


def lock_down(con: duckdb.DuckDBPyConnection, allowed_directories: tuple[str, ...] = (), no_files: bool = False) -> None:
    """No file, network or extension access from SQL, and no configuration changes, from now on.

    Applied once the store has set what it needs: the database's own file, WAL and temporary
    files stay usable, and Arrow tables registered from Python still scan, but users' SQL cannot
    read ``/proc/self/environ``, write with COPY, ATTACH another file or change the memory limit.
    Database-wide and one-way: DuckDB offers no way to turn it back on. ``allowed_directories``
    stay reachable (a lake's Parquet files). ``no_files``: not even the database's own file and log
    can be opened by a statement (a reader whose file is already open needs nothing more).
    """
    if allowed_directories:
        listed = ", ".join("'" + d.replace("'", "''") + "'" for d in allowed_directories)
        con.execute(f"SET allowed_directories = [{listed}]")
    con.execute("SET enable_external_access = false")
    if no_files:
        con.execute("SET disabled_filesystems = 'LocalFileSystem'")
    con.execute("SET lock_configuration = true")
