"""Patterns the user writes run on telemetry in linear time: a crafted value cannot hold a thread.

``(a+)+$`` against ``a…a!`` takes 2^n steps on a backtracking engine (n = 40 is hours); each test
runs the match on a thread and fails if it has not finished within seconds.
"""

from __future__ import annotations

import threading
from collections import Counter

from agentfunnel.collector.config import PrivacySettings
from agentfunnel.collector.privacy import Redactor
from agentfunnel.scoring.assertions import AssertionSpec, evaluate_assertions
from agentfunnel.scoring.case_models import ArgumentExpectation
from agentfunnel.scoring.stages.reading import expectation_problem as _expectation_problem

EVIL = "(a+)+$"
CRAFTED = "a" * 40 + "!"


def finishes(work) -> object:
    out: list[object] = []
    worker = threading.Thread(target=lambda: out.append(work()), daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert not worker.is_alive(), "the match is still running: backtracking on untrusted text"
    return out[0]


def test_an_assertion_regex_on_a_crafted_artifact():
    spec = AssertionSpec(kind="name_like", path="$.fields[*]", pattern=EVIL, regex=True)
    [result] = finishes(lambda: evaluate_assertions([spec], {"fields": [CRAFTED]}, {}))
    assert result.passed is False
    [result] = evaluate_assertions([spec], {"fields": ["AAA"]}, {})  # still case-insensitive
    assert result.passed is True


def test_an_argument_pattern_on_crafted_arguments():
    exp = ArgumentExpectation(pointer="/q", pattern=EVIL)
    problem = finishes(lambda: _expectation_problem(exp, {"q": CRAFTED}))
    assert problem is not None and problem["check"] == "pattern"
    assert _expectation_problem(exp, {"q": "aaa"}) is None


def test_a_redaction_pattern_on_a_crafted_value():
    redactor = Redactor(PrivacySettings(patterns=[{"name": "evil", "regex": EVIL}]))
    counts: Counter[str] = Counter()
    out = finishes(lambda: redactor.attributes({"a": CRAFTED, "b": "xaa"}, counts))
    assert out == {"a": CRAFTED, "b": "x[redacted:evil]"} and counts == {"pattern:evil": 1}
