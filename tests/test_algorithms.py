"""Server algorithms and caches against their closed forms (no training involved)."""

from __future__ import annotations

import torch

from robusttune.core.runspec import RunSpec
from robusttune.methods.algorithms import make_algorithm
from robusttune.methods.algorithms.caches import StateCache
from robusttune.problem.sampling import Sample


def _demoa(**keys):
    spec = RunSpec(
        dataset="synthetic",
        method="demoa",
        clients=4,
        participation=0.5,
        participation_mode="bernoulli",
        demoa_alpha=0.3,
        **keys,
    )
    counts = torch.ones(4)
    return spec, make_algorithm(spec, torch.zeros(3), counts)


def _round(algorithm, clients, gradients, byzantine=None):
    clients = torch.tensor(clients, dtype=torch.long)
    if byzantine is None:
        byzantine = torch.zeros(len(clients), dtype=torch.bool)
    state = algorithm.begin_round(
        Sample.of(clients, torch.as_tensor(byzantine), "cpu"), gradients, torch.zeros(3)
    )
    return algorithm.inputs(state, state.honest, torch.zeros(3))


def test_demoa_decayed_cache_equals_the_closed_form_product():
    _spec, algorithm = _demoa()
    alpha, p = 0.3, 0.5
    g0 = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    _round(algorithm, [0, 2], g0)
    # Client 0 is not sampled for 3 rounds: P(m) = prod_{s}(1 - alpha p) m = (1 - alpha p)^3 m.
    for _ in range(3):
        inputs = _round(algorithm, [1], torch.tensor([[1.0, 1.0, 1.0]]))
    first = alpha * g0[0]  # m_0 after its refresh from zero: (1 - alpha p) * 0 + alpha g
    expected = (1 - alpha * p) ** 3 * first
    assert torch.allclose(inputs.rows[0], expected, atol=1e-6)
    assert torch.allclose(inputs.rows[2], (1 - alpha * p) ** 3 * alpha * g0[1], atol=1e-6)
    assert inputs.rows.shape == (4, 3)  # DeMoA aggregates all N momenta


def test_demoa_sampled_momentum_recursion():
    _, algorithm = _demoa()
    g1 = torch.tensor([[1.0, 0.0, 0.0]])
    g2 = torch.tensor([[0.0, 2.0, 0.0]])
    _round(algorithm, [3], g1)
    inputs = _round(algorithm, [3], g2)
    c = 1 - 0.3 * 0.5
    assert torch.allclose(inputs.rows[3], c * 0.3 * g1[0] + 0.3 * g2[0])


def test_demoa_ablations_are_the_papers():
    """coefficient_swap: (1 - alpha p) -> (1 - alpha) for the sampled, unsampled momenta left as
    they are; no_decay: the sampled keep (1 - alpha p), P = id for the unsampled."""
    alpha, p = 0.3, 0.5
    _, swap = _demoa(demoa_ablation="coefficient_swap")
    _round(swap, [0, 1], torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]]))
    inputs = _round(swap, [0], torch.tensor([[0.0, 0.0, 0.0]]))
    assert torch.allclose(inputs.rows[0], torch.full((3,), (1 - alpha) * alpha))
    assert torch.allclose(inputs.rows[1], torch.full((3,), alpha * 2.0))  # untouched, not decayed
    _, no_decay = _demoa(demoa_ablation="no_decay")
    _round(no_decay, [0, 1], torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]]))
    inputs = _round(no_decay, [0], torch.tensor([[0.0, 0.0, 0.0]]))
    assert torch.allclose(inputs.rows[0], torch.full((3,), (1 - alpha * p) * alpha))
    assert torch.allclose(inputs.rows[1], torch.full((3,), alpha * 2.0))
    _, paper = _demoa()
    _round(paper, [0, 1], torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]]))
    inputs = _round(paper, [0], torch.tensor([[0.0, 0.0, 0.0]]))
    assert torch.allclose(inputs.rows[1], torch.full((3,), (1 - alpha * p) * alpha * 2.0))


def test_demoa_server_step_is_minus_eta_times_aggregate():
    _spec, algorithm = _demoa(server_lr=0.5)
    x = torch.tensor([1.0, 1.0, 1.0])
    assert torch.allclose(
        algorithm.step(x, torch.tensor([2.0, 0.0, -2.0])), torch.tensor([0.0, 1.0, 2.0])
    )


