"""The spread of the honest inputs each run's rule aggregated, per cell of the axes that vary.

A round's ``honest_input_spread`` (rounds.csv, `robusttune.engine.input_statistics.honest_input_spread`) is
V = mean_{i in H} ||x_i - xbar_H||^2 over the rule's honest input rows (under DeMoA the honest
clients' cached momenta, fresh and decayed); a run's figure is its mean over its rounds
(summary.json's ``mean_honest_input_spread``). DeMoA's ablations (arXiv 2509.02970, Sec. 3) are
argued through this variance: the coefficient swap (1 - alpha p) -> (1 - alpha) adds
alpha^2 p (1 - p) ||m_i||^2 to it. `spread_table` puts V beside the final accuracy, so "what an
ablation does to the momentum's variance and to accuracy under attack" is one table.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from robusttune.display.markdown import markdown_table
from robusttune.reports import axes

__all__ = ["spread_section", "spread_table"]

COLUMN = "mean_honest_input_spread"


def spread_table(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per cell (`axes.row_axes`, with the threat when the attack varies) of the runs
    that recorded a spread: ``runs``, the mean over its seeds of the runs' mean spread V, its
    sample standard deviation ``sd`` (ddof = 1), ``min``, ``max`` and the mean final accuracy (%)
    ``accuracy`` (a run without a finite accuracy counts as 0). Empty when no run recorded V."""
    if runs.empty or COLUMN not in runs:
        return pd.DataFrame()
    values = pd.to_numeric(runs[COLUMN], errors="coerce")
    recorded = runs[values.notna()]
    if recorded.empty:
        return pd.DataFrame()
    frame = axes.labelled(recorded)
    spread = pd.to_numeric(frame[COLUMN], errors="coerce").astype(float)
    grouped = frame.assign(spread=spread, accuracy=axes.accuracy_percent(frame)).groupby(
        axes.cell_index(recorded), sort=True
    )
    return grouped.agg(
        runs=("spread", "size"),
        mean=("spread", "mean"),
        sd=("spread", "std"),
        min=("spread", "min"),
        max=("spread", "max"),
        accuracy=("accuracy", "mean"),
    )


def spread_section(runs: pd.DataFrame, out_dir: Path) -> list[str]:
    """report.md's lines on the honest input spread, with ``honest_input_spread.csv`` in
    ``out_dir``; none when no run recorded it (runs written before it was recorded)."""
    table = spread_table(runs)
    if table.empty:
        return []
    table.to_csv(out_dir / "honest_input_spread.csv")
    return [
        "## Spread of the honest inputs the rule aggregated",
        "",
        "Per round, V = mean over the honest inputs of ||x_i − x̄_H||² in the space the rule "
        "aggregates (under a cache, the honest cached rows: DeMoA's momenta); a run's figure "
        "is its mean over rounds. Per cell: the mean over seeds, its sd (ddof = 1), range, "
        "and the mean final accuracy (%). CSV: honest_input_spread.csv.",
        "",
        markdown_table(table, floatfmt=".4g"),
        "",
    ]
