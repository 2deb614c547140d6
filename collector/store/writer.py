"""The single writer: group commits of span, log and metric batches into DuckDB.

Receivers hand decoded batches to ``Store.submit`` and wait on the returned future; the writer
thread takes everything queued, appends it as Arrow tables in one transaction, commits, and only
then resolves the futures. So an acknowledged span is a committed span, and many requests share
one commit. The queue is bounded in payload bytes: when it is full, ``submit`` raises
``Saturated`` and the receiver pushes back instead of growing.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import operator
import os
import queue
import threading
from collections import deque
import time
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Callable

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from ..batches import LogBatch, SpanBatch
from ..config import StoreSettings
from ..metric_batches import MetricBatch
from ..wire import WIRE
from .export import write_snapshot
from ..errors import PermanentError, RetryableError, Saturated, StoreClosing
from ..telemetry import Metrics
from .dedupe import DedupeWindow
from .guard import StoreUnusable, WalMark, check_files, held_elsewhere, wal_path
from .metrics_table import metrics_arrow_table
from . import lake as lakestore
from .clock import utcnow as _utcnow
from .connect import connect, lock_down  # noqa: F401 (the store's connection helpers, imported from here by callers)
from .lake.shipper import Shipper
from .schema import append_arrow, describe, migrate, transaction

log = logging.getLogger(__name__)
INGEST_GRACE_SECONDS = 0.02  # how long a job that used up its share waits for the next request

_SPAN_COLUMNS = (
    "trace_id", "span_id", "parent_span_id", "name", "kind", "status_code", "status_message",
    "service_name", "scope_name", "scope_version", "attributes", "resource_attributes", "events",
    "links", "trace_state",
)
_LOG_COLUMNS = (
    "record_id", "trace_id", "span_id", "severity", "severity_number", "event_name", "body",
    "attributes", "resource_attributes", "service_name", "scope_name",
)


def handed_over() -> Future:
    """A future for work already handed to a worker: it cannot be cancelled (``cancel()`` is False once running).

    Whoever waits for it may give up (a request cancelled at shutdown cancels what it awaited): the work
    runs all the same, and its result is set without an ``InvalidStateError`` in the worker's callbacks.
    """
    fut: Future = Future()
    fut.set_running_or_notify_cancel()
    return fut


@dataclass(frozen=True, slots=True)
class CommitResult:
    """What the store did with one submitted batch."""

    written: int
    duplicates: int


@dataclass(slots=True)
class _Item:
    batch: SpanBatch | LogBatch | MetricBatch | None
    future: Future
    nbytes: int
    job: Callable[[duckdb.DuckDBPyConnection], Any] | None = None
    queued_at: float = 0.0
    transaction: bool = True  # False: the job runs its own transactions (shipping to a lake)
    work: str = "other"  # what the writer's CPU time for it is counted as (writer_cpu_microseconds)
    on_rollback: Callable[[], None] | None = None  # told on the writer thread when the job's writes are undone


def _one_line(exc: BaseException) -> str:
    """An error's message on one line (DuckDB's run over several)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def _select(values: list[Any], mask: list[bool] | None) -> list[Any]:
    return values if mask is None else [v for v, keep in zip(values, mask) if keep]


# Span columns holding JSON we wrote ourselves (json.JSONEncoder or the compiled decoder, which is
# tested to write the same bytes). Tagged as Arrow's JSON extension type, DuckDB stores the text
# as it is instead of parsing every value again on INSERT; plain strings where pyarrow lacks it.
_SPAN_JSON_COLUMNS = frozenset({"attributes", "resource_attributes", "events", "links"})
_JSON_TYPE = pa.json_(pa.string()) if hasattr(pa, "json_") else None


def _strings(values: list[Any]) -> pa.Array:
    """A utf8 array of str or None; the compiled module fills its buffers when built (pyarrow's
    generic converter costs about 100 ns a value, a tenth of a span's whole write)."""
    if WIRE is None:
        return pa.array(values, pa.string())
    try:
        validity, offsets, data, nulls = WIRE.string_buffers(values)
    except OverflowError:  # over 2 GiB of text in one column: 64-bit offsets
        return pa.array(values, pa.large_string())
    return pa.Array.from_buffers(pa.string(), len(values),
                                 [validity and pa.py_buffer(validity), pa.py_buffer(offsets), pa.py_buffer(data)],
                                 nulls)


