"""Model prices, for cost per session: a shipped table you can override per model.

Prices are USD per million tokens, list prices at the time of writing; patterns are matched
case-insensitively against the model name the telemetry reports (exact, then glob, longest
pattern first). A model no pattern matches has no known price, and a session that used one has
cost NULL, not 0: an unknown cost must not read as free.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

from pydantic import BaseModel, ConfigDict, Field


class Price(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    input_per_million: float = Field(ge=0, description="USD per million input tokens.")
    output_per_million: float = Field(ge=0, description="USD per million output tokens.")


DEFAULT_PRICES: dict[str, Price] = {p: Price(input_per_million=i, output_per_million=o) for p, i, o in (
    ("claude-opus-4*", 15.0, 75.0),
    ("claude-opus-4-5*", 5.0, 25.0),
    ("claude-sonnet-4*", 3.0, 15.0),
    ("claude-3-7-sonnet*", 3.0, 15.0),
    ("claude-3-5-sonnet*", 3.0, 15.0),
    ("claude-haiku-4-5*", 1.0, 5.0),
    ("claude-3-5-haiku*", 0.8, 4.0),
    ("gpt-4.1", 2.0, 8.0), ("gpt-4.1-2025-*", 2.0, 8.0),
    ("gpt-4.1-mini*", 0.4, 1.6),
    ("gpt-4.1-nano*", 0.1, 0.4),
    ("gpt-4o", 2.5, 10.0), ("gpt-4o-2024-*", 2.5, 10.0),
    ("gpt-4o-mini*", 0.15, 0.6),
    ("gpt-5", 1.25, 10.0), ("gpt-5-2025-*", 1.25, 10.0),
    ("gpt-5-mini*", 0.25, 2.0),
    ("o3", 2.0, 8.0), ("o4-mini*", 1.1, 4.4),
    ("gemini-2.5-pro*", 1.25, 10.0),
    ("gemini-2.5-flash*", 0.3, 2.5),
    ("gemini-2.0-flash*", 0.1, 0.4),
)}

MATCHED_REMEMBERED = 4096  # distinct model names a table remembers the glob match of


class PriceTable:
    """Compiled lookups over the defaults plus the configured overrides (which win)."""

    def __init__(self, overrides: dict[str, Price] | None = None, use_defaults: bool = True) -> None:
        table = {**(DEFAULT_PRICES if use_defaults else {}), **(overrides or {})}
        self._exact = {k.lower(): v for k, v in table.items() if not any(c in k for c in "*?[")}
        self._globs = sorted(((k.lower(), v) for k, v in table.items() if any(c in k for c in "*?[")),
                             key=lambda kv: -len(kv[0]))
        self._matched: dict[str, Price | None] = {}  # model names seen, matched against the globs once

    def price(self, model: str | None) -> Price | None:
        if not model:
            return None
        name = model.lower()
        if name in self._exact:
            return self._exact[name]
        if name in self._matched:
            return self._matched[name]
        found = next((price for pattern, price in self._globs if fnmatchcase(name, pattern)), None)
        if len(self._matched) >= MATCHED_REMEMBERED:  # names come from telemetry: never let them pile up
            self._matched.clear()
        self._matched[name] = found
        return found

    def cost(self, model: str | None, input_tokens: int | None, output_tokens: int | None) -> float | None:
        price = self.price(model)
        if price is None or (input_tokens is None and output_tokens is None):
            return None
        return ((input_tokens or 0) * price.input_per_million + (output_tokens or 0) * price.output_per_million) / 1e6
