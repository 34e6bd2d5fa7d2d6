"""A map's cells started from an earlier map's answers (``breakdown.start_from``): the same cells
at another horizon or on another dataset usually break where they broke before, so bisection
first tries the earlier answer b0 and b0 + 1 (`robusttune.experiments.breakdown.cell_search`) and goes on only
where they disagree with it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from robusttune.core.csv_input import read_table
from robusttune.core.registry import SpecError
from robusttune.experiments.breakdown.bisection import EPS, NO_ANSWER, Cell, lattice_top

__all__ = ["prior_starts", "read_prior"]

# keys a later map changes without changing which cell it is: the horizon (rounds), the lattice
# (clients; the earlier answer is carried over as a fraction)
IGNORED_KEYS = ("rounds", "clients")


def read_prior(path: str | Path) -> pd.DataFrame:
    """breakdown.csv of an earlier map: ``path`` is the map's folder or the file itself."""
    given = Path(path)
    csv = given / "breakdown.csv" if given.is_dir() else given
    if not csv.is_file():
        raise SpecError(
            f"breakdown.start_from: {str(path)!r} is neither a map folder holding "
            f"breakdown.csv nor such a file; allowed: a folder written by "
            f"`robusttune breakdown`, or its breakdown.csv"
        )
    table = read_table(csv, numeric=("breakdown_fraction",))
    if table is None:
        raise SpecError(
            f"breakdown.start_from: {str(csv)!r} is not a readable UTF-8 CSV; "
            f"allowed: the breakdown.csv a `robusttune breakdown` map writes"
        )
    missing = [c for c in ("status", "breakdown_fraction") if c not in table.columns]
    if missing:
        raise SpecError(
            f"breakdown.start_from: {str(csv)!r} lacks {', '.join(missing)}; allowed: "
            f"the breakdown.csv a `robusttune breakdown` map writes"
        )
    return table


def _empty(value: Any) -> bool:
    if isinstance(value, float):
        return math.isnan(value)
    return value is None or value in ("", "none")


def _same(value: Any, recorded: Any) -> bool:
    """A cell's value against the CSV's: empty equals empty (a key only some cells set, like
    pre_aggregator, is blank in the others), numbers by value, anything else as text."""
    if _empty(value) or _empty(recorded):
        return _empty(value) and _empty(recorded)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return math.isclose(float(value), float(recorded), rel_tol=1e-9, abs_tol=1e-12)
        except (TypeError, ValueError):
            return False
    return str(value) == str(recorded)


def prior_starts(
    prior: pd.DataFrame, cells: Sequence[Cell], max_fraction: float
) -> dict[Cell, int]:
    """For each cell, the earlier map's answer as a lattice point b0 = floor(beta0 N), clamped to
    [0, k_max]. A row answers a cell when they agree on the keys that tell this map's cells apart
    (every key some cell sets, less IGNORED_KEYS; a key the cell leaves unset must be blank in the
    row, so `median` is not `nnm+median`); keys the CSV lacks (a dataset axis the earlier map did
    not have) are not compared, nor are keys only the earlier map's cells set (an attack per cell
    there, the whole adversary per cell here). Several matching rows: the lowest answer (the
    worst case). A cell without a matching row, or whose matching rows all lack an answer (the
    clean run failed or did not learn), starts cold; a map over seeds answers with its median."""
    keys = sorted(
        ({key for cell in cells for key in cell.as_dict()} & set(prior.columns)) - set(IGNORED_KEYS)
    )
    usable = prior[~prior["status"].isin(NO_ANSWER)]
    starts: dict[Cell, int] = {}
    for cell in cells:
        values = cell.as_dict()
        matches = usable
        for key in keys:
            if matches.empty:
                break
            matches = matches[[_same(values.get(key), v) for v in matches[key]]]
        fractions = pd.to_numeric(matches["breakdown_fraction"], errors="coerce").dropna()
        if fractions.empty:
            continue
        b0 = math.floor(float(fractions.min()) * cell.clients + EPS)
        starts[cell] = min(lattice_top(cell.clients, max_fraction), max(0, b0))
    return starts
