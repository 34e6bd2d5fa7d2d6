"""What the attacker holds and sees: each Byzantine client's own honest state under the momentum
algorithms, and the attacker's statistics over the aggregator's inputs or over the round's sample
(RunSpec ``attack_scope``). Hand cases on the algorithms, then one run end to end."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import norm

from robusttune.core.runspec import RunSpec
from robusttune.engine.byzantine_messages import byzantine_messages
from robusttune.engine.simulation import Simulation
from robusttune.methods.algorithms import make_algorithm
from robusttune.methods.attacks import make_attack
from robusttune.problem.sampling import Sample

D = 3


def attacked_round(algorithm, attack, clients, byzantine_mask, gradients, scope="inputs"):
    """One round as the simulation runs it: begin, attack the Byzantine rows, store. Returns the
    messages sent (rows aligned with ``clients``) and the rule's input."""
    clients = torch.tensor(clients, dtype=torch.long)
    model = torch.zeros(D)
    state = algorithm.begin_round(
        Sample.of(clients, byzantine_mask[clients], "cpu"), gradients, model
    )
    messages = state.honest
    if state.sample.n_byzantine:
        messages = byzantine_messages(attack, algorithm, state, model, scope=scope, generator=None)
    return messages, algorithm.inputs(state, messages, model)


@pytest.mark.parametrize("method", ["demoa", "fedcm"])
def test_bit_flip_sends_minus_the_honest_momentum_every_round(method):
    """Constant gradient g, N = 3, client 2 Byzantine, fixed sampling schedule. Its honest
    momentum, by hand: DeMoA m <- (1 - alpha p) m + alpha g when sampled and (1 - alpha p) m
    otherwise (p = n/N of the round); FedCM m <- (1 - alpha) m + alpha g when sampled, kept
    otherwise. The bit-flip message is -m in every round it is sampled: not a recursion over the
    flipped messages it sent before."""
    alpha = 0.1
    spec = RunSpec(
        dataset="synthetic",
        method=method,
        clients=3,
        participation=0.5,
        participation_mode="fixed",
        demoa_alpha=alpha,
        byzantine_fraction=0.34,
        attack="bit_flip",
    )
    byzantine_mask = torch.tensor([False, False, True])
    algorithm = make_algorithm(spec, torch.zeros(D), torch.ones(3), byzantine_mask)
    attack = make_attack("bit_flip")
    g = torch.tensor([1.0, -2.0, 0.5])
    schedule = [[0, 2], [1], [1, 2], [0, 2], [0, 1, 2], [0], [2]]
    m = torch.zeros(D)
    for clients in schedule:
        p = len(clients) / 3
        c = 1 - alpha * p if method == "demoa" else 1 - alpha
        sampled = 2 in clients
        if sampled:
            m = c * m + alpha * g
        elif method == "demoa":
            m = c * m
        messages, _ = attacked_round(
            algorithm, attack, clients, byzantine_mask, g.expand(len(clients), D).clone()
        )
        if sampled:
            assert torch.allclose(messages[clients.index(2)], -m, atol=1e-7)
        assert torch.allclose(algorithm.byzantine_momenta.read(torch.tensor([2]))[0], m, atol=1e-7)
    # the honest momentum is about 1 (alpha g summed over rounds), far from the decayed flips
    assert float(m.norm()) > 0.3


def test_own_momentum_equals_the_server_copy_without_an_attack():
    """attack none: a Byzantine client's own momentum and the server's copy of it are one value
    (the recursion is the same), bit for bit, in a real DeMoA run."""
    spec = RunSpec(
        dataset="synthetic",
        model="mlp",
        method="demoa",
        clients=10,
        rounds=6,
        participation=0.5,
        participation_mode="bernoulli",
        byzantine_fraction=0.3,
        synthetic_samples=400,
        seed=3,
    )
    sim = Simulation(spec)
    for _ in sim:
        pass
    members = sim.byzantine.nonzero().flatten()
    own = sim.algorithm.byzantine_momenta.read(members)
    assert torch.equal(own, sim.algorithm.momenta.read()[members])
    assert float(own.abs().sum()) > 0


