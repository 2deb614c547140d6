"""Shared storage on DuckLake: one schema per replica, union views for readers, one owner per session.

DuckLake commits concurrent appends to one table, but an UPDATE or DELETE conflicts with any
concurrent write to the same table, and it has no PRIMARY KEY or UNIQUE. So every replica writes
only into its own schema (``lake.r<i>``, the ordinary migrations minus the constraints it lacks):
each table has exactly one writer and the store's UPDATE/DELETE code runs unchanged. Readers use
the views in ``lake.main``, named like the tables, that put the schemas together; spans and logs
are de-duplicated there, and the newest row of a session wins (after a change of ``replicas``
two owners may both have written one).

Each session has one owner, ``owner_of(session_id, replicas)``; only it writes the session's rows
(sessions, case runs, judgments and the per-call step results in ``call_scores``). The extensions
are loaded from their PyPI wheels (the ``lake`` extra): nothing is downloaded at run time.

A replica does not commit to the lake as it ingests: its writer connection is its own DuckDB file
(``store.path``, the single-process store, where requests are acknowledged and the session stage
runs) with the lake attached as ``lake``; ``shipper`` copies what it committed to ``lake.r<i>``
in large transactions, and the session stage reads the other replicas' rows from the lake.

The package's parts, each importing only those after it: ``tables`` (the session stage's tables on
a replica and on a reader), ``catalog`` (attaching, schemas, readers' views, the change feed,
maintenance), ``shipper`` (the file to the lake), ``placement`` (who owns what, where it goes).
"""

from .catalog import (EVERY_REPLICA, EXTENSIONS, LAKE_MIGRATIONS, LOCAL_MIGRATIONS, META, REMOTE_COLUMNS, assembled_elsewhere,
                      attach_lake, build_readers, compact, complete_schemas, connect_lake, data_directory, expire,
                      extension_path, file_count, has_metadata, index_everywhere, lake_ddl, local_catalog, open_reader,
                      open_replica, progress, reader_views, replica_sources, schemas_with_rows, set_progress, snapshot,
                      union_sql)
from .placement import CATALOG, READERS, LakeUnavailable, lake_placement, owner_of, retry_conflicts, schema_of
from .tables import LakeSessionTables, ReaderTables

__all__ = [
    "CATALOG", "EVERY_REPLICA", "EXTENSIONS", "LAKE_MIGRATIONS", "LOCAL_MIGRATIONS", "META", "READERS", "REMOTE_COLUMNS",
    "LakeSessionTables", "LakeUnavailable", "ReaderTables", "assembled_elsewhere", "attach_lake", "build_readers",
    "compact", "complete_schemas", "connect_lake", "data_directory", "expire", "extension_path", "file_count",
    "has_metadata", "index_everywhere", "lake_ddl", "lake_placement", "local_catalog", "open_reader", "open_replica",
    "owner_of", "progress", "reader_views", "replica_sources", "retry_conflicts", "schema_of", "schemas_with_rows",
    "set_progress", "snapshot", "union_sql",
]
