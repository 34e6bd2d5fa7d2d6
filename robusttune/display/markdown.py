"""GitHub markdown tables for the reports (no tabulate dependency)."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

__all__ = ["markdown_table"]


def _cell(value: Any, floatfmt: str) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return "" if math.isnan(value) else format(value, floatfmt)
    if value is None:
        return ""
    return str(value).replace("|", "\\|")


def markdown_table(frame: pd.DataFrame, floatfmt: str = ".2f", index: bool | None = None) -> str:
    """A GitHub markdown table (no tabulate dependency). The index is shown when it is named;
    MultiIndex columns are joined as ``p=0.5, β=0.1``-style headers by their level names."""
    if frame.empty:
        return "_(no runs)_"
    show_index = index if index is not None else any(n is not None for n in frame.index.names)
    if isinstance(frame.columns, pd.MultiIndex):
        names = [_axis_label(n) for n in frame.columns.names]
        headers = [
            ", ".join(f"{n}={_cell(v, 'g')}" for n, v in zip(names, col)) for col in frame.columns
        ]
    else:
        headers = [str(c) for c in frame.columns]
    if show_index:
        headers = [" / ".join(str(n) for n in frame.index.names), *headers]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(["---"] * len(headers)) + "|"]
    for key, row in zip(frame.index, frame.itertuples(index=False)):
        cells = [_cell(v, floatfmt) for v in row]
        if show_index:
            label = " / ".join(map(str, key)) if isinstance(key, tuple) else str(key)
            cells = [label, *cells]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _axis_label(name: Any) -> str:
    return {"participation": "p", "byzantine_fraction": "β"}.get(str(name), str(name))


# -- the report ----------------------------------------------------------------------------------