def _demoa_with_cache(scope_spec: dict) -> tuple:
    """N = 7, Byzantine clients 1 and 3; the server's slots hold known momenta, slot 3 holds a
    malicious message client 3 sent earlier."""
    spec = RunSpec(
        dataset="synthetic",
        method="demoa",
        aggregator="mean",
        clients=7,
        participation=2 / 7,
        participation_mode="fixed",
        demoa_alpha=0.5,
        byzantine_fraction=0.29,
        attack="alie",
        **scope_spec,
    )
    byzantine_mask = torch.zeros(7, dtype=torch.bool)
    byzantine_mask[[1, 3]] = True
    algorithm = make_algorithm(spec, torch.zeros(D), torch.ones(7), byzantine_mask)
    slots = torch.tensor(
        [
            [1.0, 0.0, 2.0],
            [9.0, 9.0, 9.0],
            [2.0, 1.0, 0.0],
            [-50.0, 40.0, 7.0],
            [0.0, 3.0, 1.0],
            [1.0, 1.0, 1.0],
            [4.0, -1.0, 2.0],
        ]
    )
    algorithm.momenta.slots.copy_(slots)
    algorithm.momenta.written_by_byzantine[3] = True
    algorithm.byzantine_momenta.refresh(torch.tensor([1]), torch.tensor([[0.5, 0.5, 0.5]]))
    return spec, algorithm, byzantine_mask, slots


GRADIENTS = torch.tensor([[2.0, 2.0, -2.0], [1.0, 0.0, 1.0]])  # rows: clients 0 and 1


def _expected_rows(slots: torch.Tensor, scope: str) -> tuple[np.ndarray, int, int]:
    """The honest rows the attacker computes from, n and f, by hand. The round samples clients 0
    (honest) and 1 (Byzantine); p = 2/7, alpha = 0.5, c = 1 - alpha p."""
    c = 1 - 0.5 * 2 / 7
    fresh0 = c * slots[0] + 0.5 * GRADIENTS[0]
    if scope == "sample":
        return fresh0[None].numpy().astype(np.float64), 2, 1
    # every input row but client 1's (sampled Byzantine) and client 3's (a stale malicious slot)
    rows = [fresh0] + [c * slots[i] for i in (2, 4, 5, 6)]
    return torch.stack(rows).numpy().astype(np.float64), 7, 2


@pytest.mark.parametrize("scope", ["inputs", "sample"])
def test_alie_statistics_follow_the_scope(scope):
    _spec, algorithm, mask, slots = _demoa_with_cache({"attack_scope": scope})
    rows, n, f = _expected_rows(slots, scope)
    messages, _ = attacked_round(algorithm, make_attack("alie"), [0, 1], mask, GRADIENTS, scope)
    # Baruch: s = floor(n/2 + 1) - f, z = Phi^-1((n - f - s) / (n - f)); n = 2 has cdf 0, clamped
    # to 1/(2n); sigma of a single row is 0
    s = np.floor(n / 2 + 1) - f
    z = norm.ppf(min(max((n - f - s) / (n - f), 1 / (2 * n)), 1 - 1 / (2 * n)))
    sigma = rows.std(axis=0, ddof=1) if len(rows) > 1 else np.zeros(D)
    expected = rows.mean(axis=0) - z * sigma
    assert (n, f, round(float(z), 4)) == ((7, 2, 0.2533) if scope == "inputs" else (2, 1, -0.6745))
    assert np.allclose(messages[1].numpy(), expected, atol=1e-5)


@pytest.mark.parametrize("method", ["fedsgd", "demoa"])
def test_population_scope_gives_alie_the_runs_n_and_f_under_every_algorithm(method):
    """``attack_scope: population``: mu and sigma over the rows of ``inputs``, but n = N = 25 and
    f = B = 5 whatever the rule aggregates, so z = Phi^-1(0.6) = 0.2533 (s = floor(25/2 + 1) -
    5 = 8, (25 - 5 - 8) / 20 = 0.6) under FedSGD's sample of 4 as under DeMoA's 25 slots, where
    ``inputs`` gives z(4, 1) = Phi^-1(1/3) and z(25, 1) = Phi^-1(12/24) = 0 (one Byzantine slot)."""
    spec = RunSpec(
        dataset="synthetic",
        method=method,
        clients=25,
        participation=4 / 25,
        byzantine_fraction=0.2,
        attack="alie",
        attack_scope="population",
    )
    mask = torch.zeros(25, dtype=torch.bool)
    mask[[1, 7, 9, 11, 13]] = True
    gradients = torch.tensor([[1.0, 0, 2], [9, 9, 9], [3, 1, 0], [-1, 2, 1]])
    by_scope = {}
    for scope in ("population", "inputs"):
        algorithm = make_algorithm(spec, torch.zeros(D), torch.ones(25), mask)
        by_scope[scope], _ = attacked_round(
            algorithm, make_attack("alie"), [0, 1, 2, 3], mask, gradients.clone(), scope
        )
    honest = gradients[[0, 2, 3]].double().numpy()
    if method == "demoa":  # fresh momenta alpha g of the 3 honest sampled, 21 honest zero slots
        alpha = spec.demoa_alpha
        honest = np.concatenate([alpha * honest, np.zeros((21, D))])
        z_inputs = 0.0
    else:
        z_inputs = norm.ppf(1 / 3)
    mu, sigma = honest.mean(axis=0), honest.std(axis=0, ddof=1)
    assert round(float(norm.ppf(0.6)), 4) == 0.2533
    assert np.allclose(by_scope["population"][1].numpy(), mu - norm.ppf(0.6) * sigma, atol=1e-5)
    assert np.allclose(by_scope["inputs"][1].numpy(), mu - z_inputs * sigma, atol=1e-5)


