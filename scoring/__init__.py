"""Scoring: sessions onto funnels and outcome ladders; later cases, judges and trajectories."""

from .assembled import Session, TraceShare
from .config import ScoringConfig
from .results import DropOff, SessionScore
from .session import SessionScorer
from .engine import TraceSummary

__all__ = ["ScoringConfig", "Session", "SessionScorer", "SessionScore", "TraceShare", "TraceSummary", "DropOff"]
