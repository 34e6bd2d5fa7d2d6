"""The tables behind issue 14's claim 10, read from a breakdown map's folder (markdown on stdout).

    python analysis/findings/claim10_map.py MAP_DIR

MAP_DIR is what `robusttune breakdown` wrote: breakdown.csv (one row per cell), frontier.csv
(beta*(p) per method), breakdown_points.csv (every evaluated lattice point, with the run folder
that decided it) and trials/ (those runs' rounds.csv). Three tables:

theory      per method: cells, the rule's theoretical fraction over its inputs (`theory_fraction`:
            the largest beta with the precondition met, e.g. median (n - 1) / (2n) rounded down to
            the lattice), the cells whose measured breakdown reaches it (breakdown >= theory),
            those that break below it, those never broken on the lattice, those whose
            failing point more likely than not holds a Byzantine-majority sample in some round
            (`p_majority_run` > 0.5, the map's own binomial figure), and those whose first
            failing run aggregated a round with the precondition false for the Byzantine rows
            actually in its input.
frontier    beta*(p): per method and participation the smallest breakdown over its cells
            (frontier.csv; `>=` where no cell broke on the lattice).
cached      every cell of the methods that aggregate a cache (SWB-DM, DelayedMomentum, DeMoA):
            clean accuracy and the survival threshold, the breakdown against the theory, and of
            the run that failed first above the breakdown (its rounds.csv): the rounds whose
            rule precondition failed for the Byzantine rows actually in the cache
            (aggregated and not precondition_held_actual), the largest Byzantine share of the
            inputs, and the Byzantine-majority samples (2 b_t >= |S_t|). `why`:
            "precondition" where some round's precondition failed; else "within precondition"
            (the attack broke it at a count the rule claims to handle); "weak baseline" is added
            where the cell's clean accuracy is below half the method's own clean accuracy at
            p = 1 (the cache had not warmed up in the cell's rounds, so a survival threshold of
            half the clean accuracy is close to chance).

With ``--also MAP2 [MAP3 ...]`` (maps of the same cells at other seeds, e.g.
search_spaces/findings/claim10_cached_seeds.yaml's) a fourth table puts each cell's breakdown in
every map side by side, for the cells all of them hold, with the range over the maps.

With ``--dataset-from MAP2`` (the same cells on another dataset: the digits map beside a
Fashion-MNIST one, issue 27; or at other rounds: the map at each cell's horizon beside the map at
its own rounds, cells paired on CELL_KEYS, which leave the rounds out) three more: every cell's
answer on both (MAP2's first), per method how many cells answer alike, lower or higher on
MAP_DIR, and the cells whose answer differs with both clean accuracies, MAP_DIR's rounds and what
broke each.

Everything is a function of the folders; nothing is run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NamedTuple

import pandas as pd

from robusttune.display.markdown import markdown_table
from robusttune.experiments.breakdown.answer import breakdown_label

# what identifies a cell: the older maps had one cell per attack, the newer ones one per method
# and regime against the whole adversary (and NNM in front of a rule: its `method` is labelled
# `nnm+median` on reading, as breakdown.md spells it)
CELL_KEYS = ["method", "participation", "participation_mode", "attack"]


def cell_keys(cells: pd.DataFrame) -> list[str]:
    """The CELL_KEYS a map's breakdown.csv has."""
    return [key for key in CELL_KEYS if key in cells.columns]


def read_map_csv(path: Path) -> pd.DataFrame:
    """breakdown.csv or breakdown_points.csv, the method labelled with its pre-aggregator."""
    frame = pd.read_csv(path)
    if "pre_aggregator" in frame.columns:
        pre = frame["pre_aggregator"].fillna("none").astype(str)
        wrapped = ~pre.isin(["none", ""])
        frame.loc[wrapped, "method"] = pre[wrapped] + "+" + frame.loc[wrapped, "method"]
    return frame


CACHED_METHODS = ("swb_dm", "delayed_momentum")
CACHED_PREFIX = "demoa"


def _method_order(frame: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(frame["method"]))


