"""The aggregation error ||Agg - xbar_H||_2 (SWB-DM's Figure 2 quantity): the formula on hand
cases, the round loop's record of it against the rule's own inputs and output, its column in
rounds.csv and its mean in summary.json."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from robusttune.core.runspec import RunSpec
from robusttune.engine.input_statistics import aggregation_error
from robusttune.engine.recording import run_to_folder
from robusttune.engine.simulation import Simulation
from robusttune.problem.sampling import byzantine_clients

FULL = {
    "dataset": "synthetic",
    "model": "mlp",
    "clients": 6,
    "participation": 1.0,
    "rounds": 3,
    "local_epochs": 1,
    "synthetic_samples": 300,
    "aggregate_weights": "uniform",
}


def test_hand_case_plain_and_weighted_mean():
    rows = torch.tensor([[0.0, 0.0], [2.0, 0.0], [math.inf, math.nan]])
    byzantine = torch.tensor([False, False, True])
    aggregate = torch.tensor([1.0, 1.0])
    # benign mean (1, 0): the error is the distance from (1, 1), 1; the Byzantine row's inf and
    # NaN never reach it
    assert float(aggregation_error(aggregate, rows, byzantine, None)) == pytest.approx(1.0)
    # weights 1 and 3 on the honest rows: benign mean (1.5, 0), error sqrt(0.5^2 + 1^2)
    weights = torch.tensor([1.0, 3.0, 100.0])
    assert float(aggregation_error(aggregate, rows, byzantine, weights)) == pytest.approx(
        math.sqrt(1.25)
    )


def test_undefined_without_honest_rows_and_infinite_for_a_nonfinite_aggregate():
    rows = torch.ones(3, 4)
    assert aggregation_error(torch.zeros(4), rows, torch.ones(3, dtype=torch.bool), None) is None
    broken = torch.tensor([0.0, math.nan, 0.0, 0.0])
    value = aggregation_error(broken, rows, torch.tensor([False, True, False]), None)
    assert float(value) == math.inf


def _spy_on_rule(simulation: Simulation) -> list[tuple[np.ndarray, np.ndarray]]:
    """Wrap the simulation's rule: every call's (inputs, output) as float64 arrays."""
    calls, rule = [], simulation.aggregator

    def spy(updates, **context):
        out = rule(updates, **context)
        calls.append((updates.double().numpy().copy(), out.double().numpy().copy()))
        return out

    simulation.aggregator = spy
    spy.precondition = rule.precondition
    spy.needs_reference = rule.needs_reference
    return calls


@pytest.mark.parametrize("method", ["median", "swb", "swb_dm"])
def test_the_record_is_the_rule_output_against_its_honest_inputs(method):
    """Full participation: the rule's rows are the N clients in order (fedavg's sample, or
    swb_dm's cache, every slot rewritten every round), the honest ones those
    byzantine_clients(spec) does not mark."""
    spec = RunSpec(
        **FULL, method=method, attack="ipm_swbdm", byzantine_fraction=2 / 6, attack_scope="sample"
    )
    simulation = Simulation(spec)
    calls = _spy_on_rule(simulation)
    records = list(simulation)
    honest = ~byzantine_clients(spec).numpy()
    assert honest.sum() == 4 and len(calls) == len(records) == 3
    expected = [float(np.linalg.norm(out - rows[honest].mean(axis=0))) for rows, out in calls]
    measured = [r.aggregation_error for r in records]
    assert measured == pytest.approx(expected, rel=1e-5)
    assert all(e > 0 for e in measured)  # an attacked robust rule is not the benign mean
    assert simulation.summary(0.0).mean_aggregation_error == pytest.approx(
        np.mean(expected), rel=1e-5
    )


def test_the_mean_without_attack_is_the_benign_mean():
    records = list(Simulation(RunSpec(**{**FULL, "aggregate_weights": "samples"}, method="fedavg")))
    assert [r.aggregation_error for r in records] == pytest.approx([0.0] * 3, abs=1e-5)


def test_a_refused_round_has_no_error():
    """Guarded Krum at n = 4, f = 1 (needs n > 2f + 2) never aggregates."""
    spec = RunSpec(
        **{**FULL, "clients": 4},
        method="krum",
        attack="alie",
        byzantine_fraction=0.25,
        guarded=True,
    )
    simulation = Simulation(spec)
    records = list(simulation)
    assert not any(r.aggregated for r in records)
    assert all(math.isnan(r.aggregation_error) for r in records)
    assert math.isnan(simulation.summary(0.0).mean_aggregation_error)


# the two per-round figures on the rule's inputs share their bookkeeping: a running mean that a
# checkpoint carries, a rounds.csv column, its mean in summary.json and in the runs table
ROUND_FIGURES = ("aggregation_error", "honest_input_spread")


@pytest.mark.parametrize("figure", ROUND_FIGURES)
def test_a_restored_simulation_keeps_the_running_mean(figure):
    spec = RunSpec(
        **{**FULL, "rounds": 4}, method="median", attack="alie", byzantine_fraction=2 / 6
    )
    whole = Simulation(spec)
    list(whole)
    first = Simulation(spec)
    first.step(), first.step()
    second = Simulation(spec)
    second.load_state_dict(first.state_dict())
    list(second)
    mean = f"mean_{figure}"
    assert getattr(second.summary(0.0), mean) == getattr(whole.summary(0.0), mean)
    assert math.isfinite(getattr(whole.summary(0.0), mean))


@pytest.mark.parametrize("figure", ROUND_FIGURES)
def test_a_run_folder_has_the_column_and_the_summary_its_mean(tmp_path, figure):
    from robusttune.reports.results import load_runs

    spec = RunSpec(**FULL, method="swb", attack="alie_swbdm", byzantine_fraction=2 / 6)
    run_to_folder(spec, tmp_path / "run", tensorboard=False)
    with (tmp_path / "run" / "rounds.csv").open(newline="") as handle:
        column = [float(row[figure]) for row in csv.DictReader(handle)]
    assert len(column) == 3 and all(math.isfinite(v) and v > 0 for v in column)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary[f"mean_{figure}"] == pytest.approx(sum(column) / 3, rel=1e-9)
    assert load_runs(tmp_path)[f"mean_{figure}"].tolist() == pytest.approx(
        [sum(column) / 3], rel=1e-9
    )


def _runs_with_errors() -> tuple[pd.DataFrame, pd.DataFrame]:
    """Made-up runs (3 seeds per cell) and their rounds: per run, rounds with errors e - d, e,
    e + d and one NaN round (a refusal), so the run's mean is e; e = E0 + C sqrt(beta) + s,
    seed offset s in {-0.1, 0, 0.1}."""
    runs, rounds = [], []
    truth = {
        ("median", "alie"): (1.0, 2.0),
        ("swb", "alie"): (1.5, 3.0),
        ("median", "ipm"): (1.0, 5.0),
        ("swb", "ipm"): (1.5, 6.0),
    }
    cells = [(m, "none", 0.0) for m in ("median", "swb")] + [
        (m, a, b) for (m, a) in truth for b in (0.1, 0.2, 0.3)
    ]
    for method, attack, beta in cells:
        e0, c = truth[(method, "alie")] if attack == "none" else truth[(method, attack)]
        for seed, offset in zip((1, 2, 3), (-0.1, 0.0, 0.1)):
            run_id = f"{method}-{attack}-{beta}-{seed}"
            error = e0 + c * math.sqrt(beta) + offset
            runs.append(
                {
                    "run_id": run_id,
                    "method": method,
                    "attack": attack,
                    "attack_strength": None,
                    "byzantine_fraction": beta,
                    "seed": seed,
                }
            )
            rounds += [
                {"run_id": run_id, "round": r, "aggregation_error": v}
                for r, v in enumerate((error - 0.05, error, error + 0.05, math.nan), 1)
            ]
    return pd.DataFrame(runs), pd.DataFrame(rounds)


def test_tables_average_seeds_and_the_fit_recovers_the_bound():
    from robusttune.reports.aggregation import (
        aggregation_error_table,
        run_aggregation_errors,
        sqrt_fit_table,
    )

    runs, rounds = _runs_with_errors()
    scored = run_aggregation_errors(runs, rounds)
    table = aggregation_error_table(scored)
    cell = table.loc[("swb", "ipm", 0.2)]
    assert cell["mean"] == pytest.approx(1.5 + 6.0 * math.sqrt(0.2))
    assert cell["std"] == pytest.approx(0.1) and cell["runs"] == 3
    assert cell["max"] - cell["min"] == pytest.approx(0.2)
    fits = sqrt_fit_table(scored)
    # the ipm curves start from the clean runs, which lie on the alie truth: same E0 by design
    for (method, attack), (e0, c) in {
        ("median", "ipm"): (1.0, 5.0),
        ("swb", "ipm"): (1.5, 6.0),
        ("swb", "alie"): (1.5, 3.0),
    }.items():
        assert fits.loc[(method, attack), "E0"] == pytest.approx(e0)
        assert fits.loc[(method, attack), "C"] == pytest.approx(c)
        assert fits.loc[(method, attack), "points"] == 4


def test_two_points_are_not_fitted():
    from robusttune.reports.aggregation import run_aggregation_errors, sqrt_fit_table

    runs, rounds = _runs_with_errors()
    short = runs[runs["byzantine_fraction"].isin([0.0, 0.1])]
    assert sqrt_fit_table(run_aggregation_errors(short, rounds)).empty


def test_the_report_draws_figure_two_from_the_recorded_error(tmp_path):
    from robusttune.reports.results import report

    for beta in (0.0, 1 / 6, 2 / 6):
        spec = RunSpec(
            **{**FULL, "rounds": 2},
            method="swb",
            attack="alie_swbdm" if beta else "none",
            byzantine_fraction=beta,
        )
        run_to_folder(spec, tmp_path / "runs" / f"b{beta:.2f}", tensorboard=False)
    text = report(tmp_path / "runs", out=tmp_path / "report").read_text()
    assert "## Figure 2: aggregation error against corruption" in text
    assert "## Test error against corruption" in text
    for name in (
        "aggregation_error_vs_corruption.png",
        "test_error_vs_corruption.png",
        "aggregation_error.csv",
        "aggregation_error_fit.csv",
    ):
        assert (tmp_path / "report" / name).stat().st_size > 0, name
    csv_list = next(line for line in text.splitlines() if line.startswith("CSV files beside"))
    assert "aggregation_error.csv" in csv_list and "aggregation_error_fit.csv" in csv_list
    table = pd.read_csv(tmp_path / "report" / "aggregation_error.csv")
    assert len(table) == 3 and (table["runs"] == 1).all() and (table["mean"] > 0).all()
