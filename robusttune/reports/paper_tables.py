"""The SWB-DM paper's tables from a results folder's runs (`robusttune.reports.runs.load_runs`):

- Table I   mean final accuracy (%) by Byzantine fraction x participation, per method, averaged
            over every attack condition and seed present;
- Table II  number of collapsed runs per method, collapse = final accuracy <= chance + 0.5
            points (the paper's <= 10.5% on 10 classes) or non-finite parameters;
- Table IV  mean accuracy gain (points) from round 10 to round 25 per method (one column per
            dataset), from rounds.csv;

and the accuracy per attack (mean, and mean +- sd over seeds). `robusttune.reports.results`
writes them into report.md."""

from __future__ import annotations

import math
from typing import Any, cast

import pandas as pd

from robusttune.reports import axes

__all__ = [
    "METHOD_ORDER",
    "accuracy_table",
    "attack_spread_table",
    "attack_table",
    "collapse_table",
    "gain_table",
    "round_value",
    "sort_methods",
]

# The paper's column order; other methods follow alphabetically.
METHOD_ORDER = (
    "fedavg",
    "median",
    "krum",
    "bulyan",
    "fltrust",
    "swb",
    "swb_dm",
    "delayed_momentum",
    "demoa",
    "fedsgd",
    "fedavgm",
    "fedcm",
    "fedcm_xu",
    "byz_vr_marina_pp",
)


def sort_methods(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows in the paper's method order (METHOD_ORDER, then alphabetical); other index levels
    (dataset) alphabetical."""
    if frame.empty:
        return frame
    order = {m: i for i, m in enumerate(METHOD_ORDER)}
    names = list(frame.index.names)

    def key(entry: Any) -> tuple[Any, ...]:
        entry = entry if isinstance(entry, tuple) else (entry,)
        return tuple(
            (order.get(v, len(order)), str(v)) if n == "method" else (0, str(v))
            for n, v in zip(names, entry)
        )

    return frame.loc[sorted(frame.index, key=key)]


# -- the paper's tables -------------------------------------------------------------------------
def _by_dataset(runs: pd.DataFrame) -> list[str]:
    return ["dataset"] if "dataset" in runs and runs["dataset"].nunique() > 1 else []


def accuracy_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Table I: mean final accuracy (%) per method (rows; per dataset when several) x
    (participation, byzantine_fraction) (columns), over every attack and seed in the folder."""
    if runs.empty:
        return pd.DataFrame()
    index = [*_by_dataset(runs), "method"]
    table = runs.assign(accuracy=100 * runs["final_accuracy"]).pivot_table(
        index=index,
        columns=["participation", "byzantine_fraction"],
        values="accuracy",
        aggfunc="mean",
    )
    # the paper's layout: p = 0.5 block before p = 0.1, beta ascending inside each block
    # the columns are (participation, byzantine_fraction) pairs
    table = table[sorted(table.columns, key=lambda c: (-float(c[0]), float(c[1])))]  # type: ignore[index]
    return sort_methods(table)


def attack_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Mean final accuracy (%) over seeds per cell of the axes that vary between the runs (rows:
    `axes.row_axes`, e.g. participation x split x method; method alone when nothing else varies)
    x attack at its strength (columns, the clean runs as ``none``), and each row's ``worst``
    attack: where a rule breaks, read by attack rather than averaged over them (Table I)."""
    if runs.empty:
        return pd.DataFrame()
    labelled = axes.labelled(runs).assign(accuracy=100 * runs["final_accuracy"])
    table = labelled.pivot_table(
        index=axes.row_axes(runs), columns="threat", values="accuracy", aggfunc="mean"
    )
    attacked = [c for c in table.columns if c != "none"]
    table = table[(["none"] if "none" in table.columns else []) + sorted(attacked)]
    if attacked:
        table["worst"] = table[attacked].min(axis=1)
    return sort_methods(table)


def attack_spread_table(runs: pd.DataFrame) -> pd.DataFrame:
    """`attack_table` as text for reading, each cell ``mean ± sd`` (sample standard deviation over
    the cell's seeds, in points) where it has several seeds, so a cell whose float path can swing
    shows that it swings; ``worst`` is the worst attack's cell. The mean alone where one seed."""
    table = attack_table(runs)
    if table.empty:
        return table
    labelled = axes.labelled(runs).assign(accuracy=100 * runs["final_accuracy"])
    spread, seeds = (
        labelled.pivot_table(
            index=axes.row_axes(runs),
            columns="threat",
            values="accuracy",
            aggfunc=how,
            dropna=False,
        )
        for how in ("std", "size")
    )
    attacked = [c for c in table.columns if c != "worst"]
    text = pd.DataFrame(index=table.index, columns=table.columns, dtype=object)
    for row in table.index:
        for column in attacked:
            # both tables hold float means (pivot_table of a float column); pandas-stubs types a
            # cell as any scalar
            mean = cast(float, table.at[row, column])
            sd = cast(float, spread.at[row, column])
            several = cast(int, seeds.at[row, column]) > 1
            text.at[row, column] = f"{mean:.1f} ± {sd:.1f}" if several else f"{mean:.1f}"
        under_attack = table.loc[row, [c for c in attacked if c != "none"]]
        if "worst" in table.columns and under_attack.notna().any():
            text.at[row, "worst"] = cast(str, text.at[row, under_attack.idxmin()])
    return text


def collapse_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Table II: per method, ``collapsed`` runs out of ``runs``."""
    if runs.empty:
        return pd.DataFrame(columns=["collapsed", "runs"])
    index = [*_by_dataset(runs), "method"]
    table = runs.groupby(index).agg(collapsed=("collapsed", "sum"), runs=("collapsed", "size"))
    table["collapsed"] = table["collapsed"].astype(int)
    return sort_methods(table)


def round_value(rounds: pd.DataFrame, run_id: str, at: int, column: str = "accuracy") -> float:
    """A run's ``column`` at round ``at``: the last evaluated value at or before it (accuracy is
    NaN in rounds that were not evaluated); NaN when the run stopped before ``at``."""
    rows = rounds[rounds["run_id"] == run_id]
    if rows.empty or rows["round"].max() < at:
        return math.nan
    known = rows[(rows["round"] <= at) & rows[column].notna()]
    return float(known.sort_values("round")[column].iloc[-1]) if len(known) else math.nan


def gain_table(
    runs: pd.DataFrame, rounds: pd.DataFrame, start: int = 10, end: int = 25
) -> pd.DataFrame:
    """Table IV: mean accuracy gain in points, acc(round ``end``) - acc(round ``start``), per
    method (rows) and dataset (columns), over runs that reached round ``end``."""
    gains = []
    for run_id, method, dataset in zip(runs["run_id"], runs["method"], runs["dataset"]):
        before, after = round_value(rounds, run_id, start), round_value(rounds, run_id, end)
        if math.isfinite(before) and math.isfinite(after):
            gains.append({"method": method, "dataset": dataset, "gain": 100 * (after - before)})
    if not gains:
        return pd.DataFrame()
    table = pd.DataFrame(gains).pivot_table(
        index="method", columns="dataset", values="gain", aggfunc="mean"
    )
    table.columns = [f"{c} gain" for c in table.columns]
    return sort_methods(table)
