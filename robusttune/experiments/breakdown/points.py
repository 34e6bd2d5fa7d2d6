"""A breakdown map's lattice points and what runs make of them: a `Cell` (the RunSpec keys it
fixes and its N clients), a `Point` (k Byzantine clients of a cell), an `Outcome` (the runs'
accuracy, collapse and cost), and the survival rule bisection reads them by: the bar
(`survival_bar`: an absolute threshold, or chance + a share of the clean margin above chance),
whether a clean run learned (`learned`), the lattice's top (`lattice_top`) and the statuses."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from robusttune.core.records import RunSummary, mean_accuracy

__all__ = [
    "DEFAULT_CLEAN_MARGIN",
    "EPS",
    "NO_ANSWER",
    "STATUSES",
    "Cell",
    "Evaluator",
    "Outcome",
    "Point",
    "Verdict",
    "lattice_top",
    "learned",
    "survival_bar",
]

EPS = 1e-9
STATUSES = ("ok", "survives_all", "non_monotone", "fails_clean", "clean_at_chance")
# statuses without a breakdown point: the clean run failed the bar, or it did not learn
NO_ANSWER = ("fails_clean", "clean_at_chance")
# A clean run must beat chance by this much (accuracy points) for its cell to have a breakdown
# point (docs/explanations/concepts.md, "Survival above chance"): at the default relative
# threshold 0.5 a survivor then stands at least 5 points above chance, ten times the collapse
# margin, and a clean run at the margin is 4.5 binomial standard deviations above chance on the
# digits validation part (180 images).
DEFAULT_CLEAN_MARGIN = 0.1


# -- points and outcomes -----------------------------------------------------------------------
@dataclass(frozen=True)
class Cell:
    """One cell of the map: the RunSpec keys it fixes (``values``, in order) and its number of
    clients N, which sets its lattice."""

    values: tuple[tuple[str, Hashable], ...]
    clients: int

    @classmethod
    def of(cls, clients: int, **values: Hashable) -> Cell:
        return cls(tuple(values.items()), int(clients))

    def as_dict(self) -> dict[str, Any]:
        return dict(self.values)

    def __getitem__(self, key: str) -> Any:
        return self.as_dict()[key]

    @property
    def label(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.values) or "cell"


@dataclass(frozen=True)
class Point:
    """A lattice point: ``byzantine`` = k Byzantine clients in ``cell``; beta = k / N."""

    cell: Cell
    byzantine: int

    @property
    def fraction(self) -> float:
        return self.byzantine / self.cell.clients


@dataclass(frozen=True)
class Outcome:
    """What a point's runs gave: mean final accuracy over them (the selection accuracy,
    `RunSummary.selection_accuracy`: validation accuracy when the runs hold a validation part),
    whether any collapsed, how many trials (new runs) it took, what stands behind the number (run
    folders, tuned knobs), ``runs``: what evaluating it in full costs without any saving (seeds x
    adversary variants x budget; None: ``trials``), the measure of the full lattice, and
    ``test_accuracy``: the mean final test accuracy of the same runs (what a report states of the
    selected setting; NaN for a hand-made outcome) and ``chance``: 1/K for the runs' K classes
    (0 for a hand-made outcome: its bar is then relative to 0)."""

    accuracy: float
    collapsed: bool = False
    trials: int = 1
    detail: tuple[Any, ...] = ()
    # the adversary setting that gave this: the worst, or the first that broke the point
    breaker: tuple[tuple[str, Any], ...] = ()
    runs: int | None = None
    test_accuracy: float = math.nan
    chance: float = 0.0

    @property
    def full_runs(self) -> int:
        return self.trials if self.runs is None else self.runs

    @classmethod
    def from_summaries(cls, summaries: Sequence[RunSummary], **extra: Any) -> Outcome:
        """Mean selection accuracy (a non-finite one counts as 0), mean test accuracy and
        collapse in any run."""
        detail = tuple(s.run_dir for s in summaries if s.run_dir)
        detail += tuple(f"{k}={v}" for k, v in extra.items())
        accuracy = mean_accuracy(s.selection_accuracy for s in summaries) if summaries else 0.0
        test = mean_accuracy(s.final_accuracy for s in summaries) if summaries else 0.0
        classes = max((s.num_classes for s in summaries), default=0)
        return cls(
            accuracy,
            any(s.collapsed for s in summaries),
            len(summaries),
            detail,
            test_accuracy=test,
            chance=1.0 / classes if classes > 0 else 0.0,
        )


Verdict = Outcome | bool
Evaluator = Callable[[Sequence[Point]], Sequence[Verdict]]


def survival_bar(
    threshold: float | None, relative_threshold: float, clean_accuracy: float, chance: float = 0.0
) -> float:
    """The accuracy an attacked point must reach: the absolute ``threshold`` if given, else the
    same share of the clean run's margin above chance,

        bar = chance + relative_threshold x (clean_accuracy - chance),   chance = 1/K,

    so a clean run of 0.15 on 10 classes asks 0.125 of an attacked one, not 0.075 (below chance:
    every run that did not collapse would survive). ``chance`` = 0 is the plain relative bar."""
    if threshold is not None:
        return threshold
    return chance + relative_threshold * (clean_accuracy - chance)


def learned(clean_accuracy: float, chance: float, clean_margin: float) -> bool:
    """Whether a clean run learned: its accuracy beats chance by at least ``clean_margin``
    (accuracy - chance >= clean_margin). A cell whose clean run did not learn has no breakdown
    point (its status is ``clean_at_chance``): any bar drawn from it measures noise."""
    return math.isfinite(clean_accuracy) and clean_accuracy - chance >= clean_margin - EPS


def lattice_top(clients: int, max_fraction: float) -> int:
    """k_max = floor(max_fraction x N): the lattice is {0, 1, ..., k_max} / N."""
    return math.floor(max_fraction * clients + EPS)
