"""The figure lines bench/gpu.py and bench/gpu_tune.py print, ``<name>: <value>`` with notes
after ``#``: one class both phases derive from (a module they share, not a bench of its own)."""

from __future__ import annotations

import math

__all__ = ["Figures"]


class Figures:
    """The figure lines a phase prints, the values printed and the figures that failed."""

    def __init__(self) -> None:
        self.failed: list[str] = []
        self.values: dict[str, float] = {}

    def figure(self, name: str, value: float) -> float:
        self.values[name] = value
        print(f"{name}: {value:.6g}", flush=True)
        return value

    @staticmethod
    def note(text: str) -> None:
        print(f"# {text}", flush=True)

    def ratio(self, name: str, numerator: float, denominator: float) -> float:
        """``numerator / denominator`` as the figure ``name`` (nan when the denominator is not
        positive)."""
        value = numerator / denominator if denominator > 0 else math.nan
        return self.figure(name, value)
