"""The Byzantine-majority / collapse table on hand-built rounds: every expected round and lag is
read off the made-up accuracy sequence by hand (chance on 10 classes: <= 0.105)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from robusttune.core.records import RoundRecord, RunSummary
from robusttune.core.runspec import RunSpec
from robusttune.engine.recording import RunWriter
from robusttune.reports.majority import (
    Evaluation,
    evaluations,
    first_majority_round,
    majority_summary,
    majority_table,
    run_events,
)
from robusttune.reports.results import report

NAN = math.nan


def rounds_of(accuracies, majority_at=(), nonfinite_at=()) -> pd.DataFrame:
    """rounds.csv rows of one run: accuracy per round (NaN: not evaluated), the rounds whose
    sample was Byzantine-majority, the rounds with non-finite parameters."""
    return pd.DataFrame(
        {
            "round": range(1, len(accuracies) + 1),
            "accuracy": accuracies,
            "byzantine_majority": [r in majority_at for r in range(1, len(accuracies) + 1)],
            "nonfinite_params": [
                5 if r in nonfinite_at else 0 for r in range(1, len(accuracies) + 1)
            ],
        }
    )


def test_a_fall_right_after_the_first_majority_round_that_the_run_recovers_from():
    events = run_events(rounds_of([0.3, 0.5, 0.1, 0.1, 0.6], majority_at=(3, 5)), 10)
    assert events["first_majority"] == 3 and events["majority_rounds"] == 2
    assert events["accuracy_before"] == 0.5
    assert events["fell"] == 3 and events["fell_lag"] == 0
    assert events["collapsed_from"] is pd.NA and events["collapse_lag"] is pd.NA


def test_a_lasting_collapse_is_dated_to_the_start_of_the_final_stretch_at_chance():
    # at chance in round 2 (a dip), up again, then at chance from round 5 to the end
    events = run_events(rounds_of([0.4, 0.1, 0.5, 0.6, 0.09, 0.1, 0.105], majority_at=(4,)), 10)
    assert events["first_majority"] == 4 and events["accuracy_before"] == 0.5
    assert events["fell"] == 5 and events["fell_lag"] == 1  # the dip of round 2 is before
    assert events["collapsed_from"] == 5 and events["collapse_lag"] == 1


def test_an_untrained_run_has_not_fallen_and_unevaluated_rounds_are_skipped():
    # evaluated every other round; still at chance when the majority comes (round 2), rising late
    events = run_events(rounds_of([NAN, 0.1, NAN, 0.1, NAN, 0.7], majority_at=(2,)), 10)
    assert events["first_majority"] == 2 and math.isnan(events["accuracy_before"])
    assert events["fell"] is pd.NA and events["collapsed_from"] is pd.NA
    # never trained: collapsed from its first evaluation, before the majority round
    events = run_events(rounds_of([NAN, 0.1, NAN, 0.1], majority_at=(3,)), 10)
    assert events["accuracy_before"] == 0.1 and events["fell"] is pd.NA
    assert events["collapsed_from"] == 2 and events["collapse_lag"] == -1


def test_non_finite_parameters_are_a_fall_and_a_collapse_and_no_majority_is_never():
    events = run_events(rounds_of([0.4, 0.6, NAN], majority_at=(2,), nonfinite_at=(3,)), 10)
    assert (events["fell"], events["collapsed_from"], events["collapse_lag"]) == (3, 3, 1)
    events = run_events(rounds_of([0.4, 0.05, 0.1]), 10)
    assert events["first_majority"] is pd.NA and events["majority_rounds"] == 0
    assert events["fell"] is pd.NA and events["fell_lag"] is pd.NA  # no majority, no fall
    assert events["collapsed_from"] == 2 and events["collapse_lag"] is pd.NA


def test_the_evaluated_rounds_and_the_first_majority_round_read_off_rounds_csv():
    # rounds.csv read back from disk holds the majority flag as text; rows arrive out of order
    rows = rounds_of([NAN, 0.5, NAN, 0.1, NAN, NAN], majority_at=(5, 3), nonfinite_at=(6,))
    rows = rows.assign(byzantine_majority=rows["byzantine_majority"].map(str)).iloc[::-1]
    assert first_majority_round(rows) == 3
    assert first_majority_round(rounds_of([0.5, 0.6])) is None
    marks = evaluations(rows, 10)
    assert [(m.round, m.at_chance) for m in marks] == [(2, False), (4, True), (6, True)]
    assert marks[0] == Evaluation(2, 0.5, False) and math.isnan(marks[2].accuracy)


def runs_and_rounds():
    """Four runs of two methods at one rate: fedsgd falls at once twice (lags 0 and 1, one of
    them for good), demoa never falls, one demoa run never sees a majority."""
    sequences = {
        ("fedsgd+cclip", 1): ([0.3, 0.1, 0.1, 0.1], (2,)),  # fell 2, collapsed from 2
        ("fedsgd+cclip", 2): ([0.3, 0.4, 0.1, 0.5], (2,)),  # fell 3 (lag 1), recovered
        ("demoa", 1): ([0.2, 0.4, 0.6, 0.8], (2, 3)),
        ("demoa", 2): ([0.2, 0.4, 0.6, 0.9], ()),
    }
    runs, rounds = [], []
    for (method, seed), (accuracies, majority) in sequences.items():
        run_id = f"{method}-{seed}"
        runs.append(
            {
                "run_id": run_id,
                "method": method,
                "attack": "alie",
                "attack_strength": None,
                "byzantine_fraction": 0.2,
                "participation": 0.1,
                "seed": seed,
                "final_accuracy": accuracies[-1],
                "num_classes": 10,
                "collapsed": accuracies[-1] <= 0.105,
            }
        )
        rounds.append(rounds_of(accuracies, majority_at=majority).assign(run_id=run_id))
    return pd.DataFrame(runs), pd.concat(rounds, ignore_index=True)


def test_majority_table_has_one_row_per_run_with_its_events():
    runs, rounds = runs_and_rounds()
    table = majority_table(runs, rounds).set_index("run_id")
    assert len(table) == 4
    assert table.loc["fedsgd+cclip-1", ["first_majority", "fell", "collapsed_from"]].tolist() == [
        2,
        2,
        2,
    ]
    assert table.loc["fedsgd+cclip-2", "fell_lag"] == 1
    assert table.loc["demoa-2", "first_majority"] is pd.NA
    assert table.loc["demoa-1", "final_accuracy"] == 0.8


def test_summary_counts_falls_and_collapses_after_the_first_majority_round():
    runs, rounds = runs_and_rounds()
    summary = majority_summary(majority_table(runs, rounds), ["method"])
    fedsgd, demoa = summary.loc["fedsgd+cclip"], summary.loc["demoa"]
    assert (fedsgd["runs"], fedsgd["with_majority"], fedsgd["fell"]) == (2, 2, 2)
    assert fedsgd["fell_share"] == 1.0 and fedsgd["fell_lag"] == 0.5  # median of 0 and 1
    assert (fedsgd["collapsed"], fedsgd["collapsed_share"], fedsgd["collapse_lag"]) == (1, 0.5, 0)
    assert fedsgd["accuracy"] == pytest.approx(100 * (0.1 + 0.5) / 2)
    assert (demoa["with_majority"], demoa["fell"], demoa["collapsed"]) == (1, 0, 0)
    assert demoa["first_majority"] == 2 and math.isnan(demoa["fell_lag"])


def record(round_index: int, accuracy: float, majority: bool) -> RoundRecord:
    return RoundRecord(
        round=round_index,
        accuracy=accuracy,
        loss=1.0,
        param_norm=1.0,
        nonfinite_params=0,
        max_class_share=0.2,
        sampled=2,
        byzantine_sampled=int(majority),
        nonfinite_messages=0,
        byzantine_input_share=0.5 * majority,
        byzantine_majority=majority,
        f_assumed=0,
        precondition_held_assumed=True,
        precondition_held_actual=True,
        aggregated=True,
        collapsed=False,
        train_seconds=0.0,
        aggregate_seconds=0.0,
    )


def test_the_report_has_the_majority_section_from_real_run_folders(tmp_path):
    for method, accuracies in (("fedsgd+cclip", [0.4, 0.1, 0.1]), ("demoa", [0.2, 0.5, 0.7])):
        spec = RunSpec(
            dataset="synthetic",
            clients=10,
            rounds=3,
            participation=0.1,
            byzantine_fraction=0.2,
            attack="alie",
            method=method,
        )
        writer = RunWriter(tmp_path / "sweep" / method, spec, tensorboard=False)
        for r, accuracy in enumerate(accuracies, start=1):
            writer.write(record(r, accuracy, majority=r == 2))
        writer.close(
            RunSummary(
                final_accuracy=accuracies[-1],
                final_loss=1.0,
                collapsed=accuracies[-1] <= 0.105,
                rounds_run=3,
                byzantine_majority_rounds=1,
                seconds=0.1,
                num_classes=10,
                spec=spec.to_dict(),
            )
        )
    text = report(tmp_path / "sweep", out=tmp_path / "report").read_text()
    assert "## Byzantine-majority rounds and collapses" in text
    table = pd.read_csv(tmp_path / "report" / "majority_runs.csv").set_index("method")
    assert (
        table.loc["fedsgd+cclip", "fell"] == 2 and table.loc["fedsgd+cclip", "collapsed_from"] == 2
    )
    assert math.isnan(table.loc["demoa", "fell"])
    # method, seed, first majority, majority rounds, accuracy before, fell, lag, collapsed from,
    # lag, final accuracy
    assert "| fedsgd+cclip | 42 | 2 | 1 | 40.0 | 2 | 0 | 2 | 0 | 10.0 |" in text
    assert "| demoa | 42 | 2 | 1 | 20.0 | never |  | never |  | 70.0 |" in text