@pytest.mark.parametrize("scope", ["inputs", "sample"])
def test_ipm_and_mimic_follow_the_scope(scope):
    _spec, algorithm, mask, slots = _demoa_with_cache({"attack_scope": scope})
    rows, _, _ = _expected_rows(slots, scope)
    messages, _ = attacked_round(algorithm, make_attack("ipm"), [0, 1], mask, GRADIENTS, scope)
    assert np.allclose(messages[1].numpy(), -0.1 * rows.mean(axis=0), atol=1e-6)
    _spec, algorithm, mask, slots = _demoa_with_cache({"attack_scope": scope})
    messages, _ = attacked_round(algorithm, make_attack("mimic"), [0, 1], mask, GRADIENTS, scope)
    copied = [i for i, row in enumerate(rows) if np.allclose(messages[1].numpy(), row, atol=1e-6)]
    assert len(copied) == 1  # an exact copy of one honest row of the scope
    if scope == "inputs":
        # the row farthest from the mean along the top principal direction of the 5 rows
        centred = rows - rows.mean(axis=0)
        direction = np.linalg.svd(centred)[2][0]
        assert copied[0] == int(np.abs(centred @ direction).argmax())


def test_state_cache_inputs_scope_reads_the_cached_states():
    """SWB-DM's cache of N = 4 states: IPM's mu over the inputs is the mean of the honest slots
    (minus the model) with the sampled honest client's fresh state in place."""
    spec = RunSpec(
        dataset="synthetic",
        method="swb_dm",
        clients=4,
        participation=0.5,
        byzantine_fraction=0.25,
        attack="ipm",
    )
    mask = torch.tensor([False, True, False, False])
    model = torch.zeros(D)
    algorithm = make_algorithm(spec, model, torch.ones(4), mask)
    algorithm.cache.slots.copy_(
        torch.tensor([[1.0, 1.0, 1.0], [5.0, 5.0, 5.0], [3.0, 0.0, 0.0], [0.0, 3.0, 0.0]])
    )
    clients = torch.tensor([0, 1])
    state = algorithm.begin_round(
        Sample.of(clients, mask[clients], "cpu"),
        torch.tensor([[0.0, 0.0, 6.0], [2.0, 2.0, 2.0]]),
        model,
    )
    for scope, mu in (
        ("inputs", torch.tensor([1.0, 1.0, 2.0])),
        ("sample", torch.tensor([0.0, 0.0, 6.0])),
    ):
        messages = byzantine_messages(
            make_attack("ipm"), algorithm, state, model, scope=scope, generator=None
        )
        assert torch.allclose(messages[1], -0.1 * mu)
        assert torch.equal(messages[0], state.honest[0])


def test_demoa_mean_under_a_bit_flip_majority_does_not_learn():
    """The issue's run: 60% Byzantine clients sending minus their honest momentum turn the mean of
    momenta uphill. Before each Byzantine client kept its own momentum it reached 92%."""
    spec = RunSpec(
        method="demoa",
        aggregator="mean",
        attack="bit_flip",
        byzantine_fraction=0.6,
        clients=25,
        participation=0.5,
        participation_mode="bernoulli",
        rounds=150,
        model="mlp",
        eval_every=50,
    )
    sim = Simulation(spec)
    records = list(sim)
    assert sim.summary(0.0).collapsed
    assert records[-1].accuracy < 0.2 or records[-1].nonfinite_params > 0


def test_nonfinite_messages_are_counted_and_a_robust_rule_keeps_training():
    """A sign flip scaled past float32's range sends -inf/+inf coordinates; rounds.csv counts those
    messages, the median keeps the model finite."""
    spec = RunSpec(
        dataset="synthetic",
        model="mlp",
        aggregator="median",
        attack="sign_flip",
        attack_strength=1e39,
        byzantine_fraction=0.2,
        clients=10,
        participation=1.0,
        rounds=2,
        local_epochs=1,
        synthetic_samples=400,
    )
    records = list(Simulation(spec))
    assert [r.nonfinite_messages for r in records] == [2, 2]
    assert all(r.nonfinite_params == 0 for r in records)
