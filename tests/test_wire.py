"""The compiled protobuf decoder (``_wire``) against the pure-Python reference (upb + json).

Differential: for every body, both decoders must raise PermanentError or give identical columns,
rejection counts and messages. Bodies come from the benchmark payloads, from hypothesis-built
requests re-serialized with shuffled field order, split (merged) sub-messages, overridden
values and unknown fields, from hand-written wire edge cases, and from random bytes and
mutations of valid bodies.

Importing ``_wire`` is deliberately unconditional: CI must build the extension, and a failed
build should fail here rather than silently test the fallback against itself.
"""

from __future__ import annotations

import math
import os
import random
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import (AnyValue, ArrayValue, InstrumentationScope, KeyValue,
                                                      KeyValueList)
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from agentfunnel.collector import _wire, decode
from agentfunnel.collector.batches import SPAN_COLUMNS, SpanBatch
from agentfunnel.collector.errors import PermanentError

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from payloads import genai_request_bytes  # noqa: E402

PREFIX = "is not a valid OTLP ExportTraceServiceRequest protobuf: "
HAS_STRINDEX = "string_value_strindex" in AnyValue.DESCRIPTOR.fields_by_name


# ---------------------------------------------------------------------------- comparing


def outcome(fn: Any, body: bytes) -> tuple[Any, ...]:
    try:
        b = fn(body)
    except PermanentError as exc:
        return ("error", str(exc))
    return ("ok", {c: getattr(b, c) for c in SPAN_COLUMNS}, b.rejected.count, b.rejected.messages,
            b.payload_bytes, b)


def assert_same(body: bytes) -> tuple[Any, ...]:
    """Both decoders agree on ``body``; returns the reference outcome."""
    ref = outcome(decode.decode_traces_protobuf_reference, body)
    got = outcome(decode.decode_traces_protobuf_wire, body)
    assert got[0] == ref[0], (ref[:2] if ref[0] == "error" else "reference accepted", got[:2] if got[0] == "error" else "wire accepted")
    if ref[0] == "error":
        assert got[1].startswith(f"body ({len(body)} bytes) {PREFIX}"), got[1]
        assert len(got[1]) > len(f"body ({len(body)} bytes) {PREFIX}") + 5
        return ref
    for c in SPAN_COLUMNS:
        assert got[1][c] == ref[1][c], c
    assert got[2:5] == ref[2:5]
    rb, gb = ref[5], got[5]
    assert gb.attrs == rb.attrs
    assert gb.resource_attrs == rb.resource_attrs
    assert gb.event_list == rb.event_list
    return ref


def test_the_fast_path_is_the_default() -> None:
    assert decode._wire is _wire and _wire.COLUMNS == SPAN_COLUMNS
    code = "from agentfunnel.collector import decode; print(decode.USE_WIRE)"
    for value, want in (("1", "False"), ("", "True")):
        env = {**os.environ, "AGENTFUNNEL_PURE_PYTHON": value}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == want


def test_schema_matches_the_installed_proto() -> None:
    """Every field upb knows is known to _wire with the same kind, so both validate the same."""
    kinds = {1: "fixed64", 3: "varint", 5: "varint", 6: "fixed64", 7: "fixed32", 8: "varint", 9: "string",
             11: "message", 12: "bytes", 13: "varint", 14: "varint"}
    schema = _wire._schema()
    seen: set[str] = set()

    def walk(desc: Any) -> None:
        name = desc.full_name.split(".v1.")[-1]
        if name in seen:
            return
        seen.add(name)
        assert name in schema, name
        want = {f.number: (f.name, kinds[f.type], f.message_type.full_name.split(".v1.")[-1] if f.message_type else "")
                for f in desc.fields}
        assert schema[name] == want, name
        for f in desc.fields:
            if f.message_type:
                walk(f.message_type)

    walk(ExportTraceServiceRequest.DESCRIPTOR)
    assert seen == set(schema)


# ---------------------------------------------------------------------------- benchmark payloads


@pytest.mark.parametrize("n, seed", [(512, 0), (512, 1), (37, 2), (1, 3)])
def test_bench_payloads(n: int, seed: int) -> None:
    ref = assert_same(genai_request_bytes(n, seed))
    assert ref[0] == "ok" and len(ref[5]) == n


def test_empty_and_minimal_bodies() -> None:
    for body in (b"", ExportTraceServiceRequest(resource_spans=[ResourceSpans()]).SerializeToString(),
                 ExportTraceServiceRequest(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=[Span()])])])
                 .SerializeToString()):
        assert_same(body)


# ---------------------------------------------------------------------------- hypothesis requests

SPECIAL_TEXT = ["", "\x00", "\x1f", "\x7f", '"', "\\", "\n\r\t\b\f", "\u2028", "é", "日本", "😀", "\U0010ffff",
                "a\"b\\c", "\x01\x02 \x0b\x0e"]
