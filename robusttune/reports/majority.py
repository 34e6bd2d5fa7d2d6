"""Byzantine-majority rounds and what follows them, per run, read off rounds.csv.

DeMoA (Otsuka et al., arXiv 2509.02970, experiments) reports that FedAvg and FedCM collapse right
after the first round whose sample is Byzantine-majority (``byzantine_majority``: 2 b_t >= |S_t|
with b_t >= 1 Byzantine clients sampled), while DeMoA trains through it. `majority_table` puts
that claim on a table, one row per run:

- ``first_majority``: the first round whose sample had a Byzantine majority (NA: never);
- ``accuracy_before``: the last evaluated accuracy before it (how far the run had got);
- ``fell``: the first evaluated round at or after ``first_majority`` at which the run is at
  chance, ``records.is_collapsed`` (accuracy <= 1/K + 0.5 points, or non-finite parameters),
  having been above chance at an earlier evaluation; a run still untrained when the majority
  comes has not fallen. ``fell_lag`` = fell - first_majority;
- ``collapsed_from``: the first round of the run's final stretch at chance, i.e. the round from
  which every evaluation to the end is collapsed (NA when the final accuracy is above chance:
  Table II's collapse, dated). ``collapse_lag`` = collapsed_from - first_majority;
- ``final_accuracy``.

A fall that the run recovers from is a ``fell`` without a ``collapsed_from``. Resolution is
``eval_every``: accuracy is known only in evaluated rounds. `majority_summary` counts, per cell of
the axes that vary except the attack (method x p x split in demoa.yaml), the runs that fell or
collapsed after their first majority round and the median lag.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

from robusttune.core.records import is_collapsed
from robusttune.display.markdown import markdown_table
from robusttune.reports import axes

__all__ = [
    "Evaluation",
    "evaluations",
    "first_majority_round",
    "majority_section",
    "majority_summary",
    "majority_table",
    "run_events",
]

EVENT_COLUMNS = (
    "first_majority",
    "majority_rounds",
    "accuracy_before",
    "fell",
    "fell_lag",
    "collapsed_from",
    "collapse_lag",
)


class Evaluation(NamedTuple):
    """One evaluated round of a run: its test ``accuracy`` (NaN in a round whose parameters went
    non-finite) and whether it is ``at_chance`` (records.is_collapsed)."""

    round: int
    accuracy: float
    at_chance: bool


def _majority(rounds: pd.DataFrame) -> pd.Series:
    # rounds.csv read back holds the flag as a bool, or as text after a CSV round trip
    return rounds["byzantine_majority"].astype(str).str.lower().isin(("true", "1"))


def first_majority_round(rounds: pd.DataFrame) -> int | None:
    """The first round of a run's rounds.csv rows whose sample had a Byzantine majority (None:
    never)."""
    majority = _majority(rounds)
    return int(rounds.loc[majority, "round"].min()) if majority.any() else None


def evaluations(rounds: pd.DataFrame, num_classes: int) -> list[Evaluation]:
    """A run's evaluated rounds in order, from its rounds.csv rows (``round``, ``accuracy``,
    ``nonfinite_params``): a round with an accuracy, or whose parameters went non-finite (which
    is at chance whatever its accuracy)."""
    rows = rounds.sort_values("round")
    nonfinite = (
        rows["nonfinite_params"].fillna(0) > 0
        if "nonfinite_params" in rows
        else pd.Series(False, index=rows.index)
    )
    evaluated = rows[rows["accuracy"].notna() | nonfinite]
    return [
        Evaluation(int(r), float(a), is_collapsed(float(a), num_classes, bool(n)))
        for r, a, n in zip(evaluated["round"], evaluated["accuracy"], nonfinite[evaluated.index])
    ]


def run_events(rounds: pd.DataFrame, num_classes: int) -> dict[str, Any]:
    """The EVENT_COLUMNS of one run from its rounds.csv rows (``round``, ``accuracy``,
    ``byzantine_majority``, ``nonfinite_params``); rounds are NA where the event never came."""
    first = first_majority_round(rounds)
    marks = evaluations(rounds, num_classes)

    before = [a for r, a, _ in marks if first is not None and r < first]
    fell = None
    if first is not None:
        risen = False
        for r, _, at_chance in marks:
            if r >= first and at_chance and risen:
                fell = r
                break
            risen = risen or not at_chance
    collapsed_from = None
    for r, _, at_chance in reversed(marks):
        if not at_chance:
            break
        collapsed_from = r

    def lag(event: int | None) -> Any:
        return event - first if event is not None and first is not None else pd.NA

    return {
        "first_majority": pd.NA if first is None else first,
        "majority_rounds": int(_majority(rounds).sum()),
        "accuracy_before": before[-1] if before else math.nan,
        "fell": pd.NA if fell is None else fell,
        "fell_lag": lag(fell),
        "collapsed_from": pd.NA if collapsed_from is None else collapsed_from,
        "collapse_lag": lag(collapsed_from),
    }


def majority_table(runs: pd.DataFrame, rounds: pd.DataFrame) -> pd.DataFrame:
    """One row per run (`run_events`): run_id, the varying axes (`axes.row_axes`, with the
    threat), seed, the events and final_accuracy; sorted by those axes and seed. Rounds columns
    are nullable integers (NA: never)."""
    columns = ["run_id", *EVENT_COLUMNS, "final_accuracy"]
    if runs.empty or rounds.empty or "byzantine_majority" not in rounds:
        return pd.DataFrame(columns=columns)
    frame = axes.labelled(runs)
    index = axes.cell_index(runs)
    by_run = dict(tuple(rounds.groupby("run_id")))
    rows = []
    for _, run in frame.iterrows():
        part = by_run.get(run["run_id"])
        if part is None:
            continue
        classes = int(run["num_classes"]) if run.get("num_classes") else 10
        row = {
            "run_id": run["run_id"],
            **{k: run[k] for k in index},
            "seed": run.get("seed"),
            **run_events(part, classes),
            "final_accuracy": float(run["final_accuracy"]),
        }
        rows.append(row)
    table = pd.DataFrame(rows)
    if table.empty:
        return pd.DataFrame(columns=columns)
    for column in ("first_majority", "fell", "fell_lag", "collapsed_from", "collapse_lag"):
        table[column] = table[column].astype("Int64")
    return table.sort_values([*index, "seed", "run_id"], kind="stable").reset_index(drop=True)


def majority_summary(table: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Per group of ``by`` (rows of `majority_table`): ``runs``; ``with_majority`` (runs whose
    sample had a Byzantine majority in some round); ``first_majority`` (median round); ``fell``
    and ``collapsed`` (runs that fell to chance, or collapsed for good, at or after their first
    majority round) with their share of ``with_majority``; the median lags; mean final
    accuracy (%)."""
    if table.empty:
        return pd.DataFrame()

    def summary(group: pd.DataFrame) -> pd.Series:
        hit = group[group["first_majority"].notna()]
        fell = hit[hit["fell"].notna()]
        collapsed = hit[hit["collapse_lag"].fillna(-1) >= 0]
        n = len(hit)
        return pd.Series(
            {
                "runs": len(group),
                "with_majority": n,
                "first_majority": _median(hit["first_majority"]),
                "fell": len(fell),
                "fell_share": len(fell) / n if n else math.nan,
                "fell_lag": _median(fell["fell_lag"]),
                "collapsed": len(collapsed),
                "collapsed_share": len(collapsed) / n if n else math.nan,
                "collapse_lag": _median(collapsed["collapse_lag"]),
                "accuracy": 100 * group["final_accuracy"].mean(),
            }
        )

    summaries = table.groupby(by, sort=True)[list(table.columns)].apply(summary)
    # every group's summary is a Series with the same index: pandas stacks them into a DataFrame
    assert isinstance(summaries, pd.DataFrame)
    return summaries


