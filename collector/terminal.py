"""Stored telemetry printed as inert text: what an agent or a tool wrote cannot drive the user's terminal.

Span data is written by whoever sends it. Printed raw, an ESC or a C1 byte can clear the screen, set
the window title or write the clipboard (OSC 52); through Rich, ``[/]`` crashes the printer,
``[link=…]`` becomes a live hyperlink and ``:x:`` an emoji. Every value read from the database goes
through :func:`data_text` (or :func:`visible_controls` where plain text is printed), so it shows as
typed, with control characters as visible escapes such as ``\\x1b`` or ``\\u202e``.

:func:`fit_table` lays a Rich table out within the terminal's width without cutting a word or a header.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.measure import Measurement
from rich.table import Table
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


# ---------------------------------------------------------------------------- fitting tables to the width


@dataclass(frozen=True)
class ColumnNeed:
    """What one column asks for, in cells of content (padding aside)."""

    least: int  # its longest word, header included (the whole line in a no_wrap column): never less
    full: int  # its widest line, header included


def table_chrome(table: Table) -> int:
    """Cells a table spends on borders, separators and padding, whatever its content."""
    _, right, _, left = table.padding
    n = len(table.columns)
    pads = 0
    for i in range(n):
        pad_left, pad_right = left, right
        if table.collapse_padding:
            pad_left, pad_right = 0, abs(left - right)
        if not table.pad_edge:
            pad_left = 0 if i == 0 else pad_left
            pad_right = 0 if i == n - 1 else pad_right
        pads += pad_left + pad_right
    borders = (2 if table.box and table.show_edge else 0) + (n - 1 if table.box else 0)
    return pads + borders


def column_needs(table: Table, console: Console, width: int) -> list[ColumnNeed]:
    """Each column's longest word and widest line, as Rich measures its cells and header."""
    options = console.options.update_width(max(1, width))
    needs = []
    for column in table.columns:
        cells = [Measurement.get(console, options, c) for c in column.cells]
        head = Measurement.get(console, options, column.header) if table.show_header else Measurement(0, 0)
        body = max((m.maximum for m in cells), default=0)
        least = max((m.maximum if column.no_wrap else m.minimum for m in [*cells, head]), default=0)
        full = max(least, body, head.maximum)
        needs.append(ColumnNeed(least, full if column.max_width is None else max(least, min(full, column.max_width))))
    return needs


def _raise(widths: list[int], targets: list[int], spare: int) -> int:
    """Raise widths toward their targets: whole shortfalls, the smallest first (a column short of its target wraps
    all the same), then what is left shared evenly among the rest."""
    order = sorted((i for i in range(len(widths)) if targets[i] > widths[i]), key=lambda i: targets[i] - widths[i])
    for i in order:
        if targets[i] - widths[i] <= spare:
            spare -= targets[i] - widths[i]
            widths[i] = targets[i]
    order = [i for i in order if targets[i] > widths[i]]
    for k, i in enumerate(order):
        give = min(targets[i] - widths[i], spare // (len(order) - k))
        widths[i] += give
        spare -= give
    return spare


def fit_widths(needs: list[ColumnNeed], room: int, last: tuple[int, ...] = ()) -> list[int] | None:
    """Content widths within ``room`` cells: every column gets its longest word, then columns get their widest
    line (the cheapest first: a short header is made whole before a long text takes the rest), and only then do
    the columns in ``last`` (bars) grow; None when the longest words alone do not fit."""
    widths = [n.least for n in needs]
    spare = room - sum(widths)
    if spare < 0:
        return None
    spare = _raise(widths, [n.least if i in last else n.full for i, n in enumerate(needs)], spare)
    _raise(widths, [n.full for n in needs], spare)
    return widths


def fit_table(table: Table, width: int, console: Console, last: tuple[int, ...] = (),
              fold_over: int | None = None) -> bool:
    """Make ``table`` fit ``width`` cells without breaking a word: a table that fits as it is stays as it is,
    otherwise its columns get fixed widths from :func:`fit_widths`. With ``fold_over``, a cell's word longer than
    that (and than its header's words) may be folded to make room. False (table untouched) when even the longest
    words do not fit side by side."""
    room = width - table_chrome(table)
    needs = column_needs(table, console, room)
    if sum(n.full for n in needs) <= room:
        return True
    if fold_over is not None:
        options = console.options.update_width(max(1, room))
        heads = [Measurement.get(console, options, c.header).minimum if table.show_header else 0 for c in table.columns]
        needs = [ColumnNeed(min(n.least, max(fold_over, h)), n.full) for n, h in zip(needs, heads)]
    widths = fit_widths(needs, room, last)
    if widths is None:
        return False
    for column, w in zip(table.columns, widths):
        column.width = w
    return True


def as_records(table: Table, width: int) -> RenderableType:
    """A table too wide to show side by side, one record after another: each column's name, then its value
    (wrapped at words; a token wider than the value's room is folded, nothing is cut)."""
    names = [c.header if isinstance(c.header, Text) else Text(str(c.header)) for c in table.columns]
    name_width = min(max((n.cell_len for n in names), default=1), max(8, width // 3))
    out: list[RenderableType] = []
    for i, row in enumerate(zip(*(c.cells for c in table.columns)), 1):
        grid = Table.grid(padding=(0, 1, 0, 1), collapse_padding=False)
        grid.add_column(style="bold", width=name_width, overflow="fold")
        grid.add_column(width=max(1, width - name_width - 2), overflow="fold")
        for name, value in zip(names, row):
            grid.add_row(name, value)
        out += [Text(f"-[ record {i} ]", style="dim"), grid]
    return Group(*out)


WIDE = 120  # cells for a pipe or a file at the least: the full layout, for files and for tools that read it


def output_console(**options: Any) -> Console:
    """A console on stdout as wide as the terminal (Rich reads its size, or ``COLUMNS``); a pipe or a file is
    ``WIDE`` cells, or wider if ``COLUMNS`` says so."""
    console = Console(**options)
    return console if console.is_terminal else Console(width=max(WIDE, console.width), **options)
