"""What the driver sees of a running sweep, through Tune callbacks that run on the driver: one
line per finished or failed trial (`ProgressCallback`) and the sweep's fixed-cost timeline
(`Timeline`, seconds since the command started, marked by `TimelineCallback`)."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from ray.tune import Callback

__all__ = ["Timeline", "TimelineCallback", "ProgressCallback"]


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

    def on_trial_start(self, iteration, trials, trial, **info):  # noqa: ANN001
        self.timeline.mark("first_trial_start", once=True)

    def on_trial_result(self, iteration, trials, trial, result, **info):  # noqa: ANN001
        self.timeline.mark("first_result", once=True)

    def on_trial_complete(self, iteration, trials, trial, **info):  # noqa: ANN001
        self.timeline.mark("last_trial_end")

    def on_trial_error(self, iteration, trials, trial, **info):  # noqa: ANN001
        self.timeline.mark("last_trial_end")

    def __getstate__(self) -> dict[str, Any]:
        return {"timeline": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.timeline = Timeline()


class ProgressCallback(Callback):
    """One line per finished or failed trial (Tune's own output is silenced by the command: its
    per-trial result boxes do not scale to hundreds of trials)."""

    def __init__(self, metric: str, total: int | None = None) -> None:
        self.metric, self.total, self.done = metric, total, 0

    def _line(self, trial: Any, verdict: str) -> None:
        self.done += 1
        count = f"{self.done}/{self.total}" if self.total else str(self.done)
        folder = Path(trial.path).name if trial.path else trial.trial_id
        print(f"[{count}] {folder}: {verdict}", flush=True)

    def on_trial_complete(self, iteration, trials, trial, **info):  # noqa: ANN001
        result = trial.last_result or {}
        value = result.get(self.metric, math.nan)
        shown = f"{value:.4f}" if isinstance(value, float) else str(value)
        collapsed = " collapsed" if result.get("collapsed") else ""
        self._line(trial, f"{self.metric} {shown}{collapsed} after "
                          f"{result.get('training_iteration', 0)} rounds")

    def on_trial_error(self, iteration, trials, trial, **info):  # noqa: ANN001
        self._line(trial, f"ERROR (see {trial.path}/error.txt)")
