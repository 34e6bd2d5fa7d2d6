"""CCLIP's radius against its inputs' scale, end to end: breakdown.yaml's DeMoA+CCLIP cell (N = 20,
p = 0.5 fixed, 30 rounds) with 2 Byzantine clients sending IPM at eps = 1000. The fixed radius
tau = 10 lets each huge momentum pull 10 / n per round, far more than the honest momenta's own
length, and the run collapses; the radius relative to the median distance (the default) cuts them
to an honest row's length (tau 1) or twice it (tau 2, the default) and the run trains. Verdicts
only (collapsed or above chance)."""

from __future__ import annotations

import pytest

from robusttune.core.runspec import RunSpec
from robusttune.engine.simulation import Simulation

MAP_CELL = {
    "dataset": "digits",
    "model": "mlp",
    "clients": 20,
    "local_epochs": 1,
    "lr": 0.05,
    "trainer": "sequential",
    "method": "demoa+cclip",
    "rounds": 30,
    "server_lr": 0.5,
    "batch_size": 16,
    "eval_every": 100,
    "seed": 42,
    "participation": 0.5,
    "byzantine_fraction": 0.1,
    "attack": "ipm",
    "attack_strength": 1000,
}


@pytest.mark.parametrize(
    ("scale", "tau", "survives"),
    [("absolute", 10.0, False), ("median_distance", 1.0, True), ("median_distance", 2.0, True)],
)
def test_demoa_cclip_under_a_huge_ipm_survives_only_with_the_relative_radius(scale, tau, survives):
    sim = Simulation(RunSpec(**MAP_CELL, cclip_scale=scale, cclip_tau=tau))
    records = list(sim)
    summary = sim.summary(0.0)
    if survives:  # measured 0.65 at tau 1, 0.60 at tau 2 (clean 0.86); chance is 0.1
        assert not summary.collapsed and records[-1].accuracy > 0.3
    else:  # measured 0.01
        assert summary.collapsed
