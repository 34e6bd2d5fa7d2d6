"""The papers' failure modes, reproduced on digits with few rounds (SWB-DM Section VII-B, DeMoA's
Byzantine-majority rounds)."""

from __future__ import annotations

import torch

from robusttune.aggregators import make_aggregator
from robusttune.attacks import make_attack
from robusttune.config import RunSpec
from robusttune.data import load_federated
from robusttune.models import flat_params, make_model
from robusttune.simulation import simulate
from robusttune.training import train_clients


def _final(**keys):
    records = list(simulate(RunSpec(dataset="digits", **keys)))
    return records


def test_median_lower_with_two_clients_under_ipm_predicts_one_class():
    # n = 2 is even: the `lower` convention returns the coordinate-wise minimum of the two states,
    # a deterministic wrong answer; `midpoint` averages them and keeps learning.
    base = dict(method="median", sample_size=2, byzantine_fraction=0.3, attack="ipm", rounds=5)
    lower = _final(**base, median_even="lower")[-1]
    midpoint = _final(**base, median_even="midpoint")[-1]
    assert lower.max_class_share > 0.95 and lower.collapsed
    assert midpoint.max_class_share < 0.9 and not midpoint.collapsed


def test_unguarded_krum_without_its_precondition_picks_a_byzantine_update():
    spec = RunSpec(dataset="digits", clients=4, byzantine_fraction=0.5)
    data = load_federated(spec, "cpu")
    model = make_model("cnn2", data.input_shape, data.num_classes, seed=0)
    start = flat_params(model).detach()
    clients = [(data.client_x[i], data.client_y[i]) for i in range(4)]
    states = train_clients(model, start, clients, epochs=1, batch_size=16, lr=0.05, momentum=0.9,
                           seeds=[0, 1, 2, 3])
    honest = states[:2] - start
    own = states[2:] - start
    byzantine = make_attack("alie")(honest, n_byzantine=2, n_total=4, own=own)
    krum = make_aggregator("krum")
    n, f = 4, 2  # f = floor(4 * 0.5) = 2: n > 2f + 2 = 6 fails
    assert not krum.precondition(n, f)
    inputs = torch.cat([start + honest, start + byzantine])
    picked = krum(inputs, f=f)
    assert torch.equal(picked, inputs[2]) or torch.equal(picked, inputs[3])


def test_bulyan_with_eleven_clients_holds_at_f2_and_fails_at_f3():
    base = dict(method="bulyan", clients=20, sample_size=11, attack="alie", rounds=1, local_epochs=1)
    at_f2 = _final(**base, byzantine_fraction=0.2)[-1]
    at_f3 = _final(**base, byzantine_fraction=0.3)[-1]
    assert (at_f2.f_assumed, at_f2.precondition_held_assumed) == (2, True)
    assert (at_f3.f_assumed, at_f3.precondition_held_assumed) == (3, False)


def test_byzantine_majority_round_breaks_fedavg_but_not_demoa():
    # DeMoA's setting: N = 25, beta = 0.2, Bernoulli p = 0.1. The strategic attacker stays honest
    # until it holds at least half of a round's sample. FedAvg (and FedCM) aggregate only that
    # sample, so the median follows the attacker; DeMoA aggregates all 25 cached momenta, of which
    # at most 5 are Byzantine.
    common = dict(clients=25, byzantine_fraction=0.2, participation=0.1,
                  participation_mode="bernoulli", attack="strategic_skip", seed=1)
    fedavg = _final(**common, method="median", rounds=10)
    first_majority = next(r.round for r in fedavg if r.byzantine_majority)
    assert fedavg[-1].collapsed
    healthy_before = [r for r in fedavg if r.round < first_majority]
    assert all(not r.collapsed and r.nonfinite_params == 0 for r in healthy_before)
    demoa = _final(**common, method="demoa", aggregator="median", rounds=200, eval_every=50,
                   server_lr=0.5, batch_size=32)
    assert any(r.byzantine_majority for r in demoa)
    assert not demoa[-1].collapsed and demoa[-1].nonfinite_params == 0
    fedcm = _final(**common, method="fedcm", aggregator="median", rounds=200, eval_every=50,
                   server_lr=0.5, batch_size=32)
    assert fedcm[-1].collapsed
