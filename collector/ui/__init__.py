"""The read-only web UI: overview, session list, session page, experiments and comparisons under ``/ui/``.

``queries`` holds every statement (run through ``query.run_query``, the path ``agentfunnel sql``
takes), ``model`` and ``conversation`` turn rows into what a page shows, ``pages`` renders Jinja2
templates with autoescaping, and ``app`` serves them with a strict Content-Security-Policy;
``collector.links`` names a page's address for the report and ``compare``.

Why Jinja2 and no front-end framework: pages are server-rendered from SQL results, so a template
engine with autoescaping on is the whole rendering layer, and every page works without script;
about fifty lines of vanilla JavaScript (``static/ui.js``) open linked tool calls and refresh
open sessions in place. Nothing is fetched from elsewhere: the CSS and JS ship in this package.
"""

from __future__ import annotations

from typing import Any

from .queries import Reader

__all__ = ["UI", "Reader", "serve_file"]


def __getattr__(name: str) -> Any:
    if name in ("UI", "serve_file"):
        # start-up time: aiohttp and Jinja2, which the monitors' and the demo's reads through ``Reader`` do not need
        from . import app

        return getattr(app, name)
    raise AttributeError(name)
