"""What the store checks about its files before DuckDB opens them, and the record that makes it possible.

DuckDB replays its write-ahead log (``<db>.wal``) on open, then folds it into the file and deletes
it. A log cut short (a restored backup, a copy taken mid-write, a file system that lost its tail)
or deleted is replayed as far as it reads, without a word, and the evidence is gone. So the
writer keeps a small record next to the database, ``<db>.walmark``: after every commit it notes
the database's identity and checkpoint iteration (from its header) and the log's length. A log of
the same database that DuckDB has not checkpointed since (same iteration) must be at least that
long; if it is shorter or missing, acknowledged data is missing from it and the store refuses to start.

The record is rewritten in place (one ``pwrite`` of a few bytes, no fsync) after DuckDB's own
fsync of the log: it never claims more than the log durably holds. After a power loss it may
claim less (the check is then weaker, never wrong).

A log of full length can still be damaged. DuckDB checks each entry's checksum and refuses a damaged
one, except where the damage hits an entry's length so that it runs past the end of the file: that
it takes for a write torn by a crash, and replays nothing from there on, silently. So the check
also walks the entries' framing (a length and a checksum before each) across the committed bytes:
an entry there that runs past the end is damage, not a torn write.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import struct
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import duckdb

from .connect import connect

log = logging.getLogger(__name__)

_HEADER_BYTES = 3 * 4096  # DuckDB's main header, then two database headers (the newer one is in use)
_ITERATION_AT = (4096 + 8, 8192 + 8)  # each database header: checksum (8 bytes), then its iteration
_IDENTITY = slice(124, 140)  # in the main header: 16 random bytes naming the database, made when it was created
_RECORD = "{} {:020d} {:020d}\n"


class StoreUnusable(Exception):
    """The database or its log cannot be used as they are; ``str()`` is the one line to show."""


_LOCK_HELD = re.compile(r"Could not set lock on file .*?Conflicting lock is held in .*?\(PID (\d+)\)", re.S)


def held_elsewhere(exc: BaseException) -> str | None:
    """DuckDB's refusal of a file another process has open, as the words to show (the holder's PID when
    DuckDB names it), or None for any other error: its own message is a paragraph, and names no file."""
    text = str(exc)
    if "Could not set lock on file" not in text:
        return None
    m = _LOCK_HELD.search(text)
    who = f"PID {m.group(1)}: " if m else ""
    return f"another process has the file open ({who}a running agentfunnel serve?)"


def connect_unless_held(db: Path) -> duckdb.DuckDBPyConnection:
    """The file opened for writing by a command that runs without a server, or one line saying who holds it."""
    try:
        return connect(db)
    except duckdb.IOException as exc:
        if (held := held_elsewhere(exc)) is None:
            raise
        raise StoreUnusable(f"cannot open the database {db}: {held}") from None


def wal_path(db: Path) -> Path:
    return db.with_name(db.name + ".wal")


def mark_path(db: Path) -> Path:
    return db.with_name(db.name + ".walmark")


def _iteration(header: bytes) -> int:
    return max(struct.unpack_from("<Q", header, at)[0] for at in _ITERATION_AT)


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return None


def check_files(db: Path, accept_damaged_wal: bool = False) -> None:
    """Refuse, with one line, a database that is not one and a log shorter than what was committed to it.

    Nothing is written: a file that is not a database stays as it is (DuckDB would make an empty
    file a new database). With ``accept_damaged_wal`` a short log is copied aside and opened anyway.
    """
    size = _size(db)
    if size is None:
        return
    if size == 0:
        raise StoreUnusable(f"the database {db} is an empty file, not a DuckDB database: move it away (or restore "
                            "it from a copy), or choose another --db")
    with open(db, "rb") as f:
        header = f.read(_HEADER_BYTES)
    if len(header) < _HEADER_BYTES or header[8:12] != b"DUCK":
        raise StoreUnusable(f"the database {db} is not a DuckDB database file ({size} bytes, no DuckDB header): "
                            "restore it from a copy, or choose another --db")
    expected = read_mark(db)
    if expected is None or expected[0] != header[_IDENTITY].hex() or expected[1] != _iteration(header):
        return  # no record, another database's, or DuckDB checkpointed since: the log holds only what came after
    wal = wal_path(db)
    have = _size(wal)
    committed = expected[2]
    if (have or 0) >= committed:
        if have is None or (overrun := entry_past_end(wal, committed)) is None:
            return
        at, claimed = overrun
        problem = (f"the write-ahead log {wal} is damaged: the entry at byte {at}, inside the {committed} bytes "
                   f"committed to it, claims {claimed} bytes, past the log's end ({have} bytes)")
        found = f"is damaged at byte {at}"
    else:
        found = "is missing" if have is None else f"holds {have} bytes"
        problem = (f"the write-ahead log {wal} {found}, but {committed} bytes were committed to it: it was cut "
                   "short or deleted")
    if not accept_damaged_wal:
        raise StoreUnusable(
            f"{problem}, and opening the database would lose acknowledged data; restore the log from a copy, or "
            "start with --accept-damaged-wal to keep only what it holds (the log is copied aside first; if the "
            f"database itself was put back from a copy on purpose, remove {mark_path(db)} instead)")
    if have is not None:
        kept = wal.with_name(f"{wal.name}.damaged-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}")
        shutil.copy2(wal, kept)
        log.warning("the write-ahead log %s %s (%d bytes were committed to it); opening with what it holds "
                    "(--accept-damaged-wal), a copy is kept as %s", wal, found, committed, kept)
    else:
        log.warning("the write-ahead log %s is missing (%d bytes were committed to it); opening without it "
                    "(--accept-damaged-wal)", wal, committed)


def _varint(data: bytes, at: int) -> tuple[int, int]:
    """An unsigned LEB128 value of DuckDB's binary serializer, and where the next field begins."""
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("varint")
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at += 1
        shift += 7
        if not byte & 0x80:
            return value, at


