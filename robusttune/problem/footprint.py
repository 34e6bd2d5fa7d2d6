"""How much device memory one federated run needs, estimated from its RunSpec before it runs: what
a driver needs to decide how many runs share one GPU (`robusttune.experiments.sweep.gpu_share`).

The model is built on PyTorch's ``meta`` device (shapes only: no memory, no data, no
initialisation cost), which gives its parameter count d exactly and, from one forward pass with a
hook on every leaf module, the activations of one input: a, the sum of the leaf outputs' sizes,
and a_max, the largest of them. The dataset's size comes from the shape it declares when it
registers (`DataShape`). Then, in float32 bytes, for N clients of which n take part in a round,
with batch size B::

    footprint   = context + 4 * (data + state + max(training, evaluation))
    data        = (samples + root set) * prod(input_shape)    (all of it stays on the device)
    state       = (SAMPLED_COPIES * n + CACHED_COPIES * N) * d
    training    = ACTIVATION_COPIES * n * B * a
    evaluation  = 2 * EVALUATION_CHUNK * a_max

Batched training (``train_clients``) steps the round's clients at once, so a step holds the
activations of n * B inputs, kept for the backward pass, with their gradients and temporaries
(ACTIVATION_COPIES); evaluation runs EVALUATION_CHUNK inputs at a time without gradients, which
holds a layer's input and output at once. The state counts the [n, d] blocks a round holds at its
peak (the clients' parameter, gradient and momentum stacks, the messages, a rule's sorted copy
and its temporaries) and the [N, d] caches of DeMoA and SWB-DM (messages and momenta). n is the
fixed draw's size, or for Bernoulli participation its mean plus three standard deviations.

It errs on the large side: against the two training peaks measured on a GPU (bench/gpu.py, cnn2
on ~600 CIFAR-shaped images a client, batch 32, 2 epochs: 596 MiB at 10 clients and 2,711 MiB
at 50 on an H200, 2026-12-04, data included) its data, state and training parts come to 1.1x
and 1.2x (tests/test_footprint.py)."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from robusttune.core.registries import DATASETS, MODELS
from robusttune.core.registry import SpecError
from robusttune.problem.data.base import DataShape
from robusttune.problem.evaluation import EVALUATION_CHUNK
from robusttune.problem.models import make_model

__all__ = [
    "ACTIVATION_COPIES",
    "CACHED_COPIES",
    "CUDA_CONTEXT_BYTES",
    "SAMPLED_COPIES",
    "Footprint",
    "data_shape",
    "model_profile",
    "round_clients",
    "run_footprint",
]

# A process's CUDA context and PyTorch's loaded kernels, outside the caching allocator (a few
# hundred MiB on current drivers with lazy module loading); every trial process pays it once.
CUDA_CONTEXT_BYTES = 512 * 2**20
# [n, d] float32 blocks a round holds at its peak, and [N, d] blocks of the caches (see the
# module docstring)
SAMPLED_COPIES = 6
CACHED_COPIES = 2
# an input's activations during a training step: the saved outputs, their gradients, temporaries
ACTIVATION_COPIES = 3
FLOAT_BYTES = 4


@dataclass(frozen=True)
class Footprint:
    """A run's estimated device memory in bytes, by part (`run_footprint`); ``parameters`` is d
    and ``activations_per_input`` a (training and evaluation are the two activation peaks, not
    held at once)."""

    parameters: int
    activations_per_input: int
    context: int
    data: int
    state: int
    training: int
    evaluation: int

    @property
    def total(self) -> int:
        return self.context + self.data + self.state + max(self.training, self.evaluation)


def data_shape(spec: Any) -> DataShape | None:
    """The shape the run's dataset declares (its registry entry's ``data_shape``: a `DataShape`,
    or a function called as the loader is, with the RunSpec and the dataset's own knobs), or None
    for a dataset that declares none."""
    declared = getattr(DATASETS[spec.dataset], "data_shape", None)
    if callable(declared):
        declared = declared(spec, **spec.params_for(DATASETS, spec.dataset))
    return declared if isinstance(declared, DataShape) else None


def model_profile(
    name: str, input_shape: Sequence[int], num_classes: int, **params: Any
) -> tuple[int, int, int]:
    """(d, a, a_max): the parameter count of model ``name``, and the sum and the largest of the
    output sizes of its leaf modules in one forward pass of one input, read on the ``meta``
    device. Kept per registered model, shape and knobs: a driver sizes every trial of a map, and
    they share a few models (knobs that cannot be hashed are measured each time)."""
    shape = tuple(int(s) for s in input_shape)
    knobs = tuple(sorted(params.items()))
    try:
        hash(knobs)
    except TypeError:
        return _measured_profile(MODELS[name], name, shape, int(num_classes), knobs)
    return _kept_profile(MODELS[name], name, shape, int(num_classes), knobs)


def _measured_profile(
    entry: Any,
    name: str,
    shape: tuple[int, ...],
    num_classes: int,
    knobs: tuple[tuple[str, Any], ...],
) -> tuple[int, int, int]:
    # ``entry`` (the registered class) only keys the cache: a model registered again is new
    with torch.device("meta"):
        model = make_model(name, shape, num_classes, **dict(knobs))
        sizes: list[int] = []

        def count(module: nn.Module, inputs: Any, output: Any) -> None:
            if isinstance(output, torch.Tensor):
                sizes.append(output.numel())

        hooks = [
            module.register_forward_hook(count)
            for module in model.modules()
            if not list(module.children())
        ]
        try:
            with torch.no_grad():
                model(torch.empty(1, *shape))
        finally:
            for hook in hooks:
                hook.remove()
    return sum(p.numel() for p in model.parameters()), sum(sizes), max(sizes, default=0)


_kept_profile = functools.lru_cache(maxsize=64)(_measured_profile)


def round_clients(spec: Any) -> int:
    """n of the module docstring: the clients one round trains, at most N."""
    if spec.participation_mode == "fixed" or spec.sample_size is not None:
        return int(spec.expected_sample_size)
    mean = spec.participation * spec.clients
    spread = math.sqrt(mean * (1 - spec.participation))
    return min(int(spec.clients), math.ceil(mean + 3 * spread))


def run_footprint(spec: Any) -> Footprint | None:
    """The run's estimated device memory (the module docstring's formula), or None when its
    dataset declares no shape or its model cannot be built on the meta device."""
    shape = data_shape(spec)
    if shape is None:
        return None
    try:
        d, per_input, largest = model_profile(
            spec.model, shape.input_shape, shape.num_classes, **spec.params_for(MODELS, spec.model)
        )
    except (SpecError, RuntimeError, NotImplementedError, TypeError, ValueError):
        return None  # a plugin model that needs real tensors to be built
    features = math.prod(shape.input_shape)
    clients, n, batch = int(spec.clients), round_clients(spec), int(spec.batch_size)
    return Footprint(
        parameters=d,
        activations_per_input=per_input,
        context=CUDA_CONTEXT_BYTES,
        data=FLOAT_BYTES * (shape.samples + int(spec.fltrust_root_size)) * features,
        state=FLOAT_BYTES * (SAMPLED_COPIES * n + CACHED_COPIES * clients) * d,
        training=FLOAT_BYTES * ACTIVATION_COPIES * n * batch * per_input,
        evaluation=FLOAT_BYTES * 2 * EVALUATION_CHUNK * largest,
    )
