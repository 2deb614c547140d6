"""Telemetry dialects: every framework's spans read into one normalized record."""

from .normalize import normalize
from .records import SpanRecord, SpanView

__all__ = ["normalize", "SpanRecord", "SpanView"]
