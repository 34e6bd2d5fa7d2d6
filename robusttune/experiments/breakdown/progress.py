"""One progress display for a breakdown map: cells done, points evaluated, trials, elapsed and an
estimate of the time left, in place of Ray Tune's tables.

On a terminal it is one line redrawn in place (rich ``Live``); elsewhere (a pipe, a log file, a
test) one plain line per wave. It learns the map's state from the outside: `watch` wraps the
evaluator (a cell is done once a wave no longer asks for it, since every wave holds every
unfinished cell's next points; with cells bisected each on its own, ``concurrent``, a cell is done
when `cell_done` says so) and `runs` is the `StoredRunner`'s callback (trials run, or answered from
an earlier, resumed, attempt).

The estimate: mean wall seconds per trial run so far x the trials the unfinished cells still
need, counting for each the bisection's expected points (`robusttune.experiments.breakdown.plan.CellCost`)
minus those it has had, at least one. Wall seconds, so trials run side by side on Ray count as
the throughput they are."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.text import Text

from robusttune.display.terminal import duration
from robusttune.experiments.breakdown.bisection import Cell, Evaluator, Point, Verdict
from robusttune.experiments.breakdown.plan import CellCost

__all__ = ["MapProgress", "duration"]


class MapProgress:
    """The state shown and the display itself (a context manager: the live line lives inside)."""

    def __init__(
        self,
        costs: Sequence[CellCost],
        *,
        console: Console | None = None,
        clock: Any = time.monotonic,
        concurrent: bool = False,
    ) -> None:
        self.costs = {c.cell: c for c in costs}
        self.console = console or Console(stderr=True)
        self.clock = clock
        self.started = clock()
        self.points: dict[Cell, int] = {c.cell: 0 for c in costs}
        self.pending: set[Cell] = set(self.points)
        self.waves = 0
        self.ran = 0
        self.reused = 0
        self.run_seconds = 0.0  # wall seconds spent in runs actually run (not reused)
        self._mark = clock()
        self._live: Live | None = None
        # ``concurrent``: cells bisected each in a thread of its own (`bisect_concurrently`): a
        # cell is pending until it is done, and the wave shown is the most steps any cell took
        self.concurrent = concurrent
        self._steps: dict[Cell, int] = {}
        self._seen: set[Cell] = set()
        self._lock = threading.RLock()

    # -- the display --------------------------------------------------------------------------
    def __enter__(self) -> MapProgress:
        if self.console.is_terminal:
            self._live = Live(
                Text(self.line()), console=self.console, transient=False, auto_refresh=False
            )
            self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.update(Text(self.line()), refresh=True)
            self._live.__exit__(*exc)
            self._live = None

    def _show(self, wave_end: bool = False) -> None:
        if self._live is not None:
            self._live.update(Text(self.line()), refresh=True)
        elif wave_end:
            self.console.print(self.line(), markup=False, highlight=False, soft_wrap=True)

    # -- what it learns -------------------------------------------------------------------------
    def watch(self, evaluate: Evaluator) -> Evaluator:
        """``evaluate``, reporting each wave to this display."""

        def watched(points: Sequence[Point]) -> Sequence[Verdict]:
            with self._lock:
                if self.concurrent:
                    for cell in {p.cell for p in points}:
                        self._steps[cell] = self._steps.get(cell, 0) + 1
                    self.waves = max(self._steps.values(), default=0)
                else:
                    # lock step: a cell seen before that no longer asks is done; a replicate of a
                    # later seed not asked for yet is still to come
                    asked = {p.cell for p in points}
                    self._seen |= asked
                    self.pending = asked | (set(self.points) - self._seen)
                    self.waves += 1
                    self._mark = self.clock()
                self._show()
            verdicts = evaluate(points)
            with self._lock:
                for point in points:
                    self.points[point.cell] = self.points.get(point.cell, 0) + 1
                self._show(wave_end=not self.concurrent)
            return verdicts

        return watched

    def runs(self, ran: int, reused: int) -> None:
        """`StoredRunner`'s callback: ``ran`` runs just finished, ``reused`` came from the store."""
        with self._lock:
            now = self.clock()
            if ran:
                self.run_seconds += now - self._mark
            self._mark = now
            self.ran += ran
            self.reused += reused
            self._show()

    def cell_done(self, cell: Cell) -> None:
        """A cell bisected on its own finished (`bisect_concurrently`)."""
        with self._lock:
            self.pending.discard(cell)
            self._show(wave_end=True)

    def finish(self) -> None:
        """Every cell is done (the bisection returned)."""
        with self._lock:
            self.pending = set()
            self._show(wave_end=True)

    # -- the line -------------------------------------------------------------------------------
    @property
    def cells_done(self) -> int:
        return len(self.points) - len(self.pending)

    def seconds_left(self) -> float | None:
        """Mean seconds per trial run x trials the unfinished cells are expected to need; None
        before the first trial has run."""
        if not self.ran:
            return None
        per_trial = self.run_seconds / self.ran
        left = 0
        for cell in self.pending:
            cost = self.costs.get(cell)
            if cost is None:
                continue
            points = max(1, cost.expected_points - self.points.get(cell, 0))
            left += points * cost.attacked_trials
        return per_trial * left

    def line(self) -> str:
        elapsed = self.clock() - self.started
        if not self.pending:
            left = "0s"
        else:
            seconds = self.seconds_left()
            left = "?" if seconds is None else "~" + duration(seconds)
        trials = f"{self.ran} trials" + (f" (+{self.reused} kept)" if self.reused else "")
        # short enough for an 80-column terminal: a wrapped line is not redrawn in place cleanly
        unit = (
            "cells"
            if all("seed" not in c.as_dict() for c in self.points)
            or len({c.as_dict()["seed"] for c in self.points}) <= 1
            else "cell-seeds"
        )
        return (
            f"breakdown: {self.cells_done}/{len(self.points)} {unit} done, "
            f"{sum(self.points.values())} points, {trials}, wave {self.waves}, "
            f"elapsed {duration(elapsed)}, left {left}"
        )