def _int64s(values: list[int], arrow_type: pa.DataType) -> pa.Array:
    """An int64-backed array (int64, timestamp[ns]) without nulls, filled like ``_strings``."""
    if WIRE is None:
        return pa.array(values, arrow_type)
    return pa.Array.from_buffers(arrow_type, len(values), [None, pa.py_buffer(WIRE.int64_buffer(values))])


def _column(parts: list[tuple[Any, list[bool] | None]], name: str) -> list[Any]:
    """One column over all parts, masked; the batch's own list when there is nothing to join."""
    if len(parts) == 1:
        b, mask = parts[0]
        return _select(getattr(b, name), mask)
    out: list[Any] = []
    for b, mask in parts:
        out.extend(_select(getattr(b, name), mask))
    return out


def _fsync_directory(directory: Path) -> None:
    """A rename made durable: the directory entry written to disk."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ReaderCursor:
    """A cursor of the store's database (used as a DuckDB connection); closing it tells the store, whose
    file rewrite waits for the cursors in use before it closes the connection they belong to."""

    __slots__ = ("_cursor", "_store", "_closed")

    def __init__(self, cursor: duckdb.DuckDBPyConnection, store: "Store") -> None:
        self._cursor = cursor
        self._store = store
        self._closed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._cursor.close()
        finally:
            self._store._reader_closed(self)

    def __enter__(self) -> "ReaderCursor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Store:
    """Owns the DuckDB file for writing; one instance per process."""

    def __init__(self, settings: StoreSettings, metrics: Metrics, max_queue_bytes: int = 256 * 1024 * 1024,
                 max_future_seconds: float | None = None) -> None:
        self.settings = settings
        self.metrics = metrics
        self.max_queue_bytes = max_queue_bytes
        # spans starting more than this after they arrive are counted (spans_future_dated): a clock ahead
        self.max_future_ns = None if max_future_seconds is None else int(max_future_seconds * 1e9)
        self._queue: queue.Queue[_Item | None] = queue.Queue()
        self._queue_bytes = 0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.con: duckdb.DuckDBPyConnection | None = None
        self._columns: dict[str, list[str]] = {}  # spans, logs, metrics: their columns in stored order
        self.dedupe = DedupeWindow(settings.dedupe_window_seconds, settings.dedupe_max_keys)
        self.shipper: Shipper | None = None  # on a lake: copies what is committed here to the replica's schema
        self._last_received = datetime.min  # received_at strictly increases from commit to commit
        self._shipping_stop = threading.Event()
        self._shipping: threading.Thread | None = None
        self._mark: WalMark | None = None
        self.failing: str | None = None  # why the last commit failed, until one succeeds (/readyz answers 503)
        self._probing = False
        metrics.gauge("store_failing", lambda: int(self.failing is not None))
        metrics.gauge("queue_bytes", lambda: self._queue_bytes)
        metrics.gauge("queue_requests", lambda: self._queue.qsize())
        self._jobs_waiting = 0
        self._jobs_until: float | None = None  # closing: jobs not begun by then are dropped
        self._readers: set[ReaderCursor] = set()  # cursors handed out and not closed
        self._readers_changed = threading.Condition()
        self._swapping = False  # the file is being rewritten: new readers wait
        metrics.gauge("jobs_waiting", lambda: self._jobs_waiting)
        metrics.gauge("dedupe_keys", lambda: len(self.dedupe))

    # ------------------------------------------------------------------ lifecycle
    def open(self) -> "Store":
        path = self.settings.path
        try:
            check_files(path, self.settings.accept_damaged_wal)
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreUnusable(f"cannot open the database {path}: {_one_line(exc)}") from None
        if self.settings.lake is None:
            name = glob.escape(path.name)  # a copy a stopped rewrite left (and its partial file): not the data
            for stale in [*path.parent.glob(f".{name}.rewrite*"), *path.parent.glob(f"..{name}.rewrite*")]:
                stale.unlink(missing_ok=True)
        self._connect()
        assert self.con is not None
        try:
            self._mark = WalMark(path)
        except OSError as exc:
            self.con.close()
            self.con = None
            raise StoreUnusable(f"cannot write beside the database {path}: {_one_line(exc)}") from None
        self._mark.update()
        self._columns = {table: list(describe(self.con, table)) for table in ("spans", "logs", "metrics")}
        if self.settings.lake is None and self._rewrite_marker.exists():
            # a deletion committed before the process stopped, its file not yet rewritten: rewrite it first
            self._rewrite(self.con)
        self._seed_dedupe()
        self._thread = threading.Thread(target=self._run, name="agentfunnel-writer", daemon=True)
        self._thread.start()
        if self.shipper is not None:
            self._shipping = threading.Thread(target=self._ship_forever, name="agentfunnel-shipper", daemon=True)
            self._shipping.start()
        return self

    def _connect(self) -> None:
        """The write connection, set up as every open sets it up (the schema migrated, then SQL locked down)."""
        path = self.settings.path
        try:
            self.con = connect(path)
        except (duckdb.Error, OSError) as exc:
            if (held := held_elsewhere(exc)) is not None:
                raise StoreUnusable(f"cannot open the database {path}: {held}; stop that process, or give this "
                                    "one another --db") from None
            raise StoreUnusable(f"cannot open the database {path}: {_one_line(exc)}") from None
        try:
            self.con.execute(f"SET checkpoint_threshold = '{self.settings.checkpoint_threshold_mb}MB'")
            self.con.execute(f"SET memory_limit = '{self.settings.memory_limit_mb}MB'")
            self.con.execute(f"SET threads = {self.settings.threads}")
            if self.settings.lake is not None:  # the shared lake: attached, written by the shipper
                self._open_lake()
            else:
                migrate(self.con)
                # what the log held goes into the file now: a full disk is refused here, not at the first commit
                self.con.execute("CHECKPOINT")
                lock_down(self.con)
        except BaseException as exc:
            self.con.close()
            self.con = None
            if isinstance(exc, (duckdb.Error, OSError)):
                raise StoreUnusable(f"cannot open the database {path}: {_one_line(exc)}") from None
            raise

    def _open_lake(self) -> None:
        lake = self.settings.lake
        assert self.con is not None and lake is not None
        lakestore.open_replica(self.con, lake)
        self.shipper = Shipper(f"{lakestore.CATALOG}.{lakestore.schema_of(lake.replica)}", self.metrics,
                               lake.ship_interval_seconds, lake.ship_batch_rows,
                               keep_assembled_seconds=lake.snapshot_retention_seconds,
                               prune_every_seconds=lake.compact_interval_seconds or lake.snapshot_retention_seconds)
        newest = self.con.execute("SELECT max(t) FROM (SELECT max(received_at) AS t FROM spans UNION ALL "  # type: ignore[index]  # max() gives a row
                                  "SELECT max(received_at) FROM logs UNION ALL SELECT max(received_at) FROM metrics)"
                                  ).fetchone()[0]
        self._last_received = newest or datetime.min

    def _ship_forever(self) -> None:
        """The shipper's thread: shipments go to the writer thread as jobs; compaction runs here, on a cursor."""
        lake = self.settings.lake
        assert self.shipper is not None and self.con is not None and lake is not None
        cursor = self.con.cursor()

        def maintain() -> None:
            lakestore.compact(cursor, lakestore.schema_of(lake.replica))
            if lake.replica == 0:  # one replica expires snapshots for the whole lake
                lakestore.expire(cursor, lake.snapshot_retention_seconds)
            self.metrics.inc("lake_maintenance")

        try:
            self.shipper.run(lambda fn: self.submit_job(fn, transaction=False, work="ship"), self._ship_now,
                             self._shipping_stop, maintain, lake.compact_interval_seconds)
        finally:
            cursor.close()

    def _ship_now(self, con: duckdb.DuckDBPyConnection) -> Any:
        assert self.shipper is not None
        return self.shipper.ship(con, None if self._last_received == datetime.min else self._last_received)

    def ship(self) -> Future | None:
        """On a lake: ship everything committed so far (a flush); the future resolves once it is in the lake."""
        if self.shipper is None:
            return None
        return self.submit_job(self._ship_now, transaction=False, work="ship")

    def _seed_dedupe(self) -> None:
        assert self.con is not None
        since = _utcnow() - timedelta(seconds=self.settings.dedupe_window_seconds)
        limit = self.settings.dedupe_max_keys
        rows = self.con.execute(
            "SELECT k FROM (SELECT trace_id || span_id AS k, received_at FROM spans WHERE received_at >= ? "
            " UNION ALL SELECT record_id, received_at FROM logs WHERE received_at >= ? "
            " UNION ALL SELECT point_id, received_at FROM metrics WHERE received_at >= ?) "
            "ORDER BY received_at DESC LIMIT ?",  # the newest, when more were received within the window than it holds
            [since, since, since, limit],
        ).fetchall()
        self.dedupe.add(r[0] for r in reversed(rows))  # oldest first, as they came

    def close(self, jobs_until: float | None = None) -> None:
        """Commit what is queued, then close the file. ``jobs_until`` (a ``time.monotonic()`` value, a stop's
        bound): jobs not begun by then are dropped (``StoreClosing``); their work waits for the next start."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._jobs_until = jobs_until
        self._shipping_stop.set()
        if self._shipping is not None:
            self._shipping.join()
        self._queue.put(None)
        if self._thread:
            self._thread.join()
        if self.con is not None:
            try:
                if self.shipper is not None:  # what is left goes now (or, if the lake is down, at the next start)
                    try:
                        self._ship_now(self.con)
                    except Exception as exc:  # noqa: BLE001 - it is committed here and shipped later
                        log.warning("could not ship to the lake before stopping (shipped at the next start): %s", exc)
                try:
                    self.con.execute("CHECKPOINT")
                except duckdb.Error as exc:
                    raise StoreUnusable(
                        f"could not checkpoint the database {self.settings.path} while stopping: {_one_line(exc)}; "
                        f"everything committed is in its write-ahead log {wal_path(self.settings.path)}, "
                        "replayed at the next start") from None
            finally:
                with contextlib.suppress(duckdb.Error):
                    self.con.close()
                self.con = None
                if self._mark is not None:
                    self._mark.update()
                    self._mark.close()
                    self._mark = None

    def reader(self, own: bool = False) -> "ReaderCursor":
        """A cursor for reads beside the writer; on a lake it reads every replica (the readers' views).

        Close it when done: a rewrite of the file (``rewrite``) waits for the cursors handed out, and new
        ones wait for the rewrite, so no reader ever holds a cursor of a connection that was closed.
        """
        with self._readers_changed:
            while self._swapping:
                self._readers_changed.wait()
            assert self.con is not None
            cur = ReaderCursor(self.con.cursor(), self)
            self._readers.add(cur)
        if self.settings.lake is not None and not own:  # ``own``: this replica's file as it is, not the readers' views
            cur.execute(f"USE {lakestore.READERS}")
        return cur

    def _reader_closed(self, cur: "ReaderCursor") -> None:
        with self._readers_changed:
            self._readers.discard(cur)
            self._readers_changed.notify_all()

    @property
    def _rewrite_marker(self) -> Path:
        path = self.settings.path
        return path.with_name(f".{path.name}.needs-rewrite")

    def rewrite(self) -> Future:
        """Rewrite the database file from its live rows, on the writer thread; the future gets what it took.

        DuckDB neither zeroes the blocks a DELETE frees nor rewrites a row group that keeps some rows,
        so deleted values stay readable in the file until something rewrites it. The marker file makes
        the rewrite happen at the next open if the process stops before it is done.
        """
        if self.settings.lake is not None:
            raise RuntimeError("a lake's replica file is not rewritten")
        self._rewrite_marker.touch()
        return self.submit_job(self._rewrite, transaction=False, work="rewrite")

    def _rewrite(self, con: duckdb.DuckDBPyConnection) -> dict[str, float]:
        """Checkpoint, copy every live row into a fresh file beside the database, close, swap the files, reopen.

        Readers are held back meanwhile (those open are waited for, then interrupted after
        ``rewrite_reader_wait_seconds``); batches arriving queue up for the writer as during any job.
        """
        path = self.settings.path
        started = time.monotonic()
        wal = path.with_name(path.name + ".wal")
        before = path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)
        fresh = path.with_name(f".{path.name}.rewrite")
        self._hold_readers()
        closed = False  # self.con stays set meanwhile: only the writer thread (this one) and readers (held) use it
        try:
            con.execute("CHECKPOINT")
            cur = con.cursor()
            try:
                write_snapshot(cur, fresh, self.settings.memory_limit_mb, self.settings.threads)
            finally:
                cur.close()
            con.close()
            closed = True
            os.replace(fresh, path)
            wal.unlink(missing_ok=True)  # closed after a checkpoint: empty if there
            _fsync_directory(path.parent)
            self._rewrite_marker.unlink(missing_ok=True)
        finally:
            try:
                if closed:
                    self._connect()  # the rewritten file (or, if the swap failed, the one as it was)
                    if self._mark is not None:  # the log was replaced with the file: record what it holds now
                        self._mark.update()
            finally:
                with self._readers_changed:
                    self._swapping = False
                    self._readers_changed.notify_all()
        took = time.monotonic() - started
        self.metrics.inc("file_rewrites")
        self.metrics.inc("file_rewrite_milliseconds", round(took * 1000))
        log.info("rewrote %s in %.2f s (%d -> %d bytes)", path, took, before, path.stat().st_size)
        return {"seconds": round(took, 3), "bytes_before": before, "bytes_after": path.stat().st_size}

    def _hold_readers(self) -> None:
        """Stop handing out cursors and wait for the open ones; interrupt those still open after the wait."""
        deadline = time.monotonic() + self.settings.rewrite_reader_wait_seconds
        with self._readers_changed:
            self._swapping = True
            while self._readers and (left := deadline - time.monotonic()) > 0:
                self._readers_changed.wait(left)
            late = list(self._readers)
        if late:
            self.metrics.inc("rewrite_readers_interrupted", len(late))
            log.warning("interrupting %d read(s) still open after %g s so the file can be rewritten", len(late),
                        self.settings.rewrite_reader_wait_seconds)
            for cur in late:
                cur.interrupt()
            with self._readers_changed:
                self._readers_changed.wait_for(lambda: not self._readers, timeout=1.0)
                late = list(self._readers)
            for cur in late:  # not closed by its holder: closed here, its next use fails
                cur.close()

    def probe(self) -> None:
        """While commits fail, try a small write on the writer thread (at most one at a time): readiness comes
        back once the store can commit again, even if no client sends anything meanwhile."""
        with self._lock:
            if self.failing is None or self._probing or self._closed or self.settings.lake is not None:
                return
            self._probing = True

        def job(con: duckdb.DuckDBPyConnection) -> None:
            try:  # a logged write of nothing new: it needs the log to grow, as a commit of spans does
                con.execute("UPDATE _agentfunnel_migrations SET applied_at = applied_at "
                            "WHERE name = (SELECT max(name) FROM _agentfunnel_migrations)")
                if self._mark is not None:
                    self._mark.update()
                self.failing = None
            except duckdb.Error as exc:
                self.failing = _one_line(exc)
            finally:
                self._probing = False

        try:
            self.submit_job(job, transaction=False)
        except RetryableError:
            self._probing = False

    # ------------------------------------------------------------------ submit
    @property
    def queue_bytes(self) -> int:
        return self._queue_bytes

    @property
    def jobs_waiting(self) -> int:
        """Jobs submitted and not finished: session work that is behind when it stays above zero."""
        return self._jobs_waiting

    def submit(self, batch: SpanBatch | LogBatch | MetricBatch,
               on_commit: Callable[[Future], None] | None = None) -> Future:
        """Queue a batch for the next group commit; the future resolves after COMMIT. ``on_commit`` is called with the
        future as it resolves, on the writer thread, before the writer takes its next job or batch (attached before
        the batch is queued, it cannot run later on the caller's thread): what it notes, a job queued after it sees."""
        fut = handed_over()
        if on_commit is not None:
            fut.add_done_callback(on_commit)
        nbytes = max(batch.payload_bytes, 1)
        with self._lock:
            if self._closed:
                raise StoreClosing("the store is shutting down")
            if self._queue_bytes and self._queue_bytes + nbytes > self.max_queue_bytes:
                raise Saturated(
                    f"store queue holds {self._queue_bytes} bytes (limit {self.max_queue_bytes}); retry later"
                )
            self._queue_bytes += nbytes
        self._queue.put(_Item(batch, fut, nbytes))
        return fut

    def submit_job(self, job: Callable[[duckdb.DuckDBPyConnection], Any], transaction: bool = True,
                   work: str = "other", on_rollback: Callable[[], None] | None = None) -> Future:
        """Run ``job(con)`` on the writer thread inside its own transaction; the future gets its return value.
        ``work`` names what its CPU time counts as in ``writer_cpu_microseconds``. ``on_rollback`` is called on the
        writer thread when the job fails or its commit does, before the next job runs (what remembers the job's
        writes forgets them).

        Jobs (session assembly, rescoring) share the single write connection with ingest, so they
        never race a commit and need no lock of their own; they run after every batch submitted
        before them, and give way to newer batches for at most ``max_job_delay_seconds``.
        """
        fut = handed_over()
        with self._lock:
            if self._closed:
                raise StoreClosing("the store is shutting down")
            self._jobs_waiting += 1
        self._queue.put(_Item(None, fut, 0, job, time.monotonic(), transaction, work, on_rollback))
        return fut

    # ------------------------------------------------------------------ writer thread
    def _run(self) -> None:
        """Commit data first; run jobs between commits.

        Jobs (session assembly, rescoring, judgments) wait while requests are queued, so a burst of
        ingest is never held up behind session work. Under sustained load a job that has waited
        ``max_job_delay_seconds`` runs anyway, as long as jobs have not had more than ``job_share``
        of the writer's time: sessions keep moving and ingest keeps the rest. Every job still runs after
        all data submitted before it (data is never held back for a job), which keeps
        ``submit_job(lambda con: None)`` usable as a barrier.
        """
        jobs: deque[_Item] = deque()
        stopping = False
        jobs_not_before = 0.0  # jobs had their share of the writer's time until then
        while True:
            now = time.monotonic()
            wait: float | None
            if stopping:
                wait = 0.0
            elif not jobs:
                wait = None  # nothing else to do: sleep until something arrives
            elif now < jobs_not_before:
                # Clients usually send their next request as soon as the last one is acknowledged:
                # an empty queue right after a commit is not idleness. Give them a moment.
                wait = INGEST_GRACE_SECONDS
            else:
                wait = 0.0
            items: list[_Item] = []
            spans = 0
            replan = False
            while spans < self.settings.max_batch_spans:
                try:
                    nxt = self._queue.get_nowait() if items or wait == 0.0 else self._queue.get(timeout=wait)
                except queue.Empty:
                    break
                if nxt is None:
                    stopping = True
                    break
                if nxt.job is not None:
                    jobs.append(nxt)
                    if not items and wait is None:
                        replan = True  # woken by a job: decide with it in view
                        break
                    continue
                items.append(nxt)
                spans += len(nxt.batch)  # type: ignore[arg-type]
            if items:
                self._commit_group(items)
            if replan or (stopping and items):
                continue
            if not jobs:
                if stopping:
                    break
                continue
            if stopping and self._jobs_until is not None and time.monotonic() >= self._jobs_until:
                self._drop_jobs(jobs)
                continue
            now = time.monotonic()
            if items and not (now >= jobs_not_before and (
                    self._queue.empty() or now - jobs[0].queued_at >= self.settings.max_job_delay_seconds)):
                continue
            self._run_job(jobs.popleft())
            took = time.monotonic() - now
            share = self.settings.job_share
            jobs_not_before = time.monotonic() + took * (1 - share) / share

    def _drop_jobs(self, jobs: deque[_Item]) -> None:
        """A stop ran out of time: the jobs not begun are not run (session work is redone at the next start)."""
        self.metrics.inc("jobs_dropped_at_stop", len(jobs))
        log.warning("stopping: %d store job(s) not run within the stop's bound; their traces are reopened on the "
                    "next start", len(jobs))
        while jobs:
            item = jobs.popleft()
            with self._lock:
                self._jobs_waiting -= 1
            item.future.set_exception(StoreClosing("the store closed before this job ran"))

    def _run_job(self, item: _Item) -> None:
        started = time.thread_time()
        try:
            self._run_job_in_transaction(item)
        finally:
            self._count_cpu(item.work, started)
            with self._lock:
                self._jobs_waiting -= 1

    def _count_cpu(self, work: str, started: float) -> None:
        """Count the writer thread's CPU time since ``started`` as ``work``'s: where a busy writer's time goes."""
        self.metrics.inc("writer_cpu_microseconds", round((time.thread_time() - started) * 1e6), label=work)
        self.metrics.inc("writer_runs", label=work)

    def _run_job_in_transaction(self, item: _Item) -> None:
        assert self.con is not None and item.job is not None
        con = self.con
        committing = False
        try:
            if not item.transaction:
                result = item.job(con)
            else:
                con.execute("BEGIN TRANSACTION")
                result = item.job(con)
                # a statement the job caught failing aborted the transaction, and DuckDB's COMMIT then rolls it back
                # without a word: asked first, an aborted transaction raises, and the job fails as it should
                con.execute("SELECT 1")
                committing = True
                con.execute("COMMIT")
                if self._mark is not None:
                    self._mark.update()
                if self.shipper is not None:
                    self.shipper.note(0)
        except Exception as exc:  # noqa: BLE001 - a failing job must not stop the writer
            if committing and isinstance(exc, duckdb.Error):  # the store, not the job (a full disk): one line
                self.failing = _one_line(exc)
                log.warning("store job could not commit: %s", self.failing)
            else:
                log.exception("store job failed")
            try:
                con.execute("ROLLBACK")
            except duckdb.Error:
                pass
            if item.on_rollback is not None:
                try:
                    item.on_rollback()
                except Exception:  # noqa: BLE001 - the writer goes on
                    log.exception("a store job's rollback handler failed")
            item.future.set_exception(exc)
            return
        item.future.set_result(result)

    def _commit_group(self, items: list[_Item]) -> None:
        started = time.thread_time()
        try:
            self._commit_items(items)
        finally:
            self._count_cpu("commit", started)

    def _commit_items(self, items: list[_Item]) -> None:
        try:
            results = self._write(items)
        except (duckdb.Error, ValueError, OverflowError, TypeError) as exc:
            # ValueError/OverflowError/TypeError: data Arrow cannot hold (e.g. a time past 2^63 ns);
            # whatever the cause, the writer thread must survive it
            self.metrics.inc("commit_errors")
            if len(items) > 1:
                # One bad batch must not keep failing the others: retry each on its own.
                for item in items:
                    self._commit_items([item])
                return
            item = items[0]
            log.warning("store write failed: %s", exc)
            err: Exception
            if isinstance(exc, (duckdb.ConversionException, duckdb.InvalidInputException, ValueError, OverflowError,
                                TypeError)):
                err = PermanentError(f"the store refused this request's data: {exc}")
            else:
                err = RetryableError(f"the store could not commit: {exc}")
                self.failing = _one_line(exc)
            self._finish(item, exc=err)
            return
        for item, result in zip(items, results):
            self._finish(item, result=result)

    def _finish(self, item: _Item, result: CommitResult | None = None, exc: Exception | None = None) -> None:
        with self._lock:
            self._queue_bytes -= item.nbytes
        if exc is not None:
            item.future.set_exception(exc)
        else:
            item.future.set_result(result)

    def _write(self, items: list[_Item]) -> list[CommitResult]:
        assert self.con is not None
        con = self.con
        # strictly increasing, even if the clock steps back: on a lake the shipper names rows by a range of it
        received_at = self._last_received = max(_utcnow(), self._last_received + timedelta(microseconds=1))
        span_parts: list[tuple[SpanBatch, list[bool] | None]] = []
        log_parts: list[tuple[LogBatch, list[bool] | None]] = []
        metric_parts: list[tuple[MetricBatch, list[bool] | None]] = []
        results: list[CommitResult] = []
        new_keys: list[str] = []
        pending: set[str] = set()
        for item in items:
            b = item.batch
            keys = (list(map(operator.add, b.trace_id, b.span_id)) if isinstance(b, SpanBatch)
                    else b.point_id if isinstance(b, MetricBatch) else b.record_id)  # type: ignore[union-attr]  # items written here carry a batch
            mask = self.dedupe.fresh_mask(keys)
            if mask is None and pending.isdisjoint(keys):  # the usual case: nothing seen before
                fresh = keys
            else:
                fresh_in_window = mask or [True] * len(keys)
                mask = [keep and k not in pending for k, keep in zip(keys, fresh_in_window)]
                fresh = [k for k, keep in zip(keys, mask) if keep]
            pending.update(fresh)
            new_keys.extend(fresh)
            dup = len(keys) - len(fresh)
            results.append(CommitResult(written=len(fresh), duplicates=dup))
            part_mask = None if dup == 0 else mask
            if isinstance(b, SpanBatch):
                span_parts.append((b, part_mask))
            elif isinstance(b, MetricBatch):
                metric_parts.append((b, part_mask))
            else:
                log_parts.append((b, part_mask))  # type: ignore[arg-type]

        t0 = time.perf_counter()
        tables: dict[str, pa.Table] = {}
        future_dated = 0
        if span_parts:
            spans_tbl = self._span_table(span_parts, received_at)
            if spans_tbl.num_rows:
                tables["spans"] = spans_tbl
                if self.max_future_ns is not None:
                    horizon = pa.scalar(time.time_ns() + self.max_future_ns, pa.timestamp("ns"))
                    future_dated = pc.sum(pc.greater(spans_tbl.column("start_time"), horizon)).as_py()
        if log_parts:
            logs_tbl = self._log_table(log_parts, received_at)
            if logs_tbl.num_rows:
                tables["logs"] = logs_tbl
        if metric_parts:
            metrics_tbl = metrics_arrow_table(metric_parts, received_at)
            if metrics_tbl.num_rows:
                tables["metrics"] = metrics_tbl
        # one statement commits atomically on its own: no BEGIN/COMMIT to pay for
        with transaction(con) if len(tables) > 1 else contextlib.nullcontext():
            for table, rows in tables.items():
                append_arrow(con, table, rows, self._columns[table])
        if self._mark is not None:  # before anything is acknowledged: the record covers every acknowledged commit
            self._mark.update()
        self.failing = None
        self.dedupe.add(new_keys)
        self.metrics.inc("commits")
        if future_dated:
            self.metrics.inc("spans_future_dated", future_dated)
        if self.shipper is not None:
            self.shipper.note(sum(t.num_rows for t in tables.values()))
        evicted = self.dedupe.evicted_by_size
        if evicted:
            self.metrics.inc("dedupe_evictions", evicted)
            self.dedupe.evicted_by_size = 0
        for item, result in zip(items, results):
            kind = ("spans" if isinstance(item.batch, SpanBatch)
                    else "metric_points" if isinstance(item.batch, MetricBatch) else "logs")
            self.metrics.inc(f"{kind}_committed", result.written)
            if result.duplicates:
                self.metrics.inc(f"{kind}_duplicate", result.duplicates)
        log.debug("committed %d requests in %.1f ms", len(items), (time.perf_counter() - t0) * 1000)
        return results

    @staticmethod
    def _span_table(parts: list[tuple[SpanBatch, list[bool] | None]], received_at: datetime) -> pa.Table:
        arrays: dict[str, pa.Array] = {}
        for c in _SPAN_COLUMNS:
            arr = _strings(_column(parts, c))
            if _JSON_TYPE is not None and c in _SPAN_JSON_COLUMNS:
                json_type = _JSON_TYPE if arr.type == pa.string() else pa.json_(arr.type)
                arr = pa.ExtensionArray.from_storage(json_type, arr)
            arrays[c] = arr
        n = len(arrays["span_id"])
        # Nanosecond ints straight into timestamps: the same values as int64 cast, without the cast.
        arrays["start_time"] = _int64s(_column(parts, "start_ns"), pa.timestamp("ns"))
        arrays["end_time"] = _int64s(_column(parts, "end_ns"), pa.timestamp("ns"))
        arrays["flags"] = pa.array(_column(parts, "flags"), pa.uint32())
        arrays["received_at"] = pa.repeat(pa.scalar(received_at, pa.timestamp("us")), n)
        return pa.table(arrays)

    @staticmethod
    def _log_table(parts: list[tuple[LogBatch, list[bool] | None]], received_at: datetime) -> pa.Table:
        cols: dict[str, list[Any]] = {c: [] for c in _LOG_COLUMNS}
        times: list[int | None] = []
        observed: list[int | None] = []
        for b, mask in parts:
            for c in _LOG_COLUMNS:
                cols[c].extend(_select(getattr(b, c), mask))
            times.extend(_select(b.time_ns, mask))
            observed.extend(_select(b.observed_ns, mask))
        n = len(times)
        arrays = {c: pa.array(v, pa.int32() if c == "severity_number" else pa.string()) for c, v in cols.items()}
        arrays["time"] = pa.array(times, pa.int64()).cast(pa.timestamp("ns"))
        arrays["observed_time"] = pa.array(observed, pa.int64()).cast(pa.timestamp("ns"))
        arrays["received_at"] = pa.array([received_at] * n, pa.timestamp("us"))
        return pa.table(arrays)
