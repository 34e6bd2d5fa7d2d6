"""The torch the project runs on: the APIs it calls, with the keywords it calls them with, exist in
this torch. The project pins torch 2.14.1 for its own environment; the GPU machine's Python has
torch 2.11 (docs/how-to/gpu.md), so the project must run on 2.11 too, and these checks are the
ones where a torch version could differ: torch.func (the batched trainer), torch.load's
``weights_only`` (checkpoints), the meta device as a context (footprints and pre-flight), the
foreach kernels (the sequential trainer's update), the LAPACK Householder calls of SWB, the CPU
backend switches of the portable numerics, TensorBoard's hparams and the CUDA memory cap of a
trial with a GPU share. Python-level functions are checked by signature; builtins (which have
none to read) by a call with the call sites' keywords on tiny tensors.

The suite passed its torch-facing modules under torch 2.11.0 too (training, simulation, models,
footprint, aggregators, algorithms, attacks, numerics ...: docs/how-to/gpu.md says how), which is
what the lower bound rests on; these checks are what keeps it from rotting unseen."""

from __future__ import annotations

import inspect
import io

import pytest
import torch
from torch import nn

# The range the project supports: the GPU machine's 2.11 to the pinned 2.14.1, below 3.
LOWEST, BELOW = (2, 11), (3, 0)


def release(version: str) -> tuple[int, int]:
    """(major, minor) of a torch version string such as ``2.11.0+cu130``."""
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def parameters(function) -> set[str]:
    return set(inspect.signature(function).parameters)


def test_this_torch_is_in_the_supported_range():
    assert LOWEST <= release(torch.__version__) < BELOW, torch.__version__
    assert release("2.11.0+cu130") == (2, 11) and release("2.14.1") == (2, 14)


# (function, keywords the project passes it, where)
SIGNATURES = [
    (torch.func.vmap, {"in_dims"}, "problem/training.py: the batched trainer"),
    (torch.func.grad, set(), "problem/training.py"),
    (
        torch.func.functional_call,
        set(),
        "problem/training.py and problem/evaluation.py: CE over clients, evaluation",
    ),
    (torch.load, {"map_location", "weights_only"}, "engine/simulation.py: load_checkpoint"),
    (torch.save, set(), "sweep trials' checkpoints"),
    (torch.use_deterministic_algorithms, {"warn_only"}, "bench/gpu.py's deterministic figures"),
    (torch.cuda.set_per_process_memory_fraction, set(), "sweep/trainable.py: a trial's GPU share"),
    (torch.cuda.set_sync_debug_mode, set(), "bench/gpu.py's sync_calls figures"),
    (torch.backends.nnpack.set_flags, set(), "core/numerics.py: portable mode"),
    (torch.backends.cpu.get_cpu_capability, set(), "core/numerics.py"),
    (torch.backends.mkl.is_available, set(), "core/numerics.py"),
]


@pytest.mark.parametrize(
    ("function", "keywords", "where"),
    SIGNATURES,
    ids=[f"{f.__module__}.{f.__name__}" for f, _, _ in SIGNATURES],
)
def test_python_level_apis_take_the_keywords_used(function, keywords, where):
    assert keywords <= parameters(function), where


def test_tensorboard_writer_and_hparams_take_the_arguments_used():
    from torch.utils.tensorboard import SummaryWriter
    from torch.utils.tensorboard.summary import hparams

    assert {"log_dir", "purge_step"} <= parameters(SummaryWriter.__init__)
    experiment, start, end = hparams({"lr": 0.1, "rule": "median"}, {"accuracy": 0.0})
    assert experiment.value and start.value and end.value  # three Summary protobufs


def test_the_batched_trainers_vmap_of_grad_over_functional_call():
    model = nn.Linear(3, 2)
    params = {k: v.detach() for k, v in model.named_parameters()}
    stacked = {k: v.expand(4, *v.shape).clone() for k, v in params.items()}
    x, y = torch.randn(4, 5, 3), torch.randint(0, 2, (4, 5))

    def loss(theta, xs, ys):
        return nn.functional.cross_entropy(torch.func.functional_call(model, theta, (xs,)), ys)

    per_client = torch.func.vmap(torch.func.grad(loss))(stacked, x, y)
    shared = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(params, x, y)
    assert per_client["weight"].shape == (4, 2, 3)
    torch.testing.assert_close(per_client["weight"], shared["weight"])


def test_checkpoints_load_with_weights_only():
    buffer = io.BytesIO()
    torch.save({"theta": torch.arange(3.0), "round": 7, "rng": torch.get_rng_state()}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, map_location="cpu", weights_only=True)
    assert loaded["round"] == 7 and torch.equal(loaded["theta"], torch.arange(3.0))


def test_the_meta_device_as_a_context_builds_shapes_only():
    with torch.device("meta"):
        model = nn.Conv2d(1, 4, 3)
        out = model(torch.empty(1, 1, 8, 8))
    assert model.weight.device.type == "meta" and out.shape == (1, 4, 6, 6)


def test_foreach_updates_of_the_sequential_trainer():
    params, grads = [torch.ones(2), torch.ones(3)], [torch.full((2,), 2.0), torch.full((3,), 2.0)]
    torch._foreach_add_(params, grads, alpha=-0.5)
    assert all(torch.equal(p, torch.zeros_like(p)) for p in params)
    summed = torch._foreach_add(grads, grads)
    torch._foreach_mul_(summed, 0.25)
    torch._foreach_copy_(params, summed)
    assert all(torch.equal(p, torch.ones_like(p)) for p in params)


def test_swbs_householder_calls():
    generator = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(2, 5, 5, generator=generator)
    rows, tau = torch.geqrf(a)
    x = torch.randn(2, 5, 3, generator=generator)
    q = torch.linalg.qr(a).Q
    applied = torch.ormqr(rows, tau, x, left=True, transpose=True)
    torch.testing.assert_close(applied, q.mT @ x, atol=1e-5, rtol=1e-5)
    assert torch.nanmedian(
        torch.tensor([[1.0, float("nan")], [3.0, 2.0]]), dim=0
    ).values.tolist() == [1.0, 2.0]
    assert torch.linalg.vector_norm(torch.ones(2, 4), dim=1).tolist() == [2.0, 2.0]


def test_the_portable_numerics_switches_exist():
    assert isinstance(torch.backends.cpu.get_cpu_capability(), str)
    assert isinstance(torch.backends.mkldnn.enabled, bool)
    assert isinstance(torch.backends.cudnn.deterministic, bool)
