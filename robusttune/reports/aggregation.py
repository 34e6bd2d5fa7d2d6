"""SWB-DM's Figure 2 from a results folder: the aggregation error each run recorded.

A round's ``aggregation_error`` (rounds.csv, `robusttune.core.records.RoundRecord`) is
||Agg - xbar_H||_2, the distance of the rule's output from the mean of its honest inputs. A run's
figure is its mean over the rounds where it was defined; the tables here average runs (seeds)
per method x attack x Byzantine fraction, with their spread, and fit the paper's bound shape
E(beta) = E0 + C sqrt(beta) (Eq. 1) per method and attack from the clean runs (beta = 0) and the
attacked ones. `write_figure_two` writes the report's files for it (robusttune.reports.results.report).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import cast

import numpy as np
import pandas as pd

from robusttune.display.markdown import markdown_table
from robusttune.display.plots import aggregation_error_vs_corruption, fit_sqrt_bound
from robusttune.reports import axes

__all__ = [
    "aggregation_error_table",
    "figure_two_section",
    "run_aggregation_errors",
    "sqrt_fit_table",
    "write_figure_two",
]


def run_aggregation_errors(runs: pd.DataFrame, rounds: pd.DataFrame) -> pd.DataFrame:
    """``runs`` with ``aggregation_error``: each run's mean over its rounds in rounds.csv (NaN
    rounds, where nothing was aggregated or nothing honest was input, left out; an infinite
    round makes the run's mean infinite). Runs whose rounds.csv lacks the column (written before
    it was recorded) keep the summary's ``mean_aggregation_error`` when there is one, else NaN."""
    out = runs.copy()
    fallback = (
        out["mean_aggregation_error"].astype(float)
        if "mean_aggregation_error" in out
        else pd.Series(math.nan, index=out.index)
    )
    if len(rounds) and "aggregation_error" in rounds:
        values = pd.to_numeric(rounds["aggregation_error"], errors="coerce")
        means = values.groupby(rounds["run_id"]).mean()
        out["aggregation_error"] = out["run_id"].map(means).astype(float).fillna(fallback)
    else:
        out["aggregation_error"] = fallback
    return out


def _cell_keys(runs: pd.DataFrame) -> list[str]:
    extra = [k for k in ("dataset", "participation") if k in runs and runs[k].nunique() > 1]
    return [*extra, "method", "threat", "byzantine_fraction"]


def aggregation_error_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (dataset, participation when several) x method x attack (at its strength) x beta:
    the mean over runs of their aggregation error, its sample standard deviation (ddof = 1), min,
    max and the number of runs with a value. ``runs`` needs ``aggregation_error``
    (`run_aggregation_errors`)."""
    if runs.empty or "aggregation_error" not in runs:
        return pd.DataFrame()
    labelled = axes.labelled(runs)
    labelled = labelled[labelled["aggregation_error"].notna()]
    if labelled.empty:
        return pd.DataFrame()
    grouped = labelled.groupby(_cell_keys(labelled), sort=True)["aggregation_error"]
    # named aggregations of a grouped column make a frame (pandas-stubs types it as a series)
    return cast(
        pd.DataFrame, grouped.agg(mean="mean", std="std", min="min", max="max", runs="count")
    )


def sqrt_fit_table(runs: pd.DataFrame) -> pd.DataFrame:
    """E0 and C of E(beta) = E0 + C sqrt(beta) (least squares on the per-beta means) per method
    and attack, over the clean runs' beta = 0 and that attack's beta > 0, with the largest
    |residual|. Only where at least three finite points exist: two fit any two-parameter curve
    exactly. ``runs`` needs ``aggregation_error``."""
    if runs.empty or "aggregation_error" not in runs:
        return pd.DataFrame()
    labelled = axes.labelled(runs)
    keys = [k for k in _cell_keys(labelled) if k not in ("threat", "byzantine_fraction")]
    rows = []
    for group_key, group in labelled.groupby(keys, sort=True):
        group_key = group_key if isinstance(group_key, tuple) else (group_key,)
        clean = group[group["byzantine_fraction"] == 0]
        for threat in sorted(set(group.loc[group["attack"] != "none", "threat"])):
            attacked = group[(group["threat"] == threat) & (group["byzantine_fraction"] > 0)]
            curve = (
                pd.concat([clean, attacked])
                .groupby("byzantine_fraction")["aggregation_error"]
                .mean()
            )
            curve = curve[np.isfinite(curve.to_numpy(float))]
            if len(curve) < 3:
                continue
            beta, error = curve.index.to_numpy(float), curve.to_numpy(float)
            e0, c = fit_sqrt_bound(beta, error)
            residual = float(np.max(np.abs(e0 + c * np.sqrt(beta) - error)))
            rows.append(
                {
                    **dict(zip(keys, group_key)),
                    "threat": threat,
                    "E0": e0,
                    "C": c,
                    "points": len(curve),
                    "max_residual": residual,
                }
            )
    if not rows:
        return pd.DataFrame()
    return pd.DataFrame(rows).set_index([*keys, "threat"])


def write_figure_two(
    runs: pd.DataFrame, rounds: pd.DataFrame, out_dir: Path
) -> tuple[pd.DataFrame, pd.DataFrame, Path | None, dict[str, str]]:
    """The report's Figure 2 material in ``out_dir``: ``aggregation_error.csv`` (the per-cell
    table), ``aggregation_error_fit.csv`` (the fits) and ``aggregation_error_vs_corruption.png``.
    Returns (table, fits, figure path or None, attacks without a panel and why); nothing is
    written when no run recorded an aggregation error (the table comes back empty)."""
    scored = run_aggregation_errors(runs, rounds)
    table = aggregation_error_table(scored)
    if table.empty:
        return table, pd.DataFrame(), None, {}
    fits = sqrt_fit_table(scored)
    table.to_csv(out_dir / "aggregation_error.csv")
    fits.to_csv(out_dir / "aggregation_error_fit.csv")
    figure, skipped = aggregation_error_vs_corruption(
        scored, out_dir / "aggregation_error_vs_corruption.png"
    )
    return table, fits, figure, skipped


def figure_two_section(runs: pd.DataFrame, rounds: pd.DataFrame, out_dir: Path) -> list[str]:
    """report.md's Figure 2 section, its CSVs and figure written by `write_figure_two`; no lines
    when no run recorded an aggregation error."""
    table, fits, figure, skipped = write_figure_two(runs, rounds, out_dir)
    if table.empty:
        return []
    lines = [
        "## Figure 2: aggregation error against corruption",
        "",
        "Per round, ||Agg − x̄_H||₂: the rule's output against the mean of its honest inputs, "
        "in the space it aggregates (under a cache, the honest cached rows). A run's figure "
        "is its mean over rounds; the table averages runs (std over runs, ddof = 1). Dashed: "
        "E(β) = E0 + C sqrt(β) (SWB-DM Eq. 1) fitted to SWB when present, else to the first "
        "method, where at least three points exist. CSVs: aggregation_error.csv, "
        "aggregation_error_fit.csv.",
        "",
    ]
    if figure is not None:
        lines += [f"![aggregation error against corruption]({figure.name})", ""]
    lines += [f"- no panel for {attack}: {reason}" for attack, reason in skipped.items()]
    lines += ([""] if skipped else []) + [markdown_table(table, floatfmt=".4g"), ""]
    if not fits.empty:
        lines += ["Fitted E(β) = E0 + C sqrt(β):", "", markdown_table(fits, floatfmt=".4g"), ""]
    return lines