text = st.one_of(st.text(max_size=12), st.sampled_from(SPECIAL_TEXT),
                 st.lists(st.sampled_from(SPECIAL_TEXT), max_size=4).map("".join))
keys = st.one_of(st.sampled_from(["a", "b", "service.name", "gen_ai.usage.input_tokens", ""]), text)
doubles = st.one_of(st.floats(), st.sampled_from([math.nan, -math.nan, math.inf, -math.inf, -0.0, 0.0, 1e300,
                                                  5e-324, 1e16, 1e-7, 123456789.125, 2.0 ** 63, 0.1]))
ints = st.one_of(st.integers(-2**63, 2**63 - 1), st.sampled_from([0, -1, 2**63 - 1, -2**63, 2**53 + 1]))


def _strindex(i: int) -> AnyValue:
    return AnyValue(string_value_strindex=i)


scalar_values = st.one_of(
    text.map(lambda s: AnyValue(string_value=s)),
    st.booleans().map(lambda b: AnyValue(bool_value=b)),
    ints.map(lambda i: AnyValue(int_value=i)),
    doubles.map(lambda d: AnyValue(double_value=d)),
    st.binary(max_size=8).map(lambda b: AnyValue(bytes_value=b)),
    st.just(AnyValue()),
    *([st.integers(0, 9).map(_strindex)] if HAS_STRINDEX else []),
)


def _kvs(pairs: list[tuple[str, AnyValue]]) -> list[KeyValue]:
    return [KeyValue(key=k, value=v) for k, v in pairs]


any_values = st.recursive(
    scalar_values,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4).map(lambda vs: AnyValue(array_value=ArrayValue(values=vs))),
        st.lists(st.tuples(keys, inner), max_size=4).map(lambda kv: AnyValue(kvlist_value=KeyValueList(values=_kvs(kv)))),
    ),
    max_leaves=5,
)
attributes = st.lists(st.tuples(keys, any_values), max_size=4).map(_kvs)
few_attributes = st.lists(st.tuples(keys, scalar_values), max_size=2).map(_kvs)
ids16 = st.one_of(st.binary(min_size=16, max_size=16), st.sampled_from([b"", b"\0" * 16]), st.binary(max_size=20))
ids8 = st.one_of(st.binary(min_size=8, max_size=8), st.sampled_from([b"", b"\0" * 8]), st.binary(max_size=10))
enums = st.one_of(st.integers(0, 6), st.integers(-2**31, 2**31 - 1))


@st.composite
def spans(draw: Any) -> Span:
    s = Span(trace_id=draw(ids16), span_id=draw(ids8), parent_span_id=draw(ids8), trace_state=draw(text),
             name=draw(text), kind=draw(enums), start_time_unix_nano=draw(st.integers(0, 2**64 - 1)),
             end_time_unix_nano=draw(st.integers(0, 2**64 - 1)), flags=draw(st.integers(0, 2**32 - 1)),
             dropped_attributes_count=draw(st.integers(0, 3)))
    s.attributes.extend(draw(attributes))
    for _ in range(draw(st.integers(0, 2))):
        s.events.add(time_unix_nano=draw(st.integers(0, 2**64 - 1)), name=draw(text)).attributes.extend(draw(few_attributes))
    for _ in range(draw(st.integers(0, 2))):
        s.links.add(trace_id=draw(st.binary(max_size=17)), span_id=draw(st.binary(max_size=9)),
                    trace_state=draw(text), flags=draw(st.integers(0, 2**32 - 1))).attributes.extend(draw(few_attributes))
    if draw(st.booleans()):
        s.status.CopyFrom(Status(code=draw(enums), message=draw(text)))
    return s


@st.composite
def valid_spans(draw: Any) -> Span:
    """Mostly acceptable spans (so that columns, not only rejections, get compared)."""
    s = draw(spans())
    s.trace_id = draw(st.binary(min_size=16, max_size=16).filter(any))
    s.span_id = draw(st.binary(min_size=8, max_size=8).filter(any))
    s.kind = draw(st.integers(0, 5))
    s.status.code = draw(st.integers(0, 2))
    return s


@st.composite
def requests(draw: Any) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    for _ in range(draw(st.integers(0, 2))):
        rs = req.resource_spans.add()
        if draw(st.booleans()):
            rs.resource.CopyFrom(Resource(attributes=draw(attributes)))
            if draw(st.booleans()):
                rs.resource.attributes.add(key="service.name", value=draw(any_values))
        rs.schema_url = draw(text)
        for _ in range(draw(st.integers(0, 2))):
            ss = rs.scope_spans.add()
            if draw(st.booleans()):
                ss.scope.CopyFrom(InstrumentationScope(name=draw(text), version=draw(text), attributes=draw(few_attributes)))
            ss.spans.extend(draw(st.lists(st.one_of(valid_spans(), spans()), max_size=3)))
    return req


