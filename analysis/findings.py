"""The evidence tables of analysis/FINDINGS.md: per setting of a sweep, what its runs did over
their seeds, read from the run folders (summary.json and the per-round rounds.csv).

    python analysis/findings.py RESULTS_DIR [--out DIR] [--runs]

A setting is one value of every RunSpec key the folder's runs vary, the seed left out; its row
gives the seeds' final accuracy (mean and min-max: the spread a difference must exceed to count),
the collapsed runs (final accuracy <= chance + 0.5 points or non-finite parameters, the one rule
of robusttune.core.records), the final predicted-class max share, the parameter norm after round 1
and at the end, the first round with non-finite parameters, the rounds the guard refused
(``aggregated`` false), the rounds whose precondition held for the assumed f and for the
Byzantine inputs actually present, and the first
Byzantine-majority round. ``--runs`` prints one row per run too. Prints markdown and writes
findings_settings.csv (and findings_runs.csv) into --out (default RESULTS_DIR/analysis).
Everything is a function of the folder: robusttune.reports.results reads it.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import pandas as pd

from robusttune.core.runspec import RUNSPEC_KEYS
from robusttune.display.markdown import markdown_table
from robusttune.reports.runs import load_rounds, load_runs

# Keys that say how a run is identified or resolved rather than what was compared: the seed is
# what a setting is repeated over, the algorithm and aggregator are spelled by the method label.
NOT_SETTING_KEYS = ("seed", "algorithm", "aggregator", "data_root", "device")


def run_figures(runs: pd.DataFrame, rounds: pd.DataFrame) -> pd.DataFrame:
    """One row per run: its summary figures plus what only its rounds.csv tells (final
    max_class_share = the last evaluated round's; norm_round1 and norm_final = param_norm after
    round 1 and after the last round, NaN when not finite; first_nonfinite_round; refused_rounds
    = rounds that aggregated nothing; precondition_rounds / actual_precondition_rounds = rounds
    whose rule precondition held for the assumed f / for the Byzantine rows actually in its
    input; first_majority_round; NaN/0 where the event never happened)."""
    rows = []
    for run in runs.itertuples(index=False):
        own = rounds[rounds["run_id"] == run.run_id].sort_values("round")
        evaluated = own.dropna(subset=["max_class_share"])
        nonfinite = own[own["nonfinite_params"] > 0]
        majority = own[own["byzantine_majority"].astype(bool)]
        norms = own["param_norm"].astype(float)
        rows.append(
            {
                "run_id": run.run_id,
                "final_accuracy": run.final_accuracy,
                "collapsed": bool(run.collapsed),
                "rounds_run": int(run.rounds_run),
                "max_class_share": float(evaluated["max_class_share"].iloc[-1])
                if len(evaluated)
                else math.nan,
                "norm_round1": _finite(norms.iloc[0]) if len(norms) else math.nan,
                "norm_final": _finite(norms.iloc[-1]) if len(norms) else math.nan,
                "first_nonfinite_round": int(nonfinite["round"].iloc[0])
                if len(nonfinite)
                else math.nan,
                "refused_rounds": int((~own["aggregated"].astype(bool)).sum()),
                "precondition_rounds": int(own["precondition_held_assumed"].astype(bool).sum()),
                "actual_precondition_rounds": int(
                    own["precondition_held_actual"].astype(bool).sum()
                ),
                "first_majority_round": int(majority["round"].iloc[0])
                if len(majority)
                else math.nan,
            }
        )
    return pd.DataFrame(rows)


def setting_keys(runs: pd.DataFrame) -> list[str]:
    """The RunSpec keys whose value differs between the folder's runs, the seed left out."""
    keys = []
    for key in runs.columns:
        if (
            key in RUNSPEC_KEYS
            and key not in NOT_SETTING_KEYS
            and runs[key].map(repr).nunique() > 1
        ):
            keys.append(key)
    return keys


