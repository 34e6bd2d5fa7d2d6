"""The honest input spread V = mean_{i in H} ||x_i - xbar_H||^2 (claim 7's measured momentum
variance): the formula on hand cases, no read-back beyond the host mask, the round loop's record
of it against the rule's own inputs (the cached momenta under DeMoA), its column in rounds.csv
and its mean in summary.json."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from robusttune.core.runspec import RunSpec
from robusttune.engine.input_statistics import aggregation_error, honest_input_spread
from robusttune.engine.recording import run_to_folder
from robusttune.engine.simulation import Simulation
from tests.test_host_syncs import CountReadbacks

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


def test_hand_case_plain_and_weighted():
    rows = torch.tensor([[0.0, 0.0], [2.0, 0.0], [4.0, 3.0], [math.inf, math.nan]])
    byzantine = torch.tensor([False, False, False, True])
    # honest mean (2, 1); squared distances 4 + 1, 0 + 1, 4 + 4: (5 + 1 + 8) / 3
    assert float(honest_input_spread(rows, byzantine, None)) == pytest.approx(14 / 3)
    # weights 1, 1, 2: mean (2.5, 1.5); squared distances 8.5, 2.5, 4.5: (8.5 + 2.5 + 9) / 4
    weights = torch.tensor([1.0, 1.0, 2.0, 100.0])
    assert float(honest_input_spread(rows, byzantine, weights)) == pytest.approx(5.0)


def test_undefined_without_honest_rows_zero_for_one_and_infinite_for_a_nonfinite_row():
    rows = torch.tensor([[1.0, 2.0], [5.0, -1.0], [3.0, math.nan]])
    assert honest_input_spread(rows, torch.ones(3, dtype=torch.bool), None) is None
    assert float(honest_input_spread(rows, torch.tensor([False, True, True]), None)) == 0.0
    assert float(honest_input_spread(rows, torch.tensor([False, False, False]), None)) == math.inf


def test_no_read_back_beyond_the_host_mask_like_the_aggregation_error():
    generator = torch.Generator().manual_seed(0)
    rows = torch.randn(7, 50, generator=generator)
    byzantine = torch.tensor([True, False, False, True, False, False, False])
    weights = torch.rand(7, generator=generator)
    for measure in (
        lambda: honest_input_spread(rows, byzantine, weights),
        lambda: aggregation_error(rows[0], rows, byzantine, weights),
    ):
        with CountReadbacks() as counter:
            measure()
        assert dict(counter.calls) == {"nonzero": 1}  # the host mask's, on the CPU by contract


def _spy_on_inputs(simulation: Simulation) -> list[tuple[np.ndarray, np.ndarray]]:
    """Wrap the simulation's rule: every call's (inputs as float64, their Byzantine-row mask as
    the algorithm marks it at that moment)."""
    calls, rule = [], simulation.aggregator
    algorithm = simulation.algorithm

    def spy(updates, **context):
        if algorithm.aggregates_cache:
            mask = algorithm.momenta.written_by_byzantine.numpy().copy()
        else:
            mask = simulation.byzantine.numpy().copy()
        calls.append((updates.double().numpy().copy(), mask))
        return rule(updates, **context)

    simulation.aggregator = spy
    spy.precondition = rule.precondition
    spy.needs_reference = rule.needs_reference
    return calls


def _spread(rows: np.ndarray, byzantine: np.ndarray) -> float:
    honest = rows[~byzantine]
    return float(np.mean(np.sum((honest - honest.mean(axis=0)) ** 2, axis=1)))


@pytest.mark.parametrize(
    ("method", "extra"),
    [
        ("median", {}),
        # Bernoulli p = 0.5 over a cache: the rule sees all 6 momenta, fresh and decayed
        ("demoa", {"participation_mode": "bernoulli", "participation": 0.5, "rounds": 5}),
        (
            "demoa",
            {
                "participation_mode": "bernoulli",
                "participation": 0.5,
                "rounds": 5,
                "demoa_ablation": "coefficient_swap",
            },
        ),
    ],
)
def test_the_record_is_the_spread_of_the_rules_honest_inputs(method, extra):
    spec = RunSpec(**{**FULL, **extra}, method=method, attack="alie", byzantine_fraction=2 / 6)
    simulation = Simulation(spec)
    calls = _spy_on_inputs(simulation)
    records = list(simulation)
    aggregated = [r for r in records if r.aggregated]
    assert len(calls) == len(aggregated) == len(records)
    assert all(rows.shape[0] == 6 for rows, _ in calls)
    expected = [_spread(rows, mask) for rows, mask in calls]
    measured = [r.honest_input_spread for r in records]
    assert measured == pytest.approx(expected, rel=1e-5)
    assert any(v > 0 for v in measured)
    assert simulation.summary(0.0).mean_honest_input_spread == pytest.approx(
        np.mean(expected), rel=1e-5
    )


def test_a_refused_round_still_has_its_spread():
    """Guarded Krum at n = 4, f = 1 never aggregates; its inputs were there all the same."""
    spec = RunSpec(
        **{**FULL, "clients": 4},
        method="krum",
        attack="alie",
        byzantine_fraction=0.25,
        guarded=True,
    )
    records = list(Simulation(spec))
    assert not any(r.aggregated for r in records)
    assert all(math.isfinite(r.honest_input_spread) and r.honest_input_spread > 0 for r in records)


# the running mean across a restore and the rounds.csv / summary.json columns are tested with the
# aggregation error's, in test_aggregation_error.py (ROUND_FIGURES)


def test_the_report_tabulates_the_spread_per_cell_and_counts_a_repeated_run_once(tmp_path):
    from robusttune.reports.results import report

    for ablation in ("none", "coefficient_swap"):
        spec = RunSpec(
            **{**FULL, "rounds": 2, "participation_mode": "bernoulli", "participation": 0.5},
            method="demoa",
            demoa_ablation=ablation,
            attack="alie",
            byzantine_fraction=2 / 6,
        )
        run_to_folder(spec, tmp_path / "runs" / ablation, tensorboard=False)
        if ablation == "none":  # a second sweep ran the same configuration
            run_to_folder(spec, tmp_path / "runs" / "again" / ablation, tensorboard=False)
    text = report(tmp_path / "runs", out=tmp_path / "report").read_text()
    assert "1 more run(s) repeated a configuration" in text
    assert "## Spread of the honest inputs the rule aggregated" in text
    table = pd.read_csv(tmp_path / "report" / "honest_input_spread.csv")
    # the ablated run is labelled by its ablation, so method alone tells the two apart
    assert sorted(table["method"]) == ["demoa", "demoa[coefficient_swap]"]
    assert (table["runs"] == 1).all()
    spreads = {}
    for ablation, label in (("none", "demoa"), ("coefficient_swap", "demoa[coefficient_swap]")):
        summary = json.loads((tmp_path / "runs" / ablation / "summary.json").read_text())
        spreads[label] = summary["mean_honest_input_spread"]
    assert dict(zip(table["method"], table["mean"])) == pytest.approx(spreads)
