"""Tokens the model calls report, and how many report them."""

from __future__ import annotations

from dataclasses import dataclass

from .base import Fact, Trace


@dataclass(frozen=True, slots=True)
class Tokens:
    input_tokens: int
    input_reports: int  # model calls reporting input tokens
    output_tokens: int
    output_reports: int


class TokensFact(Fact[Tokens, Tokens]):
    name = "tokens"

    def summarize(self, trace: Trace) -> Tokens:
        inputs = [r.input_tokens for _, r in trace.llms if r.input_tokens is not None]
        outputs = [r.output_tokens for _, r in trace.llms if r.output_tokens is not None]
        return Tokens(sum(inputs), len(inputs), sum(outputs), len(outputs))

    def merge(self, a: Tokens, b: Tokens) -> Tokens:
        return Tokens(a.input_tokens + b.input_tokens, a.input_reports + b.input_reports,
                      a.output_tokens + b.output_tokens, a.output_reports + b.output_reports)


FACT = TokensFact()
