"""A case drafted from a stored session (``agentfunnel cases add --from-session``, and the UI's "add as a case"),
and the draft appended to the configured suite file.

The draft is ``scoring.cases.case_from_session`` rendered by ``render_case_yaml``: the same text either way.
Appending never rewrites what the user wrote (their comments and order stay): the draft's lines are added at
the end of the file, and the result is loaded with the suite loader before it replaces the file, so a suite
that would no longer load, lose a case or exceed ``cases.max_suite_bytes`` is refused and left as it was.
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from ..scoring import SessionScorer
from ..scoring.cases import (
    CaseFileError,
    case_from_session,
    load_suite,
    render_case_yaml,
)
from .session.jobs import gather_sessions

MAX_ID_CHARS = 200
_APPEND_LOCK = threading.Lock()  # two drafts at once append one after the other


class DraftError(ValueError):
    """A draft that cannot be added; the message says why and what to do instead."""


def draft_text(records: Sequence[Any], score: Any, case_id: str, session_id: str) -> str:
    """The one-case suite text ``cases add --from-session`` prints."""
    return render_case_yaml(case_from_session(records, score, case_id), session_id)


def check_case_id(case_id: str) -> str:
    case_id = case_id.strip()
    if not case_id or len(case_id) > MAX_ID_CHARS or re.search(r"[\x00-\x1f\x7f]", case_id):
        raise DraftError(f"a case id is 1 to {MAX_ID_CHARS} characters without control characters")
    return case_id


def suite_file(suite: str | None) -> Path:
    """The configured suite as a local YAML file the UI may append to, or a DraftError saying why not."""
    if not suite:
        raise DraftError("no case suite is configured (cases.suite): set it to a YAML file to add cases from the UI")
    if "://" in suite:
        raise DraftError(f"cases.suite is a URL ({suite}): drafts are added to a local file only; draft with "
                         "agentfunnel cases add --from-session ID --out FILE and add it to the shared suite")
    path = Path(suite)
    if path.suffix.lower() == ".toml":
        raise DraftError(f"cases.suite is a TOML file ({path}): drafts are appended to YAML suites only; draft with "
                         "agentfunnel cases add --from-session ID and add it by hand")
    return path


def _case_ids(text: str, path: Path) -> list[str]:
    try:
        data = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError as exc:
        raise DraftError(f"{path} is not valid YAML: {exc}") from None
    if data is None:
        return []
    cases = data.get("cases") if isinstance(data, dict) else data
    if not isinstance(cases, list):
        raise DraftError(f"{path} holds no list of cases (cases: [...]): it cannot take a draft")
    return [str(c.get("id")) for c in cases if isinstance(c, dict)]


def _appended(existing: str, draft: str, indent: str) -> str:
    comments, _, item = draft.partition("\ncases:\n")
    block = comments + "\n" + item
    lines = [(indent + line) if line else line for line in block.splitlines()]
    return existing.rstrip("\n") + "\n" + "\n".join(lines) + "\n"


def add_to_suite(path: Path, draft: str, case_id: str, max_bytes: int) -> int:
    """Append ``draft`` (``draft_text``'s) to the suite at ``path`` (created when absent); returns its case count."""
    with _APPEND_LOCK:
        existing = path.read_text(encoding="utf-8") if path.exists() else ""
        ids = _case_ids(existing, path)
        if case_id in ids:
            raise DraftError(f"case {case_id!r} is already in {path}: choose another id")
        if not existing.strip():
            candidates = [draft]
        elif "cases:" not in existing:  # a bare list of cases: the items go at its own indentation
            candidates = [_appended(existing, draft, "")]
        else:
            candidates = [_appended(existing, draft, indent) for indent in ("", "  ", "    ")]
        problem = "it would no longer hold every case it had and the draft"
        for text in candidates:
            if len(text.encode()) > max_bytes:
                raise DraftError(f"{path} would be over cases.max_suite_bytes ({max_bytes}) with the draft")
            fd, tmp = tempfile.mkstemp(prefix=".draft-", suffix=".yaml", dir=path.parent)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    f.write(text)
                try:
                    loaded = load_suite(Path(tmp), max_bytes=max_bytes)
                except CaseFileError as exc:
                    problem = str(exc)
                    continue
                if [c.id for c in loaded.suite.cases] != ids + [case_id]:
                    continue
                os.replace(tmp, path)
                tmp = ""
                return len(loaded.suite.cases)
            finally:
                if tmp:
                    os.unlink(tmp)
        raise DraftError(f"the draft cannot be appended to {path}: {problem}; draft with agentfunnel cases add "
                         "--from-session ID --out FILE and add it by hand")


def draft_into_suite(settings: Any, store: Any, tables: Any, session_id: str, case_id: str) -> int:
    """The running server's "add as a case": the session read back on the store's writer (as its session jobs read
    it), scored with the running scoring configuration, drafted and appended to ``cases.suite``."""
    path = suite_file(settings.cases.suite)
    keys = tuple(settings.sessions.session_keys)
    found = store.submit_job(lambda con: gather_sessions(con, tables, [session_id], session_keys=keys),
                             work="sessions").result(60)
    session = found.get(session_id)
    if session is None:
        raise DraftError(f"no session {session_id!r} is stored")
    records = list(session.records)
    score = SessionScorer(settings.scoring).score(session_id, records)
    return add_to_suite(path, draft_text(records, score, case_id, session_id), case_id, settings.cases.max_suite_bytes)
