"""The tables behind issue 14's claims 4, 6, 7, 8 and 9, from a results folder (markdown on stdout).

    python analysis/findings/claim_tables.py collapses RESULTS      # claim 4
    python analysis/findings/claim_tables.py demoa STUDY            # claim 6
    python analysis/findings/claim_tables.py aftermath STUDY        # claim 6, one majority round
    python analysis/findings/claim_tables.py ablations STUDY        # claim 7
    python analysis/findings/claim_tables.py gain RESULTS [--start 10 --end 25]   # claim 8
    python analysis/findings/claim_tables.py aggregation RESULTS    # claim 9

collapses    per method x participation x attack x beta: runs, collapsed runs (final accuracy
             <= 1/K + 0.5 points or non-finite parameters, robusttune.core.records.is_collapsed) and
             final accuracy (%) mean and std over seeds; then collapses per method x attack
             summed over beta and p.
gain         per run, 100 (acc(end) - acc(start)) from rounds.csv (the last evaluated accuracy at
             or before each round, robusttune.reports.results.round_value); per configuration (method x
             participation x attack x beta) the mean accuracy (%) at both rounds and the gain's
             mean, std and min over seeds; per method x
             participation the mean over configurations and how many gained (mean > 0).
demoa        DeMoA's comparison (demoa.yaml's runs, beta > 0, no ablation): per method x split x
             p the accuracy over attacks and seeds with the spread of the per-seed means, and the
             Byzantine-majority events (robusttune.reports.majority); what a majority round does to the
             accuracy, against the other rounds, once a run has trained; DeMoA (each rule) against
             each baseline per attack x split x p, counted as wins and losses beyond the larger
             seed std of the two cells; the beta = 0 arm (demoa_ablations.yaml) per method x split.
aftermath    runs with a Byzantine-majority round (claim6_mnist_convnet.yaml's seeds): per split x
             attack set (the paper's attacks; strategic_skip apart) x method, the test accuracy
             at the last evaluation before the first majority round, the change to the first
             evaluation at or after it, the lowest evaluation after it, runs dropping more than
             5 points, runs at chance after it, the final accuracy; the dropping runs one by
             one; final accuracy per attack (mean, seed min-max) and per seed.
ablations    DeMoA's ablations (demoa_ablation none / coefficient_swap / no_decay, beta > 0): per
             arm x p x split the honest momenta's spread V (the runs' mean honest_input_spread)
             and the accuracy, with seed spreads; V per round at a few rounds; each ablated arm
             against the unablated one per attack x split x p, beyond the seed spread.
aggregation  per method x attack x beta the mean aggregation error over seeds with std, min and
             max (robusttune.reports.aggregation), SWB - Median per attack and beta against the
             larger of the two cells' seed std, and the E0 + C sqrt(beta) fits.

Spreads are sample standard deviations over seeds (ddof = 1). Everything is a function of the
folder; nothing is run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from robusttune.display.markdown import markdown_table
from robusttune.reports import axes, majority
from robusttune.reports.aggregation import (
    aggregation_error_table,
    run_aggregation_errors,
    sqrt_fit_table,
)
from robusttune.reports.paper_tables import round_value
from robusttune.reports.runs import load_rounds, load_runs

CELL = ["method", "participation", "attack", "byzantine_fraction"]


def collapses(runs: pd.DataFrame) -> list[str]:
    runs = runs.assign(
        accuracy=100 * runs["final_accuracy"].astype(float), collapsed=runs["collapsed"].astype(int)
    )
    cells = runs.groupby(CELL).agg(
        runs=("seed", "count"),
        collapsed=("collapsed", "sum"),
        accuracy=("accuracy", "mean"),
        std=("accuracy", "std"),
    )
    attacked = runs[runs["attack"] != "none"]
    totals = attacked.pivot_table(
        index="method", columns="attack", values="collapsed", aggfunc="sum"
    )
    counts = attacked.pivot_table(
        index="method", columns="attack", values="collapsed", aggfunc="count"
    )
    totals.columns = [f"{c} collapsed" for c in totals.columns]
    counts.columns = [f"{c} runs" for c in counts.columns]
    return [
        "## Collapses per cell",
        "",
        markdown_table(cells),
        "",
        "## Collapsed attacked runs per method and attack (all beta and p)",
        "",
        markdown_table(pd.concat([totals, counts], axis=1)),
        "",
    ]


def gains(runs: pd.DataFrame, rounds: pd.DataFrame, start: int, end: int) -> list[str]:
    at_start = [100 * round_value(rounds, r, start) for r in runs["run_id"]]
    at_end = [100 * round_value(rounds, r, end) for r in runs["run_id"]]
    runs = runs.assign(
        at_start=at_start, at_end=at_end, gain=[b - a for a, b in zip(at_start, at_end)]
    ).dropna(subset=["gain"])
    cells = runs.groupby(CELL).agg(
        runs=("gain", "count"),
        **{f"acc {start}": ("at_start", "mean"), f"acc {end}": ("at_end", "mean")},
        gain=("gain", "mean"),
        std=("gain", "std"),
        min=("gain", "min"),
    )
    cells["gained"] = cells["gain"] > 0
    per_p = (
        cells.reset_index()
        .groupby(["method", "participation"])
        .agg(
            configurations=("gain", "count"),
            gained=("gained", "sum"),
            mean_gain=("gain", "mean"),
            std_over_configurations=("gain", "std"),
        )
    )
    seeds = runs.groupby(["method", "participation", "seed"])["gain"].mean()
    seed_spread = seeds.groupby(["method", "participation"]).agg(["mean", "std", "min", "max"])
    seed_spread.columns = [f"per-seed mean gain {c}" for c in seed_spread.columns]
    return [
        f"## Gain (points) from round {start} to round {end} per configuration",
        "",
        markdown_table(cells),
        "",
        "## Per method and participation",
        "",
        markdown_table(per_p),
        "",
        "## The same mean per seed (each seed averaged over the configurations)",
        "",
        markdown_table(seed_spread),
        "",
    ]


def aggregation(runs: pd.DataFrame, rounds: pd.DataFrame) -> list[str]:
    scored = run_aggregation_errors(runs, rounds)
    table = aggregation_error_table(scored)
    lines = [
        "## Mean aggregation error ||Agg - xbar_H|| per cell",
        "",
        markdown_table(table, floatfmt=".4g"),
        "",
    ]
    frame = table.reset_index()
    if {"median", "swb"} <= set(frame["method"]):
        wide = frame.pivot_table(
            index=["threat", "byzantine_fraction"], columns="method", values=["mean", "std"]
        )
        diff = pd.DataFrame(
            {
                "median": wide[("mean", "median")],
                "swb": wide[("mean", "swb")],
                "swb - median": wide[("mean", "swb")] - wide[("mean", "median")],
                "spread": wide["std"][["median", "swb"]].max(axis=1),
            }
        )
        diff["swb above, beyond spread"] = diff["swb - median"] > diff["spread"]
        lines += [
            "## SWB against Median (spread: the larger seed std of the two cells)",
            "",
            markdown_table(diff, floatfmt=".4g"),
            "",
        ]
    fits = sqrt_fit_table(scored)
    if not fits.empty:
        lines += [
            "## E(beta) = E0 + C sqrt(beta), least squares on the per-beta means",
            "",
            markdown_table(fits, floatfmt=".4g"),
            "",
        ]
    return lines


# -- claims 6 and 7: DeMoA's comparison and its ablations ------------------------------------
def _labelled(runs: pd.DataFrame) -> pd.DataFrame:
    frame = axes.labelled(runs)
    return frame.assign(
        accuracy=100 * frame["final_accuracy"].astype(float).fillna(0.0),
        collapsed=frame["collapsed"].astype(int),
    )


def _over_seeds(frame: pd.DataFrame, cell: list[str], value: str) -> pd.DataFrame:
    """Per cell: the mean of ``value`` over its runs, and the spread of the per-seed means (each
    seed averaged over the rest of the cell, e.g. the attacks): sd (ddof = 1), min, max."""
    per_seed = frame.groupby([*cell, "seed"])[value].mean()
    spread = per_seed.groupby(cell).agg(seed_sd="std", seed_min="min", seed_max="max")
    means = frame.groupby(cell).agg(runs=(value, "size"), mean=(value, "mean"))
    return means.join(spread)


def _pairs(
    frame: pd.DataFrame, arm: str, ours: list[str], theirs: list[str], value: str, cell: list[str]
) -> pd.DataFrame:
    """Each of ``ours`` against each of ``theirs`` (values of column ``arm``) per cell: cells
    where ours is above by more than the larger of the two cells' seed std (``above``), below by
    more (``below``), the rest (``within``), and the mean difference."""
    stats = frame.groupby([*cell, arm])[value].agg(["mean", "std"])
    rows = []
    for a in ours:
        for b in theirs:
            if a == b:
                continue
            try:
                left, right = stats.xs(a, level=arm), stats.xs(b, level=arm)
            except KeyError:
                continue
            both = left.add_suffix("_a").join(right.add_suffix("_b"), how="inner")
            diff = both["mean_a"] - both["mean_b"]
            bar = both[["std_a", "std_b"]].max(axis=1)
            rows.append(
                {
                    "ours": a,
                    "theirs": b,
                    "cells": len(both),
                    "above": int((diff > bar).sum()),
                    "within": int((diff.abs() <= bar).sum()),
                    "below": int((diff < -bar).sum()),
                    "mean difference": diff.mean(),
                }
            )
    return pd.DataFrame(rows).set_index(["ours", "theirs"]) if rows else pd.DataFrame()


def _majority_effect(runs: pd.DataFrame, rounds: pd.DataFrame, trained: float) -> pd.DataFrame:
    """Per method x split x p: the accuracy change (points) from one evaluation to the next, over
    steps that start from a trained model (accuracy before >= ``trained``), split into steps
    whose rounds (after the earlier evaluation, up to and including the later one) held a
    Byzantine-majority sample and the others: how many, their mean change, the worst change in a
    majority step, and how many majority steps ended at chance. Evaluated every round, a step is
    one round; evaluated every k rounds, a majority round between evaluations still counts, in
    the step that contains it."""
    info = axes.labelled(runs).set_index("run_id")[
        ["method", "split", "participation", "num_classes"]
    ]
    parts = []
    for run_id, part in rounds[rounds["run_id"].isin(info.index)].groupby("run_id"):
        part = part.sort_values("round")
        accuracy = 100 * part["accuracy"].astype(float)
        previous = accuracy.ffill().shift(1)
        majority_round = part["byzantine_majority"].astype(str).str.lower().isin(("true", "1"))
        # each evaluated round closes a step: the rounds since the previous evaluation
        step = accuracy.notna().shift(1, fill_value=False).cumsum()
        majority_step = majority_round.groupby(step).transform("any")
        chance = 100 / float(info.loc[run_id, "num_classes"] or 10) + 0.5
        parts.append(
            pd.DataFrame(
                {
                    "run_id": run_id,
                    "change": accuracy - previous,
                    "before": previous,
                    "majority": majority_step,
                    "at_chance": accuracy <= chance,
                }
            )
        )
    if not parts:
        return pd.DataFrame()
    steps = pd.concat(parts).dropna(subset=["change"])
    steps = steps[steps["before"] >= trained].join(info, on="run_id")
    cell = ["participation", "split", "method"]
    major, other = steps[steps["majority"]], steps[~steps["majority"]]
    table = pd.DataFrame(
        {
            "majority rounds": major.groupby(cell).size(),
            "mean change (majority)": major.groupby(cell)["change"].mean(),
            "worst change (majority)": major.groupby(cell)["change"].min(),
            "ended at chance (majority)": major.groupby(cell)["at_chance"].sum(),
            "other rounds": other.groupby(cell).size(),
            "mean change (other)": other.groupby(cell)["change"].mean(),
            "worst change (other)": other.groupby(cell)["change"].min(),
        }
    )
    return table.fillna({"majority rounds": 0, "ended at chance (majority)": 0, "other rounds": 0})


def _evaluation_interval(rounds: pd.DataFrame) -> int:
    """The most common gap (rounds) between a run's evaluations; 1 when every round is one."""
    gaps = (
        rounds[rounds["accuracy"].astype(float).notna()]
        .sort_values("round")
        .groupby("run_id")["round"]
        .diff()
        .dropna()
    )
    return int(gaps.mode().iloc[0]) if not gaps.empty else 1


