"""Byz-VR-MARINA-PP as DeMoA's comparison ran it: the paper's rule for p, the eq. (10) variant on
momentum (clipped differences, lambda a multiple of ||g||) and FedAvgM, each against a round
sequence computed by hand; a restored eq. (10) run continues bit for bit."""

from __future__ import annotations

import math

import pytest
import torch

from robusttune.core.runspec import RunSpec
from robusttune.engine.simulation import Simulation, load_checkpoint
from robusttune.methods.aggregators import make_rule
from robusttune.methods.algorithms import (
    ClippedMomentumMarina,
    RoundPlan,
    make_algorithm,
    marina_probability,
)
from robusttune.problem.sampling import Sample

EQ10 = {"dataset": "synthetic", "method": "byz_vr_marina_pp", "marina_variant": "clipped_momentum"}


def _round(algorithm, rule, model, clients, local, *, plan=None, messages=None, byzantine=None):
    """One round through the protocol; ``messages`` replaces what is sent. (new model, inputs)."""
    clients = torch.tensor(clients, dtype=torch.long)
    flags = (
        torch.zeros(len(clients), dtype=torch.bool)
        if byzantine is None
        else torch.tensor(byzantine)
    )
    state = algorithm.begin_round(Sample.of(clients, flags, "cpu"), local, model, plan)
    inputs = algorithm.inputs(state, state.honest if messages is None else messages, model)
    previous = inputs.previous if inputs.previous is not None else algorithm.previous(model)
    aggregate = rule(inputs.rows, f=0, weights=inputs.weights, previous=previous)
    return algorithm.step(model, aggregate, state), inputs


def test_marina_p_is_the_papers_min_of_c_over_n_b_over_m_and_zeta_over_d():
    """N = 25 clients of 1437 / 25 = 57.48 samples, b = 16: b/m = 0.2784. p = 0.5 samples
    round(12.5) = 12 clients (C/n = 0.48), so p = b/m, the issue's 'about 0.28'; p = 0.1
    samples 2 (0.08 < b/m); rand_k keeping 5% gives 0.05; an explicit marina_p is kept."""
    counts = torch.full((25,), 1437 / 25)
    spec = RunSpec(method="byz_vr_marina_pp", clients=25, participation=0.5, batch_size=16)
    assert spec.marina_p is None  # resolved from the clients' data when the run starts
    assert marina_probability(spec, counts) == pytest.approx(16 / 57.48)
    assert round(marina_probability(spec, counts), 2) == 0.28
    assert marina_probability(spec.updated(participation=0.1), counts) == pytest.approx(0.08)
    assert (
        marina_probability(
            spec.updated(marina_compressor="rand_k", marina_compress_ratio=0.05), counts
        )
        == 0.05
    )
    assert marina_probability(spec.updated(marina_p=0.5), counts) == 0.5
    # unequal sizes (a Dirichlet split): m is their mean, (10 + 30 + 80) / 3 = 40 -> 16/40
    three = RunSpec(method="byz_vr_marina_pp", clients=3, participation=1.0, batch_size=16)
    assert marina_probability(three, torch.tensor([10.0, 30.0, 80.0])) == pytest.approx(0.4)
    algorithm = make_algorithm(spec, torch.zeros(2), counts)
    assert algorithm.full_probability == pytest.approx(16 / 57.48)


def test_the_clip_multiplier_defaults_to_the_authors_level_in_both_variants():
    """The authors' code clips at 1 x ||g^k||: eq. (10) takes 1, Algorithm 1's
    alpha ||x^{k+1} - x^k|| = alpha gamma ||g^k|| takes 10 (1 x ||g^k|| at gamma 0.1)."""
    vr = make_algorithm(RunSpec(method="byz_vr_marina_pp"), torch.zeros(2), torch.ones(20))
    eq10 = make_algorithm(RunSpec(**EQ10), torch.zeros(2), torch.ones(20))
    assert (vr.clip_multiplier, eq10.clip_multiplier) == (10.0, 1.0)
    assert isinstance(eq10, ClippedMomentumMarina) and not isinstance(vr, ClippedMomentumMarina)
    given = make_algorithm(
        RunSpec(**EQ10, marina_clip_multiplier=0.1), torch.zeros(2), torch.ones(20)
    )
    assert given.clip_multiplier == 0.1


