"""Tables printed to the terminal, in one style: rich tables with a rule under the header and no
outer frame (``box.SIMPLE_HEAD``, no edge), numbers right-aligned, the title on its own line above.
Off a terminal (a pipe, a file, a test's captured output) a table is rendered at its natural width,
one line per row, so it can be grepped and never wraps. Markdown written to files (breakdown.md,
report.md) is `robusttune.display.markdown.markdown_table`'s, not this.

A table is given as a pandas DataFrame or as rows (mappings of column -> value, columns in order
of first appearance). Floats are formatted with ``floatfmt`` (NaN as ``nan``); strings are shown
as they are, so a caller that wants its own number format passes text."""

from __future__ import annotations

import io
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

__all__ = ["BOX", "duration", "make_table", "print_table", "table_text"]

BOX = box.SIMPLE_HEAD
WIDEST = 100_000  # a console wider than any table


def _columns_and_rows(data: Any, index: bool) -> tuple[list[str], list[list[Any]]]:
    if hasattr(data, "columns") and hasattr(data, "itertuples"):  # a DataFrame
        columns = [str(c) for c in data.columns]
        rows = [list(row) for row in data.itertuples(index=index, name=None)]
        return ([str(data.index.name or ""), *columns] if index else columns), rows
    records: Sequence[Mapping[str, Any]] = list(data)
    columns = list(dict.fromkeys(str(k) for record in records for k in record))
    return columns, [[record.get(c, "") for c in columns] for record in records]


def _cell(value: Any, floatfmt: str) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else format(value, floatfmt)
    return str(value)


def _numeric(cells: Iterable[str]) -> bool:
    """Whether a column shows numbers (blank and None cells do not decide)."""
    seen = False
    for text in cells:
        if text in ("", "None"):
            continue
        try:
            float(text)
        except ValueError:
            return False
        seen = True
    return seen


def make_table(
    data: Any, *, floatfmt: str = ".4g", index: bool = False, show_header: bool = True
) -> Table:
    """The rich Table of ``data`` (a DataFrame, or rows as mappings) in the one terminal style;
    ``index`` adds a DataFrame's index as the first column."""
    columns, rows = _columns_and_rows(data, index)
    cells = [[_cell(v, floatfmt) for v in row] for row in rows]
    table = Table(
        box=BOX, show_edge=False, pad_edge=False, show_header=show_header, header_style="bold"
    )
    for i, name in enumerate(columns):
        # Text, not str: a value such as "[alie]" is shown as it is, not read as rich markup
        table.add_column(
            Text(name), justify="right" if _numeric(row[i] for row in cells) else "left"
        )
    for row in cells:
        table.add_row(*(Text(text) for text in row))
    return table


def print_table(
    data: Any,
    *,
    title: str | None = None,
    console: Console | None = None,
    floatfmt: str = ".4g",
    index: bool = False,
    show_header: bool = True,
) -> None:
    """Print ``data`` as a table (see the module docstring) on ``console`` (default: stdout): on a
    terminal in rich's colours at the terminal's width, elsewhere as `table_text`."""
    console = console or Console()
    if not console.is_terminal:
        console.print(
            table_text(data, title=title, floatfmt=floatfmt, index=index, show_header=show_header),
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        return
    if title:
        console.print(title, style="bold", markup=False, highlight=False, soft_wrap=True)
    console.print(make_table(data, floatfmt=floatfmt, index=index, show_header=show_header))


def table_text(
    data: Any,
    *,
    title: str | None = None,
    floatfmt: str = ".4g",
    index: bool = False,
    show_header: bool = True,
) -> str:
    """The table as plain text at its natural width (no colour, no trailing blanks), for output
    off a terminal or through an ``echo``."""
    table = make_table(data, floatfmt=floatfmt, index=index, show_header=show_header)
    buffer = io.StringIO()
    # a table that does not expand is only as wide as its columns: here it never wraps
    console = Console(file=buffer, width=WIDEST, color_system=None)
    if title:
        console.print(title, markup=False, highlight=False, soft_wrap=True)
    console.print(table)
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines())


def duration(seconds: float) -> str:
    """A time as a progress line spells it: ``1h02m``, ``3m05s``, ``42s``."""
    seconds = round(max(0.0, seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"
