"""Offline ingest: OTLP protobuf files, OTLP/JSON files and Collector file-exporter JSON lines.

Files are cut into the same request bodies a live client would send and go through the same
pipeline, so a replay stores exactly what live ingest would. Formats are recognised by content:
JSON (one document, or one per line as the Collector's file exporter writes), a serialized
Export*ServiceRequest, or the file exporter's length-prefixed protobuf. ``.gz`` files are inflated.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .errors import PermanentError
from .pipeline import Encoding, Signal

SignalHint = Literal["auto", "traces", "logs", "metrics"]


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


def read_bodies(path: Path, hint: SignalHint = "auto") -> Iterator[Body]:
    """Yield the request bodies in ``path``; PermanentError names the file and line when it is not OTLP."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise PermanentError(f"{path}: cannot read: {exc.strerror}") from None
    if path.suffix == ".gz":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise PermanentError(f"{path}: not a valid gzip file: {exc}") from None
    head = raw.lstrip()[:1]
    if head in (b"{", b"["):
        yield from _json_bodies(path, raw)
    elif raw[:1] == b"\x00" and len(raw) >= 4:
        yield from _length_prefixed(path, raw, hint)
    elif raw:
        yield Body(_protobuf_signal(path, hint), "protobuf", raw, str(path))


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
    for lineno, line in enumerate(raw.splitlines(), 1):
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
        if pos + 4 + size > len(raw):
            raise PermanentError(f"{path}: message {index} at byte {pos} claims {size} bytes, file ends first")
        yield Body(signal, "protobuf", raw[pos + 4:pos + 4 + size], f"{path}#{index}")
        pos += 4 + size
        index += 1