def demoa_comparison(runs: pd.DataFrame, rounds: pd.DataFrame) -> list[str]:
    frame = _labelled(runs)
    ablation = frame.get("demoa_ablation", "none")
    attacked = frame[(frame["byzantine_fraction"] > 0) & (ablation == "none")]
    clean = frame[frame["byzantine_fraction"] == 0]
    cell = ["participation", "split", "method"]
    attacks, seeds = attacked["threat"].nunique(), attacked["seed"].nunique()
    lines = [
        f"## Accuracy (%) per method x split x p over the {attacks} attacks x {seeds} seeds",
        "",
        f"seed_sd/min/max: over the {seeds} per-seed means (each over the {attacks} attacks).",
        "",
        markdown_table(
            _over_seeds(attacked, cell, "accuracy").join(attacked.groupby(cell)["collapsed"].sum()),
            floatfmt=".1f",
        ),
        "",
    ]
    events = majority.majority_table(attacked, rounds[rounds["run_id"].isin(attacked["run_id"])])
    if not events.empty:
        lines += [
            "## Byzantine-majority rounds per method x split x p (robusttune.reports.majority)",
            "",
            markdown_table(
                majority.majority_summary(events, [c for c in cell if c in events]), floatfmt=".3g"
            ),
            "",
            "accuracy (%) before the first majority round, over runs that had one:",
            "",
            markdown_table(
                events.assign(before=100 * events["accuracy_before"])
                .groupby([c for c in cell if c in events])["before"]
                .describe()[["count", "mean", "min", "50%", "max"]],
                floatfmt=".1f",
            ),
            "",
        ]
    effect = _majority_effect(attacked, rounds, trained=50.0)
    if not effect.empty:
        every = _evaluation_interval(rounds[rounds["run_id"].isin(attacked["run_id"])])
        step = "round" if every == 1 else f"evaluation ({every} rounds)"
        lines += [
            f"## What one {step} does to a trained model (accuracy before >= 50%)",
            "",
            "Change in accuracy (points) from the previous evaluation, steps that hold a "
            "majority round against the others, over all attacks and seeds.",
            "",
            markdown_table(effect, floatfmt=".2f"),
            "",
        ]
    methods = list(attacked["method"].unique())
    ours = [m for m in methods if m.startswith("demoa")]
    theirs = [m for m in methods if not m.startswith("demoa")] + ["demoa"]
    pairs = _pairs(
        attacked, "method", ours, theirs, "accuracy", ["participation", "split", "threat"]
    )
    if not pairs.empty:
        cells = attacked.groupby(["participation", "split", "threat"]).ngroups
        lines += [
            f"## DeMoA against each baseline, per attack x split x p ({cells} cells)",
            "",
            "above / below: cells where the first method's mean accuracy is higher / lower "
            "by more than the larger seed std of the two cells; within: the rest.",
            "",
            markdown_table(pairs, floatfmt=".1f"),
            "",
        ]
        for p in sorted(attacked["participation"].unique()):
            at_p = _pairs(
                attacked[attacked["participation"] == p],
                "method",
                ours,
                theirs,
                "accuracy",
                ["split", "threat"],
            )
            cells_at_p = (
                attacked[attacked["participation"] == p].groupby(["split", "threat"]).ngroups
            )
            lines += [
                f"At p = {p:g} ({cells_at_p} cells):",
                "",
                markdown_table(at_p, floatfmt=".1f"),
                "",
            ]
    if not clean.empty:
        lines += [
            "## delta = 0 with plain averaging (demoa_ablations.yaml), per method x split",
            "",
            markdown_table(_over_seeds(clean, cell, "accuracy"), floatfmt=".2f"),
            "",
            markdown_table(
                _pairs(
                    clean,
                    "method",
                    ["demoa+mean"],
                    list(clean["method"].unique()),
                    "accuracy",
                    ["participation", "split"],
                ),
                floatfmt=".2f",
            ),
            "",
        ]
    return lines


