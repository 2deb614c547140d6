"""Offline ingest: OTLP protobuf files, OTLP/JSON files and Collector file-exporter JSON lines.

Files are cut into the same request bodies a live client would send and go through the same
pipeline, so a replay stores exactly what live ingest would. Formats are recognised by content:
JSON (one document, or one per line as the Collector's file exporter writes), a serialized
Export*ServiceRequest, or the file exporter's length-prefixed protobuf. Gzip files (``.gz``, or
recognised by their magic number) are inflated with the receivers' cap, ``receivers.max_request_bytes``,
applied to what one request may hold: a file that inflates past it is read as a stream of JSON lines
or length-prefixed messages, each within the cap, and anything else is refused, naming the file, as
soon as the cap is reached (a small file cannot inflate into gigabytes of memory).
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .errors import PermanentError
from .pipeline import Encoding, Signal

SignalHint = Literal["auto", "traces", "logs", "metrics"]
GZIP_MAGIC = b"\x1f\x8b"
DEFAULT_MAX_BODY = 64 * 1024 * 1024  # receivers.max_request_bytes' default


@dataclass(frozen=True, slots=True)
class Body:
    """One request's worth of a file: what it is and where it came from (for error messages)."""

    signal: Signal
    encoding: Encoding
    data: bytes
    where: str


def _signal_of_doc(doc: object, where: str) -> Signal:
    if not isinstance(doc, dict):
        raise PermanentError(f"{where}: expected a JSON object with resourceSpans, resourceLogs or resourceMetrics")
    if "resourceSpans" in doc or "resource_spans" in doc:
        return "traces"
    if "resourceLogs" in doc or "resource_logs" in doc:
        return "logs"
    if "resourceMetrics" in doc or "resource_metrics" in doc:
        return "metrics"
    raise PermanentError(f"{where}: JSON object has none of resourceSpans, resourceLogs and resourceMetrics")


def _protobuf_signal(path: Path, hint: SignalHint) -> Signal:
    """Protobuf does not say what it holds: the hint, else the file's name (``logs``, ``metrics``), else traces."""
    if hint != "auto":
        return hint
    name = path.name.lower()
    return "logs" if "logs" in name else "metrics" if "metrics" in name else "traces"


def read_bodies(path: Path, hint: SignalHint = "auto", max_body_bytes: int = DEFAULT_MAX_BODY) -> Iterator[Body]:
    """Yield the request bodies in ``path``; PermanentError names the file and line when it is not OTLP.

    ``max_body_bytes`` (``receivers.max_request_bytes``) bounds what a compressed file may inflate
    to at once, as the receivers bound a gzip body.
    """
    try:
        with open(path, "rb") as f:
            magic = f.read(2)
        compressed = path.suffix == ".gz" or magic == GZIP_MAGIC
        if not compressed:
            yield from _bodies(path, path.read_bytes(), hint)
            return
        with gzip.open(path, "rb") as gz:
            try:
                raw = gz.read(max_body_bytes + 1)
                if len(raw) <= max_body_bytes:
                    yield from _bodies(path, raw, hint)
                    return
                yield from _inflated_stream(path, gz, raw, hint, max_body_bytes)
            except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
                raise PermanentError(f"{path}: not a valid gzip file: {exc}") from None
    except OSError as exc:
        raise PermanentError(f"{path}: cannot read: {exc.strerror or exc}") from None


def _bodies(path: Path, raw: bytes, hint: SignalHint) -> Iterator[Body]:
    head = raw.lstrip()[:1]
    if head in (b"{", b"["):
        yield from _json_bodies(path, raw)
    elif raw[:1] == b"\x00" and len(raw) >= 4:
        yield from _length_prefixed(path, raw, hint)
    elif raw:
        yield Body(_protobuf_signal(path, hint), "protobuf", raw, str(path))