def theory_table(map_dir: Path, cells: pd.DataFrame, points: pd.DataFrame) -> pd.DataFrame:
    """Per method: how many cells reach the theoretical fraction, break below it, never break,
    fail where a Byzantine-majority sample is likely (p_majority_run > 0.5), or failed first in a
    run whose precondition failed in some round for the Byzantine rows actually present."""
    rows = []
    for method in _method_order(cells):
        own = cells[cells["method"] == method]
        violated = 0
        for _, cell in own.iterrows():
            figures = _failing_run_figures(map_dir, points, cell)
            violated += int(figures is not None and figures.violations > 0)
        theory = own["theory_fraction"].astype(float)
        measured = own["breakdown_fraction"].astype(float)
        never = own["status"] == "survives_all"
        known = theory.notna()
        rows.append(
            {
                "method": method,
                "cells": len(own),
                "theory (min-max)": (f"{theory.min():g}-{theory.max():g}" if known.any() else "-"),
                "reached theory": int((known & (measured >= theory - 1e-9)).sum()),
                "below theory": int((known & (measured < theory - 1e-9)).sum()),
                "never broke": int(never.sum()),
                "majority likely at failing point": int(
                    (own["p_majority_run"].astype(float) > 0.5).sum()
                ),
                "failing run broke the precondition": violated,
            }
        )
    return pd.DataFrame(rows).set_index("method")


def frontier_table(frontier: pd.DataFrame) -> pd.DataFrame:
    """beta*(p) per method (rows) and participation (columns), `>=` where nothing broke."""
    values = frontier.assign(
        value=[
            (f">= {row.lattice_top:g}" if bool(row.never_broke) else f"{row.breakdown_fraction:g}")
            for row in frontier.itertuples(index=False)
        ]
    )
    table = values.pivot(index="method", columns="participation", values="value")
    table.columns = [f"p={c:g}" for c in table.columns]
    return table.loc[_method_order(frontier)]


def _run_folder(map_dir: Path, detail: str) -> Path | None:
    """The first run folder a point's `detail` names: where it says, else re-rooted under
    MAP_DIR/trials (the map may have been moved since it was written)."""
    for token in str(detail).split():
        if "/trials/" in token:
            return Path(token) if Path(token).is_dir() else map_dir / "trials" / Path(token).name
    return None


def failing_point(points: pd.DataFrame, cell: pd.Series) -> pd.Series | None:
    """The smallest evaluated lattice point above the cell's breakdown that did not survive."""
    own = points
    for key in cell_keys(cell.to_frame().T):
        own = own[own[key] == cell[key]]
    failed = own[
        (~own["survived"].astype(bool))
        & (own["byzantine_fraction"] > float(cell["breakdown_fraction"]) + 1e-9)
    ]
    if failed.empty:
        return None
    return failed.sort_values("byzantine_fraction").iloc[0]


class RunFigures(NamedTuple):
    """What one run's rounds.csv says about why it failed."""

    violations: int  # rounds aggregated with the precondition false for the actual Byzantine rows
    aggregated: int  # rounds that aggregated at all
    max_share: float  # the largest Byzantine share of the rule's input
    majority_rounds: int  # rounds whose sample was Byzantine-majority (2 b_t >= |S_t|)


def round_figures(rounds_csv: Path) -> RunFigures:
    """Of one run: rounds aggregated with the precondition failing for the Byzantine rows actually
    present, the largest Byzantine input share, and the Byzantine-majority sample rounds."""
    rounds = pd.read_csv(rounds_csv)
    truth = {"True": True, "False": False, True: True, False: False}
    aggregated = rounds["aggregated"].map(truth).astype(bool)
    held = rounds["precondition_held_actual"].map(truth).astype(bool)
    majority = rounds["byzantine_majority"].map(truth).astype(bool)
    return RunFigures(
        int((aggregated & ~held).sum()),
        int(aggregated.sum()),
        float(rounds["byzantine_input_share"].max()),
        int(majority.sum()),
    )


def _failing_run_figures(map_dir: Path, points: pd.DataFrame, cell: pd.Series) -> RunFigures | None:
    """round_figures of the cell's failing point's run; None where none failed or it is missing."""
    point = failing_point(points, cell)
    folder = None if point is None else _run_folder(map_dir, point["detail"])
    if folder is None or not (folder / "rounds.csv").exists():
        return None
    return round_figures(folder / "rounds.csv")