# A re-serializer that keeps the meaning of a message while changing its bytes the ways the
# wire format allows: fields in any order (repeated ones keep their relative order), singular
# sub-messages split in two occurrences (merged on parse), singular scalars and oneof members
# preceded by a value they override, and unknown fields (also known numbers with a wrong wire
# type, which upb keeps as unknown) anywhere, groups included.

def varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def tag(fn: int, wt: int) -> bytes:
    return varint(fn << 3 | wt)


def ld(fn: int, payload: bytes) -> bytes:
    return tag(fn, 2) + varint(len(payload)) + payload


WT = {1: 1, 6: 1, 7: 5, 3: 0, 5: 0, 8: 0, 13: 0, 14: 0, 9: 2, 12: 2, 11: 2}  # descriptor type → wire type


def scalar_wire(ftype: int, fn: int, value: Any) -> bytes:
    if ftype == 1:
        return tag(fn, 1) + struct.pack("<d", value)
    if ftype == 6:
        return tag(fn, 1) + struct.pack("<Q", value)
    if ftype == 7:
        return tag(fn, 5) + struct.pack("<I", value)
    if ftype in (3, 5, 13, 14):
        return tag(fn, 0) + varint(value)
    if ftype == 8:
        return tag(fn, 0) + varint(int(value))
    if ftype == 9:
        return ld(fn, value.encode())
    if ftype == 12:
        return ld(fn, value)
    raise AssertionError(ftype)


def unknown_field(rnd: random.Random, depth: int = 0) -> bytes:
    fn = rnd.choice([17, 19, 50, 1000, 536870911])
    kind = rnd.randrange(6 if depth < 3 else 5)
    if kind == 0:
        return tag(fn, 0) + varint(rnd.getrandbits(rnd.choice([1, 7, 35, 64])))
    if kind == 1:
        return tag(fn, 1) + rnd.randbytes(8)
    if kind == 2:
        return ld(fn, rnd.randbytes(rnd.randrange(6)))
    if kind == 3:
        return tag(fn, 5) + rnd.randbytes(4)
    if kind == 4:
        return b""
    return tag(fn, 3) + b"".join(unknown_field(rnd, depth + 1) for _ in range(rnd.randrange(3))) + tag(fn, 4)


def wrong_wire_type(rnd: random.Random, desc: Any) -> bytes:
    """A known field number with a wire type upb does not expect for it: an unknown field."""
    f = rnd.choice(desc.fields)
    wt = rnd.choice([w for w in (0, 1, 2, 5) if w != WT[f.type]])
    return {0: tag(f.number, 0) + varint(7), 1: tag(f.number, 1) + b"\1" * 8,
            2: ld(f.number, b"\xff\x00"), 5: tag(f.number, 5) + b"\1" * 4}[wt]


def decoy(rnd: random.Random, f: Any) -> bytes:
    """An earlier occurrence of a singular scalar field, overridden by the real one after it."""
    value = {1: rnd.random(), 6: rnd.getrandbits(64), 7: rnd.getrandbits(32), 3: rnd.getrandbits(64),
             5: rnd.getrandbits(32), 8: True, 13: 5, 14: 3, 9: "decoy", 12: b"\x01\x02"}[f.type]
    return scalar_wire(f.type, f.number, value)


def chunks(msg: Any, rnd: random.Random) -> list[bytes]:
    """The fields of ``msg`` as separate wire chunks, order-shuffled and noised."""
    seqs: list[list[bytes]] = []
    oneof = msg.WhichOneof("value") if msg.DESCRIPTOR.oneofs else None
    for f, value in msg.ListFields():
        if f.message_type is not None:
            items = list(value) if f.is_repeated else [value]
            seq = []
            for item in items:
                body = chunks(item, rnd)
                if not f.is_repeated and len(body) > 1 and rnd.random() < 0.4:
                    k = rnd.randrange(len(body) + 1)
                    seq += [ld(f.number, b"".join(body[:k])), ld(f.number, b"".join(body[k:]))]
                else:
                    seq.append(ld(f.number, b"".join(body)))
            seqs.append(seq)
        elif f.is_repeated:
            seqs.append([scalar_wire(f.type, f.number, v) for v in value])
        else:
            seq = [scalar_wire(f.type, f.number, value)]
            if rnd.random() < 0.3 and f.name != oneof:
                seq.insert(0, decoy(rnd, f))
            seqs.append(seq)
    if oneof and rnd.random() < 0.4:  # another member first; the real one replaces it
        other = rnd.choice([n for n in ("string_value", "int_value", "array_value", "kvlist_value", "bool_value")
                            if n != oneof])
        d = {"string_value": ld(1, b"x"), "int_value": tag(3, 0) + varint(5),
             "array_value": ld(5, ld(1, ld(1, b"y"))), "kvlist_value": ld(6, ld(1, ld(1, b"k"))),
             "bool_value": tag(2, 0) + b"\1"}[other]
        seqs.insert(0, [d])  # kept first: before the real member
        first_fixed = True
    else:
        first_fixed = False
    for _ in range(rnd.choice([0, 0, 0, 1, 2])):
        seqs.append([unknown_field(rnd) if rnd.random() < 0.7 else wrong_wire_type(rnd, msg.DESCRIPTOR)])
    out: list[bytes] = []
    if first_fixed:
        out += seqs.pop(0)
    # random interleaving that keeps each sequence's order
    pending = [s for s in seqs if s]
    while pending:
        s = rnd.choice(pending)
        out.append(s.pop(0))
        if not s:
            pending.remove(s)
    return out


