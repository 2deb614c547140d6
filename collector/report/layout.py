"""The terminal report's shared layout: bars, tables titled alike, and tables fitted to the width.

Public so every section draws the same way (:mod:`.terminal` and the sections it shows, :mod:`.shapes`);
see :mod:`.terminal` for how a table gives way as the width shrinks.
"""

from __future__ import annotations

import io
from typing import Any, Callable

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from ..terminal import column_needs, data_text, fit_table, table_chrome, visible_controls
from .text import clip_width

BAR_WIDTH = 28
MIN_BAR = 8  # narrower than this a bar says nothing the share beside it does not
_EIGHTHS = " ▏▎▍▌▋▊▉"
# The report writes no markup of its own: plain strings that reach a table stay literal too.
AS_TYPED: dict[str, Any] = {"markup": False, "emoji": False, "highlight": False}


def bar(fraction: float | None, width: int = BAR_WIDTH) -> str:
    """A horizontal bar in eighth-blocks, so small differences still show."""
    eighths = round(max(0.0, min(1.0, fraction or 0.0)) * width * 8)
    full, rest = divmod(eighths, 8)
    return ("█" * full + (_EIGHTHS[rest] if rest else "")).ljust(width)


class Bar:
    """A bar cell drawn at the width its column gets: ``width`` cells when there is room, down to ``MIN_BAR``."""

    def __init__(self, draw: Callable[[int], Text], width: int = BAR_WIDTH) -> None:
        self.draw, self.width = draw, width

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        most = min(self.width, options.max_width)
        return Measurement(min(MIN_BAR, most), most)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.draw(min(self.width, options.max_width))


def share_bar(fraction: float | None, style: str, width: int = BAR_WIDTH) -> Bar:
    return Bar(lambda w: Text(bar(fraction, w), style=style), width)


def clipped(value: str | None, units: int) -> Text:
    """A stored value in a narrow cell: escaped first, so the clipped width is the width shown."""
    return data_text(clip_width(visible_controls(value), units))


def measurer(width: int) -> Console:
    return Console(file=io.StringIO(), width=width, **AS_TYPED)


def room(t: Table, width: int, index: int) -> int:
    """Cells left for column ``index`` when every other column gets its widest line, header included."""
    needs = column_needs(t, measurer(width), width)
    return width - table_chrome(t) - sum(n.full for i, n in enumerate(needs) if i != index)


def _cell_text(cell: RenderableType) -> Text | None:
    if isinstance(cell, str):
        return Text(cell)
    return Text(" ").join(cell.split("\n")) if isinstance(cell, Text) else None


def as_lines(t: Table) -> RenderableType:
    """A table that does not fit even with every cell wrapped at its words: a line per row, its first cell, then
    each other value after its header; the lines wrap at words."""
    out: list[RenderableType] = [Text(str(t.title), style="bold")] if t.title else []
    heads = [_cell_text(c.header) or Text() for c in t.columns]
    for row in zip(*(c.cells for c in t.columns)):
        cells = [_cell_text(c) for c in row]
        line = (cells[0] or Text()).copy()
        facts = [Text.assemble(head, " ", cell) for head, cell in zip(heads[1:], cells[1:]) if head and cell]
        if facts:
            line.append(": ")
            line.append_text(Text(" · ").join(facts))
        out.append(line)
    if t.caption:
        out.append(Text(str(t.caption), style="dim"))
    return Group(*out)


def fitted(build: Callable[[bool], Table], width: int, bar_column: int | None = None) -> RenderableType:
    """The table with its bar if the bar gets ``MIN_BAR`` cells beside full-width columns, else without it;
    then sized to the width, the bar growing last; as lines if even that does not fit."""
    t = build(True)
    if bar_column is not None and room(t, width, bar_column) < MIN_BAR:
        t, bar_column = build(False), None
    if fit_table(t, width, measurer(width), () if bar_column is None else (bar_column,)):
        return t
    return as_lines(build(False) if bar_column is not None else t)


def titled(title: str, **kw) -> Table:
    return Table(title=title, title_justify="left", title_style="bold", box=box.SIMPLE_HEAD, show_edge=False,
                 pad_edge=False, **kw)
