"""Stored telemetry printed as inert text: what an agent or a tool wrote cannot drive the user's terminal.

Span data is written by whoever sends it. Printed raw, an ESC or a C1 byte can clear the screen, set
the window title or write the clipboard (OSC 52); through Rich, ``[/]`` crashes the printer,
``[link=…]`` becomes a live hyperlink and ``:x:`` an emoji. Every value read from the database goes
through :func:`data_text` (or :func:`visible_controls` where plain text is printed), so it shows as
typed, with control characters as visible escapes such as ``\\x1b`` or ``\\u202e``.
"""

from __future__ import annotations

import json
from typing import Any

from rich.text import Text

# C0, DEL and C1 controls; lone surrogates (which cannot even be encoded for output); bidi embeddings,
# overrides, isolates and marks, which reorder the text after them (Trojan Source); and the line and
# paragraph separators, which some terminals take for line breaks.
_UNSAFE = (*range(0x00, 0x20), *range(0x7F, 0xA0), *range(0xD800, 0xE000), 0x061C, 0x200E, 0x200F,
           *range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x2028, 0x2029)
_SHORT_ESCAPES = {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}
_VISIBLE = {c: _SHORT_ESCAPES.get(c) or (f"\\x{c:02x}" if c <= 0xFF else f"\\u{c:04x}") for c in _UNSAFE}
_VISIBLE_BUT_LINE_BREAKS = {**_VISIBLE, 0x0A: "\n"}
_JSON_ESCAPES = {c: f"\\u{c:04x}" for c in _UNSAFE}


def visible_controls(value: Any, keep_line_breaks: bool = False) -> str:
    """The value as plain text, every terminal control written as an escape. ``\\n`` too unless
    ``keep_line_breaks`` (for messages): a value stays on its line of a table and cannot fake a line of output."""
    text = "" if value is None else str(value)
    return text.translate(_VISIBLE_BUT_LINE_BREAKS if keep_line_breaks else _VISIBLE)


def data_text(value: Any, style: str = "") -> Text:
    """A value from telemetry as a Rich ``Text``: never parsed for markup or emoji, controls made visible."""
    return Text(visible_controls(value), style=style)


def json_for_terminal(obj: Any) -> str:
    """JSON that keeps non-ASCII text readable but writes every terminal control as a ``\\u`` escape: the same
    document (``json.loads`` gives back the exact values), safe to print."""
    return json.dumps(obj, ensure_ascii=False).translate(_JSON_ESCAPES)
