"""An assembled trace as text, so the owner of its session scores it without assembling it again.

On a lake the replica that assembles a trace is often not the one that scores its session. The
owner would read the trace's spans back from the lake and normalize them again (the most costly
work a replica does for another's trace); the replica that assembled it stores its records as this
text instead (the lake's ``lake_assembled_traces``, shipped with the trace). A trace is encoded only when it decodes to records equal to the assembled ones (JSON has
no tuples, no keys other than strings, no NaN equal to itself): otherwise it has no text and the
owner reads its spans, as it would anyway.

Written and read with orjson, on the hot path of every trace whose session another replica owns: about half
the cost of the standard library's ``json`` to write (and check), and less to read. Either library reads the
other's text back the same; a text with ``Infinity`` or ``NaN``, which only an earlier version wrote, is read
with ``json``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import fields
from operator import attrgetter
from typing import Any

import orjson

from ...semconv import SpanRecord
from ...semconv.records import new_record
from .assembly import AssembledTrace

_FIELDS = tuple(f.name for f in fields(SpanRecord))
_values = attrgetter(*_FIELDS)  # a record's field values, in order, as a tuple
_TUPLES = tuple(i for i, f in enumerate(fields(SpanRecord)) if isinstance(f.default, tuple))


def format_for(session_keys: Sequence[str]) -> str:
    """What a text was written by: the record's fields and the session keys assembly resolved sessions by. A
    replica whose differ (other code, or another ``sessions.session_keys``) reads the trace's spans instead."""
    return "1:" + hashlib.sha256(repr((_FIELDS, tuple(session_keys))).encode()).hexdigest()[:16]


def encode(trace: AssembledTrace) -> str | None:
    """The trace as JSON, or None when JSON cannot carry it exactly."""
    rows = list(map(_values, trace.records))
    try:
        data = orjson.dumps({"records": rows, "sessions": trace.sessions, "agent_version": trace.agent_version})
    except TypeError:  # a value JSON has no form for (orjson.JSONEncodeError): a key not a string, an int past 64 bits
        return None
    doc = orjson.loads(data)
    if list(map(_record_values, doc["records"])) != rows or doc["sessions"] != trace.sessions:
        return None  # NaN and infinities come back null, a tuple a list, an object such as a date a string
    return data.decode()


def decode(trace_id: str, text: str) -> AssembledTrace:
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError:  # a text an earlier version wrote with the standard library: Infinity, NaN
        doc = json.loads(text)
    records = [new_record(*_record_values(values)) for values in doc["records"]]
    return AssembledTrace(trace_id, records, doc["sessions"], doc["agent_version"])


def _record_values(values: list[Any]) -> tuple[Any, ...]:
    """A record's values as JSON gave them back, its tuple fields tuples again."""
    for i in _TUPLES:
        values[i] = tuple(values[i])
    return tuple(values)