def cached_table(map_dir: Path, cells: pd.DataFrame, points: pd.DataFrame) -> pd.DataFrame:
    """Every cell of the cached methods with the failing run's round figures and `why`."""
    cached = cells[
        cells["method"].isin(CACHED_METHODS) | cells["method"].str.startswith(CACHED_PREFIX)
    ]
    full = cells[cells["participation"] == 1.0].groupby("method")["clean_accuracy"].first()
    rows = []
    for _, cell in cached.iterrows():
        row = {key: cell[key] for key in cell_keys(cells)}
        row.update(
            {
                "rounds": int(cell["rounds"]),
                "clean": float(cell["clean_accuracy"]),
                "threshold": float(cell["threshold"]),
                "breakdown": (
                    "survives all"
                    if cell["status"] == "survives_all"
                    else f"{float(cell['breakdown_fraction']):g}"
                ),
                "theory": float(cell["theory_fraction"]),
            }
        )
        point = failing_point(points, cell)
        why = []
        if point is None:
            row.update({"failing point": "-", "its accuracy": float("nan")})
        else:
            row.update(
                {
                    "failing point": f"{float(point['byzantine_fraction']):g}",
                    "its accuracy": float(point["accuracy"]),
                    "collapsed": bool(point["collapsed"]),
                }
            )
            figures = _failing_run_figures(map_dir, points, cell)
            if figures is not None:
                row.update(
                    {
                        "precondition failed rounds": f"{figures.violations}/{figures.aggregated}",
                        "max byzantine input share": figures.max_share,
                        "majority-sample rounds": figures.majority_rounds,
                    }
                )
                why.append("precondition" if figures.violations else "within precondition")
        if float(cell["clean_accuracy"]) < 0.5 * float(full.get(cell["method"], float("nan"))):
            why.append("weak baseline")
        row["why"] = ", ".join(why) or "-"
        rows.append(row)
    return pd.DataFrame(rows)