def reserialize(msg: Any, seed: int) -> bytes:
    return b"".join(chunks(msg, random.Random(seed)))


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(requests(), st.integers(0, 2**32))
def test_generated_requests(req: ExportTraceServiceRequest, seed: int) -> None:
    """As serialized by protobuf, then re-serialized with the same meaning in other bytes."""
    canonical = assert_same(req.SerializeToString())
    ref = assert_same(reserialize(req, seed))
    assert ref[:4] == canonical[:4]  # the re-serializer kept the meaning (checks the test itself)


# ---------------------------------------------------------------------------- hand-written edge cases


def span_bytes(**fields: Any) -> bytes:
    base = dict(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="s")
    base.update(fields)
    return Span(**base).SerializeToString()


def request_of_span(span: bytes, scope: bytes = b"", resource: bytes = b"") -> bytes:
    ss = (ld(1, scope) if scope else b"") + ld(2, span)
    rs = (ld(1, resource) if resource else b"") + ld(2, ss)
    return ld(1, rs)


def kv(key: bytes, value: bytes) -> bytes:
    return ld(1, key) + ld(2, value)


def attr_span(*kvs: bytes) -> bytes:
    return span_bytes() + b"".join(ld(9, k) for k in kvs)


def nested_array(levels: int) -> bytes:
    v = tag(3, 0) + varint(1)
    for _ in range(levels):
        v = ld(5, ld(1, v))
    return v


