"""What a sweep measures and selects by: the metrics a trial reports (every numeric
`RoundRecord` field plus EXTRA_METRICS), the default selection metric (validation accuracy, so
no knob is chosen on the test set), which metrics are test-set figures, and each metric's
default direction (`default_mode`)."""

from __future__ import annotations

import dataclasses

from robusttune.core.records import RoundRecord

__all__ = [
    "DEFAULT_METRIC",
    "EVALUATED_METRICS",
    "EXTRA_METRICS",
    "TEST_METRICS",
    "default_mode",
    "report_metrics",
    "test_metric_note",
]

# Metrics the trainable reports besides every RoundRecord field: the most recent evaluated
# accuracy and loss, so a metric is defined in rounds that were not evaluated (eval_every > 1).
EXTRA_METRICS = ("last_accuracy", "last_loss", "last_validation_accuracy")
# Metrics that are NaN in a round that was not evaluated.
EVALUATED_METRICS = ("accuracy", "loss", "max_class_share", "validation_accuracy")
# What a sweep selects by when its space names no metric: the validation part of the held-out
# set (RunSpec validation_fraction), so no knob is chosen on the test set.
DEFAULT_METRIC = "validation_accuracy"
# Metrics measured on the test part: a sweep may select by them, with a line saying so.
TEST_METRICS = ("accuracy", "loss", "max_class_share", "last_accuracy", "last_loss")


def test_metric_note(metrics: tuple[str, ...]) -> str | None:
    """The line a sweep prints when it selects by a test-set figure (None: it does not)."""
    named = [m for m in metrics if m in TEST_METRICS]
    if not named:
        return None
    return (
        f"note: search.metric {', '.join(named)} is measured on the test part: this sweep "
        f"selects on test data; {DEFAULT_METRIC} (the default) selects on the validation part"
    )


def report_metrics() -> tuple[str, ...]:
    """Every metric a trial reports: the numeric RoundRecord fields plus EXTRA_METRICS."""
    return tuple(f.name for f in dataclasses.fields(RoundRecord)) + EXTRA_METRICS


def default_mode(metric: str) -> str:
    """min for losses, times and counts of bad events; max otherwise (accuracy)."""
    lowered = metric.lower()
    if (
        "loss" in lowered
        or lowered.endswith("seconds")
        or lowered.startswith(("nonfinite", "byzantine"))
    ):
        return "min"
    return "max"
