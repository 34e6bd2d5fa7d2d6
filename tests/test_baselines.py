"""DeMoA's comparison (arXiv 2509.02970, experiments): FedAvg as FedSGD, client momenta over the sample (`fedcm`) and
as Xu et al. publish it, and Byz-VR-MARINA-PP, each against a two-round sequence computed by
hand (numbers a reader can check on paper)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from robusttune.core.runspec import RunSpec
from robusttune.methods.aggregators import make_rule
from robusttune.methods.algorithms import RoundPlan, clip_rows, make_algorithm
from robusttune.problem.sampling import Sample
from robusttune.problem.training import client_gradients


def _sample(clients, byzantine=None):
    clients = torch.tensor(clients, dtype=torch.long)
    flags = (
        torch.zeros(len(clients), dtype=torch.bool)
        if byzantine is None
        else torch.tensor(byzantine)
    )
    return Sample.of(clients, flags, "cpu")


def _round(algorithm, rule, model, clients, local, *, plan=None, messages=None, byzantine=None):
    """One round through the algorithm's protocol with ``local`` as what the clients computed;
    ``messages`` replaces what is sent (the Byzantine rows). Returns (new model, inputs)."""
    state = algorithm.begin_round(_sample(clients, byzantine), local, model, plan)
    inputs = algorithm.inputs(state, state.honest if messages is None else messages, model)
    previous = inputs.previous if inputs.previous is not None else algorithm.previous(model)
    aggregate = rule(inputs.rows, f=0, weights=inputs.weights, previous=previous)
    return algorithm.step(model, aggregate, state), inputs


def test_fedsgd_is_one_gradient_step_on_the_aggregate():
    """x1 = 0 - 0.5 mean([2, 0], [0, 2]) = [-0.5, -0.5]; x2 = x1 - 0.5 [4, -2] = [-2.5, 0.5]."""
    spec = RunSpec(dataset="synthetic", method="fedsgd", clients=3, server_lr=0.5)
    algorithm, mean = make_algorithm(spec, torch.zeros(2), torch.ones(3)), make_rule("mean")
    x1, inputs = _round(
        algorithm, mean, torch.zeros(2), [0, 1], torch.tensor([[2.0, 0.0], [0.0, 2.0]])
    )
    assert torch.allclose(x1, torch.tensor([-0.5, -0.5])) and inputs.rows.shape == (2, 2)
    x2, _ = _round(algorithm, mean, x1, [2], torch.tensor([[4.0, -2.0]]))
    assert torch.allclose(x2, torch.tensor([-2.5, 0.5]))
    assert not algorithm.trains_locally and spec.aggregate_weights == "uniform"


def test_fedcm_as_demoa_runs_it_two_rounds():
    """alpha = 0.5, eta = 1. Round 1, S = {0, 1}: m0 = 0.5 [2, 2] = [1, 1], m1 = [2, 2],
    x1 = -mean = [-1.5, -1.5]. Round 2, S = {0}: m0 = 0.5 [1, 1] + 0.5 [0, 2] = [0.5, 1.5] is the
    only input, x2 = [-2, -3]; m1 stays [2, 2] (no decay, no cache in the rule's input)."""
    spec = RunSpec(dataset="synthetic", method="fedcm", clients=2, demoa_alpha=0.5, server_lr=1.0)
    algorithm, mean = make_algorithm(spec, torch.zeros(2), torch.ones(2)), make_rule("mean")
    x1, _ = _round(algorithm, mean, torch.zeros(2), [0, 1], torch.tensor([[2.0, 2.0], [4.0, 4.0]]))
    assert torch.allclose(x1, torch.tensor([-1.5, -1.5]))
    x2, inputs = _round(algorithm, mean, x1, [0], torch.tensor([[0.0, 2.0]]))
    assert torch.allclose(inputs.rows, torch.tensor([[0.5, 1.5]]))
    assert torch.allclose(x2, torch.tensor([-2.0, -3.0]))
    assert torch.allclose(algorithm.momenta.read()[1], torch.tensor([2.0, 2.0]))


def _linear():
    """logits = W x with W in R^{2x1}, flat params [w0, w1]; one sample x = 1, y = 0, so the
    cross-entropy gradient is [p0 - 1, p1] with p = softmax(W)."""
    return nn.Linear(1, 2, bias=False), [(torch.tensor([[1.0]]), torch.tensor([0]))]


def test_fedcm_xu_two_rounds_of_local_steps_on_the_server_momentum():
    """alpha = 0.5, eta_l = 1, eta_g = 1, K = 1 (one sample, one epoch, batch 1), Delta_0 = 0.
    Round 1: g = [-0.5, 0.5] at W = 0, y = -eta_l alpha g = [0.25, -0.25], x1 = y,
    Delta_1 = -(y - x0) / (eta_l K) = [-0.25, 0.25].
    Round 2: p0 = sigmoid(0.5) at W = x1, g = [p0 - 1, 1 - p0], v = 0.5 g + 0.5 Delta_1,
    x2 = x1 - v, Delta_2 = v."""
    spec = RunSpec(
        dataset="synthetic",
        method="fedcm_xu",
        clients=1,
        participation=1.0,
        demoa_alpha=0.5,
        lr=1.0,
        local_epochs=1,
        batch_size=1,
    )
    net, data = _linear()
    algorithm, mean = make_algorithm(spec, torch.zeros(2), torch.ones(1)), make_rule("mean")
    x = torch.zeros(2)
    for expected_x, expected_delta in _fedcm_xu_by_hand():
        plan = algorithm.plan(torch.tensor([0]), torch.Generator().manual_seed(0))
        local = algorithm.local_work(plan, net, x, data, [0], "sequential")
        x, _ = _round(algorithm, mean, x, [0], local, plan=plan)
        assert torch.allclose(x, expected_x, atol=1e-6)
        assert torch.allclose(algorithm.delta, expected_delta, atol=1e-6)


def _fedcm_xu_by_hand():
    x1, delta1 = torch.tensor([0.25, -0.25]), torch.tensor([-0.25, 0.25])
    p0 = 1.0 / (1.0 + math.exp(-0.5))  # softmax([0.25, -0.25])[0]
    g = torch.tensor([p0 - 1.0, 1.0 - p0])
    v = 0.5 * g + 0.5 * delta1
    return [(x1, delta1), (x1 - v, v)]


def test_fedcm_xu_with_alpha_one_is_fedavg_with_plain_sgd():
    spec = RunSpec(
        dataset="synthetic",
        method="fedcm_xu",
        clients=1,
        demoa_alpha=1.0,
        lr=1.0,
        local_epochs=2,
        batch_size=1,
        participation=1.0,
    )
    net, data = _linear()
    algorithm = make_algorithm(spec, torch.zeros(2), torch.ones(1))
    algorithm.delta = torch.tensor([5.0, -5.0])  # ignored when alpha = 1
    local = algorithm.local_work(
        RoundPlan(torch.tensor([0])), net, torch.zeros(2), data, [0], "sequential"
    )
    w = torch.zeros(2)
    for _ in range(2):  # two plain SGD steps by hand
        p0 = torch.softmax(w, 0)[0]
        w = w - torch.stack([p0 - 1.0, 1.0 - p0])
    assert torch.allclose(local[0], w, atol=1e-6)


def test_byz_vr_marina_pp_two_rounds_full_then_clipped_difference():
    """gamma = 0.5, alpha_lambda = 1. Round 1 (the first is full): g0 = mean([2, 0], [0, 2]) =
    [1, 1], x1 = -0.5 g0 = [-0.5, -0.5]. Round 2 (partial, S = {1}): Delta = [3, 4] (norm 5),
    lambda = ||x1 - x0|| = sqrt(0.5), clip = [3, 4] sqrt(0.5) / 5, g1 = g0 + clip,
    x2 = x1 - 0.5 g1."""
    spec = RunSpec(
        dataset="synthetic",
        method="byz_vr_marina_pp",
        aggregator="mean",
        clients=2,
        server_lr=0.5,
        marina_p=0.5,
        participation=0.5,
        marina_clip_multiplier=1.0,
    )
    algorithm, mean = make_algorithm(spec, torch.zeros(2), torch.ones(2)), make_rule("mean")
    generator = torch.Generator().manual_seed(0)
    plan = algorithm.plan(torch.tensor([1]), generator)
    assert plan.full and plan.clients.tolist() == [0, 1]  # g is unknown before a full round
    x1, _ = _round(
        algorithm, mean, torch.zeros(2), [0, 1], torch.tensor([[2.0, 0.0], [0.0, 2.0]]), plan=plan
    )
    assert torch.allclose(x1, torch.tensor([-0.5, -0.5]))
    partial = RoundPlan(torch.tensor([1]))
    x2, inputs = _round(algorithm, mean, x1, [1], torch.tensor([[3.0, 4.0]]), plan=partial)
    clipped = torch.tensor([3.0, 4.0]) * math.sqrt(0.5) / 5.0
    assert torch.allclose(inputs.rows[0], clipped, atol=1e-6)
    g1 = torch.tensor([1.0, 1.0]) + clipped
    assert torch.allclose(algorithm.estimate, g1, atol=1e-6)
    assert torch.allclose(x2, x1 - 0.5 * g1, atol=1e-6)
    assert torch.equal(algorithm.anchor, x1)


@pytest.mark.parametrize("rule", ["mean", "cclip", "geometric_median", "krum"])
def test_an_all_byzantine_round_moves_the_model_by_at_most_the_clipping_bound(rule):
    """Malinovsky et al.'s claim: clipping bounds the harm even when every sampled client is
    Byzantine. After an honest full round (g0 = [1, 0], x1 = [-0.5, 0], so lambda = 0.5), both
    sampled clients are Byzantine and send huge or non-finite differences: g moves by at most
    lambda and the model by at most gamma lambda from the step it would have taken on g0."""
    spec = RunSpec(
        dataset="synthetic",
        method="byz_vr_marina_pp",
        aggregator=rule,
        clients=4,
        server_lr=0.5,
        participation=0.5,
        byzantine_fraction=0.5,
        attack="ipm",
        marina_clip_multiplier=1.0,
    )
    algorithm = make_algorithm(
        spec, torch.zeros(2), torch.ones(4), torch.tensor([False, True, False, True])
    )
    agg = make_rule(rule, **spec.aggregator_params())
    x1, _ = _round(
        algorithm,
        agg,
        torch.zeros(2),
        [0, 1, 2, 3],
        torch.tensor([[1.0, 0.0]] * 4),
        plan=RoundPlan(torch.arange(4), full=True),
    )
    g0, lam, gamma = algorithm.estimate.clone(), 0.5, 0.5
    honest = torch.tensor([[0.1, 0.1], [0.1, 0.1]])
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
    assert torch.linalg.vector_norm(inputs.rows, dim=1).max() <= lam + 1e-6
    assert torch.linalg.vector_norm(algorithm.estimate - g0) <= lam + 1e-6
    assert torch.linalg.vector_norm(x2 - (x1 - gamma * g0)) <= gamma * lam + 1e-6


def test_clip_rows_bounds_every_row_and_keeps_short_ones():
    rows = torch.tensor([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0], [float("nan"), 1.0], [3e38, 3e38]])
    out = clip_rows(rows, 1.0)
    assert torch.allclose(out[0], torch.tensor([0.6, 0.8]))
    assert torch.equal(out[1], rows[1]) and torch.equal(out[2], rows[2])
    assert torch.equal(out[3], torch.zeros(2)) and bool(torch.isfinite(out).all())
    assert torch.linalg.vector_norm(out, dim=1).max() <= 1.0 + 1e-6