def demoa_ablations(runs: pd.DataFrame, rounds: pd.DataFrame, at: tuple[int, ...]) -> list[str]:
    frame = _labelled(runs)
    frame = frame[(frame["byzantine_fraction"] > 0) & (frame["method"] == "demoa")]
    if "mean_honest_input_spread" not in frame or frame.empty:
        return ["_(no DeMoA ablation runs with a recorded spread)_"]
    frame = frame.assign(spread=frame["mean_honest_input_spread"].astype(float))
    cell = ["participation", "split", "demoa_ablation"]
    spread = _over_seeds(frame, cell, "spread")
    accuracy = _over_seeds(frame, cell, "accuracy")
    both = spread.add_suffix(" V").join(accuracy.add_suffix(" accuracy"))
    both = both.drop(columns=["runs accuracy"]).rename(columns={"runs V": "runs"})
    none = both.xs("none", level="demoa_ablation")["mean V"]
    both["V / V(none)"] = [v / none.loc[(p, s)] for (p, s, _), v in zip(both.index, both["mean V"])]
    both = both.join(frame.groupby(cell)["collapsed"].sum())
    lines = [
        "## Spread V of the honest cached momenta and accuracy (%) per arm x p x split",
        "",
        "V: each run's mean over its rounds of mean_{i in H} ||m_i - mean_H||^2; mean over the "
        "5 attacks x 3 seeds, seed_sd/min/max over the per-seed means.",
        "",
        markdown_table(both, floatfmt=".4g"),
        "",
    ]
    known = rounds[rounds["run_id"].isin(frame["run_id"])]
    if "honest_input_spread" in known:
        known = known[known["round"].isin(at)].join(frame.set_index("run_id")[cell], on="run_id")
        curve = known.pivot_table(
            index=cell, columns="round", values="honest_input_spread", aggfunc="mean"
        )
        curve.columns = [f"V at round {c}" for c in curve.columns]
        lines += [
            "## V per round (mean over attacks and seeds)",
            "",
            markdown_table(curve, floatfmt=".4g"),
            "",
        ]
    arms = list(frame["demoa_ablation"].unique())
    for value, name in (("spread", "V"), ("accuracy", "accuracy (%)")):
        pairs = _pairs(
            frame,
            "demoa_ablation",
            [a for a in arms if a != "none"],
            ["none"],
            value,
            ["participation", "split", "threat"],
        )
        lines += [
            f"## Each ablation against the unablated arm: {name}, per attack x split x p",
            "",
            markdown_table(pairs, floatfmt=".4g"),
            "",
        ]
    per_attack = frame.groupby(["participation", "split", "threat", "demoa_ablation"]).agg(
        V=("spread", "mean"),
        V_sd=("spread", "std"),
        accuracy=("accuracy", "mean"),
        accuracy_sd=("accuracy", "std"),
        collapsed=("collapsed", "sum"),
    )
    lines += ["## Per attack (3 seeds)", "", markdown_table(per_attack, floatfmt=".4g"), ""]
    return lines


