"""One cell's search for its breakdown point: `CellResult`, the state machine that asks for the
lattice points a cell needs next and, once done, holds its answer (b, its status, the points that
contradict monotonicity). Two searches: bisection from scratch or from an earlier answer b0
(``start``), with the boundary's neighbourhood verified; and a later seed's outward search from
the first seed's answer (``gallop``), which spends failures rather than survivors. The drivers
that run many cells' searches in waves are `robusttune.experiments.breakdown.bisection`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from robusttune.core.records import survives
from robusttune.experiments.breakdown.points import (
    NO_ANSWER,
    Cell,
    Outcome,
    Verdict,
    learned,
    survival_bar,
)

__all__ = ["LINEAR_FALLS", "CellResult"]

# a later seed's search steps down one point at a time for this many failures in a row, then
# doubles its step: a search far from its start (rare) takes a few waves, not k_max
LINEAR_FALLS = 3


# -- one cell's search --------------------------------------------------------------------
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
        rather than survivors: a survivor runs every adversary setting (14 runs on the default
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