def test_marina_full_rounds_use_all_of_a_clients_data_and_differences_share_the_minibatch():
    spec = RunSpec(
        dataset="synthetic", method="byz_vr_marina_pp", clients=1, batch_size=2, participation=1.0
    )
    net = nn.Linear(1, 2, bias=False)
    x, y = torch.tensor([[1.0], [2.0], [-1.0], [0.5], [3.0]]), torch.tensor([0, 1, 1, 0, 1])
    algorithm = make_algorithm(spec, torch.zeros(2), torch.tensor([5.0]))
    params = torch.tensor([0.3, -0.2])
    full = algorithm.local_work(
        RoundPlan(torch.tensor([0]), full=True), net, params, [(x, y)], [7], "sequential"
    )
    w = params.view(2, 1).clone().requires_grad_(True)
    torch.nn.functional.cross_entropy(x @ w.T, y).backward()  # over all five samples
    assert torch.allclose(full[0], w.grad.flatten(), atol=1e-6)
    algorithm.estimate, algorithm.anchor = torch.zeros(2), params.clone()
    same = algorithm.local_work(
        RoundPlan(torch.tensor([0])), net, params, [(x, y)], [7], "sequential"
    )
    assert torch.equal(same, torch.zeros(1, 2))  # grad(x; xi) - grad(x; xi) with one xi
    moved = params + torch.tensor([0.5, 0.0])
    diff = algorithm.local_work(
        RoundPlan(torch.tensor([0])), net, moved, [(x, y)], [7], "sequential"
    )
    expected = client_gradients(net, moved, [(x, y)], batch_size=2, seeds=[7]) - client_gradients(
        net, params, [(x, y)], batch_size=2, seeds=[7]
    )
    assert torch.allclose(diff, expected)