EDGE_BODIES = {
    "scope and resource after their spans": ld(1, ld(2, ld(2, span_bytes()) + ld(1, ld(1, b"lib")))
                                               + ld(1, ld(1, kv(b"service.name", ld(1, b"svc"))))),
    "resource twice (merged)": ld(1, ld(1, ld(1, kv(b"a", ld(1, b"1")))) + ld(2, ld(2, span_bytes()))
                                  + ld(1, ld(1, kv(b"service.name", ld(1, b"s2"))))),
    "service.name twice, last not a string": request_of_span(span_bytes(), resource=ld(1, kv(b"service.name", ld(1, b"x")))
                                                             + ld(1, kv(b"service.name", tag(3, 0) + b"\x05"))),
    "service.name empty string": request_of_span(span_bytes(), resource=ld(1, kv(b"service.name", ld(1, b"")))),
    "scope twice (merged)": ld(1, ld(2, ld(1, ld(1, b"a") + ld(2, b"v")) + ld(2, span_bytes()) + ld(1, ld(1, b"b")))),
    "span concatenated with another (merge)": request_of_span(span_bytes(name="a") + span_bytes(name="b", kind=3)),
    "status twice (merge)": request_of_span(span_bytes() + ld(15, tag(3, 0) + b"\x02") + ld(15, ld(2, b"m"))),
    "key after value": request_of_span(attr_span(ld(2, ld(1, b"v")) + ld(1, b"k"))),
    "key twice around value": request_of_span(attr_span(ld(1, b"a") + ld(2, ld(1, b"v")) + ld(1, b"b"))),
    "key twice before value": request_of_span(attr_span(ld(1, b"a") + ld(1, b"b\n") + ld(2, ld(1, b"v")))),
    "no key": request_of_span(attr_span(ld(2, ld(1, b"v")))),
    "no value": request_of_span(attr_span(ld(1, b"k"))),
    "value twice (array merge)": request_of_span(attr_span(kv(b"k", ld(5, ld(1, ld(1, b"x")))) + ld(2, ld(5, ld(1, tag(3, 0) + b"\x07"))))),
    "oneof array, string, array": request_of_span(attr_span(kv(b"k", ld(5, ld(1, ld(1, b"x"))) + ld(1, b"s") + ld(5, ld(1, ld(1, b"y")))))),
    "oneof kvlist, int, kvlist": request_of_span(attr_span(kv(b"k", ld(6, ld(1, kv(b"a", ld(1, b"1")))) + tag(3, 0) + b"\x01"
                                                            + ld(6, ld(1, kv(b"b", ld(1, b"2"))))))),
    "kvlist merged with duplicate keys": request_of_span(attr_span(kv(b"k", ld(6, ld(1, kv(b"a", ld(1, b"1"))) + ld(1, kv(b"b", b"")))
                                                                       + ld(6, ld(1, kv(b"a", tag(2, 0) + b"\x01")))))),
    "duplicate attribute keys": request_of_span(attr_span(kv(b"a", ld(1, b"1")), kv(b"b", ld(1, b"2")), kv(b"a", ld(1, b"3")))),
    "many duplicate keys (hash path)": request_of_span(attr_span(*[kv(b"k%d" % (i % 23), tag(3, 0) + varint(i)) for i in range(80)])),
    "bool from a 10-byte varint": request_of_span(attr_span(kv(b"b", tag(2, 0) + b"\x80" * 9 + b"\x01"))),
    "int overflowing 64 bits": request_of_span(attr_span(kv(b"i", tag(3, 0) + b"\xff" * 9 + b"\x7f"))),
    "kind as a 10-byte negative": request_of_span(span_bytes() + tag(6, 0) + varint(-1)),
    "kind above int32": request_of_span(span_bytes() + tag(6, 0) + varint(2**32 + 2)),
    "status code negative": request_of_span(span_bytes() + ld(15, tag(3, 0) + varint(-5))),
    "event fields after attributes": request_of_span(span_bytes() + ld(11, ld(3, kv(b"a", b"")) + ld(2, b"ev") + tag(1, 1) + b"\xff" * 8)),
    "empty event and link": request_of_span(span_bytes() + ld(11, b"") + ld(13, b"")),
    "link fields after attributes": request_of_span(span_bytes() + ld(13, ld(4, kv(b"a", b"")) + ld(3, b"ts") + ld(1, b"\xab") + ld(2, b""))),
    "unknown group everywhere": request_of_span(span_bytes() + tag(99, 3) + tag(1, 0) + b"\x01" + tag(99, 4),
                                                scope=tag(7, 3) + tag(7, 4)) + tag(5, 3) + tag(5, 4),
    "group on a known field number": request_of_span(span_bytes() + tag(5, 3) + tag(5, 4)),
    "wrong wire types on known fields": request_of_span(span_bytes() + tag(5, 0) + b"\x01" + tag(1, 5) + b"1234"
                                                        + tag(9, 0) + b"\x00" + tag(7, 2) + b"\x00" + tag(16, 0) + b"\x01"),
    "resource_spans as varint": tag(1, 0) + b"\x01",
    "array nesting at the limit": request_of_span(attr_span(kv(b"d", nested_array(47)))),
    "array nesting past the limit": request_of_span(attr_span(kv(b"d", nested_array(48)))),
    "depth 100 (groups)": tag(9, 3) * 100 + tag(9, 4) * 100,
    "depth 101 (groups)": tag(9, 3) * 101 + tag(9, 4) * 101,
    "groups in a span to the limit": request_of_span(span_bytes() + tag(9, 3) * 97 + tag(9, 4) * 97),
    "groups in a span past the limit": request_of_span(span_bytes() + tag(9, 3) * 98 + tag(9, 4) * 98),
    "depth via scope attributes": request_of_span(span_bytes(), scope=ld(3, kv(b"k", nested_array(47)))),
    "depth via scope attributes, too deep": request_of_span(span_bytes(), scope=ld(3, kv(b"k", nested_array(48)))),
    "field number 0 inside an unknown group (upb skips it)": tag(5, 3) + b"\x01" + b"\x73" * 8 + tag(0, 3) + tag(0, 4) + tag(5, 4),
    "field number 0 as a group": tag(0, 3) + tag(0, 4),
    "unterminated group": tag(9, 3) + tag(1, 0) + b"\x01",
    "unterminated group at the end of a span": request_of_span(span_bytes() + tag(5, 3)) + tag(5, 4),
    "mismatched end group": tag(9, 3) + tag(8, 4),
    "stray end group": tag(9, 4),
    "end group inside a span": request_of_span(span_bytes() + tag(5, 4)),
    "field number 0": tag(0, 0) + b"\x00",
    "field number 0 inside a span": request_of_span(span_bytes() + tag(0, 2) + b"\x00"),
    "wire type 6": tag(3, 6),
    "wire type 7 in an AnyValue": request_of_span(attr_span(kv(b"k", tag(1, 7)))),
    "tag of 5 bytes": b"\xf8\xff\xff\xff\x0f" + b"\x00",
    "tag above 32 bits": b"\xff\xff\xff\xff\x1f" + b"\x00",
    "tag of 6 bytes": b"\x88\x80\x80\x80\x80\x00" + b"\x00",
    "varint of 11 bytes": tag(9, 0) + b"\xff" * 10 + b"\x01",
    "length of 5 bytes": tag(9, 2) + b"\x80" * 4 + b"\x00" + tag(1, 2) + b"\x81\x80\x80\x80\x00" + b"\x00",
    "length of 6 bytes": tag(9, 2) + b"\x80" * 5 + b"\x00",
    "length of 6 bytes in a group": tag(9, 3) + tag(2, 2) + b"\x80" * 5 + b"\x00" + tag(9, 4),
    "value varint of 10 bytes in a group": tag(9, 3) + tag(2, 0) + b"\x80" * 9 + b"\x00" + tag(9, 4),
    "truncated varint": tag(9, 0) + b"\xff",
    "truncated fixed64": request_of_span(span_bytes() + tag(7, 1) + b"\x00" * 7),
    "truncated fixed32 in a group": tag(9, 3) + tag(1, 5) + b"\x00",
    "length past the end": tag(1, 2) + b"\x05",
    "length past its message": ld(1, ld(2, b"\x12\x05ab") + b"abc"),
    "bad UTF-8 in span name": request_of_span(span_bytes() + ld(5, b"\xff")),
    "surrogate in attribute key": request_of_span(attr_span(kv(b"\xed\xa0\x80", b""))),
    "overlong in string value": request_of_span(attr_span(kv(b"k", ld(1, b"\xc0\xaf")))),
    "above U+10FFFF in event name": request_of_span(span_bytes() + ld(11, ld(2, b"\xf4\x90\x80\x80"))),
    "truncated sequence in link trace_state": request_of_span(span_bytes() + ld(13, ld(3, b"a\xe2\x82"))),
    "bad UTF-8 in status message": request_of_span(span_bytes() + ld(15, ld(2, b"\x80"))),
    "bad UTF-8 in overridden value": request_of_span(attr_span(kv(b"k", ld(1, b"\xff") + ld(1, b"ok")))),
    "bad UTF-8 in scope attribute": request_of_span(span_bytes(), scope=ld(3, kv(b"\xff", b""))),
    "bad UTF-8 in schema_url": ld(1, ld(3, b"\xff")),
    "bad UTF-8 in entity ref": ld(1, ld(1, ld(3, ld(3, b"\xff")))),
    "bad UTF-8 in an unknown field": request_of_span(span_bytes() + ld(77, b"\xff")),
    "bad UTF-8 as a wrong-wire-type field": request_of_span(span_bytes() + tag(5, 5) + b"\xff\xff\xff\xff"),
    "bytes value, all paddings": request_of_span(attr_span(kv(b"a", ld(7, b"")), kv(b"b", ld(7, b"\xff")),
                                                           kv(b"c", ld(7, b"\xff\xfe")), kv(b"d", ld(7, b"\xff\xfe\xfd")))),
    "string_value_strindex": request_of_span(attr_span(kv(b"a", tag(8, 0) + b"\x03"), kv(b"b", ld(1, b"s") + tag(8, 0) + b"\x01"))),
    "key_strindex": request_of_span(attr_span(kv(b"a", b"") + tag(3, 0) + b"\x01")),
    "parent of 8 zero bytes": request_of_span(span_bytes(parent_span_id=b"\0" * 8)),
    "parent of 3 bytes": request_of_span(span_bytes(parent_span_id=b"abc")),
    "all-zero trace id": request_of_span(span_bytes(trace_id=b"\0" * 16)),
    "many rejected spans": ld(1, ld(2, b"".join(ld(2, span_bytes(span_id=b"")) for _ in range(9)) + ld(2, span_bytes()))),
}


