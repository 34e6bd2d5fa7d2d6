"""torchvision's datasets read from their on-disk files under ``data_root`` (``download=False``:
nothing is ever downloaded): mnist, fashion_mnist, emnist (byclass), cifar10, cifar100.
``fashion_mnist`` is registered by ``installed`` (Debian's files when ``data_root`` has none)."""

from __future__ import annotations

import functools
import os
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from robusttune.core.registry import SpecError
from robusttune.core.schema import RunSchema
from robusttune.problem.data.base import DATASETS, DataShape, RawDataset


@dataclass(frozen=True)
class _TorchvisionSource:
    """How one torchvision dataset is read: its class, its shape (one image, the classes, the
    images of both splits), the standard per-channel statistics of its [0, 1] training pixels
    and extra arguments."""

    cls_name: str
    shape: DataShape
    mean: tuple[float, ...]
    std: tuple[float, ...]
    kwargs: tuple[tuple[str, Any], ...] = ()

    @property
    def num_classes(self) -> int:
        return self.shape.num_classes


_TORCHVISION_SOURCES: dict[str, _TorchvisionSource] = {
    "mnist": _TorchvisionSource("MNIST", DataShape((1, 28, 28), 10, 70_000), (0.1307,), (0.3081,)),
    "fashion_mnist": _TorchvisionSource(
        "FashionMNIST", DataShape((1, 28, 28), 10, 70_000), (0.2860,), (0.3530,)
    ),
    # byclass: digits, upper- and lower-case letters, the 62-class FEMNIST stand-in of SWB-DM.
    "emnist": _TorchvisionSource(
        "EMNIST", DataShape((1, 28, 28), 62, 814_255), (0.1736,), (0.3316,), (("split", "byclass"),)
    ),
    # The per-pixel standard deviations (not the 0.2023/0.1994/0.2010 of many CIFAR repositories,
    # which are averages of per-image deviations).
    "cifar10": _TorchvisionSource(
        "CIFAR10",
        DataShape((3, 32, 32), 10, 60_000),
        (0.4914, 0.4822, 0.4465),
        (0.2470, 0.2435, 0.2616),
    ),
    "cifar100": _TorchvisionSource(
        "CIFAR100",
        DataShape((3, 32, 32), 100, 60_000),
        (0.5071, 0.4865, 0.4409),
        (0.2673, 0.2564, 0.2762),
    ),
}


def _make_torchvision_loader(name: str) -> Callable[[Any], RawDataset]:
    source = _TORCHVISION_SOURCES[name]

    def loader(spec: RunSchema) -> RawDataset:
        return _torchvision(name, os.path.abspath(os.path.expanduser(spec.data_root)))

    loader.__doc__ = (
        f"torchvision's {source.cls_name} read from ``data_root`` with download=False; "
        f"x = (v / 255 - mean_c) / std_c with mean {source.mean}, std {source.std}; "
        f"{source.num_classes} classes."
    )
    loader.__name__ = f"load_{name}"
    return loader


for _name in _TORCHVISION_SOURCES:
    if _name != "fashion_mnist":  # installed.load_fashion_mnist reads torchvision's files first
        DATASETS.register(_name, defaults={}, data_shape=_TORCHVISION_SOURCES[_name].shape)(
            _make_torchvision_loader(_name)
        )
del _name


def _torchvision_class(name: str) -> type:
    """The torchvision dataset class; for CIFAR a subclass without the MD5 checks.

    torchvision checks CIFAR's files against the official MD5 sums, which rejects every other
    faithful copy (the tiny fixtures of the tests, a repacked mirror) and re-hashes 180 MB on each
    load; the MNIST family only checks that the files exist. Without the sums a damaged file still
    fails when unpickled or reshaped, and is then reported as unreadable.
    """
    from torchvision import datasets  # slow import, only when a torchvision dataset is used

    base = getattr(datasets, _TORCHVISION_SOURCES[name].cls_name)
    if not hasattr(base, "train_list"):
        return base
    return type(
        base.__name__,
        (base,),
        {
            "train_list": [[file, None] for file, _ in base.train_list],
            "test_list": [[file, None] for file, _ in base.test_list],
            "meta": {**base.meta, "md5": None},
        },
    )


