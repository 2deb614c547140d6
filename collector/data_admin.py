"""The running server's data endpoints (loopback admin port): prune, delete, export, snapshot; and periodic pruning.

``agentfunnel prune``, ``delete``, ``export`` and ``snapshot`` post here when a server owns the
file, as ``rescore`` does: the server does the work with its own store (its single writer for
removals, a cursor of its database for copies), on worker threads, never on the event loop.
Paths are absolute (the command resolves them) and confined to the database's directory and
``admin.write_dirs``: whoever holds the admin credential gets no further than the data the server
already holds (a target elsewhere, through ``..`` or a symlink, is refused with 403). The commands
write anywhere their user can by having the server write beside the database and moving the result
(``staged_target``).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any, Callable

from aiohttp import web

from .admin_access import AdminAccess, json_body
from .store.export import export_tables, write_snapshot
from .retention import OLDER_THAN, NotSupported, Retention, cutoffs_for, deletion_json, parse_time

log = logging.getLogger(__name__)


class BadRequest(ValueError):
    """A body the endpoint cannot use; the message says what it wants."""


class OutsideDataDir(BadRequest):
    """A file target outside the directories the admin endpoint may write (answered 403)."""


def write_dirs(settings: Any) -> list[Path]:
    """Where admin requests may write: the database's directory, then ``admin.write_dirs``; resolved."""
    return [settings.store.path.resolve().parent, *(d.resolve() for d in settings.admin.write_dirs)]


def confined(value: Path, settings: Any, key: str = "to") -> Path:
    """``value`` resolved (``..`` collapsed, symlinks followed) if it lies in ``write_dirs``; else OutsideDataDir.

    The resolved path is what gets written, so what was checked is what is written. The database's
    own files (the file, its WAL, the sidecar) are never a target.
    """
    target = value.resolve()
    allowed = write_dirs(settings)
    if not any(target.is_relative_to(d) for d in allowed):
        raise OutsideDataDir(f"{key} {value} resolves to {target}, outside the directories the admin endpoint may "
                             f"write ({', '.join(map(str, allowed))}); allow another with admin.write_dirs")
    db = settings.store.path.resolve()
    if target in (db, db.with_name(db.name + ".wal"), db.with_name(db.name + ".agentfunnel.json")):
        raise BadRequest(f"{key} {value} is one of the database's own files")
    return target


def _strings(doc: dict[str, Any], key: str) -> list[str]:
    value = doc.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise BadRequest(f"{key} must be a list of non-empty strings")
    return value


def _path(doc: dict[str, Any], key: str, settings: Any) -> Path:
    value = doc.get(key)
    if not isinstance(value, str) or not Path(value).is_absolute() or "\x00" in value:
        raise BadRequest(f"{key} must be an absolute path")
    return confined(Path(value), settings, key)


def _time(doc: dict[str, Any], key: str) -> Any:
    value = doc.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadRequest(f"{key} must be an ISO 8601 time")
    return parse_time(value, f"--{key}")


def add_routes(app: web.Application, access: AdminAccess, store: Any, retention: Retention) -> None:
    """``/prune``, ``/delete``, ``/export`` and ``/snapshot`` on the admin app, behind its checks (``access``);
    copies read through ``store``'s reader cursors, removals go through ``retention`` (the store's single writer)."""
    settings = access.settings

    def endpoint(work: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable[[web.Request], Any]:
        async def handle(request: web.Request) -> web.Response:
            if (refused := access.refused(request)) is not None:
                return refused
            doc = await json_body(request)
            if not isinstance(doc, dict):
                return web.json_response({"error": "the body must be a JSON object"}, status=400)
            try:
                result = await access.run(work, doc)
            except NotSupported as exc:
                return web.json_response({"error": str(exc)}, status=409)
            except OutsideDataDir as exc:
                access.metrics.inc("admin_refused", label="outside_data_dir")
                return web.json_response({"error": str(exc)}, status=403)
            except (BadRequest, ValueError, OSError) as exc:
                return web.json_response({"error": str(exc)}, status=400)
            return web.json_response(result)
        return handle

    def prune(doc: dict[str, Any]) -> dict[str, Any]:
        before = _time(doc, "before")
        if before is not None:
            cutoffs = {t: before for t in OLDER_THAN}
        else:
            cutoffs = cutoffs_for(settings)
            if not cutoffs:
                raise BadRequest("no retention is configured (retention.raw_days, derived_days or tables); "
                                 "give --before DATE")
        return {"removed": retention.prune(cutoffs)}

    def delete(doc: dict[str, Any]) -> dict[str, Any]:
        done = retention.delete(_strings(doc, "users"), _strings(doc, "sessions"))
        return deletion_json(done)

    def export(doc: dict[str, Any]) -> dict[str, Any]:
        if settings.store.lake is not None:
            raise NotSupported("export reads a file of its own; a lake's data is already Parquet under its data_path")
        tables = _strings(doc, "tables") or None
        cursor = store.reader()
        try:
            rows = export_tables(cursor, _path(doc, "to", settings), *([tables] if tables else []),  # type: ignore[misc,arg-type]  # a reader cursor reads as a connection does; tables given or not
                                 since=_time(doc, "since"), until=_time(doc, "until"))
        finally:
            cursor.close()
        return {"rows": rows}

    def snapshot(doc: dict[str, Any]) -> dict[str, Any]:
        if settings.store.lake is not None:
            raise NotSupported("snapshot copies a file of its own; a lake is read by any DuckDB with the "
                               "ducklake extension")
        out = _path(doc, "to", settings)
        cursor = store.reader()
        try:
            return {"rows": write_snapshot(cursor, out)}  # type: ignore[arg-type]  # a reader cursor reads as a connection does
        finally:
            cursor.close()

    for name, work in (("prune", prune), ("delete", delete), ("export", export), ("snapshot", snapshot)):
        app.router.add_post(f"/{name}", endpoint(work))


async def snapshot_forever(retention: Retention, out: Path, interval: float) -> None:
    """``store.snapshot_path`` rewritten every ``interval`` seconds (the first one after one interval), as
    ``agentfunnel snapshot`` writes it: readers of the copy never see half of one."""
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(interval)
        try:
            await loop.run_in_executor(None, retention.write_snapshot)
        except Exception:  # noqa: BLE001 - counted and logged; the next one tries again
            retention.metrics.inc("snapshot_errors")
            log.exception("the periodic snapshot to %s failed", out)
            continue
        retention.metrics.inc("snapshots_written")


async def prune_forever(retention: Retention, interval: float) -> None:
    """The configured time-to-live, applied every ``interval`` seconds (the first pass soon after start)."""
    loop = asyncio.get_running_loop()
    delay = min(interval, 5.0)
    while True:
        await asyncio.sleep(delay)
        delay = interval
        try:
            removed = await loop.run_in_executor(None, retention.prune_configured)
        except Exception:  # noqa: BLE001 - counted and logged; the next pass tries again
            retention.metrics.inc("prune_errors")
            log.exception("pruning failed")
            continue
        if any(removed.values()):
            log.info("pruned %s", ", ".join(f"{n} {t}" for t, n in removed.items() if n))