@pytest.mark.parametrize("name", list(EDGE_BODIES))
def test_edge_cases(name: str) -> None:
    assert_same(EDGE_BODIES[name])


def test_edge_case_expectations() -> None:
    """A few edge cases with their outcome spelled out, so that both decoders can't agree on nonsense."""
    def ok(name: str) -> SpanBatch:
        got = outcome(decode.decode_traces_protobuf_wire, EDGE_BODIES[name])
        assert got[0] == "ok", got
        return got[5]

    def err(name: str) -> str:
        got = outcome(decode.decode_traces_protobuf_wire, EDGE_BODIES[name])
        assert got[0] == "error", name
        return got[1]

    assert ok("array nesting at the limit").attributes[0].count("[") == 47
    assert "nested deeper" in err("array nesting past the limit")
    assert "nested deeper" in err("depth 101 (groups)")
    ok("depth 100 (groups)")
    b = ok("scope and resource after their spans")
    assert (b.service_name, b.scope_name) == (["svc"], ["lib"])
    assert ok("duplicate attribute keys").attributes == ['{"a":"3","b":"2"}']
    assert ok("oneof array, string, array").attributes == ['{"k":["y"]}']
    assert ok("value twice (array merge)").attributes == ['{"k":["x",7]}']
    assert ok("key after value").attributes == ['{"k":"v"}']
    assert ok("bytes value, all paddings").attributes == ['{"a":"","b":"/w==","c":"//4=","d":"//79"}']
    assert ok("span concatenated with another (merge)").name == ["b"]
    assert ok("service.name twice, last not a string").service_name == [None]
    assert ok("wrong wire types on known fields").name == ["s"]
    b = ok("many rejected spans")
    assert len(b) == 1 and b.rejected.count == 9 and len(b.rejected.messages) == 5
    assert b.rejected.message().endswith("; and 4 more")
    assert b.rejected.messages[0] == "resourceSpans[0].scopeSpans[0].spans[0]: span_id is empty"
    assert "UTF-8" in err("bad UTF-8 in span name") and "Span.name" in err("bad UTF-8 in span name")
    assert "offset" in err("length past the end")