def _inflated_stream(path: Path, gz: gzip.GzipFile, first: bytes, hint: SignalHint, limit: int) -> Iterator[Body]:
    """A compressed file larger than one request, inflated as it is read: JSON lines or length-prefixed messages."""
    too_big = (f"{path}: inflates past {limit} bytes (receivers.max_request_bytes, the most one request may hold), "
               "and only JSON lines or length-prefixed messages are read past that")
    if first.lstrip()[:1] == b"{" and b"\n" in first:
        gz.seek(0)
        yield from _json_lines(path, iter(lambda: gz.readline(limit + 1), b""), limit)
    elif first[:1] == b"\x00":
        gz.seek(0)
        yield from _length_prefixed_stream(path, gz, hint, limit)
    else:
        raise PermanentError(too_big)


def _length_prefixed_stream(path: Path, f: gzip.GzipFile, hint: SignalHint, limit: int) -> Iterator[Body]:
    signal = _protobuf_signal(path, hint)
    pos = index = 0
    while prefix := f.read(4):
        if len(prefix) < 4:
            raise PermanentError(f"{path}: truncated length prefix at byte {pos}")
        size = int.from_bytes(prefix, "big")
        if size == 0:
            raise PermanentError(f"{path}: message {index} at byte {pos} is empty (no exporter writes one): "
                                 "not length-prefixed OTLP")
        if size > limit:
            raise PermanentError(f"{path}: message {index} at byte {pos} claims {size} bytes, more than "
                                 f"receivers.max_request_bytes ({limit})")
        data = f.read(size)
        if len(data) < size:
            raise PermanentError(f"{path}: message {index} at byte {pos} claims {size} bytes, file ends first")
        yield Body(signal, "protobuf", data, f"{path}#{index}")
        pos += 4 + size
        index += 1


def _json_bodies(path: Path, raw: bytes) -> Iterator[Body]:
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as exc:
        if exc.msg != "Extra data":
            raise PermanentError(f"{path}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
        doc = None
    except UnicodeDecodeError as exc:
        raise PermanentError(f"{path}: not UTF-8 JSON: {exc}") from None
    if doc is not None:
        docs = doc if isinstance(doc, list) else [doc]
        for i, d in enumerate(docs):
            where = f"{path}" + (f"[{i}]" if isinstance(doc, list) else "")
            yield Body(_signal_of_doc(d, where), "json", json.dumps(d).encode() if isinstance(doc, list) else raw, where)
        return
    yield from _json_lines(path, raw.splitlines(), None)


def _json_lines(path: Path, lines: Iterable[bytes], limit: int | None) -> Iterator[Body]:
    """One body per JSON line (the Collector's file exporter); with ``limit``, a longer line is refused."""
    for lineno, line in enumerate(lines, 1):
        if limit is not None and len(line.rstrip(b"\n")) > limit:
            raise PermanentError(f"{path}:{lineno}: a line longer than {limit} bytes (receivers.max_request_bytes)")
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            d = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PermanentError(f"{where}: not valid JSON: {exc.msg} at column {exc.colno}") from None
        yield Body(_signal_of_doc(d, where), "json", line, where)


def _length_prefixed(path: Path, raw: bytes, hint: SignalHint) -> Iterator[Body]:
    """The Collector file exporter's ``format: proto``: 4-byte big-endian length, then a message."""
    signal = _protobuf_signal(path, hint)
    pos = 0
    index = 0
    while pos < len(raw):
        if pos + 4 > len(raw):
            raise PermanentError(f"{path}: truncated length prefix at byte {pos}")
        size = int.from_bytes(raw[pos:pos + 4], "big")
        if size == 0:
            raise PermanentError(f"{path}: message {index} at byte {pos} is empty (no exporter writes one): "
                                 "not length-prefixed OTLP")
        if pos + 4 + size > len(raw):
            raise PermanentError(f"{path}: message {index} at byte {pos} claims {size} bytes, file ends first")
        yield Body(signal, "protobuf", raw[pos + 4:pos + 4 + size], f"{path}#{index}")
        pos += 4 + size
        index += 1
