"""Seeds as replicates: a map with ``breakdown.seeds`` = [s1, ..., sS] bisects every cell once per
seed, each seed's cell (a *replicate*: the cell with ``seed`` = s among its values) exactly as a
one-seed map at that seed bisects it, and reports per cell the S breakdown points, their median
(the headline), minimum and maximum.

A run's survival is a random event (initialisation, sampling, batches): on the digits MLP the
same cell's breakdown point moves by up to 0.30 between seeds, so one seed's answer ranks methods
by chance. Pooling seeds (the mean accuracy over seeds, judged once) hides that spread and lets a
diverged seed drag a point down or a lucky one hold it up; replicates show it.

Cost. The first seed bisects from scratch (or from ``breakdown.start_from``) and verifies its
boundary's neighbourhood, as a one-seed map does. Every later seed of a cell searches outward
from the first seed's answer b1 (`robusttune.experiments.breakdown.cell_search`), spending failures rather than
survivors: a survivor runs every adversary setting (14 runs on the default map), a failure
stops at the first setting that breaks it, and the evaluator runs first the settings that broke
the cell before (`spec_evaluator`'s ``prioritise``), so a failure mostly costs one run. Its
first wave holds the clean point and b1 + 1; after a failure it steps down one point at a time
(b1, b1 - 1, ...; doubling after three failures in a row), after a survivor it jumps up (lo + 2,
lo + 4, ...) until a failure, then steps down from there. Where the seeds agree a later seed
costs its clean point, one failure and one survivor, a step apart one or two failures more,
and it verifies no more than it evaluates (the first seed verified the cell's
boundary). On a cell whose survival is monotone in k every seed's answer is the one its own
one-seed map gives (a search of a step function finds its edge from any start;
tests/test_replicates.py compares them), and a later seed whose evaluated points contradict
each other is flagged non-monotone as any cell is. Runs are shared as in a one-seed map
(`spec_evaluator`'s ``share`` and ``staged``).

The headline is the lower median of the seeds' answers (the middle one for odd S, the lower of
the two middle ones for even S): a lattice point, and at that fraction at least half the seeds
survived. A cell has an answer when a majority of its seeds learned on their clean run; a cell
whose seeds' answers differ by more than one lattice step is marked ``seeds_disagree``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from robusttune.core.registry import SpecError
from robusttune.experiments.breakdown.bisection import (
    NO_ANSWER,
    BreakdownMap,
    Cell,
    CellResult,
    Evaluator,
    bisect_breakdown,
    distinct_cells,
)

__all__ = ["SUMMARY_STATUSES", "ReplicatedMap", "bisect_replicates", "lower_median", "replicate"]

# a cell's status over its seeds, in precedence order after the no-answer ones (NO_ANSWER)
SUMMARY_STATUSES = (*NO_ANSWER, "seeds_disagree", "non_monotone", "survives_all", "ok")


def replicate(cell: Cell, seed: int) -> Cell:
    """``cell`` at one seed: its values with ``seed`` = ``seed`` last (what `spec_evaluator` runs
    the cell's points at)."""
    if "seed" in cell.as_dict():
        raise SpecError(f"cell {cell.label} sets seed itself; a map's seeds are breakdown.seeds")
    return Cell((*cell.values, ("seed", int(seed))), cell.clients)


def lower_median(values: Sequence[int]) -> int:
    """The lower median: the ceil(S/2)-th smallest of S values (the middle one for odd S). A
    lattice point, at or above which at most half of the values lie strictly below it."""
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2]