def test_json_of_special_values() -> None:
    vals = [AnyValue(double_value=x) for x in (math.nan, math.inf, -math.inf, -0.0, 1e300, 5e-324, 1.0, 1e16, 0.1)]
    vals += [AnyValue(int_value=-2**63), AnyValue(string_value="\x00\x1f\"\\\n\u2028😀\x7f"), AnyValue()]
    span = Span(trace_id=b"\1" * 16, span_id=b"\2" * 8, attributes=[KeyValue(key=str(i), value=v) for i, v in enumerate(vals)])
    body = request_of_span(span.SerializeToString())
    ref = assert_same(body)
    assert ref[1]["attributes"] == [
        '{"0":"nan","1":"inf","2":"-inf","3":-0.0,"4":1e+300,"5":5e-324,"6":1.0,"7":1e+16,"8":0.1,'
        '"9":-9223372036854775808,"10":"\\u0000\\u001f\\"\\\\\\n\u2028😀\x7f","11":null}']


# ---------------------------------------------------------------------------- random bytes and mutations


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes(body: bytes) -> None:
    assert_same(body)


def _seed_bodies() -> list[bytes]:
    rnd = random.Random(7)
    bodies = [genai_request_bytes(3, 11)]
    bodies += [EDGE_BODIES[k] for k in ("duplicate attribute keys", "event fields after attributes",
                                        "oneof kvlist, int, kvlist", "unknown group everywhere",
                                        "link fields after attributes", "bytes value, all paddings",
                                        "many duplicate keys (hash path)", "kvlist merged with duplicate keys",
                                        "array nesting at the limit", "groups in a span to the limit",
                                        "field number 0 inside an unknown group (upb skips it)")]
    req = ExportTraceServiceRequest()
    ss = req.resource_spans.add(resource=Resource(attributes=_kvs([("service.name", AnyValue(string_value="svc"))]))).scope_spans.add()
    s = ss.spans.add(trace_id=b"\1" * 16, span_id=b"\2" * 8, name="rich", kind=2)
    s.attributes.extend(_kvs([("a", AnyValue(double_value=1.5)), ("b", AnyValue(bytes_value=b"xyz")),
                              ("c", AnyValue(kvlist_value=KeyValueList(values=_kvs([("d", AnyValue(int_value=-3))])))),
                              ("é", AnyValue(array_value=ArrayValue(values=[AnyValue(bool_value=True), AnyValue()])))]))
    s.events.add(name="e", time_unix_nano=5).attributes.extend(_kvs([("k", AnyValue(string_value="v"))]))
    s.links.add(trace_id=b"\3" * 16, span_id=b"\4" * 8, trace_state="t=1")
    s.status.CopyFrom(Status(code=2, message="bad"))
    bodies.append(req.SerializeToString())
    bodies.append(reserialize(req, rnd.randrange(1000)))
    return bodies


def _mutate(rnd: random.Random, body: bytes, others: list[bytes]) -> bytes:
    b = bytearray(body)
    for _ in range(rnd.choice([1, 1, 1, 2, 3])):
        op = rnd.randrange(7)
        i = rnd.randrange(len(b) + 1)
        if op == 0 and b:
            b[min(i, len(b) - 1)] ^= 1 << rnd.randrange(8)
        elif op == 1:
            del b[i:]
        elif op == 2:
            b[i:i] = bytes([rnd.randrange(256)])
        elif op == 3 and b:
            del b[min(i, len(b) - 1)]
        elif op == 4 and b:
            b[min(i, len(b) - 1)] = rnd.choice([0x00, 0x7F, 0x80, 0xFF, 0x0A, 0x12, 0x08, 0x0B, 0x0C, 0xC0, 0xED])
        elif op == 5:
            j = rnd.randrange(len(b) + 1)
            b[i:i] = b[min(i, j):max(i, j)][:64]
        else:
            o = rnd.choice(others)
            j = rnd.randrange(len(o) + 1)
            b[i:i] = o[j:j + rnd.randrange(1, 40)]
    return bytes(b)


def test_mutations_20k() -> None:
    """20,000 mutated bodies (bit flips, truncations, insertions, splices): same outcome, no crash."""
    rnd = random.Random(20240611)
    bodies = _seed_bodies()
    outcomes = {"ok": 0, "error": 0}
    for _ in range(20_000):
        body = _mutate(rnd, rnd.choice(bodies), bodies)
        outcomes[assert_same(body)[0]] += 1
    assert outcomes["ok"] > 1000 and outcomes["error"] > 1000, outcomes