def test_eq10_two_rounds_full_momenta_then_clipped_momentum_difference():
    """alpha = 0.5, gamma = 0.5, multiplier 1, mean. Round 1 (full): m = 0.5 g = (1, 0), (0, 1);
    g0 = (0.5, 0.5), x1 = -0.5 g0 = (-0.25, -0.25). Round 2 (S = {1}, gradient (6, 8)):
    m_1 = 0.5 (0, 1) + 0.5 (6, 8) = (3, 4.5); m_1 - g0 = (2.5, 4), norm sqrt(22.25);
    lambda = ||g0|| = sqrt(0.5); g1 = g0 + (2.5, 4) sqrt(0.5) / sqrt(22.25), x2 = x1 - 0.5 g1.
    Client 0 was not sampled: its momentum stays (1, 0)."""
    spec = RunSpec(
        **EQ10,
        aggregator="mean",
        clients=2,
        server_lr=0.5,
        demoa_alpha=0.5,
        participation=0.5,
        marina_clip_multiplier=1.0,
    )
    algorithm, mean = make_algorithm(spec, torch.zeros(2), torch.ones(2)), make_rule("mean")
    generator = torch.Generator().manual_seed(0)
    plan = algorithm.plan(torch.tensor([1]), generator)
    assert plan.full and plan.clients.tolist() == [0, 1]
    x1, inputs = _round(
        algorithm, mean, torch.zeros(2), [0, 1], torch.tensor([[2.0, 0.0], [0.0, 2.0]]), plan=plan
    )
    assert torch.allclose(inputs.rows, torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    assert torch.allclose(x1, torch.tensor([-0.25, -0.25]))
    # no coin after round 1: every later plan is the participation draw
    assert not any(algorithm.plan(torch.tensor([1]), generator).full for _ in range(200))
    x2, inputs = _round(
        algorithm, mean, x1, [1], torch.tensor([[6.0, 8.0]]), plan=RoundPlan(torch.tensor([1]))
    )
    clipped = torch.tensor([2.5, 4.0]) * math.sqrt(0.5) / math.sqrt(22.25)
    assert torch.allclose(inputs.rows[0], clipped, atol=1e-6)
    assert inputs.previous is not None and torch.equal(inputs.previous, torch.zeros(2))
    g1 = torch.tensor([0.5, 0.5]) + clipped
    assert torch.allclose(algorithm.estimate, g1, atol=1e-6)
    assert torch.allclose(x2, x1 - 0.5 * g1, atol=1e-6)
    assert torch.allclose(algorithm.momenta.read(), torch.tensor([[1.0, 0.0], [3.0, 4.5]]))


@pytest.mark.parametrize("rule", ["mean", "cclip", "geometric_median", "krum"])
def test_eq10_all_byzantine_round_moves_g_by_at_most_lambda(rule):
    """After an honest full round g0 = 0.1 (1, 0) (alpha = 0.1, gradients (1, 0)), both sampled
    clients are Byzantine and send huge or infinite momenta: every input is clipped to
    lambda = 2 ||g0|| = 0.2, so g moves by at most 0.2 and x by at most gamma 0.2 from the step
    on g0; each Byzantine client's own momentum is the honest (1 - alpha) m + alpha g."""
    spec = RunSpec(
        **EQ10,
        aggregator=rule,
        clients=4,
        server_lr=0.5,
        participation=0.5,
        byzantine_fraction=0.5,
        attack="ipm",
        marina_clip_multiplier=2.0,
    )
    byzantine = torch.tensor([False, True, False, True])
    algorithm = make_algorithm(spec, torch.zeros(2), torch.ones(4), byzantine)
    agg = make_rule(rule, **spec.aggregator_params())
    x1, _ = _round(
        algorithm,
        agg,
        torch.zeros(2),
        [0, 1, 2, 3],
        torch.tensor([[1.0, 0.0]] * 4),
        plan=RoundPlan(torch.arange(4), full=True),
        byzantine=byzantine.tolist(),
    )
    g0 = algorithm.estimate.clone()
    assert torch.allclose(g0, torch.tensor([0.1, 0.0]))
    honest = torch.tensor([[0.3, 0.3], [0.3, 0.3]])
    attack = torch.tensor([[1e6, -1e6], [float("inf"), 0.0]])
    x2, inputs = _round(
        algorithm,
        agg,
        x1,
        [1, 3],
        honest,
        plan=RoundPlan(torch.tensor([1, 3])),
        messages=attack,
        byzantine=[True, True],
    )
    assert bool(torch.isfinite(x2).all())
    assert torch.linalg.vector_norm(inputs.rows, dim=1).max() <= 0.2 + 1e-6
    assert torch.linalg.vector_norm(algorithm.estimate - g0) <= 0.2 + 1e-6
    assert torch.linalg.vector_norm(x2 - (x1 - 0.5 * g0)) <= 0.5 * 0.2 + 1e-6
    own = algorithm.byzantine_momenta.read(torch.tensor([1, 3]))
    assert torch.allclose(own, 0.9 * torch.tensor([0.1, 0.0]) + 0.1 * honest)


def test_fedavgm_is_server_momentum_over_the_rounds_aggregate():
    """alpha = 0.5, eta = 0.5, mean. Round 1: Agg = (1, 1), m = 0.5 (1, 1), x1 = (-0.25, -0.25).
    Round 2: Agg = (4, -2), m = 0.5 (0.5, 0.5) + 0.5 (4, -2) = (2.25, -0.75),
    x2 = x1 - 0.5 m = (-1.375, 0.125). FedSGD would step on the aggregate alone."""
    spec = RunSpec(dataset="synthetic", method="fedavgm", clients=3, server_lr=0.5, demoa_alpha=0.5)
    assert (spec.algorithm, spec.aggregator, spec.aggregate_weights) == (
        "fedavgm",
        "mean",
        "uniform",
    )
    assert RunSpec(method="fedavgm", aggregator="cclip").method == "fedavgm+cclip"
    algorithm, mean = make_algorithm(spec, torch.zeros(2), torch.ones(3)), make_rule("mean")
    x1, _ = _round(algorithm, mean, torch.zeros(2), [0, 1], torch.tensor([[2.0, 0.0], [0.0, 2.0]]))
    assert torch.allclose(x1, torch.tensor([-0.25, -0.25]))
    x2, _ = _round(algorithm, mean, x1, [2], torch.tensor([[4.0, -2.0]]))
    assert torch.allclose(x2, torch.tensor([-1.375, 0.125]))
    restored = make_algorithm(spec, torch.zeros(2), torch.ones(3))
    restored.load_state_dict(algorithm.state_dict())
    assert torch.equal(restored.server_momentum, torch.tensor([2.25, -0.75]))


@pytest.mark.parametrize("extra", [{"marina_variant": "clipped_momentum"}, {"method": "fedavgm"}])
def test_restored_eq10_and_fedavgm_runs_continue_bit_for_bit(extra, tmp_path):
    spec = RunSpec.from_dict(
        {
            "dataset": "synthetic",
            "model": "mlp",
            "clients": 8,
            "rounds": 4,
            "participation": 0.5,
            "synthetic_samples": 400,
            "method": "byz_vr_marina_pp",
            "attack": "gaussian",
            "byzantine_fraction": 0.25,
            **extra,
        }
    )
    whole = Simulation(spec)
    reference = [whole.step().accuracy for _ in range(4)]
    first = Simulation(spec)
    first.step(), first.step()
    torch.save(first.state_dict(), tmp_path / "simulation.pt")
    resumed = Simulation(spec)
    resumed.load_state_dict(load_checkpoint(tmp_path / "simulation.pt"))
    assert [resumed.step().accuracy for _ in range(2)] == reference[2:]
    assert torch.equal(resumed.params, whole.params)


@pytest.mark.parametrize(
    ("ablation", "second_slot"), [("coefficient_swap", [4.0, 4.0]), ("no_decay", [5.0, 4.0])]
)
def test_which_ablation_is_mifa(ablation, second_slot):
    """alpha = 1, mean, N = 2, client 0 sampled twice (p = 1/2), gradients (2, 0) then (4, 4).
    MIFA keeps each client's latest gradient: coefficient_swap (1 - alpha = 0) does, slot 0 =
    (4, 4). no_decay keeps DeMoA's 1 - alpha p = 1/2: slot 0 = (2, 0) / 2 + (4, 4) = (5, 4)."""
    spec = RunSpec(
        dataset="synthetic",
        method="demoa",
        aggregator="mean",
        clients=2,
        participation=0.5,
        demoa_alpha=1.0,
        demoa_ablation=ablation,
    )
    algorithm, mean = make_algorithm(spec, torch.zeros(2), torch.ones(2)), make_rule("mean")
    x1, _ = _round(algorithm, mean, torch.zeros(2), [0], torch.tensor([[2.0, 0.0]]))
    assert torch.allclose(algorithm.momenta.read()[0], torch.tensor([2.0, 0.0]))
    _round(algorithm, mean, x1, [0], torch.tensor([[4.0, 4.0]]))
    assert torch.allclose(algorithm.momenta.read(), torch.tensor([second_slot, [0.0, 0.0]]))
