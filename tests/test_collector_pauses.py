"""The cyclic collector's passes and pauses, counted by its own callbacks and shown on /metrics (the process's
part is asserted where a real ``agentfunnel serve`` floods: tests/test_durability.py)."""

from __future__ import annotations

import gc

from agentfunnel.collector.telemetry import COLLECTOR_PAUSES, CollectorPauses, Metrics


def test_passes_and_their_wall_time_are_counted_by_generation():
    pauses = CollectorPauses()
    assert pauses.passes() == {} and pauses.pause_microseconds() == {}
    pauses.install()
    pauses.install()  # once per process: a second install adds no second callback
    try:
        assert gc.callbacks.count(pauses._on_pass) == 1
        garbage = [[] for _ in range(20_000)]
        for a, b in zip(garbage, garbage[1:]):
            a.append(b)
            b.append(a)  # cycles: only the collector frees them, and a full pass has them to walk
        del garbage, a, b
        gc.collect(0)
        gc.collect(0)
        gc.collect(2)
    finally:
        gc.callbacks.remove(pauses._on_pass)
    passes, micros = pauses.passes(), pauses.pause_microseconds()
    assert passes["0"] >= 2 and passes["2"] >= 1
    assert micros["2"] > 0 and set(micros) <= set(passes)
    gc.collect(0)  # no longer listening
    assert pauses.passes() == passes


def test_the_process_counters_show_on_metrics_as_json_and_prometheus_text():
    COLLECTOR_PAUSES.install()
    gc.collect(1)
    gc.disable()  # no pass between the reads compared
    try:
        metrics = Metrics()
        snapshot = metrics.snapshot()
        got = metrics.get("gc_passes", "1")
        text = metrics.prometheus()
    finally:
        gc.enable()
    assert snapshot["gc_passes"]["1"] >= 1 and snapshot["gc_pause_microseconds"]["1"] >= 0
    assert got == snapshot["gc_passes"]["1"]
    assert '# TYPE agentfunnel_gc_passes_total counter' in text
    assert f'agentfunnel_gc_passes_total{{reason="1"}} {snapshot["gc_passes"]["1"]}' in text


def test_a_pass_whose_start_was_not_seen_is_not_counted():
    """Installed while a pass runs (from a finalizer, say), the first callback is that pass's end: without its
    start there is nothing to time, and counting it would add the clock's whole reading."""
    pauses = CollectorPauses()
    pauses._on_pass("stop", {"generation": 2})
    assert pauses.passes() == {} and pauses.pause_microseconds() == {}
    pauses._on_pass("start", {"generation": 0})
    pauses._on_pass("stop", {"generation": 0})
    pauses._on_pass("stop", {"generation": 0})  # one start, one pass
    assert pauses.passes() == {"0": 1} and pauses.pause_microseconds()["0"] < 1_000_000
