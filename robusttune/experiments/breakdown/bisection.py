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

This module is that core (`CellResult`, `BreakdownMap`, `bisect_breakdown`; the points and
outcomes it reads, `Cell`, `Point`, `Outcome` and the survival bar, are
`robusttune.experiments.breakdown.points`) and knows nothing of runs: an evaluator maps a batch of `Point`
to `Outcome` (or plain survival booleans); `robusttune.experiments.breakdown.evaluate` builds one from runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from robusttune.core.records import survives
from robusttune.core.registry import SpecError

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


# a later seed's search steps down one point at a time for this many failures in a row, then
# doubles its step: a search far from its start (rare) takes a few waves, not k_max
LINEAR_FALLS = 3


# -- one cell's bisection --------------------------------------------------------------------
@dataclass
class CellResult:
    """A cell's bisection state and, once done, its answer. ``breakdown`` is b (the largest
    surviving k bisection found); for a non-monotone cell ``conservative`` (the first evaluated
    failure minus one) and ``largest_survivor`` bracket the truth."""

    cell: Cell
    k_max: int
    threshold: float | None = None
    relative_threshold: float = 0.5
    outcomes: dict[int, Verdict] = field(default_factory=dict)
    lo: int = 0
    hi: int = 0
    verified: bool = False
    status: str = "pending"
    violations: list[int] = field(default_factory=list)
    scan: bool = False
    radius: int = 1  # verification: evaluate b - radius .. b + 1 + radius
    start: int | None = None  # an earlier answer b0: the first wave tries b0 and b0 + 1
    clean_margin: float = 0.0  # the clean run must beat chance by this much (`learned`)
    # search outward from ``start`` (`_gallop_probe`) instead of bisecting, and verify no more
    # than that search evaluates: a later seed's replicate, started from the first seed's answer,
    # whose neighbourhood that seed verified (`robusttune.experiments.breakdown.replicates`)
    gallop: bool = False
    _moves: int = field(default=0, init=False, repr=False)
    _up: bool = field(default=True, init=False, repr=False)
    _step: int = field(default=1, init=False, repr=False)
    _falls: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        self.hi = self.k_max + 1  # a virtual failure just above the lattice

    # survival ------------------------------------------------------------------------------
    @property
    def clean_accuracy(self) -> float:
        clean = self.outcomes.get(0)
        return clean.accuracy if isinstance(clean, Outcome) else math.nan

    @property
    def chance(self) -> float:
        """1/K of the cell's runs (0 when its verdicts are hand-made)."""
        clean = self.outcomes.get(0)
        return clean.chance if isinstance(clean, Outcome) else 0.0

    @property
    def bar(self) -> float:
        """The accuracy a point must reach (`survival_bar`)."""
        return survival_bar(
            self.threshold, self.relative_threshold, self.clean_accuracy, self.chance
        )

    def survived(self, k: int) -> bool:
        verdict = self.outcomes[k]
        if isinstance(verdict, bool):
            return verdict
        if k == 0 and self.threshold is None:
            # the relative bar is always met by the clean run itself
            return survives(verdict.accuracy, verdict.collapsed, -math.inf)
        return survives(verdict.accuracy, verdict.collapsed, self.bar)

    # the state machine ---------------------------------------------------------------------
    def requests(self) -> list[int]:
        """The points this cell needs next (empty when finished). Outcomes already known are
        consumed first, so any point evaluated earlier (e.g. by verification) is reused."""
        if self.status != "pending":
            return []
        if 0 not in self.outcomes:
            # the clean point and the first midpoint (or the prior's two points) in one wave:
            # judging them waits for the clean accuracy, but the wave is saved
            return [0] + [k for k in self._first_points() if k > 0]
        if not self.survived(0):
            self.status = "fails_clean"
            return []
        clean = self.outcomes[0]
        if isinstance(clean, Outcome) and not learned(
            clean.accuracy, clean.chance, self.clean_margin
        ):
            self.status = "clean_at_chance"
            return []
        if self.galloping:
            while self.hi - self.lo > 1:
                probe = self._gallop_probe()
                if probe not in self.outcomes:
                    return [probe]
                self._gallop_consume(probe)
            self._finish()
            return []
        for k in self._first_points():
            # the prior's points narrow the bracket before any midpoint (a survivor at b0 + 1
            # after a failure at b0 is left for verification to flag)
            if self.lo < k < self.hi and k in self.outcomes:
                if self.survived(k):
                    self.lo = k
                else:
                    self.hi = k
        while self.hi - self.lo > 1:
            mid = (self.lo + self.hi) // 2
            if mid not in self.outcomes:
                return [mid]
            if self.survived(mid):
                self.lo = mid
            else:
                self.hi = mid
        if self.scan:
            missing = [k for k in range(self.k_max + 1) if k not in self.outcomes]
            if missing:
                return missing
        if not self.verified:
            self.verified = True
            missing = [k for k in self._neighbourhood() if k not in self.outcomes]
            if missing:
                return missing
        self._finish()
        return []

    @property
    def galloping(self) -> bool:
        return self.gallop and self.start is not None and not self.scan

    def _first_points(self) -> list[int]:
        if self.galloping:
            return [self._gallop_probe()] if self.k_max > 0 else []
        if self.start is None:
            return [(self.lo + self.hi) // 2]
        b0 = min(max(self.start, 0), self.k_max)
        return [k for k in (b0, b0 + 1) if k <= self.k_max]

    def _gallop_probe(self) -> int:
        """The next point of the outward search from b0 = ``start``, which spends failures
        rather than survivors: a survivor runs every adversary setting (9 runs on the default
        map), a failure stops at the first that breaks it (mostly one run). First b0 + 1 (at
        most k_max). While no failure is known, jumps up from the largest survivor lo: lo + 2,
        lo + 4, lo + 8, ... (at most k_max). Once one is known, steps down from the lowest
        failure hi: to hi - 1 for LINEAR_FALLS failures in a row, then 2, 4, ... points at a
        time (at least lo + 1), and one point at a time again after a survivor below a gap. The
        only survivors it evaluates are b itself, those a climb passes and those a long step
        down lands on: from a start at the edge it asks b0 + 1 and b0, from a step above the
        edge b0 + 1, b0, b0 - 1, from a step below it b0 + 1, b0 + 3, b0 + 2."""
        if self._moves == 0:
            return max(1, min(min(max(self.start or 0, 0), self.k_max) + 1, self.k_max))
        if self._up:
            return min(self.lo + self._step, self.hi - 1)
        return max(self.hi - self._step, self.lo + 1)

    def _gallop_consume(self, probe: int) -> None:
        alive = self.survived(probe)
        if alive:
            self.lo = max(self.lo, probe)
        else:
            self.hi = min(self.hi, probe)
        self._moves += 1
        if self._up:
            if alive:  # still climbing: the next jump twice as far
                self._step = 2 if self._moves == 1 else self._step * 2
                return
            self._up, self._falls = False, 0
        if alive:  # a survivor below a gap: step down from the failure above it again
            self._falls = 0
        else:
            self._falls += 1
        # the step down: 1 after up to LINEAR_FALLS failures in a row, then doubling
        self._step = 1 if self._falls <= LINEAR_FALLS else 2 ** (self._falls - LINEAR_FALLS)

    def _neighbourhood(self) -> list[int]:
        b = self.lo
        return [k for k in range(b - self.radius, b + self.radius + 2) if 0 <= k <= self.k_max]

    def _finish(self) -> None:
        b = self.lo
        self.violations = sorted(
            k
            for k in self.outcomes
            if (k <= b and not self.survived(k)) or (k > b and self.survived(k))
        )
        if self.violations:
            self.status = "non_monotone"
        elif b == self.k_max:
            self.status = "survives_all"
        else:
            self.status = "ok"

    # the answer ----------------------------------------------------------------------------
    @property
    def breakdown(self) -> int | None:
        return None if self.status in (*NO_ANSWER, "pending") else self.lo

    @property
    def conservative(self) -> int | None:
        """First evaluated failure minus one (= breakdown for a monotone cell)."""
        if self.breakdown is None:
            return None
        failures = [k for k in self.outcomes if not self.survived(k)]
        return min(failures) - 1 if failures else self.k_max

    @property
    def largest_survivor(self) -> int | None:
        if self.breakdown is None:
            return None
        return max(k for k in self.outcomes if self.survived(k))

    @property
    def broken_by(self) -> str:
        """The adversary setting that broke the first failing point (``attack_strength=100``),
        "" when no evaluated point failed or the verdict carries none."""
        failures = sorted(k for k in self.outcomes if not self.survived(k))
        verdict = self.outcomes[failures[0]] if failures else None
        if not isinstance(verdict, Outcome) or not verdict.breaker:
            return ""
        return " ".join(f"{k}={v}" for k, v in verdict.breaker)

    @property
    def trials(self) -> int:
        return sum(v.trials if isinstance(v, Outcome) else 1 for v in self.outcomes.values())

    @property
    def lattice_trials(self) -> int:
        """What evaluating every lattice point in full would cost: the clean point's full runs
        plus k_max times an attacked point's (the mean over the attacked points evaluated; the
        clean point's when none was)."""
        full = {k: v.full_runs if isinstance(v, Outcome) else 1 for k, v in self.outcomes.items()}
        attacked = [n for k, n in full.items() if k > 0]
        clean = full.get(0, attacked[0] if attacked else 1)
        per_point = sum(attacked) / len(attacked) if attacked else clean
        return round(clean + self.k_max * per_point)

    def row(self) -> dict[str, Any]:
        N = self.cell.clients

        def frac(k: int | None) -> float | None:
            return None if k is None else k / N

        clean = self.outcomes.get(0)
        return {
            **self.cell.as_dict(),
            "clients": N,
            "breakdown_fraction": frac(self.breakdown),
            "breakdown_byzantine": self.breakdown,
            "status": self.status,
            "monotone": self.status != "non_monotone",
            "conservative_fraction": frac(self.conservative),
            "largest_surviving_fraction": frac(self.largest_survivor),
            "clean_accuracy": self.clean_accuracy,
            "chance": self.chance,
            "clean_test_accuracy": (
                clean.test_accuracy if isinstance(clean, Outcome) else math.nan
            ),
            "threshold": self.bar if 0 in self.outcomes else None,
            "points_evaluated": len(self.outcomes),
            "lattice_points": self.k_max + 1,
            "trials": self.trials,
            "broken_by": self.broken_by,
            "evaluated": " ".join(
                f"{k}{'+' if self.survived(k) else '-'}" for k in sorted(self.outcomes)
            ),
            "violations": " ".join(str(k) for k in self.violations),
        }


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