def test_service_name_follows_the_reference_str_check() -> None:
    """The reference keeps service.name when its Python value is a str: bytes and nan qualify."""
    for value, want in ((AnyValue(bytes_value=b"\x01\x02"), "AQI="), (AnyValue(double_value=-math.inf), "-inf"),
                        (AnyValue(double_value=1.5), None), (AnyValue(int_value=3), None), (AnyValue(), None),
                        (AnyValue(string_value=""), "")):
        body = request_of_span(span_bytes(), resource=ld(1, KeyValue(key="service.name", value=value).SerializeToString()))
        assert assert_same(body)[1]["service_name"] == [want]


# ---------------------------------------------------------------------------- store


def test_span_table_stores_the_columns_verbatim(tmp_path: Path) -> None:
    """What the writer inserts from compiled-decoder columns reads back as the same values."""
    from datetime import datetime

    from agentfunnel.collector.store.schema import migrate
    from agentfunnel.collector.store.writer import Store, connect

    special = EDGE_BODIES["bytes value, all paddings"]
    batches = [decode.decode_traces_protobuf_wire(b) for b in
               (genai_request_bytes(7, 1), special, request_of_span(attr_span(kv("\x00é😀\"\\".encode(), ld(1, b"\n\x1f"))))
                + request_of_span(span_bytes(span_id=b"\x09" * 8) + ld(11, ld(2, b"ev")) + ld(13, ld(3, b"ts"))))]
    masks = [None, [True], [False, True]]
    received = datetime(2026, 1, 2, 3, 4, 5, 678901)
    con = connect(tmp_path / "t.duckdb")
    migrate(con)
    spans_tbl = Store._span_table(list(zip(batches, masks)), received)  # noqa: F841 (read by DuckDB)
    con.execute("INSERT INTO spans BY NAME SELECT * FROM spans_tbl")
    cols = ["trace_id", "span_id", "parent_span_id", "name", "kind", "status_code", "status_message", "service_name",
            "scope_name", "scope_version", "attributes", "resource_attributes", "events", "links", "trace_state"]
    got = con.execute(f"SELECT {', '.join(c + '::VARCHAR' for c in cols)}, epoch_ns(start_time), epoch_ns(end_time), "
                      "flags, received_at FROM spans").fetchall()
    want = []
    for b, mask in zip(batches, masks):
        for i in range(len(b)):
            if mask is None or mask[i]:
                want.append(tuple(getattr(b, c)[i] for c in cols) + (b.start_ns[i], b.end_ns[i], b.flags[i], received))
    assert got == want and len(want) == 9


# ---------------------------------------------------------------------------- Arrow buffers

_TEXT = st.one_of(st.none(), st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40))


@given(st.lists(_TEXT, max_size=300))
@settings(max_examples=300, deadline=None)
def test_string_buffers_make_the_array_pyarrow_makes(values: list[str | None]) -> None:
    import pyarrow as pa

    validity, offsets, data, nulls = _wire.string_buffers(values)
    arr = pa.Array.from_buffers(pa.string(), len(values),
                                [validity and pa.py_buffer(validity), pa.py_buffer(offsets), pa.py_buffer(data)], nulls)
    arr.validate(full=True)
    assert arr.equals(pa.array(values, pa.string())) and arr.null_count == values.count(None)


@given(st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=300))
@settings(max_examples=200, deadline=None)
def test_int64_buffer_makes_the_array_pyarrow_makes(values: list[int]) -> None:
    import pyarrow as pa

    arr = pa.Array.from_buffers(pa.timestamp("ns"), len(values), [None, pa.py_buffer(_wire.int64_buffer(values))])
    assert arr.equals(pa.array(values, pa.timestamp("ns")))


def test_arrow_buffers_refuse_what_pyarrow_refuses() -> None:
    with pytest.raises(TypeError, match="item 1 is int"):
        _wire.string_buffers(["a", 1])
    with pytest.raises(TypeError, match="item 0 is NoneType"):
        _wire.int64_buffer([None])
    with pytest.raises(OverflowError):
        _wire.int64_buffer([0, 2**63])  # a time past 2^63 ns: the writer turns this into a refusal
    with pytest.raises(UnicodeEncodeError):
        _wire.string_buffers(["\ud800"])


def test_span_table_without_the_compiled_module_is_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from datetime import datetime

    from agentfunnel.collector.store import writer

    parts = [(decode.decode_traces_protobuf(genai_request_bytes(20, 3)), None),
             (decode.decode_traces_protobuf(EDGE_BODIES["bytes value, all paddings"]), [True])]
    at = datetime(2026, 1, 1)
    compiled = writer.Store._span_table(parts, at)
    monkeypatch.setattr(writer, "WIRE", None)
    assert writer.Store._span_table(parts, at).equals(compiled)
