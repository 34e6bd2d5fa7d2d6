"""Writing a breakdown map to a folder (the p-frontier and the orderings over seeds it writes are
`robusttune.experiments.breakdown.frontier`'s): breakdown.csv (one row per cell: the answer over its
seeds), breakdown_seeds.csv (one row per cell and seed), breakdown_points.csv (every evaluated
point and the runs behind it), breakdown.png (the heatmap), frontier.csv and frontier.png (the
breakdown fraction as a function of p, one curve per method), ordering.csv and ordering_by_p.csv
(in how many seeds the frontier's order of two methods, or of two regimes of a method, holds)
and breakdown.md."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from robusttune.display.markdown import markdown_table
from robusttune.experiments.breakdown.answer import answer, breakdown_table
from robusttune.experiments.breakdown.bisection import BreakdownMap
from robusttune.experiments.breakdown.frontier import (
    frontier_table,
    ordering_table,
    regime_ordering_table,
)
from robusttune.experiments.breakdown.replicates import ReplicatedMap

# the columns of breakdown.csv and breakdown_points.csv after the cell's own axes (method,
# participation ...), as the reference documents them
BREAKDOWN_COLUMNS: dict[str, str] = {
    "breakdown": "The answer as it reads: the median over seeds with the seeds' range in brackets, '>= top' for a cell that never broke on the lattice, 'fails clean' or 'clean at chance' without a baseline.",
    "clients": "N, the cell's clients (the lattice is {0, 1/N, 2/N, ...}).",
    "breakdown_fraction": "The median over seeds (the lower median for an even count) of each seed's largest surviving fraction b/N below its first failing point (empty when the cell has no baseline).",
    "breakdown_byzantine": "b, that fraction's Byzantine clients.",
    "breakdown_min": "The smallest of the seeds' breakdown fractions.",
    "breakdown_max": "The largest of the seeds' breakdown fractions.",
    "seeds": "The seeds the cell was bisected at (breakdown.seeds), each a replicate.",
    "seeds_answered": "Seeds whose clean run passed the bar and learned (the median is over these; a cell needs a majority of its seeds).",
    "seeds_agree": "The seeds' answers lie within one lattice step of each other.",
    "seed_breakdowns": "Each seed's answer, in breakdown.seeds order (breakdown_seeds.csv has the rest).",
    "status": "ok, survives_all (never broke up to max_fraction), non_monotone (a survivor above a failure), seeds_disagree (the seeds' answers differ by more than one lattice step), fails_clean (the clean run missed an absolute threshold) or clean_at_chance (the clean run beat chance by less than clean_margin).",
    "never_broke": "The median is the lattice top: at least half the seeds survived every point tried, so the breakdown lies above it.",
    "monotone": "No point above a failing one survived, in any seed.",
    "conservative_fraction": "For a non-monotone cell, the fraction below its first failure (the smallest over seeds).",
    "largest_surviving_fraction": "The largest fraction any evaluated point survived (over seeds).",
    "clean_accuracy": "Validation accuracy at beta = 0, the cell's baseline (the mean over seeds).",
    "clean_accuracy_min": "The lowest seed's clean accuracy.",
    "chance": "1/K for the dataset's K classes: the bar and the clean margin are read above it.",
    "clean_test_accuracy": "Test accuracy of the same clean runs.",
    "threshold": "The survival bar: chance + relative_threshold x (clean accuracy - chance), or the absolute threshold (the mean over seeds).",
    "points_evaluated": "Lattice points evaluated (bisection, verification), over every seed.",
    "lattice_points": "Points of the cell's lattice up to max_fraction.",
    "trials": "Runs the cell took, over every seed.",
    "broken_by": "The adversary setting that broke the first failing point (of the median seed).",
    "attack_family": "Its family: ladder (a strength ladder) or rule-aware.",
    "evaluated": "Each evaluated point k with + (survived) or - (failed).",
    "violations": "Points that survived above a failure (non-monotone cells).",
    "inputs": "n_in, the rows the cell's rule aggregates (the sample, or all N cached rows).",
    "theory_fraction": "The rule's own bound as a fraction of n_in (from its precondition); empty where it states none.",
    "p_majority_round": "At the first failing point: the chance one round's sample is Byzantine-majority.",
    "p_majority_run": "The chance some round of the run is.",
}
# breakdown_seeds.csv: one row per cell and seed, after the cell's own keys; each column is the
# one seed's figure (what a one-seed map at that seed writes in breakdown.csv)
SEEDS_COLUMNS: dict[str, str] = {
    "seed": "The replicate's seed.",
    "clients": "N.",
    "breakdown_fraction": "This seed's largest surviving fraction below its first failing point.",
    "breakdown_byzantine": "b, that fraction's Byzantine clients.",
    "status": "This seed's status: ok, survives_all, non_monotone, fails_clean or clean_at_chance.",
    "monotone": "No point above a failing one survived.",
    "conservative_fraction": "The fraction below this seed's first evaluated failure.",
    "largest_surviving_fraction": "The largest fraction this seed survived.",
    "clean_accuracy": "This seed's clean validation accuracy.",
    "chance": "1/K.",
    "clean_test_accuracy": "Its test accuracy.",
    "threshold": "This seed's survival bar.",
    "points_evaluated": "Lattice points this seed evaluated.",
    "lattice_points": "Points of the lattice up to max_fraction.",
    "trials": "Runs this seed took.",
    "broken_by": "The adversary setting that broke this seed's first failing point.",
    "evaluated": "Each evaluated point k with + (survived) or - (failed).",
    "violations": "Points that survived above a failure.",
}

POINTS_COLUMNS: dict[str, str] = {
    "seed": "The replicate's seed.",
    "clients": "N.",
    "byzantine": "k, the point's Byzantine clients.",
    "byzantine_fraction": "k / N.",
    "survived": "Every adversary setting's runs survived at this point.",
    "accuracy": "What survival read: validation accuracy of the setting named in adversary (that seed's run).",
    "test_accuracy": "The same runs' test accuracy.",
    "collapsed": "A run of that setting collapsed.",
    "trials": "Runs the point took.",
    "adversary": "The setting that gave the accuracy: a survivor's worst, a failed point's breaker.",
    "detail": "Every run folder behind the point.",
}

__all__ = ["BREAKDOWN_COLUMNS", "POINTS_COLUMNS", "SEEDS_COLUMNS", "write_breakdown"]


def write_breakdown(
    result: BreakdownMap | ReplicatedMap,
    out_dir: str | Path,
    title: str = "Breakdown map",
    base: Mapping[str, Any] | None = None,
) -> Path:
    """breakdown.csv (one row per cell: its answer over seeds), breakdown_seeds.csv (one row per
    cell and seed), breakdown_points.csv (every evaluated point and the runs behind it),
    breakdown.png (heatmap: the median, the seeds' range in each square), frontier.csv and
    frontier.png (`frontier_table`, one curve per method over p), ordering.csv
    (`ordering_table`) and breakdown.md, which opens with the map's answer; with ``base`` (the
    plan's run) each cell also gets the theory columns (`theory_columns`). Returns the .md path."""
    from robusttune.display.plots import breakdown_frontier, breakdown_heatmap

    result = ReplicatedMap.of(result)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = breakdown_table(result, base)
    table.to_csv(out / "breakdown.csv", index=False)
    seeds_table = result.seeds_frame()
    seeds_table.to_csv(out / "breakdown_seeds.csv", index=False)
    result.points_frame().to_csv(out / "breakdown_points.csv", index=False)
    figure = breakdown_heatmap(table, out / "breakdown.png")
    frontier = frontier_table(table, base, seeds_table)
    frontier.to_csv(out / "frontier.csv", index=False)
    ordering = ordering_table(frontier)
    ordering.to_csv(out / "ordering.csv", index=False)
    by_regime = regime_ordering_table(frontier)
    by_regime.to_csv(out / "ordering_by_p.csv", index=False)
    frontier_figure = breakdown_frontier(frontier, out / "frontier.png")
    several = len(result.seeds) > 1
    hidden = (
        "evaluated",
        "violations",
        "threshold",
        "breakdown_fraction",
        "breakdown_byzantine",
        "monotone",
        "lattice_points",
        "breakdown_min",
        "breakdown_max",
        "chance",
        "clean_accuracy_min",
        "seeds_agree",
        *(() if several else ("seeds", "seeds_answered", "seed_breakdowns")),
    )
    shown = [c for c in table.columns if c not in hidden]
    seeds_line = (
        f"Seeds {result.seeds} are replicates: each cell is bisected at each seed as a "
        f"one-seed map would be, and `breakdown` is the median of their answers with "
        f"their range in brackets (`seed_breakdowns` lists them in order, "
        f"`breakdown_seeds.csv` has each seed's row)."
        if several
        else "One seed: each breakdown point is one draw of a random event; list several "
        "in breakdown.seeds to see its spread."
        if result.seeds
        else ""
    )
    lines = [
        f"# {title}",
        "",
        *answer(table),
        "",
        "Largest Byzantine fraction on the lattice {0, 1/N, ...} at which a run survives "
        "(no collapse, final accuracy >= threshold: by default chance plus half the clean "
        "run's margin above chance) against every adversary setting tried "
        "(`broken_by` names the setting that broke the first failing point, the one tried "
        "first of those that break it: the cell's earlier breakers go first within a stage; "
        "`attack_family` its family: `ladder` or `rule-aware`; the adversary runs the "
        "ladders first, so `rule-aware` means every ladder survived that point); "
        "`theory_fraction` is the rule's own bound over its `inputs`, `p_majority_round` "
        "and `p_majority_run` the chance of a Byzantine-majority sample at the failing point."
        + (" " + seeds_line if seeds_line else ""),
        "",
        markdown_table(table[shown], floatfmt=".3g", index=False),
        "",
        f"Cost: {result.cost_line()}.",
        "",
    ]
    flagged = table[table["status"] == "non_monotone"]
    if len(flagged):
        lines += [
            "## Non-monotone cells",
            "",
            "Survival is not monotone in the Byzantine count here; the breakdown column is "
            "bisection's answer, `conservative_fraction` the first evaluated failure minus one.",
            "",
        ]
        keys = list(dict.fromkeys(k for c in result.cells for k in c.as_dict()))
        for _, row in flagged.iterrows():
            # a key only some cells set (pre_aggregator) is blank, not "nan", in the others
            cell = ", ".join(f"{k}={row[k]}" for k in keys if not pd.isna(row[k]))
            lines.append(
                f"- {cell}: evaluated {row['evaluated']} (k+ survived, k- failed); "
                f"contradicting points: {row['violations']}"
            )
        lines.append("")
    if figure is not None:
        lines += [f"![breakdown heatmap]({figure.name})", ""]
    if not frontier.empty:
        pivot = frontier.pivot(index="method", columns="participation", values="label")
        pivot = pivot.loc[list(dict.fromkeys(frontier["method"]))]
        pivot.columns = [f"p={p:g}" for p in pivot.columns]
        pivot.index.name = "method"
        lines += [
            "## The p-frontier",
            "",
            "beta*(p): for each method and participation p the smallest breakdown fraction "
            "over its cells at that p (every attack and sampling mode: the worst case); "
            "`>=` marks a value no cell at the minimum broke below (the lattice top)"
            + ("; in brackets the range of the seeds' own frontiers" if several else "")
            + ". `frontier.csv` names the cell that set each value.",
            "",
            markdown_table(pivot, index=True),
            "",
        ]
        if frontier_figure is not None:
            lines += [f"![p-frontier]({frontier_figure.name})", ""]

    def holds(h: int, t: int, r: int, n: int) -> str:
        others = ", ".join(
            f"{count} {word}" for count, word in ((t, "tied"), (r, "reversed")) if count
        )
        return f"{h} of {n}" + (f" ({others})" if others else "")

    def with_holds(table: Any) -> Any:
        return table.assign(
            **{
                "holds in": [
                    holds(*values)
                    for values in zip(
                        table["holds"], table["ties"], table["reversed"], table["seeds"]
                    )
                ]
            }
        )

    if not ordering.empty:
        shown_order = with_holds(ordering)
        lines += [
            "## How firmly the frontier orders the methods",
            "",
            "At each p, every two neighbours of the frontier's order (medians over seeds): "
            "in how many seeds the higher method's own frontier is above the lower's. A "
            "comparison that holds in fewer than all seeds is a statement about these "
            "seeds, not about the methods (`ordering.csv`).",
            "",
            markdown_table(
                shown_order[
                    [
                        "participation",
                        "higher",
                        "lower",
                        "higher_fraction",
                        "lower_fraction",
                        "holds in",
                    ]
                ],
                floatfmt=".3g",
                index=False,
            ),
            "",
        ]
    if not by_regime.empty:
        lines += [
            "## How firmly the frontier orders each method's regimes",
            "",
            "For each method, every two neighbouring participations whose frontier values "
            "differ: in how many seeds the higher one's own frontier is above the "
            "other's (`ordering_by_p.csv`).",
            "",
            markdown_table(
                with_holds(by_regime)[
                    [
                        "method",
                        "higher_p",
                        "lower_p",
                        "higher_fraction",
                        "lower_fraction",
                        "holds in",
                    ]
                ],
                floatfmt=".3g",
                index=False,
            ),
            "",
        ]
    lines += ["Every evaluated point and its runs: `breakdown_points.csv`.", ""]
    path = out / "breakdown.md"
    path.write_text("\n".join(lines))
    return path
