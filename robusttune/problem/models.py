"""Models (registry) and the flat-vector view of their parameters.

Every model here is buffer-free: a model's whole state is its parameter vector theta in R^d, which
is what clients send, caches hold and rules aggregate. BatchNorm is replaced by GroupNorm in
resnet18 because running statistics are not aggregatable and break ``torch.func.vmap``.

The flat layout is the order of ``model.named_parameters()``: theta = concat_j vec(W_j). ``ParamLayout``
turns a flat vector (or a stack of them, ``Tensor[..., d]``) into the ``{name: tensor}`` dict that
``torch.func.functional_call`` takes, as views without copies; `bound_copy` gives a copy of the
architecture whose own parameters are such views, for loops that call one vector many times.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from robusttune.core.registries import MODELS
from robusttune.core.registry import SpecError

__all__ = [
    "CNN2",
    "MLP",
    "MODELS",
    "ConvNet",
    "ParamLayout",
    "bound_copy",
    "flat_params",
    "load_flat_params",
    "make_model",
    "param_layout",
    "param_views",
    "resnet18",
]


def _image_shape(name: str, input_shape: Sequence[int]) -> tuple[int, int, int]:
    """(C, H, W) from an input shape; (H, W) counts as one channel."""
    shape = tuple(int(s) for s in input_shape)
    if len(shape) == 2:
        shape = (1, *shape)
    if len(shape) != 3 or min(shape) < 1:
        raise SpecError(
            f"model {name!r} needs an image input_shape (C, H, W); got {tuple(input_shape)} "
            f"(use model mlp for flat inputs)"
        )
    return shape


@MODELS.register("cnn2")
class CNN2(nn.Module):
    """The CNN of the SWB-DM study: on (3, 32, 32) with 10 classes it has exactly 545,098
    parameters.

        conv(C->32, 3x3, pad 1) ReLU maxpool2 -> conv(32->64, 3x3, pad 1) ReLU maxpool2
        -> flatten -> linear(64*H'*W' -> 128) ReLU -> linear(128 -> K)

    896 + 18,496 + 524,416 + 1,290 = 545,098 on CIFAR (H' = W' = 8). The flatten size follows the
    input: on 1x8x8 digits H' = W' = 2, on 1x28x28 H' = W' = 7 (floor, as nn.MaxPool2d).
    Small inputs: a 2x2 pool is applied only when both spatial sizes are >= 2 at that point and is
    skipped otherwise (a 1-pixel-wide map cannot be pooled), so tiny synthetic shapes still run.
    """

    def __init__(self, input_shape: Sequence[int], num_classes: int) -> None:
        super().__init__()
        c, h, w = _image_shape("cnn2", input_shape)
        self.image_shape = (c, h, w)
        self.conv1 = nn.Conv2d(c, 32, kernel_size=3, padding=1)
        self.pool1, h, w = _pool_or_skip(h, w)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=3, padding=1)
        self.pool2, h, w = _pool_or_skip(h, w)
        self.fc1 = nn.Linear(64 * h * w, 128)
        self.fc2 = nn.Linear(128, num_classes)
        self.relu = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        # reshape, not view: batches gathered under vmap may not be contiguous
        x = x.reshape(x.shape[0], *self.image_shape)
        x = self.pool1(self.relu(self.conv1(x)))
        x = self.pool2(self.relu(self.conv2(x)))
        x = self.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def _pool_or_skip(h: int, w: int) -> tuple[nn.Module, int, int]:
    if h >= 2 and w >= 2:
        return nn.MaxPool2d(2), h // 2, w // 2
    return nn.Identity(), h, w


@MODELS.register("convnet")
class ConvNet(nn.Module):
    """The ConvNet for 28x28 grayscale digits (PyTorch's MNIST example network, without dropout):

        conv(C->32, 3x3, valid) ReLU -> conv(32->64, 3x3, valid) ReLU -> maxpool2
        -> flatten -> linear(64*H'*W' -> 128) ReLU -> linear(128 -> K)

    On (1, 28, 28) with 10 classes: 28 -> 26 -> 24 -> 12, so 320 + 18,496 + 1,179,776 + 1,290 =
    1,199,882 parameters. Why this one: DeMoA (arXiv 2509.02970) trains "a ConvNet" on MNIST
    without publishing it; its experimental set (ALIE, bit flip, IPM, label flip and mimic
    against CM, Krum, RFA and CCLIP, 25 clients) is that of Karimireddy, He and Jaggi (ICLR 2022,
    "Byzantine-robust learning on heterogeneous datasets via bucketing"), whose MNIST model is
    this network. Its two dropout layers are left out: they would draw from PyTorch's global RNG
    (not seeded by the RunSpec, not checkpointed) and need their own randomness under vmap.
    Inputs need H, W >= 6 (two valid convolutions, then a 2x2 pool).
    """

    def __init__(self, input_shape: Sequence[int], num_classes: int) -> None:
        super().__init__()
        c, h, w = _image_shape("convnet", input_shape)
        if min(h, w) < 6:
            raise SpecError(
                f"model 'convnet' needs images of at least 6x6; got {h}x{w} (cnn2 takes any size)"
            )
        self.image_shape = (c, h, w)
        self.conv1 = nn.Conv2d(c, 32, kernel_size=3)
        self.conv2 = nn.Conv2d(32, 64, kernel_size=3)
        self.pool = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(64 * ((h - 4) // 2) * ((w - 4) // 2), 128)
        self.fc2 = nn.Linear(128, num_classes)
        self.relu = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        x = x.reshape(
            x.shape[0], *self.image_shape
        )  # reshape: vmap's batches may not be contiguous
        x = self.pool(self.relu(self.conv2(self.relu(self.conv1(x)))))
        x = self.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


@MODELS.register("mlp")
class MLP(nn.Module):
    """flatten -> linear(prod(input_shape) -> 200) ReLU -> linear(200 -> 200) ReLU
    -> linear(200 -> K): the two-hidden-layer 200-unit MLP of McMahan et al. (2017, "2NN")."""

    hidden = 200

    def __init__(self, input_shape: Sequence[int], num_classes: int) -> None:
        super().__init__()
        features = math.prod(int(s) for s in input_shape)
        if features < 1:
            raise SpecError(f"model 'mlp' needs a non-empty input_shape; got {tuple(input_shape)}")
        self.net = nn.Sequential(
            nn.Linear(features, self.hidden),
            nn.ReLU(),
            nn.Linear(self.hidden, self.hidden),
            nn.ReLU(),
            nn.Linear(self.hidden, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x.reshape(x.shape[0], -1))


# GroupNorm with 2 groups, as in the federated ResNet-18 of Hsieh et al. (2020) and Reddi et al.
# (2021, "Adaptive Federated Optimization"); any divisor of 64 keeps every layer valid.
RESNET_GROUPS = 2


@MODELS.register("resnet18")
def resnet18(input_shape: Sequence[int], num_classes: int) -> nn.Module:
    """torchvision's ResNet-18 with the CIFAR stem (3x3 conv, stride 1, no max-pool) and
    GroupNorm(2, c) in place of every BatchNorm, so the model is buffer-free. The global average
    pool makes it accept any (C, H, W) input (on 8x8 the last stage sees 1x1 maps)."""
    from torchvision.models.resnet import BasicBlock, ResNet

    c, h, w = _image_shape("resnet18", input_shape)
    model = ResNet(
        BasicBlock,
        [2, 2, 2, 2],
        num_classes=num_classes,
        norm_layer=lambda channels: nn.GroupNorm(RESNET_GROUPS, channels),
    )
    model.conv1 = nn.Conv2d(c, 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return _Reshape((c, h, w), model)


class _Reshape(nn.Module):
    """Reshape flat or (H, W) inputs to (C, H, W) before the wrapped model."""

    def __init__(self, image_shape: tuple[int, int, int], inner: nn.Module) -> None:
        super().__init__()
        self.image_shape = image_shape
        self.inner = inner

    def forward(self, x: Tensor) -> Tensor:
        return self.inner(x.reshape(x.shape[0], *self.image_shape))


def make_model(
    name: str,
    input_shape: Sequence[int],
    num_classes: int,
    *,
    seed: int | None = None,
    device: torch.device | str | None = None,
    **params: Any,
) -> nn.Module:
    """Build model ``name`` for inputs of ``input_shape`` (without the batch dimension) and
    ``num_classes`` outputs.

    With ``seed`` the initialisation is a function of the seed alone: the model is built on the CPU
    under ``torch.manual_seed(seed)`` inside ``torch.random.fork_rng``, so the caller's global RNG
    state is left as it was. Without it, PyTorch's global RNG is used. ``device`` moves the built
    model (initial values do not depend on the device).
    """
    if num_classes < 1:
        raise SpecError(f"num_classes must be >= 1; got {num_classes}")
    shape = tuple(int(s) for s in input_shape)
    if seed is None:
        model = MODELS.make(name, input_shape=shape, num_classes=num_classes, **params)
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed))
            model = MODELS.make(name, input_shape=shape, num_classes=num_classes, **params)
    buffers = [b for b, _ in model.named_buffers()]
    if buffers:  # a contract of the package: a model's state is its parameter vector
        raise RuntimeError(f"model {name!r} has buffers {buffers}; models must be buffer-free")
    return model.to(device) if device is not None else model


def flat_params(model: nn.Module) -> Tensor:
    """theta = concat_j vec(W_j) over ``model.named_parameters()`` (a detached copy, Tensor[d])."""
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def load_flat_params(model: nn.Module, flat: Tensor) -> None:
    """Copy ``flat`` (Tensor[d], same layout as ``flat_params``) into the model's parameters."""
    layout = _flat_layout(model, flat)
    with torch.no_grad():
        for p, view in zip(model.parameters(), layout.views(flat).values()):
            p.copy_(view)


@dataclass(frozen=True)
class ParamLayout:
    """Names, shapes and sizes of a model's parameters in flat order."""

    names: tuple[str, ...]
    shapes: tuple[torch.Size, ...]
    sizes: tuple[int, ...]

    @property
    def numel(self) -> int:
        return sum(self.sizes)

    def views(self, flat: Tensor) -> dict[str, Tensor]:
        """``{name: tensor}`` views of ``flat: Tensor[..., d]`` (leading dims are kept, e.g. a
        stack of k clients gives tensors of shape (k, *shape)). Slices of a contiguous last
        dimension reshape without a copy, so gradients w.r.t. ``flat`` come back flat."""
        lead = flat.shape[:-1]
        chunks = torch.split(flat, list(self.sizes), dim=-1)
        return {n: c.view(*lead, *s) for n, c, s in zip(self.names, chunks, self.shapes)}


def param_layout(model: nn.Module) -> ParamLayout:
    names, shapes, sizes = [], [], []
    for name, p in model.named_parameters():
        names.append(name)
        shapes.append(p.shape)
        sizes.append(p.numel())
    return ParamLayout(tuple(names), tuple(shapes), tuple(sizes))


def _flat_layout(model: nn.Module, flat: Tensor) -> ParamLayout:
    """The model's layout, once ``flat`` is checked to be one vector of it (Tensor[d])."""
    layout = param_layout(model)
    if flat.shape != (layout.numel,):
        raise ValueError(
            f"expected a flat vector of {layout.numel} values; got shape {tuple(flat.shape)}"
        )
    return layout


def param_views(model: nn.Module, flat: Tensor) -> dict[str, Tensor]:
    """``{name: view}`` of ``flat`` for ``torch.func.functional_call(model, ..., (x,))``."""
    return param_layout(model).views(flat)


def bound_copy(model: nn.Module, flat: Tensor) -> tuple[nn.Module, list[Tensor]]:
    """A copy of ``model`` whose parameters are leaf views of ``flat`` (Tensor[d], the layout of
    `flat_params`), and those parameters in that order: ``copy(x)`` computes f(x; flat), the
    gradient of a loss comes back per parameter, and an in-place update of a parameter writes
    ``flat``. ``model`` is not modified and its parameters are not copied (they are swapped for
    the views while the module is copied).

    For a loop that calls one vector many times, where ``functional_call`` would swap every
    parameter in and out of the module on each call (about 0.1 ms for the MLP's six tensors, a
    fifth of one of its steps on the CPU). The arithmetic is the same kernels on the same values,
    so the results are the same bits as ``functional_call``'s."""
    layout = _flat_layout(model, flat)
    bound: list[Tensor] = [nn.Parameter(view) for view in layout.views(flat).values()]
    # deepcopy takes a memo of objects already copied: the parameters map to the views
    memo = {id(p): b for p, b in zip(model.parameters(), bound)}
    return copy.deepcopy(model, memo), bound
