"""Breakdown maps: for every cell (aggregator x attack x participation [x dataset]) the largest
Byzantine fraction on the lattice {0, 1/N, 2/N, ...} at which a run survives.

Survival of a lattice point k (k Byzantine clients of N, beta = k/N):

    survives(k) = not collapsed(k) and accuracy(k) >= threshold,
    threshold   = the absolute ``threshold`` if given, else
                  chance + relative_threshold x (accuracy(0) - chance),   chance = 1/K

(default: half the same cell's clean margin above chance, K the dataset's classes). A cell whose
clean run does not learn (accuracy(0) - chance < ``clean_margin``) has no breakdown point: its
status is ``clean_at_chance``, never a survival. Assuming survives(k) is
non-increasing in k, the breakdown point b = max{k : survives(k)} is found by bisection on
[0, k_max] in ceil(log2(k_max + 1)) evaluations instead of k_max + 1. A cell may start from an
earlier answer b0 (``starts``: a previous map of the same cells, at fewer rounds or on another
dataset): its first wave then holds b0 and b0 + 1 beside the clean point, and bisection goes on
only in the bracket they leave, so a prior that still holds costs those two points (a later
seed's replicate, ``gallop``, searches outward from its start instead and leaves verification to
the seed that verified the cell: `robusttune.experiments.breakdown.replicates`). All cells
are bisected in lock step: each *wave* hands the evaluator one batch holding every cell's next
point, so a Ray layer runs a whole wave as parallel trials. The boundary is then verified: the point above b has
failed (bisection guarantees it) and the points within ``verify_radius`` of the boundary are
evaluated too; any evaluated point that contradicts monotonicity (a failure at or below b, a
survivor above it) marks the cell ``non_monotone``; it is reported, not hidden.

This module is that core's drivers and the map they give (`bisect_breakdown`,
`bisect_concurrently`, `BreakdownMap`; one cell's search is `CellResult`,
`robusttune.experiments.breakdown.cell_search`; the points and outcomes it reads, `Cell`,
`Point`, `Outcome` and the survival bar, are `robusttune.experiments.breakdown.points`) and
knows nothing of runs: an evaluator maps a batch of `Point`
to `Outcome` (or plain survival booleans); `robusttune.experiments.breakdown.evaluate` builds one from runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from robusttune.core.registry import SpecError

# one cell's search, re-exported beside the drivers that run it
from robusttune.experiments.breakdown.cell_search import CellResult

# the lattice's points and what runs make of them, re-exported: this module's callers read them
# from here (`robusttune.experiments.breakdown.points`)
from robusttune.experiments.breakdown.points import (
    DEFAULT_CLEAN_MARGIN,
    EPS,
    NO_ANSWER,
    STATUSES,
    Cell,
    Evaluator,
    Outcome,
    Point,
    Verdict,
    lattice_top,
    learned,
    survival_bar,
)

__all__ = [
    "DEFAULT_CLEAN_MARGIN",
    "EPS",
    "NO_ANSWER",
    "STATUSES",
    "BreakdownMap",
    "Cell",
    "CellResult",
    "Evaluator",
    "Outcome",
    "Point",
    "Verdict",
    "bisect_breakdown",
    "bisect_concurrently",
    "lattice_top",
    "learned",
    "survival_bar",
]


@dataclass
class BreakdownMap:
    """Every cell's result plus the cost: points and trials used against the full lattice grid
    (``grid_trials`` = lattice points x the mean trials one point took)."""

    cells: list[CellResult]
    waves: int

    @property
    def points_used(self) -> int:
        return sum(len(c.outcomes) for c in self.cells)

    @property
    def grid_points(self) -> int:
        return sum(c.k_max + 1 for c in self.cells)

    @property
    def trials_used(self) -> int:
        return sum(c.trials for c in self.cells)

    @property
    def grid_trials(self) -> int:
        """Trials of the full lattice: every point of every cell evaluated in full
        (`CellResult.lattice_trials`), no point skipped, shared or stopped early."""
        return sum(c.lattice_trials for c in self.cells)

    @property
    def trial_ratio(self) -> float:
        """trials_used / grid_trials: what the map cost against the full lattice."""
        return self.trials_used / self.grid_trials if self.grid_trials else 0.0

    def cost_line(self) -> str:
        return (
            f"{self.trials_used} trials ({self.points_used} lattice points in {self.waves} "
            f"waves) against {self.grid_trials} for the full lattice grid "
            f"({self.grid_points} points): {100 * self.trial_ratio:.0f}%"
        )

    def to_frame(self) -> Any:
        import pandas as pd

        return pd.DataFrame([c.row() for c in self.cells])

    def points_frame(self) -> Any:
        """Every evaluated point: the trials behind each number (``accuracy``: what survival
        read, validation accuracy when the runs hold a validation part; ``test_accuracy``: the
        same runs on the test part). ``adversary`` is the setting
        that gave its accuracy: a survivor's worst, a failed point's first that broke it where
        the ladder stopped there (`spec_evaluator`'s ``survival`` and ``prioritise``), its
        worst otherwise."""
        import pandas as pd

        rows = []
        for c in self.cells:
            for k in sorted(c.outcomes):
                v = c.outcomes[k]
                outcome = v if isinstance(v, Outcome) else Outcome(math.nan, not v, 1)
                rows.append(
                    {
                        **c.cell.as_dict(),
                        "clients": c.cell.clients,
                        "byzantine": k,
                        "byzantine_fraction": k / c.cell.clients,
                        "survived": c.survived(k),
                        "accuracy": outcome.accuracy,
                        "test_accuracy": outcome.test_accuracy,
                        "collapsed": outcome.collapsed,
                        "trials": outcome.trials,
                        "adversary": " ".join(f"{a}={b}" for a, b in outcome.breaker),
                        "detail": " ".join(map(str, outcome.detail)),
                    }
                )
        return pd.DataFrame(rows)


def distinct_cells(cells: Iterable[Cell]) -> list[Cell]:
    """The cells as a list; a cell listed twice is a configuration error (both drivers)."""
    listed: list[Cell] = []
    for cell in cells:
        if cell in listed:
            raise SpecError(f"cell {cell.label} is listed twice")
        listed.append(cell)
    return listed


def bisect_breakdown(
    cells: Iterable[Cell],
    evaluate: Evaluator,
    *,
    max_fraction: float = 0.5,
    threshold: float | None = None,
    relative_threshold: float = 0.5,
    verify_radius: int = 1,
    on_non_monotone: str = "flag",
    max_waves: int = 1000,
    starts: Mapping[Cell, int] | None = None,
    clean_margin: float = 0.0,
    gallop: bool = False,
) -> BreakdownMap:
    """Parallel bisection of every cell's breakdown point (see the module docstring).

    ``evaluate`` receives one list of Points per wave (every cell's next points, no duplicates)
    and returns one verdict per point, in order: an `Outcome` judged by the threshold rule, or a
    bool taken as the survival verdict itself. ``on_non_monotone="scan"`` evaluates the rest of a
    flagged cell's lattice so its largest survivor is exact. ``starts`` gives cells an earlier
    answer b0 to begin from (module docstring); for a cell whose survival is monotone in k the
    answer is the one a bisection without it finds. ``clean_margin``: a cell whose clean outcome
    does not beat chance by that much (`learned`) stops there, ``clean_at_chance``.
    ``gallop``: a cell with a start searches outward from it (`CellResult._gallop_probe`) and
    verifies no more than that search evaluates: for a replicate whose boundary's neighbourhood
    another replicate of the cell verified. Either way, on a monotone cell every start gives
    the answer a bisection from scratch gives."""
    if not 0 < max_fraction < 1:
        raise SpecError(f"max_fraction must be in (0, 1); got {max_fraction}")
    if verify_radius < 0:
        raise SpecError(f"verify_radius must be >= 0; got {verify_radius}")
    if on_non_monotone not in ("flag", "scan"):
        raise SpecError(f"on_non_monotone {on_non_monotone!r} is not allowed; allowed: flag, scan")
    results = []
    for cell in distinct_cells(cells):
        results.append(
            CellResult(
                cell,
                lattice_top(cell.clients, max_fraction),
                threshold,
                relative_threshold,
                radius=verify_radius,
                start=(starts or {}).get(cell),
                clean_margin=clean_margin,
                gallop=gallop,
            )
        )
    waves = 0
    while True:
        wanted: dict[Point, CellResult] = {}
        for result in results:
            ks = result.requests()
            if (
                not ks
                and result.status == "non_monotone"
                and on_non_monotone == "scan"
                and not result.scan
            ):
                result.scan, result.status = True, "pending"
                ks = result.requests()
            for k in ks:
                wanted[Point(result.cell, k)] = result
        if not wanted:
            break
        waves += 1
        if waves > max_waves:
            raise RuntimeError(f"breakdown bisection did not finish in {max_waves} waves")
        points = list(wanted)
        verdicts = list(evaluate(points))
        if len(verdicts) != len(points):
            raise ValueError(
                f"evaluator returned {len(verdicts)} verdicts for {len(points)} points"
            )
        for point, verdict in zip(points, verdicts):
            wanted[point].outcomes[point.byzantine] = verdict
    return BreakdownMap(results, waves)


def bisect_concurrently(
    cells: Iterable[Cell],
    evaluate: Evaluator,
    *,
    starts: Mapping[Cell, int] | None = None,
    on_cell_done: Callable[[CellResult], None] | None = None,
    **options: Any,
) -> BreakdownMap:
    """`bisect_breakdown` of every cell on its own, all cells at once: each cell in a thread of
    its own hands ``evaluate`` its next points as soon as its last ones are judged, so a cell
    never waits for another cell's slowest run (the lock-step waves' barrier). For a streaming
    runner (`robusttune.experiments.sweep.stream`), which runs whatever any cell asks for as slots free.
    Every cell gets the answer, statuses and outcomes `bisect_breakdown` gives it (a cell's
    bisection reads only its own outcomes; tests/test_breakdown.py compares the two drivers);
    ``waves`` is the most any one cell took. ``evaluate`` must be safe to call from several
    threads (`spec_evaluator`'s is); ``on_cell_done`` hears of each cell as it finishes."""
    from concurrent.futures import ThreadPoolExecutor

    def one(cell: Cell) -> BreakdownMap:
        part = bisect_breakdown(
            [cell],
            evaluate,
            **options,
            starts={cell: starts[cell]} if starts and cell in starts else None,
        )
        if on_cell_done is not None:
            on_cell_done(part.cells[0])
        return part

    cells = distinct_cells(cells)
    if not cells:
        return BreakdownMap([], 0)
    with ThreadPoolExecutor(max_workers=len(cells), thread_name_prefix="robusttune-cell") as pool:
        futures = [pool.submit(one, cell) for cell in cells]
        parts = [future.result() for future in futures]
    return BreakdownMap([part.cells[0] for part in parts], max(part.waves for part in parts))
