"""Scoring: sessions onto funnels and outcome ladders; later cases, judges and trajectories."""

from .config import ScoringConfig
from .results import DropOff, SessionScore
from .session import SessionScorer

__all__ = ["ScoringConfig", "SessionScorer", "SessionScore", "DropOff"]
