"""The tables behind issue 14's claims 4, 8 and 9, from a results folder (markdown on stdout).

    python analysis/findings/claim_tables.py collapses RESULTS      # claim 4
    python analysis/findings/claim_tables.py gain RESULTS [--start 10 --end 25]   # claim 8
    python analysis/findings/claim_tables.py aggregation RESULTS    # claim 9

collapses    per method x participation x attack x beta: runs, collapsed runs (final accuracy
             <= 1/K + 0.5 points or non-finite parameters, robusttune.records.is_collapsed) and
             final accuracy (%) mean and std over seeds; then collapses per method x attack
             summed over beta and p.
gain         per run, 100 (acc(end) - acc(start)) from rounds.csv (the last evaluated accuracy at
             or before each round, robusttune.results.round_value); per configuration (method x
             participation x attack x beta) the mean accuracy (%) at both rounds and the gain's
             mean, std and min over seeds; per method x
             participation the mean over configurations and how many gained (mean > 0).
aggregation  per method x attack x beta the mean aggregation error over seeds with std, min and
             max (robusttune.aggregation_report), SWB - Median per attack and beta against the
             larger of the two cells' seed std, and the E0 + C sqrt(beta) fits.

Spreads are sample standard deviations over seeds (ddof = 1). Everything is a function of the
folder; nothing is run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from robusttune.aggregation_report import (aggregation_error_table, run_aggregation_errors,
                                           sqrt_fit_table)
from robusttune.results import load_rounds, load_runs, markdown_table, round_value

CELL = ["method", "participation", "attack", "byzantine_fraction"]


def collapses(runs: pd.DataFrame) -> list[str]:
    runs = runs.assign(accuracy=100 * runs["final_accuracy"].astype(float),
                       collapsed=runs["collapsed"].astype(int))
    cells = runs.groupby(CELL).agg(runs=("seed", "count"), collapsed=("collapsed", "sum"),
                                   accuracy=("accuracy", "mean"), std=("accuracy", "std"))
    attacked = runs[runs["attack"] != "none"]
    totals = attacked.pivot_table(index="method", columns="attack", values="collapsed",
                                  aggfunc="sum")
    counts = attacked.pivot_table(index="method", columns="attack", values="collapsed",
                                  aggfunc="count")
    totals.columns = [f"{c} collapsed" for c in totals.columns]
    counts.columns = [f"{c} runs" for c in counts.columns]
    return ["## Collapses per cell", "", markdown_table(cells), "",
            "## Collapsed attacked runs per method and attack (all beta and p)", "",
            markdown_table(pd.concat([totals, counts], axis=1)), ""]


def gains(runs: pd.DataFrame, rounds: pd.DataFrame, start: int, end: int) -> list[str]:
    at_start = [100 * round_value(rounds, r, start) for r in runs["run_id"]]
    at_end = [100 * round_value(rounds, r, end) for r in runs["run_id"]]
    runs = runs.assign(at_start=at_start, at_end=at_end,
                       gain=[b - a for a, b in zip(at_start, at_end)]).dropna(subset=["gain"])
    cells = runs.groupby(CELL).agg(runs=("gain", "count"),
                                   **{f"acc {start}": ("at_start", "mean"),
                                      f"acc {end}": ("at_end", "mean")},
                                   gain=("gain", "mean"), std=("gain", "std"), min=("gain", "min"))
    cells["gained"] = cells["gain"] > 0
    per_p = cells.reset_index().groupby(["method", "participation"]).agg(
        configurations=("gain", "count"), gained=("gained", "sum"), mean_gain=("gain", "mean"),
        std_over_configurations=("gain", "std"))
    seeds = runs.groupby(["method", "participation", "seed"])["gain"].mean()
    seed_spread = seeds.groupby(["method", "participation"]).agg(["mean", "std", "min", "max"])
    seed_spread.columns = [f"per-seed mean gain {c}" for c in seed_spread.columns]
    return [f"## Gain (points) from round {start} to round {end} per configuration", "",
            markdown_table(cells), "",
            "## Per method and participation", "", markdown_table(per_p), "",
            "## The same mean per seed (each seed averaged over the configurations)", "",
            markdown_table(seed_spread), ""]


def aggregation(runs: pd.DataFrame, rounds: pd.DataFrame) -> list[str]:
    scored = run_aggregation_errors(runs, rounds)
    table = aggregation_error_table(scored)
    lines = ["## Mean aggregation error ||Agg - xbar_H|| per cell", "",
             markdown_table(table, floatfmt=".4g"), ""]
    frame = table.reset_index()
    if {"median", "swb"} <= set(frame["method"]):
        wide = frame.pivot_table(index=["threat", "byzantine_fraction"], columns="method",
                                 values=["mean", "std"])
        diff = pd.DataFrame({
            "median": wide[("mean", "median")], "swb": wide[("mean", "swb")],
            "swb - median": wide[("mean", "swb")] - wide[("mean", "median")],
            "spread": wide["std"][["median", "swb"]].max(axis=1)})
        diff["swb above, beyond spread"] = diff["swb - median"] > diff["spread"]
        lines += ["## SWB against Median (spread: the larger seed std of the two cells)", "",
                  markdown_table(diff, floatfmt=".4g"), ""]
    fits = sqrt_fit_table(scored)
    if not fits.empty:
        lines += ["## E(beta) = E0 + C sqrt(beta), least squares on the per-beta means", "",
                  markdown_table(fits, floatfmt=".4g"), ""]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", choices=["collapses", "gain", "aggregation"])
    parser.add_argument("results_dir", type=Path)
    parser.add_argument("--start", type=int, default=10)
    parser.add_argument("--end", type=int, default=25)
    args = parser.parse_args(argv)
    if not args.results_dir.is_dir():
        print(f"error: results folder {str(args.results_dir)!r} does not exist", file=sys.stderr)
        return 2
    runs = load_runs(args.results_dir)
    if runs.empty:
        print(f"error: no run (summary.json) under {args.results_dir}", file=sys.stderr)
        return 2
    if args.table == "collapses":
        lines = collapses(runs)
    elif args.table == "gain":
        lines = gains(runs, load_rounds(args.results_dir, runs), args.start, args.end)
    else:
        lines = aggregation(runs, load_rounds(args.results_dir, runs))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