# Attacks aimed at the majority round (claim6_mnist_convnet.yaml): their rows are kept apart from
# the paper's attacks in the aftermath tables, which would otherwise average them away.
AIMED_ATTACKS = ("strategic_skip",)


def majority_aftermath_runs(runs: pd.DataFrame, rounds: pd.DataFrame) -> pd.DataFrame:
    """One row per attacked run that had a Byzantine-majority round, read off its rounds.csv test
    accuracy (%): ``first_majority``; ``before`` (the last evaluation before it, at
    ``before_round``); ``after`` (the first evaluation at or after it, at ``after_round``);
    ``change`` = after - before; ``lowest_after`` (the lowest evaluation from ``after_round`` to
    the end); ``at_chance_after`` (some evaluation from ``after_round`` on is collapsed,
    robusttune.core.records.is_collapsed, a round with non-finite parameters included); ``final``
    (final test accuracy). The rounds are robusttune.reports.majority's (`first_majority_round`,
    `evaluations`), as its majority table reads them."""
    frame = _labelled(runs)
    frame = frame[frame["byzantine_fraction"] > 0]
    by_run = dict(tuple(rounds.groupby("run_id")))
    rows = []
    for _, run in frame.iterrows():
        part = by_run.get(run["run_id"])
        first = None if part is None else majority.first_majority_round(part)
        if first is None:
            continue
        classes = int(run["num_classes"]) if run.get("num_classes") else 10
        marks = majority.evaluations(part, classes)
        earlier = [mark for mark in marks if mark.round < first]
        later = [mark for mark in marks if mark.round >= first]
        if not earlier or not later:
            continue
        before, after = 100 * earlier[-1].accuracy, 100 * later[0].accuracy
        rows.append(
            {
                "method": run["method"],
                "split": run["split"],
                "attack": run["attack"],
                "threat": run["threat"],
                "seed": run["seed"],
                "first_majority": first,
                "before_round": earlier[-1].round,
                "before": before,
                "after_round": later[0].round,
                "after": after,
                "change": after - before,
                "lowest_after": 100 * pd.Series([mark.accuracy for mark in later]).min(),
                "at_chance_after": any(mark.at_chance for mark in later),
                "final": run["accuracy"],
            }
        )
    return pd.DataFrame(rows)