def test_fedcm_aggregates_only_the_sampled_set():
    spec = RunSpec(dataset="synthetic", method="fedcm", clients=5, demoa_alpha=0.5)
    algorithm = make_algorithm(spec, torch.zeros(2), torch.ones(5))
    inputs = _round(algorithm, [1, 4], torch.tensor([[2.0, 2.0], [4.0, 4.0]]))
    assert inputs.rows.shape == (2, 2)
    assert torch.allclose(inputs.rows, torch.tensor([[1.0, 1.0], [2.0, 2.0]]))


def test_state_cache_slots_start_as_initial_model_and_sampled_overwrite():
    spec = RunSpec(dataset="synthetic", method="swb_dm", clients=3)
    initial = torch.tensor([1.0, -1.0])
    algorithm = make_algorithm(spec, initial, torch.ones(3))
    clients = torch.tensor([2])
    byzantine = torch.tensor([True])
    states = torch.tensor([[5.0, 5.0]])
    state = algorithm.begin_round(Sample.of(clients, byzantine, "cpu"), states, initial)
    inputs = algorithm.inputs(state, state.honest, initial)
    assert torch.equal(inputs.rows, torch.tensor([[1.0, -1.0], [1.0, -1.0], [5.0, 5.0]]))
    assert inputs.byzantine_rows.tolist() == [False, False, True]


def test_bfloat16_cache_halves_memory_and_reads_float32():
    cache = StateCache(4, torch.randn(1000), "bfloat16")
    assert cache.slots.dtype == torch.bfloat16 and cache.read().dtype == torch.float32
    assert cache.slots.element_size() * cache.slots.numel() == 4 * 1000 * 2


def test_state_cache_attack_view_leaves_the_cache_untouched():
    spec = RunSpec(dataset="synthetic", method="swb_dm", clients=4, participation=0.5)
    initial = torch.tensor([1.0, 2.0, 3.0])
    algorithm = make_algorithm(spec, initial, torch.ones(4))
    before = algorithm.cache.read().clone()
    clients = torch.tensor([0, 2])
    byzantine = torch.tensor([False, True])
    states = initial + torch.tensor([[1.0, 1.0, 1.0], [5.0, 5.0, 5.0]])
    state = algorithm.begin_round(Sample.of(clients, byzantine, "cpu"), states, initial)
    view = algorithm.attack_view(state, initial)
    assert torch.equal(algorithm.cache.read(), before)
    assert torch.equal(view.rows[0], state.honest[0])  # the honest client's fresh update
    assert torch.equal(view.rows[[1, 3]], torch.zeros(2, 3))  # untouched: initial - model
    # the slot the Byzantine client is about to overwrite counts as Byzantine
    assert view.byzantine.tolist() == [False, False, True, False]


def test_aggregate_weights_auto_is_each_algorithms_paper_default():
    """FedAvg weighs by n_i (McMahan et al.); DeMoA's and FedCM's robust rules take the n
    clients' momenta one vote each, so demoa + mean is the plain mean under a skewed split."""
    assert RunSpec(method="fedavg").aggregate_weights == "samples"
    assert RunSpec(method="swb_dm").aggregate_weights == "samples"
    for method in ("demoa", "fedcm"):
        assert RunSpec(method=method).aggregate_weights == "uniform"
    assert RunSpec(method="demoa", aggregate_weights="samples").aggregate_weights == "samples"
    spec = RunSpec(
        dataset="synthetic",
        method="demoa",
        aggregator="mean",
        clients=2,
        participation=1.0,
        participation_mode="bernoulli",
        demoa_alpha=1.0,
    )
    counts = torch.tensor([1.0, 3.0])  # a Dirichlet split: client 1 holds three times the data
    algorithm = make_algorithm(spec, torch.zeros(1), counts)
    state = algorithm.begin_round(
        Sample.of(torch.tensor([0, 1]), torch.tensor([False, False]), "cpu"),
        torch.tensor([[0.0], [4.0]]),
        torch.zeros(1),
    )
    inputs = algorithm.inputs(state, state.honest, torch.zeros(1))
    assert inputs.weights is None
    from robusttune.methods.aggregators import make_rule

    mean = make_rule("mean")
    assert mean(inputs.rows, weights=inputs.weights).item() == 2.0  # not (0 + 3 * 4) / 4 = 3
    weighted = make_algorithm(spec.updated(aggregate_weights="samples"), torch.zeros(1), counts)
    state = weighted.begin_round(state.sample, torch.tensor([[0.0], [4.0]]), torch.zeros(1))
    inputs = weighted.inputs(state, state.honest, torch.zeros(1))
    assert mean(inputs.rows, weights=inputs.weights).item() == 3.0