_VERSION_ENTRY_MAX = 256  # the log's first entry: its type, version 2, the database's identity, its iteration


def _first_framed_entry(head: bytes) -> int | None:
    """Where the framed entries begin: after the unframed version entry. None when the log is not of the
    version whose framing is known (the check is then left to DuckDB)."""
    try:
        at = 0
        fields: dict[int, int] = {}
        while True:
            if at + 2 > len(head):
                return None
            field = struct.unpack_from("<H", head, at)[0]
            at += 2
            if field == 0xFFFF:
                break
            if field == 102:  # the identity: a list of byte values
                count, at = _varint(head, at)
                for _ in range(count):
                    _, at = _varint(head, at)
            elif field in (100, 101, 103):
                fields[field], at = _varint(head, at)
            else:
                return None
        return at if fields.get(101) == 2 else None
    except ValueError:
        return None


def log_entries(fd: int, end: int) -> Iterator[tuple[int, int | None]]:
    """Each framed entry of an open log, up to ``end``, as (its offset, the length it claims); None for a frame cut
    short by the end. Nothing when the framing is not one this reads. Reads 16 bytes per entry: a length, then a
    checksum."""
    at = _first_framed_entry(os.pread(fd, _VERSION_ENTRY_MAX, 0))
    if at is None:
        return
    while at < end:
        frame = os.pread(fd, 16, at)
        if len(frame) < 16:
            yield at, None
            return
        size = struct.unpack_from("<Q", frame)[0]
        yield at, size
        at += 16 + size


def entry_past_end(wal: Path, committed: int) -> tuple[int, int] | None:
    """The first framed entry starting inside the committed bytes whose length runs past the log's end, as
    (its offset, the length it claims); None when there is none or the framing is not one this reads.

    The walk stops at the committed length, so what a crash tore after the last commit is not judged."""
    with open(wal, "rb") as f:
        end = os.fstat(f.fileno()).st_size
        for at, size in log_entries(f.fileno(), end):
            if at >= committed:
                break
            if size is None:
                return at, 16
            if at + 16 + size > end:
                return at, size
    return None


def read_mark(db: Path) -> tuple[str, int, int] | None:
    """(database identity, checkpoint iteration, log length) as last recorded, or None when there is no readable
    record."""
    try:
        identity, iteration, length = mark_path(db).read_text("ascii").split()
        return identity, int(iteration), int(length)
    except (OSError, ValueError):
        return None


class WalMark:
    """The record of ``check_files``, kept current by the writer thread after each commit."""

    def __init__(self, db: Path) -> None:
        self.db_fd = os.open(db, os.O_RDONLY)
        self.identity = os.pread(self.db_fd, _IDENTITY.stop, 0)[_IDENTITY].hex()
        self.wal = str(wal_path(db))
        self.path = mark_path(db)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        self.last: tuple[int, int] | None = None
        self.failed = False

    def update(self) -> None:
        """Record the current iteration and log length; read the iteration first, so a checkpoint between
        the two reads records less than the log holds, never more."""
        try:
            iteration = max(struct.unpack("<Q", os.pread(self.db_fd, 8, at))[0] for at in _ITERATION_AT)
            try:
                length = os.stat(self.wal).st_size
            except FileNotFoundError:
                length = 0
            if (iteration, length) != self.last:
                os.pwrite(self.fd, _RECORD.format(self.identity, iteration, length).encode(), 0)
                self.last = (iteration, length)
            self.failed = False
        except OSError as exc:  # the record is a check, not the data: commits go on without it
            if not self.failed:
                log.warning("could not record the write-ahead log's length in %s: %s", self.path, exc)
            self.failed = True

    def close(self) -> None:
        os.close(self.db_fd)
        os.close(self.fd)