def _attack_set(attack: str) -> str:
    return attack if attack in AIMED_ATTACKS else "paper's attacks"


def _range(values: pd.Series) -> str:
    return f"{values.min():.1f}-{values.max():.1f}"


def majority_aftermath(runs: pd.DataFrame, rounds: pd.DataFrame, drop: float = 5.0) -> list[str]:
    """What each run's first Byzantine-majority round did (`majority_aftermath_runs`), per split x
    attack set (the paper's attacks; each of AIMED_ATTACKS) x method, and the runs whose first
    evaluation after it is more than ``drop`` points below the last one before; then the final
    accuracy per attack (mean over seeds, seed min-max) and per seed."""
    events = majority_aftermath_runs(runs, rounds)
    frame = _labelled(runs)
    frame = frame[frame["byzantine_fraction"] > 0]
    frame = frame.assign(attack_set=[_attack_set(a) for a in frame["attack"]])
    lines = []
    if not events.empty:
        events = events.assign(**{"attack set": [_attack_set(a) for a in events["attack"]]})
        cell = ["split", "attack set", "method"]
        summary = events.groupby(cell, sort=False).apply(
            lambda g: pd.Series(
                {
                    "runs": len(g),
                    "first majority round": ", ".join(
                        str(r) for r in sorted(g["first_majority"].unique())
                    ),
                    "before: median (min-max)": f"{g['before'].median():.1f} ({_range(g['before'])})",
                    "change at first evaluation after: mean, worst": f"{g['change'].mean():+.1f}, {g['change'].min():+.1f}",
                    "lowest after (min-max)": _range(g["lowest_after"]),
                    f"runs dropping > {drop:g} points": int((g["change"] < -drop).sum()),
                    "at chance after": int(g["at_chance_after"].sum()),
                    "final (min-max)": _range(g["final"]),
                }
            ),
            include_groups=False,
        )
        dropped = events[events["change"] < -drop].sort_values(
            ["split", "method", "attack", "seed"]
        )
        lines += [
            "## The first Byzantine-majority round and what followed it (test accuracy, %)",
            "",
            "before: the last evaluation before the round; first after: the first at or "
            "after it; lowest after: the lowest from then to the end; at chance: "
            "robusttune.core.records.is_collapsed.",
            "",
            markdown_table(summary),
            "",
            f"Runs whose first evaluation after the round is more than {drop:g} points "
            f"below the last one before ({len(dropped)}):",
            "",
        ]
        lines += [
            f"- {r.method}, {r.split}, {r.attack}, seed {r.seed}: {r.before:.1f} -> "
            f"{r.after:.1f}% (round {r.before_round} -> {r.after_round}; majority round "
            f"{r.first_majority}), lowest after {r.lowest_after:.1f}%, final {r.final:.1f}%"
            for r in dropped.itertuples()
        ]
        lines.append("")
    per_attack = (
        frame.groupby(["split", "threat", "method"])["accuracy"]
        .agg(lambda a: f"{a.mean():.1f} ({_range(a)})")
        .unstack("method")
    )
    lines += [
        "## Final test accuracy (%) per attack: mean over seeds (seed min-max)",
        "",
        markdown_table(per_attack),
        "",
    ]
    per_seed = (
        frame.groupby(["split", "method", "attack_set", "seed"])["accuracy"]
        .mean()
        .unstack(["attack_set", "seed"])
    )
    per_seed.columns = [f"{attacks}: s{seed}" for attacks, seed in per_seed.columns]
    lines += [
        "## Final test accuracy (%) per seed: the mean over the paper's attacks, and each "
        "aimed attack",
        "",
        markdown_table(per_seed, floatfmt=".1f"),
        "",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "table", choices=["collapses", "gain", "aggregation", "demoa", "ablations", "aftermath"]
    )
    parser.add_argument("results_dir", type=Path)
    parser.add_argument("--start", type=int, default=10)
    parser.add_argument("--end", type=int, default=25)
    args = parser.parse_args(argv)
    if not args.results_dir.is_dir():
        print(f"error: results folder {str(args.results_dir)!r} does not exist", file=sys.stderr)
        return 2
    runs = load_runs(args.results_dir)
    if args.table in ("demoa", "ablations", "aftermath"):  # two sweeps in one study share an arm
        runs, _ = axes.distinct_runs(runs)
    if runs.empty:
        print(f"error: no run (summary.json) under {args.results_dir}", file=sys.stderr)
        return 2
    if args.table == "collapses":
        lines = collapses(runs)
    elif args.table == "demoa":
        lines = demoa_comparison(runs, load_rounds(args.results_dir, runs))
    elif args.table == "aftermath":
        lines = majority_aftermath(runs, load_rounds(args.results_dir, runs))
    elif args.table == "ablations":
        lines = demoa_ablations(runs, load_rounds(args.results_dir, runs), (5, 20, 40, 60))
    elif args.table == "gain":
        lines = gains(runs, load_rounds(args.results_dir, runs), args.start, args.end)
    else:
        lines = aggregation(runs, load_rounds(args.results_dir, runs))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