def _median(values: pd.Series) -> float:
    values = values.dropna()
    return float(values.astype(float).median()) if len(values) else math.nan


def _shown(table: pd.DataFrame) -> pd.DataFrame:
    """Rounds as text for markdown: NA reads ``never``, lags without an event stay empty."""
    shown = table.drop(columns=["run_id"]).copy()
    for column in ("first_majority", "fell", "collapsed_from"):
        shown[column] = [("never" if pd.isna(v) else str(int(v))) for v in shown[column]]
    for column in ("fell_lag", "collapse_lag"):
        shown[column] = ["" if pd.isna(v) else str(int(v)) for v in shown[column]]
    shown["final_accuracy"] = 100 * shown["final_accuracy"]
    shown["accuracy_before"] = 100 * shown["accuracy_before"]
    return shown


def majority_section(runs: pd.DataFrame, rounds: pd.DataFrame, out_dir: Path) -> list[str]:
    """The report's lines on Byzantine-majority rounds (the summary, then every run), with
    ``majority_runs.csv`` and ``majority_summary.csv`` written to ``out_dir``; no lines when no
    run has Byzantine clients or rounds.csv has no ``byzantine_majority``."""
    attacked = runs[runs["byzantine_fraction"] > 0] if "byzantine_fraction" in runs else runs
    table = majority_table(attacked, rounds)
    if table.empty:
        return []
    by = [c for c in axes.row_axes(attacked) if c in table]
    summary = majority_summary(table, by)
    table.to_csv(out_dir / "majority_runs.csv", index=False)
    summary.to_csv(out_dir / "majority_summary.csv")
    return [
        "## Byzantine-majority rounds and collapses",
        "",
        "Per run: the first round whose sample had a Byzantine majority (2 b >= |S|, b >= 1), "
        "the accuracy (%) just before it, the first evaluated round at or after it at which "
        "the run had fallen to chance (<= chance + 0.5 points, or non-finite, after being "
        "above it), and the round from which it stayed there to the end (collapsed). Lags "
        "count rounds after the first majority round; `never` is never.",
        "",
        "### Summary over attacks and seeds",
        "",
        "Shares are of the runs with a majority round; lags are medians.",
        "",
        markdown_table(summary, floatfmt=".3g"),
        "",
        "### Every run",
        "",
        markdown_table(_shown(table), floatfmt=".1f", index=False),
        "",
    ]