def test_marina_rand_k_is_unbiased_and_off_by_default():
    from robusttune.methods.algorithms import rand_k

    assert RunSpec(method="byz_vr_marina_pp").marina_compressor == "none"
    rows = torch.arange(1.0, 11.0).expand(4000, -1)
    q = rand_k(rows, 0.2, torch.Generator().manual_seed(0))
    assert ((q != 0).sum(dim=1) == 2).all()
    assert torch.allclose(q.mean(0), rows[0], rtol=0.1)


def test_marina_coin_follows_marina_p():
    spec = RunSpec(dataset="synthetic", method="byz_vr_marina_pp", clients=10, marina_p=0.2)
    algorithm = make_algorithm(spec, torch.zeros(2), torch.ones(10))
    algorithm.estimate = torch.zeros(2)  # past the first round
    generator = torch.Generator().manual_seed(3)
    fulls = sum(algorithm.plan(torch.tensor([1, 2]), generator).full for _ in range(2000))
    assert 0.17 < fulls / 2000 < 0.23


def test_new_methods_are_presets_labelled_by_what_ran():
    for method, algorithm, rule in (
        ("fedsgd", "fedsgd", "mean"),
        ("fedcm_xu", "fedcm_xu", "mean"),
        ("byz_vr_marina_pp", "byz_vr_marina_pp", "cclip"),
    ):
        spec = RunSpec(method=method)
        assert (spec.method, spec.algorithm, spec.aggregator) == (method, algorithm, rule)
        assert spec.aggregate_weights == "uniform"
        other = RunSpec(method=method, aggregator="median")
        assert other.method == f"{algorithm}+median" and other.aggregator == "median"
    assert RunSpec(method="fedcm_xu").server_lr == 1.0 and RunSpec(method="fedsgd").server_lr == 0.1


def test_drift_is_the_same_in_both_training_strategies():
    """FedCM's local steps (g + drift) agree between the sequential and the batched trainer."""
    from robusttune.problem.models import flat_params, make_model
    from robusttune.problem.training import train_clients

    torch.manual_seed(0)
    net = make_model("cnn2", (1, 8, 8), 10, seed=0)
    start = flat_params(net).detach().clone()
    data = [(torch.randn(n, 1, 8, 8), torch.randint(0, 10, (n,))) for n in (5, 9)]
    drift = 0.01 * torch.randn_like(start)
    runs = [
        train_clients(
            net,
            start,
            data,
            epochs=1,
            batch_size=4,
            lr=0.05,
            momentum=0.0,
            seeds=[1, 2],
            strategy=s,
            drift=drift,
        )
        for s in ("sequential", "batched")
    ]
    assert torch.allclose(runs[0], runs[1], atol=1e-5)
    plain = train_clients(
        net,
        start,
        data,
        epochs=1,
        batch_size=4,
        lr=0.05,
        momentum=0.0,
        seeds=[1, 2],
        strategy="sequential",
    )
    assert not torch.allclose(plain, runs[0])
