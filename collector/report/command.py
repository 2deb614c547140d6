"""``agentfunnel report``: the funnel, outcome mix and drop-offs, in the terminal or as one HTML file."""

from __future__ import annotations

import sys
from pathlib import Path

from ...scoring.variant_registry import BUILTIN_REGISTRY, Registry
from ..config import StoreSettings
from ..query import QueryError
from ..links import ui_base
from .data import load_report
from .html import render_html
from .sql import Filters
from .terminal import print_terminal
from .text import lang_of, text


def run_report(db: Path | StoreSettings, lang: str = "en", html_path: Path | None = None, variant: str | None = None,
               agent: str | None = None, since: str | None = None, stage_questions: bool = False,
               registry: Registry = BUILTIN_REGISTRY, **slices: str | None) -> int:
    """The ``report`` command; returns the exit status. ``slices``: model, agent_version, provider, server,
    experiment, until and bucket (``Filters``). ``stage_questions``: the terminal report also shows each stage's
    question and evidence (the HTML report always does). ``registry``: the configuration's funnel variants."""
    lang = lang_of(lang)
    try:
        filters = Filters.parse(variant, agent, since, **slices)
    except ValueError as exc:
        print(f"agentfunnel report: {exc}", file=sys.stderr)
        return 2
    try:
        data = load_report(db, filters, registry=registry)
    except QueryError as exc:
        print(f"agentfunnel report: {exc}", file=sys.stderr)
        return 1
    data.ui_base = ui_base(db)
    data.stage_questions = stage_questions
    if html_path is not None:
        try:
            html_path.write_text(render_html(data, lang), encoding="utf-8")
        except OSError as exc:
            print(f"agentfunnel report: cannot write {html_path}: {exc}", file=sys.stderr)
            return 1
        print(text("wrote", lang, path=html_path, n=data.summary.sessions))
        return 0
    print_terminal(data, lang)
    return 0
