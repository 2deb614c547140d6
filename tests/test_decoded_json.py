"""A decoded batch's JSON text read back (``decoded.from_json``) gives exactly what ``json.loads`` gives.

``from_json`` reads with orjson and falls back to ``json`` where orjson refuses the text. The two
libraries could still differ on a text both accept: orjson reads an integer past 64 bits as a float.
These tests hold the two equal (values and their types) on every text the decoders write: from
decoded values built by hypothesis (int64 integers, finite and non-finite floats, text with lone
surrogates and control characters, bytes, nesting) and from every recorded fixture's attributes,
resource attributes and events. They also show the fallback is needed, and what the guard rests on.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentfunnel.collector.decode import decode_traces_protobuf
from agentfunnel.collector.decoded import from_json, to_json
from agentfunnel.collector.otlp_values import InValue, JsonValueError, json_any

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = sorted((ROOT / "tests" / "fixtures" / "otlp").glob("*/*.traces.binpb"))


def typed(value: Any) -> Any:
    """The value with each leaf's type beside it and each object's keys in order: ``1 == 1.0 == True`` and
    ``-0.0 == 0.0`` in Python, and two dicts are equal in any order, but not as a stored row reads them."""
    if isinstance(value, dict):
        return [(k, typed(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [typed(v) for v in value]
    if isinstance(value, float):
        return ("float", repr(value))
    return (type(value).__name__, value)


def assert_same(text: str) -> None:
    assert typed(from_json(text)) == typed(json.loads(text))


_LEAVES = (st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1)
           | st.floats(allow_nan=False, allow_infinity=False)
           | st.text(st.characters(codec=None, exclude_categories=())))
_VALUES = st.recursive(_LEAVES, lambda inner: st.lists(inner, max_size=5)
                       | st.dictionaries(st.text(max_size=8), inner, max_size=5), max_leaves=30)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.text(max_size=20), _VALUES, max_size=8))
def test_texts_of_decoded_values_read_back_as_json_reads_them(attributes):
    assert_same(to_json(attributes))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(width=64) | st.integers(-(2**63), 2**63 - 1), max_size=20))
def test_numbers_read_back_to_the_same_value_and_type(numbers):
    # the decoders make a non-finite float a string before writing it (to_json refuses NaN)
    text = to_json([n if not isinstance(n, float) or math.isfinite(n) else str(n) for n in numbers])
    assert_same(text)


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_recorded_fixtures_texts_read_back_as_json_reads_them(fixture):
    batch = decode_traces_protobuf(fixture.read_bytes())
    texts = [t for t in (*batch.attributes, *batch.resource_attributes, *batch.events, *batch.links) if t]
    assert texts
    for text in texts:
        assert_same(text)


def test_a_lone_surrogate_is_read_by_the_fallback():
    text = to_json({"k": "a\ud800b"})
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(text)
    assert from_json(text) == {"k": "a\ud800b"}


def test_integers_past_64_bits_never_reach_a_decoded_text():
    # what from_json relies on: orjson reads an int64 and a uint64 time exactly, and 2**64 as a float, which the
    # decoders never write: they refuse an integer outside int64
    for edge in (-(2**63), 2**63 - 1, 2**64 - 1):
        assert typed(from_json(str(edge))) == typed(orjson.loads(str(edge))) == ("int", edge)
    assert isinstance(orjson.loads(str(2**64)), float)
    for too_big in (2**63, -(2**63) - 1):
        with pytest.raises(InValue, match="outside int64") as refused:
            json_any({"intValue": str(too_big)}, 5)
        assert refused.value.kind is JsonValueError