@dataclass
class ReplicatedMap:
    """Every cell's bisection at every seed (``results[cell]``: one `CellResult` per seed, in
    ``seeds`` order) and the summary over them (`summary_row`). ``waves``: the most waves any
    replicate took, first seed and later seeds in sequence."""

    cells: list[Cell]
    seeds: list[int]
    results: dict[Cell, list[CellResult]]
    waves: int

    @property
    def replicates(self) -> list[CellResult]:
        """Every (cell, seed) result, cell by cell, seeds in order."""
        return [result for cell in self.cells for result in self.results[cell]]

    @classmethod
    def of(cls, result: BreakdownMap | ReplicatedMap) -> ReplicatedMap:
        """``result`` as a ReplicatedMap: a `BreakdownMap` (cells bisected at the evaluator's
        own seeds, e.g. `bisect_breakdown` called directly) is one replicate per cell; its
        ``seeds`` are the cells' own where every cell carries one, else none."""
        if isinstance(result, ReplicatedMap):
            return result
        cells = [r.cell for r in result.cells]
        seeded = bool(cells) and all("seed" in c.as_dict() for c in cells)
        seeds = list(dict.fromkeys(int(c["seed"]) for c in cells)) if seeded else []
        return cls(cells, seeds, {r.cell: [r] for r in result.cells}, result.waves)

    def representative(self, cell: Cell) -> CellResult:
        """The replicate that stands for ``cell`` in the per-cell columns drawn from one
        bisection (the breaking family, the theory columns at the failing point): the first
        seed whose answer is the median, else the first seed."""
        results = self.results[cell]
        answers = [r.breakdown for r in results if r.breakdown is not None]
        median = lower_median(answers) if len(answers) * 2 > len(results) else None
        return next(
            (r for r in results if median is not None and r.breakdown == median), results[0]
        )

    def as_map(self) -> BreakdownMap:
        """The replicates as one `BreakdownMap` (its cells are the seeded cells): the cost
        figures (trials_used, grid_trials, points_used, trial_ratio ...) are its."""
        return BreakdownMap(self.replicates, self.waves)

    def cost_line(self) -> str:
        seeds = f" over {len(self.seeds)} seeds" if len(self.seeds) > 1 else ""
        return self.as_map().cost_line() + seeds

    # the answer --------------------------------------------------------------------------------
    def summary_row(self, cell: Cell) -> dict[str, Any]:
        """One cell over its seeds (breakdown.csv's row; `summarise`)."""
        return summarise(cell, self.results[cell])

    def to_frame(self) -> Any:
        """One row per cell: the summary over seeds (breakdown.csv)."""
        import pandas as pd

        return pd.DataFrame([self.summary_row(cell) for cell in self.cells])

    def seeds_frame(self) -> Any:
        """One row per cell and seed: each replicate's `CellResult.row` (breakdown_seeds.csv)."""
        import pandas as pd

        return pd.DataFrame([result.row() for result in self.replicates])

    def points_frame(self) -> Any:
        """Every evaluated point of every replicate, with its ``seed`` column."""
        return self.as_map().points_frame()


def _fraction(k: int | None, clients: int) -> float | None:
    return None if k is None else k / clients


def summarise(cell: Cell, replicates: Sequence[CellResult]) -> dict[str, Any]:
    """A cell's answer over its seeds' replicates:

        breakdown  = lower median of b_s over the seeds s with an answer (`lower_median`),
        min, max   = the smallest and largest b_s,

    given when a strict majority of the seeds has an answer (their clean run passed the bar and
    learned); otherwise the cell has none and its status is the commonest no-answer status
    (``clean_at_chance`` on a tie). The status then, in this order: ``seeds_disagree`` (max - min
    is more than one lattice step), ``non_monotone`` (a seed's survival was not monotone in k),
    ``survives_all`` (the median is the lattice top), ``ok``."""
    N = cell.clients
    answers = [r.breakdown for r in replicates if r.breakdown is not None]
    seeds = len(replicates)
    answered = len(answers) * 2 > seeds
    k_max = replicates[0].k_max
    if not answered:
        missing = [r.status for r in replicates if r.status in NO_ANSWER]
        status = max(NO_ANSWER, key=lambda s: (missing.count(s), s == "clean_at_chance"))
        median = low = high = None
    else:
        median, low, high = lower_median(answers), min(answers), max(answers)
        if high - low > 1:
            status = "seeds_disagree"
        elif any(r.status == "non_monotone" for r in replicates):
            status = "non_monotone"
        elif median == k_max:
            status = "survives_all"
        else:
            status = "ok"
    at_median = next((r for r in replicates if median is not None and r.breakdown == median), None)
    conservative = [r.conservative for r in replicates if r.conservative is not None]
    survivors = [r.largest_survivor for r in replicates if r.largest_survivor is not None]
    rows = [r.row() for r in replicates]

    def mean(values: Iterable[float]) -> float:
        kept = [v for v in values if math.isfinite(v)]
        return sum(kept) / len(kept) if kept else math.nan

    def per_seed(result: CellResult) -> str:
        return f"{result.breakdown / N:.3g}" if result.breakdown is not None else result.status

    return {
        **cell.as_dict(),
        "clients": N,
        "breakdown_fraction": _fraction(median, N),
        "breakdown_byzantine": median,
        "breakdown_min": _fraction(low, N),
        "breakdown_max": _fraction(high, N),
        "seeds": seeds,
        "seeds_answered": len(answers),
        "seeds_agree": answered and high - low <= 1,  # type: ignore[operator]
        "seed_breakdowns": " ".join(per_seed(r) for r in replicates),
        "status": status,
        "never_broke": median is not None and median == k_max,
        "monotone": all(r.status != "non_monotone" for r in replicates),
        "conservative_fraction": _fraction(min(conservative), N)
        if answered and conservative
        else None,
        "largest_surviving_fraction": _fraction(max(survivors), N)
        if answered and survivors
        else None,
        "clean_accuracy": mean(r.clean_accuracy for r in replicates),
        "clean_accuracy_min": min(
            (r.clean_accuracy for r in replicates if math.isfinite(r.clean_accuracy)),
            default=math.nan,
        ),
        "chance": replicates[0].chance,
        "clean_test_accuracy": mean(row["clean_test_accuracy"] for row in rows),
        "threshold": mean(r.bar for r in replicates if 0 in r.outcomes),
        "points_evaluated": sum(len(r.outcomes) for r in replicates),
        "lattice_points": k_max + 1,
        "trials": sum(r.trials for r in replicates),
        "broken_by": at_median.broken_by if at_median is not None else "",
        "evaluated": " | ".join(
            _seed_prefix(r, seeds) + row["evaluated"] for r, row in zip(replicates, rows)
        ),
        "violations": " | ".join(
            _seed_prefix(r, seeds) + row["violations"]
            for r, row in zip(replicates, rows)
            if r.violations
        ),
    }