def settings_table(runs: pd.DataFrame, rounds: pd.DataFrame) -> pd.DataFrame:
    """One row per setting (the varied keys, in the order the runs first show them): ``seeds``,
    ``accuracy`` (mean final accuracy, a non-finite one counted as 0, robusttune.core.records'
    rule), ``acc_min``/``acc_max``, ``collapsed`` ("k/n"), ``max_class_share`` (mean), the mean
    ``norm_round1`` and the median ``norm_final`` (non-finite ends left out), the runs'
    ``first_nonfinite`` rounds, the mean ``refused``, ``precondition_held`` (assumed f) and
    ``held_actual`` (actual Byzantine rows) rounds, and the
    runs' ``first_majority`` rounds (lists in seed order)."""
    figures = run_figures(runs, rounds).set_index("run_id")
    keys = setting_keys(runs)
    joined = runs.set_index("run_id")[[*keys, "seed"]].join(figures).reset_index()
    joined = joined.sort_values("seed", kind="stable")
    groups = (
        joined.groupby([joined[k].map(_label) for k in keys], sort=False)
        if keys
        else [((), joined)]
    )
    rows = []
    for label, part in groups:
        accuracy = part["final_accuracy"].astype(float)
        counted = accuracy.where(accuracy.map(math.isfinite), 0.0)
        row = dict(zip(keys, label if isinstance(label, tuple) else (label,)))
        row.update(
            {
                "seeds": len(part),
                "accuracy": counted.mean(),
                "acc_min": counted.min(),
                "acc_max": counted.max(),
                "collapsed": f"{int(part['collapsed'].sum())}/{len(part)}",
                "max_class_share": part["max_class_share"].mean(),
                "norm_round1": part["norm_round1"].mean(),
                "norm_final": part["norm_final"].median(),
                "first_nonfinite": _rounds_list(part["first_nonfinite_round"]),
                "refused": part["refused_rounds"].mean(),
                "precondition_held": part["precondition_rounds"].mean(),
                "held_actual": part["actual_precondition_rounds"].mean(),
                "first_majority": _rounds_list(part["first_majority_round"]),
            }
        )
        rows.append(row)
    return pd.DataFrame(rows)


def _finite(value: float) -> float:
    return float(value) if math.isfinite(float(value)) else math.nan


def _label(value: object) -> object:
    # NaN (a key left unset in some runs) would make its own group per run
    return "-" if isinstance(value, float) and math.isnan(value) else value


def _rounds_list(values: pd.Series) -> str:
    """``4, -, 10``: each run's round of the event, ``-`` where it never happened."""
    return ", ".join("-" if not math.isfinite(v) else str(int(v)) for v in values.astype(float))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results_dir", type=Path)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--runs", action="store_true", help="also one row per run")
    args = parser.parse_args(argv)
    if not args.results_dir.is_dir():
        print(f"error: results folder {str(args.results_dir)!r} does not exist", file=sys.stderr)
        return 2
    runs = load_runs(args.results_dir)
    if runs.empty:
        print(f"error: no run (summary.json) under {args.results_dir}", file=sys.stderr)
        return 2
    rounds = load_rounds(args.results_dir, runs)
    out = args.out or args.results_dir / "analysis"
    out.mkdir(parents=True, exist_ok=True)
    table = settings_table(runs, rounds)
    table.to_csv(out / "findings_settings.csv", index=False)
    print(markdown_table(table, floatfmt=".3g", index=False))
    if args.runs:
        keys = setting_keys(runs)
        per_run = runs[["run_id", *keys, "seed"]].merge(
            run_figures(runs, rounds).drop(columns=["final_accuracy", "collapsed", "rounds_run"]),
            on="run_id",
        )
        per_run = runs[["run_id", "final_accuracy", "collapsed", "rounds_run"]].merge(
            per_run, on="run_id"
        )
        per_run.to_csv(out / "findings_runs.csv", index=False)
        print()
        print(markdown_table(per_run.drop(columns=["run_id"]), floatfmt=".3g", index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
