"""Rebuild the SWB-DM paper's Tables I, II and IV and its Figure 2 from a results folder.

    python analysis/tables.py RESULTS_DIR [--out DIR] [--gain-from 10] [--gain-to 25]
                                          [--attack alie --attack ipm]

Table I   mean final accuracy (%) by Byzantine fraction x participation, per method
Table II  collapsed runs (final accuracy <= chance + 0.5 points) per method
Table IV  mean accuracy gain (points) from round 10 to round 25 per method and dataset
          (needs runs of at least 25 rounds, e.g. the paper grid with --set rounds=25)
Figure 2  mean L2 aggregation error ||Agg - xbar_H|| (recorded per round) against beta per
          method, one panel per attack (ALIE, IPM), with E0 + C sqrt(beta) fitted to SWB
          (figure2.png); the same panels for the test error, 1 - accuracy (test_error.png)

Prints the tables as markdown and writes table1_accuracy.csv, table2_collapses.csv,
table4_gain.csv, figure2.png and test_error.png into --out (default RESULTS_DIR/analysis).
Everything is a function of the folder: robusttune.reports.results builds the tables,
robusttune.reports.aggregation the aggregation errors, robusttune.display.plots the figures.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from robusttune.display import plots
from robusttune.display.markdown import markdown_table
from robusttune.reports.aggregation import run_aggregation_errors
from robusttune.reports.paper_tables import accuracy_table, collapse_table, gain_table
from robusttune.reports.runs import load_rounds, load_runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results_dir", type=Path)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--gain-from", type=int, default=10)
    parser.add_argument("--gain-to", type=int, default=25)
    parser.add_argument(
        "--attack",
        action="append",
        default=None,
        help="Figure 2 panels (repeatable; default alie and ipm when present)",
    )
    args = parser.parse_args(argv)
    if not args.results_dir.is_dir():
        print(f"error: results folder {str(args.results_dir)!r} does not exist", file=sys.stderr)
        return 2
    out = args.out or args.results_dir / "analysis"
    out.mkdir(parents=True, exist_ok=True)

    runs = load_runs(args.results_dir)
    if runs.empty:
        print(f"error: no run (summary.json) under {args.results_dir}", file=sys.stderr)
        return 2
    rounds = load_rounds(args.results_dir, runs)
    tables = {
        "Table I: mean final accuracy (%) by Byzantine fraction and participation": (
            "table1_accuracy",
            accuracy_table(runs),
        ),
        "Table II: collapsed runs (<= chance + 0.5 points)": (
            "table2_collapses",
            collapse_table(runs),
        ),
        f"Table IV: mean accuracy gain (points), round {args.gain_from} to {args.gain_to}": (
            "table4_gain",
            gain_table(runs, rounds, args.gain_from, args.gain_to),
        ),
    }
    for title, (name, table) in tables.items():
        table.to_csv(out / f"{name}.csv")
        print(f"## {title}\n")
        print(
            markdown_table(table) if not table.empty else f"_(no run reached round {args.gain_to})_"
        )
        print()
    scored = run_aggregation_errors(runs, rounds)
    for label, draw, name, data in (
        (
            "figure 2 (aggregation error)",
            plots.aggregation_error_vs_corruption,
            "figure2.png",
            scored,
        ),
        ("test error", plots.classification_error_vs_corruption, "test_error.png", runs),
    ):
        figure, skipped = draw(data, out / name, attacks=args.attack)
        print(f"{label}: {figure if figure else '(no attacked runs with that figure)'}")
        for attack, reason in skipped.items():
            print(f"  no panel for {attack}: {reason}")
    print(f"tables: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