def _seed_prefix(result: CellResult, seeds: int) -> str:
    return f"seed {result.cell['seed']}: " if seeds > 1 and "seed" in result.cell.as_dict() else ""


def bisect_replicates(
    cells: Iterable[Cell],
    seeds: Sequence[int],
    evaluate: Evaluator,
    *,
    starts: Mapping[Cell, int] | None = None,
    concurrent: bool = False,
    on_replicate_done: Callable[[CellResult], None] | None = None,
    **options: Any,
) -> ReplicatedMap:
    """Every cell's breakdown point at every seed (module docstring): the first seed's replicates
    start from ``starts`` (an earlier map's answers), every later seed's from the first seed's
    answer. ``options`` are `bisect_breakdown`'s. ``concurrent``: each cell in a thread of its
    own (first seed, then its later seeds in lock step), for a streaming runner, so no cell waits
    for another's slowest run; otherwise two lock-step phases over all cells (first seed, later
    seeds), the in-process order. Either way a replicate reads only its own outcomes, so both
    give every replicate the same answer. ``on_replicate_done`` hears of each (cell, seed) as it
    finishes (concurrent only)."""
    cells = distinct_cells(cells)
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise SpecError("seeds must list at least one seed")
    if len(set(seeds)) != len(seeds):
        raise SpecError(f"breakdown.seeds lists a seed twice ({seeds}); allowed: distinct seeds")
    first, later = seeds[0], seeds[1:]

    def first_phase(group: list[Cell]) -> BreakdownMap:
        seeded = {replicate(c, first): c for c in group}
        return bisect_breakdown(
            list(seeded),
            evaluate,
            **options,
            starts={r: starts[c] for r, c in seeded.items() if starts and c in starts},
        )

    def later_phase(done: list[CellResult], group: list[Cell]) -> BreakdownMap:
        answers = {c: r.breakdown for c, r in zip(group, done)}
        units = [replicate(c, s) for c in group for s in later]
        # a first-seed answer to start from, else the earlier map's, else cold
        begin = {
            replicate(c, s): answers[c] if answers[c] is not None else (starts or {}).get(c)
            for c in group
            for s in later
        }
        return bisect_breakdown(
            units,
            evaluate,
            **options,
            gallop=True,
            starts={u: b for u, b in begin.items() if b is not None},
        )

    def whole(group: list[Cell]) -> tuple[list[CellResult], int]:
        head = first_phase(group)
        if on_replicate_done is not None:
            for result in head.cells:
                on_replicate_done(result)
        if not later:
            return head.cells, head.waves
        tail = later_phase(head.cells, group)
        if on_replicate_done is not None:
            for result in tail.cells:
                on_replicate_done(result)
        return head.cells + tail.cells, head.waves + tail.waves

    if not cells:
        return ReplicatedMap([], seeds, {}, 0)
    if concurrent:
        with ThreadPoolExecutor(
            max_workers=len(cells), thread_name_prefix="robusttune-cell"
        ) as pool:
            parts = [pool.submit(whole, [cell]) for cell in cells]
            done = [part.result() for part in parts]
        found = [r for results, _ in done for r in results]
        waves = max(w for _, w in done)
    else:
        found, waves = whole(cells)
    by_cell: dict[Cell, list[CellResult]] = {c: [] for c in cells}
    index = {replicate(c, s): c for c in cells for s in seeds}
    for result in found:
        by_cell[index[result.cell]].append(result)
    order = {s: i for i, s in enumerate(seeds)}
    for cell in cells:
        by_cell[cell].sort(key=lambda r: order[r.cell["seed"]])
    return ReplicatedMap(cells, seeds, by_cell, waves)
