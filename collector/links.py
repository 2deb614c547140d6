"""Where the running server's UI shows a session, an experiment or a comparison.

The report, the HTML report and ``compare`` print these when a server owns the database (its
sidecar names its HTTP address); reading a file offline they print nothing, since no UI is up.
Beside the UI, not in it: the report, ``compare`` and the UI's pages name addresses without loading
templates or the web server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from .query import UntrustedSidecar, running_server


def ui_base(db: Any) -> str | None:
    """``http://127.0.0.1:4318/ui/`` of the server that owns ``db`` (a path), or None."""
    if not isinstance(db, (str, Path)):
        return None  # a lake: replicas have no single UI to name
    try:
        info = running_server(Path(db))
    except UntrustedSidecar:
        return None
    url = (info or {}).get("http_url")
    return f"{url}/ui/" if isinstance(url, str) and url.startswith("http://127.0.0.1:") else None


def path_segment(value: Any) -> str:
    """``value`` as one path segment, every reserved character escaped (``/``, ``%``, ``{``, ``?``, ``#``, spaces).

    The UI's routes take any characters after ``sessions/`` and ``experiments/``, so an id
    round-trips however it is spelled (except ``.`` and ``..``, which browsers resolve as paths).
    """
    return quote(str(value), safe="")


def session_url(base: str, session_id: str) -> str:
    return f"{base}sessions/{path_segment(session_id)}"


def experiment_url(base: str, name: str) -> str:
    return f"{base}experiments/{path_segment(name)}"


def compare_url(base: str, a: str, b: str) -> str:
    return f"{base}compare?{urlencode({'a': a, 'b': b})}"
