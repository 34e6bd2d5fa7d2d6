"""Models: the papers' parameter count, shapes on every input the datasets give, buffer-free
state, seeded initialisation, and the flat-vector view used by training and aggregation."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call

from robusttune.core.registry import SpecError
from robusttune.problem.models import (
    MODELS,
    bound_copy,
    flat_params,
    load_flat_params,
    make_model,
    param_layout,
    param_views,
)

SHAPES = [(1, 8, 8), (3, 32, 32), (1, 28, 28)]


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_cnn2_has_the_papers_545098_parameters():
    # 896 + 18,496 + 524,416 + 1,290 (SWB-DM study, CIFAR-10)
    model = make_model("cnn2", (3, 32, 32), 10, seed=0)
    assert n_params(model) == 545_098
    assert [p.numel() for p in model.parameters()] == [864, 32, 18_432, 64, 524_288, 128, 1_280, 10]


def test_cnn2_flatten_follows_the_input():
    # 8x8 -> 4x4 -> 2x2: fc1 takes 64 * 2 * 2 = 256 features; 28x28 -> 14x14 -> 7x7
    assert make_model("cnn2", (1, 8, 8), 10).fc1.in_features == 256
    assert make_model("cnn2", (1, 28, 28), 10).fc1.in_features == 64 * 7 * 7


@pytest.mark.parametrize(
    ("shape", "features"), [((1, 1, 1), 64), ((1, 3, 3), 64), ((2, 5, 1), 64 * 5)]
)
def test_cnn2_skips_pools_a_tiny_input_cannot_take(shape, features):
    model = make_model("cnn2", shape, 4)
    assert model.fc1.in_features == features
    assert model(torch.randn(2, *shape)).shape == (2, 4)


def test_convnet_is_pytorchs_mnist_network_without_dropout():
    # 28 -> 26 -> 24 -> pool 12: 320 + 18,496 + (64 * 12 * 12 * 128 + 128) + 1,290
    model = make_model("convnet", (1, 28, 28), 10, seed=0)
    assert [p.numel() for p in model.parameters()] == [
        288,
        32,
        18_432,
        64,
        1_179_648,
        128,
        1_280,
        10,
    ]
    assert n_params(model) == 1_199_882
    assert not any(isinstance(m, nn.Dropout) for m in model.modules())
    assert make_model("convnet", (3, 32, 32), 10).fc1.in_features == 64 * 14 * 14


def test_convnet_refuses_images_its_convolutions_cannot_take():
    with pytest.raises(SpecError, match="6x6; got 5x8"):
        make_model("convnet", (1, 5, 8), 10)


def test_mlp_widths():
    model = make_model("mlp", (1, 8, 8), 10)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(64, 200), (200, 200), (200, 10)]


def test_resnet18_has_cifar_stem_and_groupnorm():
    model = make_model("resnet18", (3, 32, 32), 10, seed=0)
    inner = model.inner
    assert inner.conv1.kernel_size == (3, 3) and inner.conv1.stride == (1, 1)
    assert isinstance(inner.maxpool, nn.Identity)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    assert any(isinstance(m, nn.GroupNorm) for m in model.modules())


@pytest.mark.parametrize("name", MODELS.names())
@pytest.mark.parametrize("shape", SHAPES)
def test_output_shape(name, shape):
    model = make_model(name, shape, 7, seed=0)
    assert model(torch.randn(3, *shape)).shape == (3, 7)
    # flat inputs of the same size are reshaped (datasets may hand images flattened)
    assert model(torch.randn(2, torch.Size(shape).numel())).shape == (2, 7)


@pytest.mark.parametrize("name", MODELS.names())
def test_buffer_free(name):
    model = make_model(name, (3, 32, 32), 10)
    assert list(model.buffers()) == []


@pytest.mark.parametrize("name", ["cnn2", "convnet", "resnet18"])
def test_image_models_refuse_flat_input_shapes(name):
    with pytest.raises(SpecError, match="mlp"):
        make_model(name, (20,), 3)


def test_unknown_model_is_a_spec_error():
    with pytest.raises(SpecError, match="cnn2"):
        make_model("vgg", (3, 32, 32), 10)


@pytest.mark.parametrize("name", ["cnn2", "mlp"])
def test_seeded_init_is_deterministic_and_leaves_global_rng_alone(name):
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    a = flat_params(make_model(name, (1, 8, 8), 10, seed=7))
    assert torch.equal(torch.random.get_rng_state(), before)
    b = flat_params(make_model(name, (1, 8, 8), 10, seed=7))
    c = flat_params(make_model(name, (1, 8, 8), 10, seed=8))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_flat_roundtrip_and_views():
    model = make_model("cnn2", (1, 8, 8), 10, seed=0)
    flat = flat_params(model)
    assert flat.shape == (param_layout(model).numel,)
    new = torch.randn_like(flat)
    load_flat_params(model, new)
    assert torch.equal(flat_params(model), new)
    views = param_views(model, new)
    assert list(views) == [n for n, _ in model.named_parameters()]
    # views, not copies: every tensor lives inside `new`'s storage
    assert all(
        v.untyped_storage().data_ptr() == new.untyped_storage().data_ptr() for v in views.values()
    )
    x = torch.randn(4, 1, 8, 8)
    assert torch.allclose(functional_call(model, views, (x,)), model(x))


def test_views_of_a_stack_keep_the_leading_dimension():
    model = make_model("mlp", (1, 8, 8), 10, seed=0)
    layout = param_layout(model)
    stack = torch.randn(3, layout.numel)
    views = layout.views(stack)
    for (_name, p), v in zip(model.named_parameters(), views.values()):
        assert v.shape == (3, *p.shape)
    assert torch.equal(layout.views(stack[1])["net.0.weight"], views["net.0.weight"][1])


def test_load_flat_params_checks_the_size():
    model = make_model("mlp", (1, 8, 8), 10)
    with pytest.raises(ValueError, match="flat vector"):
        load_flat_params(model, torch.zeros(3))


@pytest.mark.parametrize(("name", "shape"), [("mlp", (64,)), ("cnn2", (1, 8, 8))])
def test_bound_copy_computes_what_functional_call_computes_and_writes_its_vector(name, shape):
    model = make_model(name, shape, 10, seed=0)
    original = {n: p.detach().clone() for n, p in model.named_parameters()}
    flat = torch.randn(param_layout(model).numel) * 0.1
    net, params = bound_copy(model, flat)
    x, y = torch.randn(5, *shape), torch.tensor([0, 1, 2, 3, 4])
    # the same forward and gradients, bit for bit, as the functional call on views of `flat`
    leaf = flat.clone().requires_grad_(True)
    expected = functional_call(model, param_views(model, leaf), (x,))
    assert torch.equal(net(x), expected)
    grads = torch.autograd.grad(nn.functional.cross_entropy(net(x), y), params)
    (flat_grad,) = torch.autograd.grad(nn.functional.cross_entropy(expected, y), [leaf])
    assert torch.equal(torch.cat([g.reshape(-1) for g in grads]), flat_grad)
    # an in-place step on the parameters is a step on `flat`; the model itself is untouched
    before = flat.clone()
    with torch.no_grad():
        torch._foreach_add_(params, list(grads), alpha=-0.5)
    assert torch.equal(flat, before - 0.5 * flat_grad)
    assert all(torch.equal(p, original[n]) for n, p in model.named_parameters())
    assert all(p.requires_grad and p.is_leaf for p in params)


def test_bound_copy_keeps_tied_parameters_tied_and_checks_the_size():
    tied = nn.Sequential(nn.Linear(3, 3, bias=False), nn.Linear(3, 3, bias=False))
    tied[1].weight = tied[0].weight
    flat = torch.arange(9.0)
    net, params = bound_copy(tied, flat)
    assert len(params) == 1 and net[0].weight is net[1].weight is params[0]
    assert torch.equal(net(torch.eye(3)), torch.eye(3) @ flat.view(3, 3).T @ flat.view(3, 3).T)
    with pytest.raises(ValueError, match="flat vector of 9 values"):
        bound_copy(tied, torch.zeros(10))
