"""What every signal's decoded batch shares, beneath ``batches`` (spans, logs) and ``metric_batches``.

Compact JSON text of decoded values, the checks of OTLP ids, what a resource and scope give every
row under them, the refusals an OTLP partial success reports, long values cut with one mark, and
what a decoded batch costs in memory (what admission and the queues after it count).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
MAX_REJECT_MESSAGES = 5


def to_json(value: Any) -> str:
    """Compact JSON text for a decoded AnyValue tree (non-finite floats already made strings)."""
    return _dumps(value)


def from_json(text: str | bytes) -> Any:
    """A text ``to_json`` wrote of decoded values (a batch's, or one stored from it), read back: what ``json.loads``
    gives, in about a quarter of its time on span attributes (orjson). The two differ only where orjson refuses the
    text (a lone surrogate, which OTLP/JSON can carry in an escape; ``NaN`` in a text from elsewhere), which is
    then read by ``json``, and on integers outside [-2**63, 2**64 - 1], which orjson reads as floats: a decoded
    value has none (OTLP's integers are int64 and its times uint64, ``otlp_values`` refuses the rest). Values the
    collector makes itself (the forwarder's own spans) are handed on parsed; the JSON inside a value, the sender's
    own text, is read by the dialects with ``json``, which keeps any integer exact."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        pass  # read below, outside the handler: an error of json's own comes without orjson's attached
    return json.loads(text)


@dataclass(slots=True)
class Rejections:
    """Spans or records refused inside an otherwise good request (OTLP partial success)."""

    count: int = 0
    messages: list[str] = field(default_factory=list)

    def add(self, where: str, why: str) -> None:
        self.count += 1
        if len(self.messages) < MAX_REJECT_MESSAGES:
            self.messages.append(f"{where}: {why}")

    def extend(self, count: int, first: list[tuple[str, str]]) -> None:
        """Add ``count`` refusals of which ``first`` spells out the leading ones (as ``add`` keeps)."""
        for where, why in first:
            self.add(where, why)
        self.count += count - len(first)

    def message(self) -> str:
        more = self.count - len(self.messages)
        return "; ".join(self.messages) + (f"; and {more} more" if more > 0 else "")


def hex_id(raw: bytes, size: int, what: str, *, optional: bool = False) -> str | None:
    """Lowercase hex of an OTLP id, or a ValueError naming what is wrong with it."""
    if not raw:
        if optional:
            return None
        raise ValueError(f"{what} is empty")
    if len(raw) != size:
        raise ValueError(f"{what} has {len(raw)} bytes, expected {size}")
    if optional and not any(raw):
        return None
    if not any(raw):
        raise ValueError(f"{what} is all zeros")
    return raw.hex()


@dataclass(slots=True)
class ResourceContext:
    """What every span or record under one resource and scope shares; JSON made once."""

    attributes: dict[str, Any]
    attributes_json: str
    service_name: str | None
    scope_name: str | None = None
    scope_version: str | None = None

    @classmethod
    def of(cls, attributes: dict[str, Any]) -> "ResourceContext":
        service = attributes.get("service.name")
        return cls(attributes, to_json(attributes), service if isinstance(service, str) else None)

    def with_scope(self, name: str | None, version: str | None) -> "ResourceContext":
        return ResourceContext(self.attributes, self.attributes_json, self.service_name,
                               name or None, version or None)


TRUNCATION_MARK = "…[truncated by agentfunnel: {dropped} more bytes]"


def truncated(value: Any, limit: int, count: list[int]) -> Any:
    """``value`` with every string longer than ``limit`` bytes cut and marked; ``count[0]`` counts the cuts."""
    if isinstance(value, str):
        raw = value.encode()
        if len(raw) <= limit:
            return value
        count[0] += 1
        kept = raw[:limit].decode(errors="ignore")  # never cut a character in two
        return kept + TRUNCATION_MARK.format(dropped=len(raw) - len(kept.encode()))
    if isinstance(value, dict):
        return {k: truncated(v, limit, count) for k, v in value.items()}
    if isinstance(value, list):
        return [truncated(v, limit, count) for v in value]
    return value

class Decoded(Protocol):
    """A decoded batch of any signal, as ``decoded_cost`` measures it (a metric batch also has ``buckets``)."""

    payload_bytes: int

    def __len__(self) -> int: ...


DECODED_ROW_BYTES = 700  # a decoded span or log record beyond its JSON text: its column entries and ids
BUCKET_BYTES = 48  # a decoded metric bucket count or bound: protobuf's slot, a Python int and list slot, Arrow's value


def decoded_cost(batch: Decoded) -> int:
    """What a decoded batch holds in memory: its payload text and each row's other columns.

    A request is admitted again at this size once decoded (a small protobuf body of many spans
    costs several times its bytes as Python objects, and admission by body bytes alone let a
    flood of such bodies grow the process without ever pushing back), and a committed batch
    waits to be prepared at this size. A metric point's buckets count too (``MetricBatch.buckets``), and the request
    a span batch keeps for the session stage's compiled path (``SpanBatch.wire``).
    """
    wire = getattr(batch, "wire", None)
    return (batch.payload_bytes + DECODED_ROW_BYTES * len(batch) + BUCKET_BYTES * getattr(batch, "buckets", 0)
            + (len(wire) if wire is not None else 0))