def seed_table(maps: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Each cell's breakdown fraction in every map (columns named by map), for the cells every map
    holds, with min, max and their spread (a cell never broken counts as its lattice top)."""
    merged = None
    keys = cell_keys(next(iter(maps.values())))
    for label, cells in maps.items():
        values = cells[[*keys, "breakdown_fraction"]].rename(columns={"breakdown_fraction": label})
        merged = values if merged is None else merged.merge(values, on=keys)
    labels = list(maps)
    merged["min"] = merged[labels].min(axis=1)
    merged["max"] = merged[labels].max(axis=1)
    merged["spread"] = merged["max"] - merged["min"]
    return merged


def seed_summary(table: pd.DataFrame, cells: pd.DataFrame) -> pd.DataFrame:
    """Per method, `seed_table`'s cells read against the rule's bound (``theory_fraction`` of
    ``cells``, the first map's breakdown.csv): cells the same at every seed, the mean and largest
    per-cell spread, cells at or above the bound at every seed, below it at every seed, cells
    where some seed has no breakdown (its clean run failed: "fails clean") and cells of a rule
    that declares no bound (FLTrust); the last two are left out of the bound counts."""
    keys = cell_keys(cells)
    labels = [c for c in table.columns if c not in [*keys, "min", "max", "spread"]]
    scored = table.merge(cells[[*keys, "theory_fraction"]], on=keys)
    values = scored[labels].astype(float)
    complete = values.notna().all(axis=1)
    bound = scored["theory_fraction"].astype(float)
    reached = values.ge(bound - 1e-9, axis=0)
    judged = complete & bound.notna()
    rows = []
    for method, group in scored.groupby("method", sort=False):
        at = group.index
        whole = complete.loc[at]
        rows.append(
            {
                "method": method,
                "cells": len(group),
                "same at every seed": int((group["spread"][whole] == 0).sum()),
                "mean spread": float(group["spread"][whole].mean()),
                "max spread": float(group["spread"][whole].max()),
                "reached bound at every seed": int(
                    reached.loc[at][judged.loc[at]].all(axis=1).sum()
                ),
                "below bound at every seed": int(
                    (~reached.loc[at][judged.loc[at]]).all(axis=1).sum()
                ),
                "a seed fails clean": int((~whole).sum()),
                "no bound declared": int(bound.loc[at].isna().sum()),
            }
        )
    return pd.DataFrame(rows)


def family_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Per method: the cells whose first failing point a strength ladder broke, those only a
    rule-aware attack broke (every ladder survived that point), and those never broken."""
    never = cells["status"] == "survives_all"
    family = cells["attack_family"].fillna("")
    rows = [
        {
            "method": method,
            "cells": len(group),
            "ladder": int(((family[group.index] == "ladder") & ~never[group.index]).sum()),
            "rule-aware": int(((family[group.index] == "rule-aware") & ~never[group.index]).sum()),
            "never broke": int(never[group.index].sum()),
        }
        for method, group in cells.groupby("method", sort=False)
    ]
    return pd.DataFrame(rows)


def moved_table(cells: pd.DataFrame, before: pd.DataFrame, label: str) -> pd.DataFrame:
    """The cells whose breakdown differs from ``before``'s (the same cells under another
    adversary): both fractions (a cell never broken reads as ">= top"), the move, and what broke
    the cell now."""
    keys = cell_keys(cells)

    def shown(frame: pd.DataFrame) -> pd.Series:
        top = frame["largest_surviving_fraction"].astype(float)
        value = frame["breakdown_fraction"].astype(float)
        return pd.Series(
            [
                f">= {t:g}" if status == "survives_all" else f"{v:g}"
                for status, t, v in zip(frame["status"], top, value)
            ],
            index=frame.index,
        )

    merged = cells.assign(now=shown(cells)).merge(
        before.assign(then=shown(before))[[*keys, "then", "breakdown_fraction"]],
        on=keys,
        suffixes=("", "_before"),
    )
    moved = merged[merged["now"] != merged["then"]]
    out = moved[[*keys, "rounds", "clean_accuracy"]].copy()
    out[label] = moved["then"]
    out["now"] = moved["now"]
    out["move"] = moved["breakdown_fraction"].astype(float) - moved[
        "breakdown_fraction_before"
    ].astype(float)
    out["broken by now"] = moved["broken_by"].fillna("-")
    out["family"] = moved["attack_family"].fillna("-")
    return out


REGIME_KEYS = ["participation", "participation_mode"]


def _answers(cells: pd.DataFrame) -> pd.Series:
    return pd.Series([breakdown_label(row) for _, row in cells.iterrows()], index=cells.index)


def _paired(cells: pd.DataFrame, other: pd.DataFrame) -> pd.DataFrame:
    """The cells both maps hold, this map's columns beside ``other``'s (suffix ``_other``), each
    with its answer as breakdown.md prints it."""
    keys = cell_keys(cells)
    return cells.assign(answer=_answers(cells)).merge(
        other.assign(answer=_answers(other)), on=keys, suffixes=("", "_other")
    )


def dataset_grid(
    cells: pd.DataFrame, other: pd.DataFrame, label: str, other_label: str
) -> pd.DataFrame:
    """Each cell's answer on both datasets, method (rows) x regime (columns): "a" where they agree,
    "a -> b" (``other_label``'s, then ``label``'s) where they do not."""
    paired = _paired(cells, other)
    paired["shown"] = [
        a if a == b else f"{b} -> {a}" for a, b in zip(paired["answer"], paired["answer_other"])
    ]
    paired["regime"] = [
        f"p={p:g} {mode}" for p, mode in zip(paired["participation"], paired["participation_mode"])
    ]
    grid = paired.pivot(index="method", columns="regime", values="shown")
    regimes = list(
        dict.fromkeys(paired.sort_values(REGIME_KEYS, ascending=[True, False])["regime"])
    )
    grid = grid.loc[_method_order(paired), regimes]
    grid.columns.name = f"{other_label} -> {label}"
    return grid


def seeds_grid(cells: pd.DataFrame) -> pd.DataFrame:
    """A map over several seeds: each cell's answer as breakdown.md prints it (the median over
    seeds, their range in brackets), method (rows) x regime (columns)."""
    shown = cells.assign(answer=_answers(cells))
    shown["regime"] = [
        f"p={p:g} {mode}" for p, mode in zip(shown["participation"], shown["participation_mode"])
    ]
    grid = shown.pivot(index="method", columns="regime", values="answer")
    regimes = list(dict.fromkeys(shown.sort_values(REGIME_KEYS, ascending=[True, False])["regime"]))
    return grid.loc[_method_order(shown), regimes]


def seeds_against(cells: pd.DataFrame, other: pd.DataFrame, seed: int) -> pd.DataFrame:
    """Per method: the cells whose median over seeds equals, lies below or above ``other``'s
    answer (a one-seed map at ``seed``), and the cells whose seeds' range does not hold it."""
    paired = cells.merge(other, on=cell_keys(cells), suffixes=("", "_other"))
    median = pd.to_numeric(paired["breakdown_fraction"], errors="coerce")
    alone = pd.to_numeric(paired["breakdown_fraction_other"], errors="coerce")
    low = pd.to_numeric(paired["breakdown_min"], errors="coerce")
    high = pd.to_numeric(paired["breakdown_max"], errors="coerce")
    rows = []
    for method in _method_order(paired):
        at = paired["method"] == method
        rows.append(
            {
                "method": method,
                "cells": int(at.sum()),
                f"median = seed {seed}": int((at & (median == alone)).sum()),
                "median below": int((at & (median < alone)).sum()),
                "median above": int((at & (median > alone)).sum()),
                f"seed {seed} outside the range": int(
                    (at & ((alone < low - 1e-9) | (alone > high + 1e-9))).sum()
                ),
            }
        )
    return pd.DataFrame(rows)


def dataset_summary(cells: pd.DataFrame, other: pd.DataFrame) -> pd.DataFrame:
    """Per method, over the cells both maps hold: those whose answer is the same, lower on this
    map's dataset, higher on it, and the mean move of the breakdown fraction (this - other; a cell
    never broken counts as its lattice top, a cell whose clean run failed on either is left out
    of the move and counted apart)."""
    paired = _paired(cells, other)
    clean = ~(paired["status"].eq("fails_clean") | paired["status_other"].eq("fails_clean"))
    move = (
        paired["breakdown_fraction"].astype(float)
        - paired["breakdown_fraction_other"].astype(float)
    ).where(clean)
    same = paired["answer"] == paired["answer_other"]
    rows = []
    for method, group in paired.groupby("method", sort=False):
        at = group.index
        rows.append(
            {
                "method": method,
                "cells": len(group),
                "same": int(same[at].sum()),
                "lower": int((~same[at] & (move[at] < -1e-9)).sum()),
                "higher": int((~same[at] & (move[at] > 1e-9)).sum()),
                "fails clean on either": int((~clean[at]).sum()),
                "mean move": float(move[at].mean()),
            }
        )
    return pd.DataFrame(rows)


def dataset_table(
    cells: pd.DataFrame, other: pd.DataFrame, label: str, other_label: str
) -> pd.DataFrame:
    """The cells whose answer differs between the two maps: rounds (``other_label``'s too where
    the maps' rounds differ: a map at the horizon), both clean accuracies, both answers, the move
    and what broke the cell on each."""
    keys = cell_keys(cells)
    paired = _paired(cells, other)
    moved = paired[paired["answer"] != paired["answer_other"]]
    out = moved[keys].copy()
    if (paired["rounds"] != paired["rounds_other"]).any():
        out[f"rounds {other_label}"] = moved["rounds_other"]
    out["rounds"] = moved["rounds"]
    out[f"clean {other_label}"] = moved["clean_accuracy_other"]
    out[f"clean {label}"] = moved["clean_accuracy"]
    out[other_label] = moved["answer_other"]
    out[label] = moved["answer"]
    out["move"] = moved["breakdown_fraction"].astype(float) - moved[
        "breakdown_fraction_other"
    ].astype(float)
    out[f"broken by {other_label}"] = moved["broken_by_other"].fillna("-")
    out[f"broken by {label}"] = moved["broken_by"].fillna("-")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("map_dir", type=Path)
    parser.add_argument(
        "--also",
        type=Path,
        nargs="+",
        default=[],
        help="maps of the same cells at other seeds, compared cell by cell",
    )
    parser.add_argument(
        "--moved-from",
        type=Path,
        default=None,
        help="a map of the same cells under another adversary (e.g. the ladders "
        "only): the cells whose breakdown moved, old beside new",
    )
    parser.add_argument(
        "--dataset-from",
        type=Path,
        default=None,
        help="a map of the same cells on another dataset or at other rounds: every "
        "cell's answer on both, and the cells whose answer differs",
    )
    parser.add_argument(
        "--one-seed-from",
        type=Path,
        default=None,
        help="with a map over several seeds: a one-seed map of the same cells, "
        "each cell's median beside its answer",
    )
    parser.add_argument(
        "--one-seed", type=int, default=42, help="the seed of --one-seed-from's map (default 42)"
    )
    args = parser.parse_args(argv)
    needed = ("breakdown.csv", "frontier.csv", "breakdown_points.csv")
    others = [folder for folder in (args.moved_from, args.dataset_from) if folder is not None]
    for folder in [args.map_dir, *args.also, *others]:
        missing = [name for name in needed if not (folder / name).exists()]
        if missing:
            print(
                f"error: map folder {str(folder)!r} lacks {', '.join(missing)} "
                "(a folder written by `robusttune breakdown`)",
                file=sys.stderr,
            )
            return 2
    cells = read_map_csv(args.map_dir / "breakdown.csv")
    frontier = pd.read_csv(args.map_dir / "frontier.csv")
    points = read_map_csv(args.map_dir / "breakdown_points.csv")
    print(
        "\n".join(
            [
                "## Measured breakdown against the rule's theoretical fraction, per method",
                "",
                markdown_table(theory_table(args.map_dir, cells, points)),
                "",
                "## The p-frontier beta*(p) (worst cell at each p)",
                "",
                markdown_table(frontier_table(frontier)),
                "",
                "## The cached methods cell by cell, and the run that failed first",
                "",
                markdown_table(
                    cached_table(args.map_dir, cells, points), floatfmt=".3g", index=False
                ),
                "",
            ]
        )
    )
    if "breakdown_min" in cells.columns and (cells.get("seeds", pd.Series([1])) > 1).any():
        print(
            "\n".join(
                [
                    "## Each cell's breakdown over seeds: the median [min, max]",
                    "",
                    markdown_table(seeds_grid(cells)),
                    "",
                ]
            )
        )
        ordering = args.map_dir / "ordering.csv"
        if ordering.exists():
            print(
                "\n".join(
                    [
                        "## How firmly the frontier orders neighbouring methods",
                        "",
                        markdown_table(pd.read_csv(ordering), floatfmt=".3g", index=False),
                        "",
                    ]
                )
            )
        if args.one_seed_from is not None:
            other = read_map_csv(args.one_seed_from / "breakdown.csv")
            seed = args.one_seed
            print(
                "\n".join(
                    [
                        f"## The median over seeds against the one-seed map "
                        f"{args.one_seed_from.name} (seed {seed})",
                        "",
                        markdown_table(seeds_against(cells, other, seed), index=False),
                        "",
                    ]
                )
            )
    if "attack_family" in cells.columns:
        print(
            "\n".join(
                [
                    "## What broke each cell first: a strength ladder or a rule-aware attack",
                    "",
                    markdown_table(family_table(cells), index=False),
                    "",
                ]
            )
        )
    if args.moved_from is not None:
        moved = moved_table(
            cells, read_map_csv(args.moved_from / "breakdown.csv"), args.moved_from.name
        )
        print(
            "\n".join(
                [
                    f"## Cells whose breakdown moved ({len(moved)} of {len(cells)}): "
                    f"{args.moved_from.name} beside this map",
                    "",
                    markdown_table(moved, floatfmt=".3g", index=False),
                    "",
                ]
            )
        )
    if args.dataset_from is not None:
        other = read_map_csv(args.dataset_from / "breakdown.csv")
        label, other_label = args.map_dir.name, args.dataset_from.name
        changed = dataset_table(cells, other, label, other_label)
        print(
            "\n".join(
                [
                    f"## Each cell's answer on {other_label} -> {label}",
                    "",
                    markdown_table(dataset_grid(cells, other, label, other_label)),
                    "",
                    f"## Per method: {label} against {other_label}",
                    "",
                    markdown_table(dataset_summary(cells, other), floatfmt=".3g", index=False),
                    "",
                    f"## The cells whose answer differs: {other_label} -> {label} "
                    f"({len(changed)} of {len(cells)})",
                    "",
                    markdown_table(changed, floatfmt=".3g", index=False),
                    "",
                ]
            )
        )
    if args.also:
        maps = {
            folder.name: read_map_csv(folder / "breakdown.csv")
            for folder in [args.map_dir, *args.also]
        }
        seeds = seed_table(maps)
        print(
            "\n".join(
                [
                    "## The breakdown per map (seed), cells every map holds",
                    "",
                    markdown_table(seeds, floatfmt=".3g", index=False),
                    "",
                    "## Per method over the maps (seeds)",
                    "",
                    markdown_table(seed_summary(seeds, cells), floatfmt=".3g", index=False),
                    "",
                ]
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
