"""What the SQL endpoint's server and worker say to each other (``collector.sql_sandbox``, ``collector.sql_worker``):
the files of the worker's directory, the messages on its stdin and stdout (a 4-byte big-endian length, then JSON),
and store tables' Arrow schemas as text. Apart from the worker so the server does not load what only the worker
runs (Arrow's datasets)."""

from __future__ import annotations

import base64
import json
import struct
from typing import IO, Any

import pyarrow as pa

SCAN_PREFIX = "_scan_"  # the Arrow dataset behind a store table: `spans` is a view over `_scan_spans`
CATALOG = "catalog.duckdb"
SCHEMAS = "schemas.json"
SCANS = "scans.sock"
_HEADER = struct.Struct(">I")


def read_message(stream: IO[bytes]) -> Any:
    """The next message, or None at the end of the stream."""
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(head)
    return json.loads(stream.read(size))


def write_message(stream: IO[bytes], message: Any) -> None:
    body = json.dumps(message).encode()
    stream.write(_HEADER.pack(len(body)) + body)
    stream.flush()


def encode_schema(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def decode_schema(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))
