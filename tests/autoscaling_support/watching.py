"""Watching a command's trial folders while it runs, for tests/test_autoscaling.py: which trials
run now (`running_trials`), steps taken in order when their condition holds (`Watcher`: lose a
worker, kill a driver), and `wait_for`."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def running_trials(folder: Path, fresh_s: float = 3.0) -> dict[str, int]:
    """Trial folders under ``folder`` that run now: rounds.csv written in the last ``fresh_s``
    seconds, no summary.json yet. Folder -> rounds done."""
    now, found = time.time(), {}
    for path in folder.glob("**/rounds.csv"):
        try:
            if (path.parent / "summary.json").exists() or now - path.stat().st_mtime > fresh_s:
                continue
            found[str(path.parent)] = max(0, len(path.read_text().splitlines()) - 1)
        except OSError:
            continue
    return found


class Watcher(threading.Thread):
    """Polls every 0.2 s; runs each (condition, action) step once, in order, when its condition
    holds. ``done`` holds what each action returned."""

    def __init__(self, steps: list[tuple[Callable[[], bool], Callable[[], Any]]]) -> None:
        super().__init__(daemon=True)
        self.steps = list(steps)
        self.done: list[Any] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while self.steps and not self.halt.is_set():
            condition, action = self.steps[0]
            if condition():
                self.done.append(action())
                self.steps.pop(0)
            time.sleep(0.2)

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=5)


def wait_for(condition: Callable[[], bool], timeout_s: float, what: str) -> float:
    started = time.time()
    while not condition():
        if time.time() - started > timeout_s:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.25)
    return time.time()
