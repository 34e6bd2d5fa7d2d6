"""Local training: the two strategies agree, follow PyTorch SGD, are seeded; DeMoA's one-batch
gradients; evaluation on a case computed by hand."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from robusttune.problem.evaluation import Evaluation, evaluate
from robusttune.problem.models import flat_params, make_model
from robusttune.problem.training import (
    batch_orders,
    client_gradients,
    resolve_trainer,
    train_clients,
)


def client_data(sizes, shape=(1, 8, 8), classes=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(n, *shape, generator=g), torch.randint(0, classes, (n,), generator=g))
        for n in sizes
    ]


@pytest.fixture(scope="module")
def cnn():
    return make_model("cnn2", (1, 8, 8), 10, seed=0)


def test_batch_orders_cover_each_sample_once_per_epoch():
    batches = batch_orders(11, epochs=2, batch_size=4, seed=3)
    assert [len(b) for b in batches] == [4, 4, 3, 4, 4, 3]
    for epoch in (batches[:3], batches[3:]):
        assert sorted(torch.cat(epoch).tolist()) == list(range(11))
    assert all(
        torch.equal(a, b) for a, b in zip(batches, batch_orders(11, epochs=2, batch_size=4, seed=3))
    )
    assert batch_orders(0, epochs=2, batch_size=4, seed=3) == []


@pytest.mark.parametrize(
    ("name", "shape"), [("cnn2", (1, 8, 8)), ("cnn2", (3, 32, 32)), ("mlp", (1, 8, 8))]
)
def test_batched_equals_sequential(name, shape):
    # unequal sizes and short last batches (13 = 5+5+3, 7 = 5+2, 22), two epochs: the batched
    # strategy drops finished clients and pads short batches, the result must not change
    model = make_model(name, shape, 10, seed=1)
    start = flat_params(model)
    data = (
        client_data([13, 7, 22], shape=shape)
        if shape[1] == 8
        else client_data([9, 4, 6], shape=shape)
    )
    kw = {"epochs": 2, "batch_size": 5, "lr": 0.05, "momentum": 0.9, "seeds": [11, 12, 13]}
    seq = train_clients(model, start, data, strategy="sequential", **kw)
    bat = train_clients(model, start, data, strategy="batched", **kw)
    assert seq.shape == (3, start.numel())
    assert (seq - start).abs().max() > 1e-3  # it trained
    torch.testing.assert_close(bat, seq, atol=1e-5, rtol=0)
    assert torch.equal(flat_params(model), start)  # the template model is never modified


@pytest.mark.parametrize("strategy", ["sequential", "batched"])
def test_one_start_per_client_trains_each_from_its_own(strategy):
    # the clients of several runs in one call (bench/gpu.py's stacked runs): client i from
    # starts[i] must give what training it alone from starts[i] gives; unequal sizes, so the
    # batched stack is reordered by steps and must come back in the order of `data`
    model = make_model("mlp", (1, 8, 8), 10, seed=1)
    base = flat_params(model)
    data = client_data([13, 7, 22, 0])
    starts = torch.stack([base, base + 0.01, base - 0.02, base * 0.5])
    kw = {"epochs": 2, "batch_size": 5, "lr": 0.05, "momentum": 0.9}
    out = train_clients(model, starts, data, seeds=[1, 2, 3, 4], strategy=strategy, **kw)
    alone = torch.cat(
        [
            train_clients(model, starts[i], [data[i]], seeds=[i + 1], strategy="sequential", **kw)
            for i in range(4)
        ]
    )
    torch.testing.assert_close(out, alone, atol=1e-5, rtol=0)
    assert torch.equal(out[3], starts[3])  # no data: its own start back
    with pytest.raises(ValueError, match="one per client"):
        train_clients(model, starts[:2], data, seeds=[1, 2, 3, 4], strategy=strategy, **kw)


def test_momentum_zero_one_step_is_a_gradient_step(cnn):
    start = flat_params(cnn)
    ((x, y),) = client_data([6])
    lr = 0.1
    out = train_clients(
        cnn,
        start,
        [(x, y)],
        epochs=1,
        batch_size=6,
        lr=lr,
        momentum=0.0,
        seeds=[0],
        strategy="sequential",
    )
    # independent: the full batch's mean cross-entropy through ordinary autograd
    ref = copy.deepcopy(cnn)
    ref.zero_grad()
    F.cross_entropy(ref(x), y).backward()
    grad = torch.cat([p.grad.reshape(-1) for p in ref.parameters()])
    torch.testing.assert_close(out[0], start - lr * grad, atol=1e-6, rtol=0)


@pytest.mark.parametrize("strategy", ["sequential", "batched"])
def test_matches_torch_optim_sgd(cnn, strategy):
    start = flat_params(cnn)
    data = client_data([9, 4])
    seeds, lr, mu, epochs, bs = [5, 6], 0.05, 0.9, 2, 4
    out = train_clients(
        cnn,
        start,
        data,
        epochs=epochs,
        batch_size=bs,
        lr=lr,
        momentum=mu,
        seeds=seeds,
        strategy=strategy,
    )
    for i, ((x, y), seed) in enumerate(zip(data, seeds)):
        ref = copy.deepcopy(cnn)
        opt = torch.optim.SGD(ref.parameters(), lr=lr, momentum=mu)
        for b in batch_orders(len(y), epochs=epochs, batch_size=bs, seed=seed):
            opt.zero_grad()
            F.cross_entropy(ref(x[b]), y[b]).backward()
            opt.step()
        torch.testing.assert_close(out[i], flat_params(ref), atol=1e-5, rtol=0)


def test_same_seeds_same_result(cnn):
    start = flat_params(cnn)
    data = client_data([10, 6])
    kw = {"epochs": 1, "batch_size": 4, "lr": 0.05, "momentum": 0.9, "strategy": "sequential"}
    a = train_clients(cnn, start, data, seeds=[1, 2], **kw)
    b = train_clients(cnn, start, data, seeds=[1, 2], **kw)
    c = train_clients(cnn, start, data, seeds=[1, 3], **kw)
    assert torch.equal(a, b)
    assert torch.equal(a[0], c[0]) and not torch.equal(a[1], c[1])


@pytest.mark.parametrize("strategy", ["sequential", "batched"])
def test_client_without_data_returns_start(cnn, strategy):
    start = flat_params(cnn)
    data = client_data([0, 5])
    out = train_clients(
        cnn,
        start,
        data,
        epochs=2,
        batch_size=4,
        lr=0.05,
        momentum=0.9,
        seeds=[1, 2],
        strategy=strategy,
    )
    assert torch.equal(out[0], start) and not torch.equal(out[1], start)
    assert train_clients(
        cnn, start, [], epochs=1, batch_size=4, lr=0.1, momentum=0.0, seeds=[], strategy=strategy
    ).shape == (0, start.numel())


def test_client_gradients_batched_equals_sequential_and_reference(cnn):
    start = flat_params(cnn)
    given = start.clone()
    data = client_data([20, 3, 0, 9])  # a client smaller than the batch and one without data
    seeds = [4, 5, 6, 7]
    seq = client_gradients(cnn, start, data, batch_size=8, seeds=seeds, strategy="sequential")
    bat = client_gradients(cnn, start, data, batch_size=8, seeds=seeds, strategy="batched")
    # the start is read, not written or made a leaf of any graph
    assert torch.equal(start, given) and not start.requires_grad
    torch.testing.assert_close(bat, seq, atol=1e-6, rtol=0)
    assert torch.equal(seq[2], torch.zeros_like(start))
    for strategy in ("sequential", "batched"):  # a round that sampled nobody
        assert client_gradients(
            cnn, start, [], batch_size=8, seeds=[], strategy=strategy
        ).shape == (0, start.numel())
    (x, y), seed = data[0], seeds[0]
    b = batch_orders(len(y), epochs=1, batch_size=8, seed=seed)[0]  # the first local step's batch
    ref = copy.deepcopy(cnn)
    F.cross_entropy(ref(x[b]), y[b]).backward()
    torch.testing.assert_close(
        seq[0], torch.cat([p.grad.reshape(-1) for p in ref.parameters()]), atol=1e-6, rtol=0
    )


def test_evaluate_hand_computed():
    # logits = x (identity weight): predictions [0, 1, 0, 0] against labels [0, 1, 1, 0]
    model = nn.Linear(2, 2, bias=False)
    params = torch.eye(2).reshape(-1)
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 0.0]])
    y = torch.tensor([0, 1, 1, 0])
    ev = evaluate(model, params, x, y, chunk_size=3)
    # CE of logits (1, 0) is log(1 + e) - 1 when right, log(1 + e) when wrong: 3 right, 1 wrong
    assert ev == Evaluation(
        accuracy=0.75, loss=pytest.approx(math.log(1 + math.e) - 0.75), max_class_share=0.75
    )


def test_evaluate_survives_nonfinite_params(cnn):
    ((x, y),) = client_data([12])
    params = flat_params(cnn)
    params[3] = float("nan")
    ev = evaluate(cnn, params, x, y)
    assert math.isnan(ev.loss)
    assert 0.0 <= ev.accuracy <= 1.0 and 0.0 < ev.max_class_share <= 1.0
    inf = flat_params(cnn).fill_(float("inf"))
    assert math.isnan(evaluate(cnn, inf, x, y).loss)


def test_evaluate_matches_the_model(cnn):
    ((x, y),) = client_data([50])
    ev = evaluate(cnn, flat_params(cnn), x, y, chunk_size=16)
    logits = cnn(x).detach()
    assert ev.accuracy == pytest.approx((logits.argmax(1) == y).float().mean().item())
    assert ev.loss == pytest.approx(F.cross_entropy(logits, y).item(), rel=1e-5)
    assert ev.max_class_share == pytest.approx(torch.bincount(logits.argmax(1)).max().item() / 50)


def test_resolve_trainer():
    assert resolve_trainer("auto", torch.device("cpu")) == "sequential"
    assert resolve_trainer("auto", torch.device("cuda")) == "batched"
    assert resolve_trainer("auto", "cuda:1") == "batched"
    assert resolve_trainer("batched", torch.device("cpu")) == "batched"
    assert resolve_trainer("auto", "mps") == "sequential"  # nothing measured there: the safe one
    with pytest.raises(ValueError, match="allowed"):
        resolve_trainer("parallel", torch.device("cpu"))
