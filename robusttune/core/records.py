"""What a run leaves behind, torch-free: one `RoundRecord` per round, one `RunSummary` per run, and
the two rules every layer judges them by (collapse and survival). The simulation writes them,
the run folder stores them, the trainable reports them, breakdown, calibration and results read
them: nobody passes a loose dict or re-states a rule.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, ClassVar

__all__ = [
    "COLLAPSE_MARGIN",
    "ROUND_COLUMNS",
    "RoundRecord",
    "RunSummary",
    "is_collapsed",
    "mean_accuracy",
    "selection_accuracy",
    "survives",
]

# Collapse = final accuracy <= chance + 0.5 points (the SWB-DM paper's <= 10.5% on 10 classes).
COLLAPSE_MARGIN = 0.005


def is_collapsed(accuracy: float, num_classes: int, nonfinite: bool) -> bool:
    """Collapsed: non-finite parameters, a non-finite accuracy, or accuracy <= 1/K + 0.005."""
    return (
        nonfinite or not math.isfinite(accuracy) or accuracy <= 1.0 / num_classes + COLLAPSE_MARGIN
    )


def selection_accuracy(test: float, validation: float, has_validation: bool) -> float:
    """The accuracy selections and collapse read: ``validation`` when the run holds a
    validation part out (``validation_fraction`` > 0), else ``test`` (issue 23)."""
    return validation if has_validation else test


def survives(accuracy: float, collapsed: bool, bar: float) -> bool:
    """A run (or a point's runs) survives when nothing collapsed and its accuracy, finite, reaches
    the bar (breakdown's and calibration's one survival rule)."""
    return not collapsed and math.isfinite(accuracy) and accuracy >= bar


def mean_accuracy(accuracies: Iterable[float | None]) -> float:
    """Mean final accuracy where a run without a finite accuracy (it diverged, or errored) counts
    as 0, not as missing; NaN for no runs."""
    values = [_number(a) for a in accuracies]
    if not values:
        return math.nan
    return sum(v if math.isfinite(v) else 0.0 for v in values) / len(values)


@dataclass(frozen=True)
class RoundRecord:
    """What one round leaves behind. Accuracy is a fraction in [0, 1]; accuracy and loss are NaN
    in rounds that were not evaluated (every ``eval_every`` rounds, and the last).

    ``aggregation_error``: ||Agg - xbar_H||_2, the aggregate's L2 distance from the mean of the
    rule's honest inputs, in the space the rule aggregates (SWB-DM's Figure 2 quantity;
    `robusttune.engine.input_statistics.aggregation_error` says which rows and weights). NaN when it
    is not defined: no aggregate this round (a guarded refusal, nobody to aggregate) or no
    honest input; +inf when the aggregate was not finite. ``honest_input_spread``: the mean
    squared distance of those honest inputs from xbar_H
    (`robusttune.engine.input_statistics.honest_input_spread`; under DeMoA the honest cached momenta),
    also in a refused round; NaN when the rule had no input or no honest one this round, +inf
    when one was not finite. Both last, with NaN defaults, so records built by code that does
    not measure them stay valid."""

    round: int
    accuracy: float
    loss: float
    param_norm: float
    nonfinite_params: int
    max_class_share: float
    sampled: int
    byzantine_sampled: int
    nonfinite_messages: int  # messages sent this round with a NaN or infinite coordinate
    byzantine_input_share: float
    byzantine_majority: bool
    f_assumed: int
    precondition_held_assumed: bool
    precondition_held_actual: bool
    aggregated: bool
    collapsed: bool
    train_seconds: float
    aggregate_seconds: float
    aggregation_error: float = math.nan
    honest_input_spread: float = math.nan
    # accuracy on the validation part of the held-out set (``validation_fraction``), evaluated
    # with ``accuracy``; NaN when not evaluated or without a validation part
    validation_accuracy: float = math.nan

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# rounds.csv's columns (one per RoundRecord field), as the reference documents them
ROUND_COLUMNS: dict[str, str] = {
    "round": "The round, from 1.",
    "accuracy": "Test accuracy (a fraction) of the global model; NaN in rounds not evaluated.",
    "loss": "Test loss; NaN in rounds not evaluated.",
    "param_norm": "L2 norm of the global model's parameters.",
    "nonfinite_params": "Parameters that are NaN or infinite (a diverged run).",
    "max_class_share": "The largest share of test predictions given to one class (1.0: one class for every input).",
    "sampled": "n, the clients sampled this round.",
    "byzantine_sampled": "The Byzantine clients among them.",
    "nonfinite_messages": "Messages sent this round with a NaN or infinite coordinate.",
    "byzantine_input_share": "The Byzantine share of the rule's input rows (cached rows included).",
    "byzantine_majority": "Whether the Byzantine rows were a majority of the rule's input.",
    "f_assumed": "f, the corruption the rule was told to expect: floor(n_in x assumed fraction).",
    "precondition_held_assumed": "Whether the rule's precondition held for f_assumed.",
    "precondition_held_actual": "Whether it held for the actual Byzantine rows.",
    "aggregated": "Whether the rule ran (not when nobody was sampled, or a guarded run refused).",
    "collapsed": "The collapse rule at this round: non-finite parameters or accuracy <= 1/K + 0.005.",
    "train_seconds": "Seconds of client training.",
    "aggregate_seconds": "Seconds of aggregation.",
    "aggregation_error": "||Agg - xbar_H||_2, the aggregate's distance from the mean of the rule's honest inputs (SWB-DM's Figure 2 quantity).",
    "honest_input_spread": "The mean squared distance of the honest inputs from their mean (under DeMoA the honest cached momenta's variance).",
    "validation_accuracy": "Accuracy on the validation part of the held-out set; NaN when not evaluated or without one.",
}


@dataclass(frozen=True)
class RunSummary:
    """The end of one run: summary.json's content, typed. Figures never measured or non-finite
    are NaN here and null in JSON.

    ``stopped_early``: a scheduler or an interruption ended the run before its last round (its
    last accuracy is not a final one). ``run_dir``: its run folder, when it has one. ``error``:
    why it has no final figures (a trial that errored or never ran); such a run is collapsed.
    ``mean_aggregation_error``: the mean of its rounds' ``RoundRecord.aggregation_error`` over the
    rounds where it was defined (+inf once an aggregate was not finite, null in JSON like every
    non-finite figure; NaN when no round had one, or the summary predates the figure).
    ``mean_honest_input_spread``: the same mean of ``RoundRecord.honest_input_spread``.
    ``float_path``: the float path the run computed with (``robusttune.core.numerics.FloatPath.label``:
    mode, ATen capability, MKL branch, threads), so two summaries that differ can be told apart
    by machine; absent from summaries written before it existed. ``restored_from_rounds``: the
    checkpointed rounds a Ray Tune trial continued from, one per restart (its node lost, its
    sweep or map resumed), in order; empty for a run that went through in one go. The trial
    writes it itself: Tune's own record of restarts (``iterations_since_restore`` in
    result.json) is written by the driver, and a driver killed mid-sync leaves it empty."""

    final_accuracy: float
    final_loss: float
    collapsed: bool
    rounds_run: int
    byzantine_majority_rounds: int
    seconds: float
    num_classes: int
    spec: Mapping[str, Any] = field(default_factory=dict)  # the resolved RunSpec (to_dict())
    stopped_early: bool = False
    run_dir: str | None = None
    error: str | None = None
    mean_aggregation_error: float = math.nan
    mean_honest_input_spread: float = math.nan
    final_validation_accuracy: float = math.nan
    float_path: str | None = None  # what the run computed with (robusttune.core.numerics.FloatPath)
    restored_from_rounds: tuple[int, ...] = ()

    # summary.json's keys, as the reference documents them
    KEYS: ClassVar[dict[str, str]] = {
        "final_accuracy": "Test accuracy after the last round (a fraction).",
        "final_loss": "Test loss after the last round.",
        "collapsed": "The run collapsed: non-finite parameters or final accuracy <= 1/K + 0.005 (on validation accuracy when there is a validation part).",
        "rounds_run": "Rounds run (fewer than asked when stopped early).",
        "byzantine_majority_rounds": "Rounds whose rule input had a Byzantine majority.",
        "seconds": "Wall-clock seconds of the run.",
        "num_classes": "K, the dataset's classes.",
        "spec": "The resolved RunSpec: every key's value, plugin knobs included.",
        "stopped_early": "A scheduler or an interruption ended the run before its last round.",
        "run_dir": "The run folder.",
        "error": "Why the run did not finish (a configuration error), else null.",
        "mean_aggregation_error": "The mean of the rounds' aggregation_error over rounds where it is defined.",
        "mean_honest_input_spread": "The same mean of honest_input_spread.",
        "final_validation_accuracy": "Validation accuracy after the last round (what selections read).",
        "float_path": "The float path the run computed with (numerics mode, kernels, threads, torch).",
        "restored_from_rounds": "The checkpointed rounds a restarted trial continued from, one per restart (empty: it ran in one go).",
    }

    @property
    def has_validation(self) -> bool:
        """Whether the run held a validation part out (``validation_fraction`` > 0)."""
        return float(self.spec.get("validation_fraction", 0) or 0) > 0

    @property
    def selection_accuracy(self) -> float:
        """The accuracy every selection reads (`selection_accuracy`)."""
        return selection_accuracy(
            self.final_accuracy, self.final_validation_accuracy, self.has_validation
        )

    @classmethod
    def failed(
        cls, reason: str, spec: Mapping[str, Any] | None = None, run_dir: str | None = None
    ) -> RunSummary:
        """A run with no final figures: NaN accuracy and loss, collapsed, ``error`` = reason."""
        return cls(
            final_accuracy=math.nan,
            final_loss=math.nan,
            collapsed=True,
            rounds_run=0,
            byzantine_majority_rounds=0,
            seconds=0.0,
            num_classes=0,
            spec=dict(spec or {}),
            run_dir=run_dir,
            error=reason,
        )

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> RunSummary:
        """Read summary.json's content; null figures become NaN. A missing ``collapsed`` is
        judged from the accuracy (``is_collapsed``); keys this class does not know are ignored
        (summaries written by newer versions stay readable)."""
        known = {f.name for f in fields(cls)}
        data = {k: v for k, v in values.items() if k in known}
        accuracy = _number(data.get("final_accuracy"))
        classes = int(data.get("num_classes") or 0)
        collapsed = data.get("collapsed")
        if collapsed is None:
            collapsed = (
                is_collapsed(accuracy, classes, False) if classes else not math.isfinite(accuracy)
            )
        return cls(
            final_accuracy=accuracy,
            final_loss=_number(data.get("final_loss")),
            collapsed=bool(collapsed),
            rounds_run=int(data.get("rounds_run") or 0),
            byzantine_majority_rounds=int(data.get("byzantine_majority_rounds") or 0),
            seconds=_number(data.get("seconds")),
            num_classes=classes,
            spec=dict(data.get("spec") or {}),
            stopped_early=bool(data.get("stopped_early", False)),
            run_dir=data.get("run_dir"),
            error=data.get("error"),
            mean_aggregation_error=_number(data.get("mean_aggregation_error")),
            mean_honest_input_spread=_number(data.get("mean_honest_input_spread")),
            final_validation_accuracy=_number(data.get("final_validation_accuracy")),
            float_path=data.get("float_path"),
            restored_from_rounds=tuple(int(r) for r in data.get("restored_from_rounds") or ()),
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: NaN and infinities as None; ``run_dir``, ``error`` and ``float_path`` only when set."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["spec"] = dict(self.spec)
        out["restored_from_rounds"] = list(self.restored_from_rounds)
        for key in ("run_dir", "error", "float_path"):
            if out[key] is None:
                del out[key]
        return {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in out.items()
        }

    def at(self, run_dir: str | None) -> RunSummary:
        """The same summary, pointing at its run folder."""
        return replace(self, run_dir=None if run_dir is None else str(run_dir))

    def restored_from(self, rounds: Sequence[int]) -> RunSummary:
        """The same summary, recording the checkpointed rounds its trial continued from."""
        return replace(self, restored_from_rounds=tuple(int(r) for r in rounds))

    def stopped(self) -> RunSummary:
        """The same summary, marked as ended before its last round."""
        return replace(self, stopped_early=True)


def _number(value: Any) -> float:
    try:
        return float(value) if value is not None else math.nan
    except (TypeError, ValueError):
        return math.nan
