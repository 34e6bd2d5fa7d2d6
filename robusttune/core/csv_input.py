"""CSV files others may have written or broken (a results folder's rounds.csv, breakdown.csv and
tuning.csv; a map's ``breakdown.start_from``), read beside `robusttune.core.yaml_input`: a table
is read only if it parses as UTF-8 CSV and holds the columns asked for, with its numeric columns
numbers (a cell that is not one is NaN), so a report of a shared folder reads what it can and
passes over the rest, and a command refuses in one line, instead of a traceback (issue 57)."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

__all__ = ["read_table"]


def read_table(
    path: str | Path, required: Sequence[str] = (), numeric: Sequence[str] = ()
) -> pd.DataFrame | None:
    """``path`` as a DataFrame, or None when it is not a readable CSV holding every
    ``required`` column; the ``numeric`` columns it has are coerced to numbers (NaN where a
    value is not one)."""
    try:
        table = pd.read_csv(path, encoding="utf-8", encoding_errors="strict")
    except (OSError, ValueError, csv.Error, pd.errors.ParserError, pd.errors.EmptyDataError):
        return None
    if any(column not in table.columns for column in required):
        return None
    for column in numeric:
        if column in table.columns:
            table[column] = pd.to_numeric(table[column], errors="coerce")
    return table
