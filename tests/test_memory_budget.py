"""The server's memory budget: every cap in it is a setting, the defaults' sum stays under 1 GiB, and the
operations page shows the same table and sum as the code computes (what ``agentfunnel serve`` logs at start)."""

from __future__ import annotations

import re
import types
import typing

from pydantic import BaseModel

from agentfunnel.collector.budget import CAPS, IDLE_BASE_BYTES, budget_line, memory_budget
from agentfunnel.collector.config import MiB, Settings
from docs_text import DOCS

GiB = 1024 * MiB


def _field(model: type[BaseModel], dotted: str) -> object:
    """The settings field a dotted name names (through optional sections such as ``forward``); KeyError if none."""
    head, _, rest = dotted.partition(".")
    info = model.model_fields[head]
    if not rest:
        return info
    annotation = info.annotation
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    return _field(annotation, rest)


def test_every_cap_is_a_setting():
    for cap in CAPS:
        _field(Settings, cap.setting)  # raises for a name that is no setting
    assert len({cap.setting for cap in CAPS}) == len(CAPS)


def test_the_defaults_sum_under_one_gib_with_the_idle_base():
    budget = memory_budget(Settings())
    assert sum(budget.values()) + IDLE_BASE_BYTES < GiB, budget
    assert budget["store.memory_limit_mb"] == Settings().store.memory_limit_mb * MiB


def test_in_flight_and_the_prepare_queue_count_apart_only_when_held_bytes_do_not_push_back():
    pushing = memory_budget(Settings())
    evicting = memory_budget(Settings.model_validate({"sessions": {"push_back_when_held_full": False}}))
    assert "receivers.max_bytes_in_flight" not in pushing and "sessions.max_prepare_queue_bytes" not in pushing
    extra = Settings().receivers.max_bytes_in_flight + Settings().sessions.max_prepare_queue_bytes
    assert sum(evicting.values()) == sum(pushing.values()) + extra
    forwarding = memory_budget(Settings.model_validate({"forward": {"endpoint": "localhost:4317", "mode": "hold"}}))
    assert forwarding["forward.queue_max_bytes"] == 128 * MiB and forwarding["forward.hold_max_bytes"] == 128 * MiB


def test_the_operations_page_shows_the_budget_the_code_computes():
    text = (DOCS / "operations.md").read_text()
    rows = dict(re.findall(r"^  \| `([a-z_.]+)` \| [^|]+ \| ([\d,]+) \|", text, flags=re.M))
    budget = memory_budget(Settings())
    assert set(rows) == {cap.setting for cap in CAPS}
    for setting, mib in rows.items():
        assert int(mib.replace(",", "")) == round(budget.get(setting, 0) / MiB), setting
    total = round((sum(budget.values()) + IDLE_BASE_BYTES) / MiB)
    assert f"about {total:,} MiB" in text
    assert f"about {total:,} MiB" in budget_line(Settings())