def _expected_files(name: str, root: str) -> tuple[str, list[str]]:
    """The folder torchvision reads ``name`` from under ``root``, and the files it needs there."""
    from torchvision import datasets

    source = _TORCHVISION_SOURCES[name]
    base = getattr(datasets, source.cls_name)
    if hasattr(base, "train_list"):  # CIFAR: python pickles in base_folder
        files = [file for file, _ in base.train_list + base.test_list] + [base.meta["filename"]]
        return os.path.join(root, base.base_folder), files
    folder = os.path.join(root, source.cls_name, "raw")
    if source.cls_name == "EMNIST":
        split = dict(source.kwargs)["split"]
        files = [
            f"emnist-{split}-{part}-{kind}-ubyte"
            for part in ("train", "test")
            for kind in ("images-idx3", "labels-idx1")
        ]
    else:  # MNIST, FashionMNIST: the unpacked .gz resources
        files = [os.path.splitext(os.path.basename(url))[0] for url, _ in base.resources]
    return folder, files


@functools.lru_cache(maxsize=2)
def _torchvision(name: str, root: str) -> RawDataset:
    """Read both splits through torchvision and normalise per channel.

    Uses the datasets' ``.data``/``.targets`` arrays directly (one vectorised conversion) rather
    than ``__getitem__``, which builds a PIL image per sample. Cached per (name, absolute root);
    maxsize 2 because EMNIST byclass alone is 2.2 GB as float32.
    """
    source = _TORCHVISION_SOURCES[name]
    cls = _torchvision_class(name)
    kwargs = dict(source.kwargs)
    try:
        train = cls(root, train=True, download=False, **kwargs)
        test = cls(root, train=False, download=False, **kwargs)
    except RuntimeError:
        folder, files = _expected_files(name, root)
        missing = [f for f in files if not os.path.isfile(os.path.join(folder, f))]
        if not missing:
            raise
        raise SpecError(
            f"dataset {name!r} not found: torchvision expects its files in {folder} "
            f"(missing: {', '.join(missing)}); no download is attempted (no network assumed): "
            f"put the files there or set data_root (now {root})"
        ) from None
    except (
        pickle.UnpicklingError,
        EOFError,
        ValueError,
        KeyError,
        AssertionError,
        TypeError,
    ) as err:
        folder, _ = _expected_files(name, root)
        raise SpecError(
            f"dataset {name!r} in {folder} could not be read "
            f"({type(err).__name__}: {err}); replace the files with torchvision's"
        ) from None

    mean = torch.tensor(source.mean, dtype=torch.float32)
    std = torch.tensor(source.std, dtype=torch.float32)
    return RawDataset(
        train_x=_normalise(_images_nchw(train.data), mean, std),
        train_y=torch.as_tensor(np.asarray(train.targets), dtype=torch.int64),
        test_x=_normalise(_images_nchw(test.data), mean, std),
        test_y=torch.as_tensor(np.asarray(test.targets), dtype=torch.int64),
        num_classes=source.num_classes,
    )


def _images_nchw(data: Any) -> Tensor:
    """uint8 images as [N, C, H, W]: MNIST-family tensors are [N, H, W], CIFAR arrays [N, H, W, C]."""
    if isinstance(data, np.ndarray):  # CIFAR: torchvision turned the stored CHW rows into HWC
        return torch.from_numpy(np.ascontiguousarray(data.transpose(0, 3, 1, 2)))
    return data.unsqueeze(1)


def _normalise(images: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    """x = (v / 255 - mean_c) / std_c, in place on the one float copy (EMNIST is 2.2 GB)."""
    x = images.to(torch.float32)
    shape = (1, -1, 1, 1)
    return x.div_(255.0).sub_(mean.view(shape)).div_(std.view(shape))
