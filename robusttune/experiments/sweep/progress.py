"""What the driver sees of a running sweep, through Tune callbacks that run on the driver: the
one progress display (`ProgressCallback`) and the sweep's fixed-cost timeline
(`Timeline`, seconds since the command started, marked by `TimelineCallback`)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ray.tune import Callback

if TYPE_CHECKING:
    from ray.tune.experiment import Trial

from robusttune.display.terminal import duration

__all__ = ["ProgressCallback", "Timeline", "TimelineCallback", "duration"]


class Timeline:
    """Driver-side times (seconds since the command started) of the sweep's fixed costs."""

    def __init__(self) -> None:
        self.origin = time.perf_counter()
        self.marks: dict[str, float] = {}

    def mark(self, name: str, once: bool = False) -> None:
        if once and name in self.marks:
            return
        self.marks[name] = time.perf_counter() - self.origin


class TimelineCallback(Callback):
    """Marks when the first trial starts and the last one ends, on the driver. Not carried into
    a restored Tuner (its timeline belongs to one command run)."""

    def __init__(self, timeline: Timeline | None = None) -> None:
        self.timeline = timeline or Timeline()

    def on_trial_start(
        self, iteration: int, trials: list[Trial], trial: Trial, **info: Any
    ) -> None:
        self.timeline.mark("first_trial_start", once=True)

    def on_trial_result(
        self, iteration: int, trials: list[Trial], trial: Trial, result: dict[str, Any], **info: Any
    ) -> None:
        self.timeline.mark("first_result", once=True)

    def on_trial_complete(
        self, iteration: int, trials: list[Trial], trial: Trial, **info: Any
    ) -> None:
        self.timeline.mark("last_trial_end")

    def on_trial_error(
        self, iteration: int, trials: list[Trial], trial: Trial, **info: Any
    ) -> None:
        self.timeline.mark("last_trial_end")

    def __getstate__(self) -> dict[str, Any]:
        return {"timeline": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.timeline = Timeline()


class ProgressCallback(Callback):
    """The one progress display of a sweep: trials finished of the total, errored, the best
    metric so far, elapsed time and an estimate of the time left. Tune's own output is silenced
    by the command (its per-trial result boxes do not scale to hundreds of trials).

    On a terminal it is one line redrawn in place (rich ``Live``), with a line above it for each
    errored trial; elsewhere (a pipe, a log file, a test) one plain line per finished or errored
    trial, the summary at its end. A resumed sweep counts the trials it keeps (Tune hands them
    over finished) and knows its total from the stored sweep.

    The estimate: wall seconds since this command's first trial started / trials ended since,
    x trials still to run; wall seconds, so trials side by side count as the throughput they
    are. None until a trial has ended in this run."""

    def __init__(
        self,
        metric: str,
        total: int | None = None,
        *,
        mode: str = "max",
        name: str = "sweep",
        console: Any = None,
        clock: Callable[[], float] = time.monotonic,
        refresh_seconds: float = 1.0,
    ) -> None:
        self.metric, self.total, self.mode, self.name = metric, total, mode, name
        self.console = console
        self.clock = clock
        self.refresh_seconds = refresh_seconds
        self.started: float | None = None
        self.kept = self.finished = self.errored = self.errored_kept = 0
        self.best: float | None = None
        self._seen: set[str] = set()
        self._live: Any = None
        self._drawn = 0.0

    # -- what it learns ---------------------------------------------------------------------
    def _better(self, value: Any) -> None:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value):
            return
        if self.best is None or (value > self.best if self.mode == "max" else value < self.best):
            self.best = float(value)

    def _take_over(self, trials: list[Any]) -> None:
        """The first step: the trials Tune already holds as ended are kept from an earlier run."""
        from robusttune.experiments.sweep.trials import config_error

        for trial in trials:
            if trial.status == "TERMINATED":
                self._seen.add(trial.trial_id)
                if config_error(trial):
                    self.errored += 1
                    self.errored_kept += 1
                else:
                    self.kept += 1
                    self._better((trial.last_result or {}).get(self.metric))

    def on_step_begin(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        if self.started is None:
            self.started = self.clock()
            self._take_over(trials)
            self._open()
        if self._live is not None and self.clock() - self._drawn >= self.refresh_seconds:
            self._draw()

    def on_trial_complete(
        self, iteration: int, trials: list[Trial], trial: Trial, **info: Any
    ) -> None:
        from robusttune.experiments.sweep.trials import config_error

        if trial.trial_id in self._seen:
            return
        self._seen.add(trial.trial_id)
        result = trial.last_result or {}
        message = config_error(trial)
        if message:
            self.errored += 1
            self._trial_line(trial, f"ERROR (configuration): {message}", error=True)
            return
        self.finished += 1
        value = result.get(self.metric, math.nan)
        self._better(value)
        shown = f"{value:.4f}" if isinstance(value, float) else str(value)
        collapsed = " collapsed" if result.get("collapsed") else ""
        self._trial_line(
            trial,
            f"{self.metric} {shown}{collapsed} after {result.get('training_iteration', 0)} rounds",
        )

    def on_trial_error(
        self, iteration: int, trials: list[Trial], trial: Trial, **info: Any
    ) -> None:
        self._seen.add(trial.trial_id)
        self.errored += 1
        self._trial_line(trial, f"ERROR (see {trial.path}/error.txt)", error=True)

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        self.close()

    # -- the line -----------------------------------------------------------------------------
    @property
    def ended(self) -> int:
        return self.kept + self.finished + self.errored

    def seconds_left(self) -> float | None:
        """Wall seconds per trial ended in this run x trials still to end; None before one."""
        ran = self.finished + self.errored - self.errored_kept
        if self.started is None or not ran or self.total is None:
            return None
        return (self.clock() - self.started) / ran * max(0, self.total - self.ended)

    def line(self) -> str:
        elapsed = 0.0 if self.started is None else self.clock() - self.started
        total = "?" if self.total is None else str(self.total)
        done = self.kept + self.finished
        parts = [
            f"{self.name}: {done}/{total} finished" + (f" ({self.kept} kept)" if self.kept else ""),
            f"{self.errored} errored",
        ]
        if self.best is not None:
            parts.append(f"best {self.metric} {self.best:.4f}")
        left = self.seconds_left()
        if self.total is not None and self.ended >= self.total:
            remaining = "0s"
        else:
            remaining = "?" if left is None else "~" + duration(left)
        parts += [f"elapsed {duration(elapsed)}", f"left {remaining}"]
        return ", ".join(parts)

    # -- the display --------------------------------------------------------------------------
    def _console(self) -> Any:
        if self.console is None:
            from rich.console import Console

            self.console = Console()
        return self.console

    def _open(self) -> None:
        console = self._console()
        if console.is_terminal and self._live is None:
            from rich.live import Live
            from rich.text import Text

            self._live = Live(
                Text(self.line()), console=console, auto_refresh=False, transient=False
            )
            self._live.__enter__()

    def _draw(self) -> None:
        from rich.text import Text

        self._drawn = self.clock()
        self._live.update(Text(self.line()), refresh=True)

    def _trial_line(self, trial: Any, verdict: str, error: bool = False) -> None:
        folder = Path(trial.path).name if trial.path else trial.trial_id
        total = "?" if self.total is None else str(self.total)
        text = f"[{self.ended}/{total}] {folder}: {verdict}"
        console = self._console()
        if self._live is not None:
            if error:  # above the live line, which stays the last line on the screen
                self._live.console.print(text, markup=False, highlight=False, soft_wrap=True)
            self._draw()
        else:
            console.print(f"{text} | {self.line()}", markup=False, highlight=False, soft_wrap=True)

    def interrupted(self) -> None:
        """Ctrl-C: Tune stops the trials and saves the sweep's state once more (seconds)."""
        message = (
            "Ctrl-C: stopping the trials and saving the sweep's state (Ctrl-C again skips saving)"
        )
        if self._live is not None:
            self._live.console.print(message, markup=False, highlight=False)
            self._draw()
        else:
            self._console().print(message, markup=False, highlight=False, soft_wrap=True)

    def close(self) -> None:
        """Draw the last line and leave the display (idempotent: an interrupted sweep calls it
        from the runner as well)."""
        if self._live is not None:
            self._draw()
            self._live.__exit__(None, None, None)
            self._live = None

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles the run config's callbacks into the experiment state; the display belongs
        # to one command run (a restored Tuner gets this run's callback instead).
        state = dict(self.__dict__)
        state.update(console=None, _live=None, clock=time.monotonic)
        return state
