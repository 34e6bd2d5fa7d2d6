"""Datasets and their federated split.

A dataset is a registry entry ``loader(spec) -> RawDataset``: normalised float32 inputs of shape
(N, C, H, W) (or (N, d) for a flat synthetic set) and int64 labels, on the CPU, cached in-process
because a sweep builds many runs from one dataset. ``load_federated`` splits the training set over
the clients with a per-class Dirichlet partition (Hsu, Qi and Brown, 2019, "Measuring the effects
of non-identical data distribution for federated visual classification", the scheme the SWB-DM and
DeMoA code use), draws FLTrust's root set, and moves everything to the run's device once.

Every random draw here is seeded by ``partition_seed`` only, never by the run seed: every method and
every run seed of a sweep trains on exactly the same split (SWB-DM, Section VI, "Partitioning").

Datasets:

* ``digits``: scikit-learn's 8x8 handwritten digits (1,797 images, shipped inside scikit-learn, so
  it works with no network: the embedded default).
* ``synthetic``: a seeded Gaussian mixture of any shape, for tests and benchmarks.
* ``mnist``, ``fashion_mnist``, ``emnist`` (split byclass, 62 classes: the FEMNIST stand-in of the
  SWB-DM paper), ``cifar10``, ``cifar100``: torchvision's on-disk files under ``data_root``, read
  with ``download=False``. Nothing is ever downloaded.
"""

from __future__ import annotations

import functools
import math
import os
import pickle
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import torch
from torch import Tensor

from robusttune.registry import Registry, SpecError
from robusttune.schema import RUNSPEC_KEYS

if TYPE_CHECKING:
    from robusttune.config import RunSpec

__all__ = [
    "DATASETS",
    "RawDataset",
    "FederatedData",
    "dirichlet_partition",
    "root_set",
    "load_federated",
    "clear_dataset_cache",
]

DATASETS: Registry[Callable[[Any], "RawDataset"]] = Registry("dataset", RUNSPEC_KEYS)


@dataclass(frozen=True)
class RawDataset:
    """A whole dataset, normalised: float32 inputs, int64 labels in [0, num_classes), CPU tensors.

    Instances are cached and shared by every run of the process: treat the tensors as read-only.
    """

    train_x: Tensor
    train_y: Tensor
    test_x: Tensor
    test_y: Tensor
    num_classes: int


@dataclass(frozen=True)
class FederatedData:
    """One run's data on its device: the clients' shards, the test set and the server root set.

    ``client_x[i]`` are views into one block holding the training set in client order (one copy on
    the device, not one per client); the test tensors may be shared with the in-process cache.
    Treat all of them as read-only (an attack that poisons labels works on a copy).
    """

    num_classes: int
    input_shape: tuple[int, ...]
    client_x: list[Tensor]
    client_y: list[Tensor]
    test_x: Tensor
    test_y: Tensor
    root_x: Tensor
    root_y: Tensor

    @property
    def client_sizes(self) -> list[int]:
        return [int(y.shape[0]) for y in self.client_y]


# --------------------------------------------------------------------------------------------
# Seeding
# --------------------------------------------------------------------------------------------

# Independent streams derived from the one partition seed, so that e.g. changing the root-set size
# does not change the partition, and changing synthetic_samples does not change the class means.
_STREAM_PARTITION = 0
_STREAM_ROOT = 1
_STREAM_SYNTH_MEANS = 2
_STREAM_SYNTH_TRAIN = 3
_STREAM_SYNTH_TEST = 4


def _rng(seed: int, stream: int) -> np.random.Generator:
    """A numpy generator for (seed, stream); negative seeds are mapped into [0, 2^64)."""
    return np.random.default_rng([stream, int(seed) % 2**64])


# --------------------------------------------------------------------------------------------
# Partition
# --------------------------------------------------------------------------------------------

# A Dirichlet draw that leaves a client empty is redrawn at most this many times. The redraw only
# touches the K x N proportion matrix (emptiness depends on the counts alone), so it is cheap even
# for EMNIST; the NIID-Bench code redraws without a bound, which never ends when N exceeds what a
# tiny alpha can fill (alpha = 0.01 puts each class on about one client).
_MAX_REDRAWS = 50


def dirichlet_partition(labels: np.ndarray, n_clients: int, alpha: float, seed: int) -> list[np.ndarray]:
    """Split sample indices over ``n_clients`` clients, non-IID per class (Hsu et al., 2019).

    For every class k with index set I_k (|I_k| = n_k): draw q_k ~ Dirichlet(alpha * 1_N), shuffle
    I_k, and give client j the slice between floor(n_k * sum_{l<j} q_kl) and
    floor(n_k * sum_{l<=j} q_kl). Small alpha concentrates a class on few clients; as alpha grows,
    every client's label mix tends to the global one. ``alpha = inf`` is the IID split: a random
    permutation of all indices cut into N parts whose sizes differ by at most one.

    Every client gets at least one sample: a draw with an empty client is redrawn (its proportions
    only) up to ``_MAX_REDRAWS`` times, which conditions the Dirichlet draw on "no empty client";
    if that still fails (e.g. many clients and a tiny alpha), each empty client in turn receives
    one random sample from the client that is then the largest.

    Args:
        labels: class label of each training sample, shape [n].
        n_clients: N >= 1, at most n.
        alpha: Dirichlet concentration > 0, or ``math.inf`` for IID.
        seed: the partition seed (not the run seed), the only source of randomness.

    Returns:
        N sorted, disjoint index arrays (int64) whose union is range(n).
    """
    labels = np.asarray(labels).reshape(-1)
    n = labels.size
    if n_clients < 1:
        raise SpecError(f"clients must be >= 1; got {n_clients}")
    if n < n_clients:
        raise SpecError(
            f"clients={n_clients} exceeds the {n} training samples; every client needs at least one"
        )
    if not alpha > 0:
        raise SpecError(f"dirichlet_alpha must be > 0 (inf: IID); got {alpha}")
    rng = _rng(seed, _STREAM_PARTITION)

    if math.isinf(alpha):
        return [np.sort(part) for part in np.array_split(rng.permutation(n), n_clients)]

    _, inverse = np.unique(labels, return_inverse=True)
    class_sizes = np.bincount(inverse)  # n_k
    counts = _dirichlet_counts(class_sizes, n_clients, alpha, rng)  # [K, N]

    # Samples grouped by class, shuffled within each class; then class k's block is cut into the
    # N consecutive runs counts[k, 0], counts[k, 1], ... (the np.split on cumulative proportions,
    # done for all classes at once with one np.repeat).
    grouped = np.lexsort((rng.random(n), inverse))
    owner = np.empty(n, dtype=np.int64)
    owner[grouped] = np.repeat(np.tile(np.arange(n_clients), class_sizes.size), counts.reshape(-1))

    sizes = counts.sum(axis=0)
    if sizes.min() == 0:
        owner, sizes = _fill_empty_clients(owner, sizes, rng)
    by_client = np.argsort(owner, kind="stable")  # stable: indices ascending within a client
    return np.split(by_client, np.cumsum(sizes)[:-1])


def _dirichlet_counts(class_sizes: np.ndarray, n_clients: int, alpha: float,
                      rng: np.random.Generator) -> np.ndarray:
    """counts[k, j] = floor(n_k * cumsum(q_k)_j) - floor(n_k * cumsum(q_k)_{j-1}), q_k ~ Dir(alpha).

    Redrawn while a client would be empty, at most ``_MAX_REDRAWS`` times; the last draw is
    returned either way (the caller repairs empty clients)."""
    n_k = class_sizes[:, None]
    counts = None
    for _ in range(_MAX_REDRAWS):
        q = rng.dirichlet(np.full(n_clients, alpha), size=class_sizes.size)  # [K, N]
        if not np.isfinite(q).all():  # a tiny alpha can underflow: count it as a failed draw
            continue
        cut = np.minimum(np.floor(np.cumsum(q, axis=1) * n_k).astype(np.int64), n_k)
        cut[:, -1] = class_sizes  # the cumulative sum may end at 1 - 1e-16
        counts = np.diff(cut, axis=1, prepend=0)
        if counts.sum(axis=0).min() > 0:
            break
    if counts is None:  # every draw underflowed: all on client 0, the repair spreads it
        counts = np.zeros((class_sizes.size, n_clients), dtype=np.int64)
        counts[:, 0] = class_sizes
    return counts


def _fill_empty_clients(owner: np.ndarray, sizes: np.ndarray,
                        rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Give each empty client one random sample of the client that is largest at that moment."""
    original = sizes
    sizes = sizes.copy()
    receivers: dict[int, list[int]] = {}
    # A loop over empty clients (at most N) that only decides who gives to whom.
    for empty in np.flatnonzero(sizes == 0):
        donor = int(np.argmax(sizes))
        sizes[donor] -= 1
        sizes[empty] += 1
        receivers.setdefault(donor, []).append(int(empty))
    # Each donor's samples are one contiguous block of the owner-sorted order.
    by_client = np.argsort(owner, kind="stable")
    starts = np.cumsum(original) - original
    owner = owner.copy()
    for donor, takers in receivers.items():
        picks = rng.choice(int(original[donor]), size=len(takers), replace=False)
        owner[by_client[starts[donor] + picks]] = takers
    return owner, sizes


def root_set(labels: np.ndarray, size: int, seed: int) -> np.ndarray:
    """Indices of a class-balanced server root set of ``min(size, n)`` training samples (FLTrust).

    FLTrust (Cao et al., NDSS 2021) samples its small clean root set from the learning task's
    training data, so it overlaps the clients' pool. Balanced: every sample gets its rank r within
    its class in a random order, and samples are taken by increasing r * K + pi(class) for a random
    class permutation pi, i.e. one per class, then a second per class, ... . Class counts in the
    root set therefore differ by at most one, unless a class has run out of samples (the others
    then fill in). Seeded by the partition seed on its own stream.

    Returns:
        sorted int64 indices into the training set.
    """
    labels = np.asarray(labels).reshape(-1)
    n = labels.size
    size = min(int(size), n)
    rng = _rng(seed, _STREAM_ROOT)
    _, inverse = np.unique(labels, return_inverse=True)
    class_sizes = np.bincount(inverse)
    grouped = np.lexsort((rng.random(n), inverse))  # by class, random order within a class
    rank = np.empty(n, dtype=np.int64)
    rank[grouped] = np.arange(n) - np.repeat(np.cumsum(class_sizes) - class_sizes, class_sizes)
    priority = rank * class_sizes.size + rng.permutation(class_sizes.size)[inverse]
    return np.sort(np.argsort(priority, kind="stable")[:size])


# --------------------------------------------------------------------------------------------
# Loaders
# --------------------------------------------------------------------------------------------


def clear_dataset_cache() -> None:
    """Forget every cached RawDataset (frees memory; tests use it)."""
    for cached in (_digits, _synthetic, _torchvision):
        cached.cache_clear()


# Dataset defaults: the global ones (the SWB-DM cifar10 setup) cannot learn digits (1,437
# training images, ~70 per client): ~20% after 10 rounds, where lr 0.05, batch 16, 5 local
# epochs reached 93%.
@DATASETS.register("digits", defaults={"lr": 0.05, "batch_size": 16, "local_epochs": 5})
def load_digits(spec: RunSpec) -> RawDataset:
    """scikit-learn's 8x8 digits: train 1,437 / test 360, stratified, fixed split seed 0.

    x = (v / 16 - m) / s, v in {0..16} the pixel value, m and s the mean and standard deviation of
    all training pixels (one channel). Shape (1, 8, 8), 10 classes. The split seed is fixed, not
    the run or partition seed, so every run evaluates on the same 360 images.
    """
    return _digits()


@functools.lru_cache(maxsize=1)
def _digits() -> RawDataset:
    from sklearn.datasets import load_digits as sk_load_digits  # slow import, only when used
    from sklearn.model_selection import train_test_split

    x, y = sk_load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        x / 16.0, y, test_size=360, stratify=y, random_state=0
    )
    mean, std = x_train.mean(), x_train.std()

    def tensor(a: np.ndarray) -> Tensor:
        return torch.as_tensor((a - mean) / std, dtype=torch.float32).reshape(-1, 1, 8, 8)

    return RawDataset(
        train_x=tensor(x_train),
        train_y=torch.as_tensor(y_train, dtype=torch.int64),
        test_x=tensor(x_test),
        test_y=torch.as_tensor(y_test, dtype=torch.int64),
        num_classes=10,
    )


# Expected distance between two class means, in units of the noise standard deviation. With
# 10 classes, 2,000 samples and d = 20, 64 or 3,072, nearest-mean (Bayes) accuracy was 97-99% and
# logistic regression 95-97% at 6.0 (83% / 78% at 4.0): learnable in a few rounds, not trivial.
_SYNTHETIC_SEPARATION = 6.0


@DATASETS.register("synthetic", defaults={"model": "mlp", "lr": 0.05, "batch_size": 16,
                                          "local_epochs": 2})
def load_synthetic(spec: RunSpec) -> RawDataset:
    """A Gaussian mixture: x = mu_y + eps, eps ~ N(0, I_d), mu_k = (S / sqrt(2d)) z_k, z_k ~ N(0, I_d).

    Then E||mu_a - mu_b||^2 = S^2 with S = ``_SYNTHETIC_SEPARATION``. Shape ``synthetic_shape``
    ("1x8x8" -> (1, 8, 8), "20" -> (20,)), K = ``synthetic_classes``, ``synthetic_samples``
    training samples and max(K, round(0.2 * samples)) test samples, labels balanced (i mod K, then
    shuffled). Everything is drawn from the partition seed, so the task is the same for every run
    seed; the means have their own stream, so the task stays the same when the sample count changes.
    """
    shape = tuple(int(part) for part in spec.synthetic_shape.split("x"))
    return _synthetic(shape, int(spec.synthetic_classes), int(spec.synthetic_samples),
                      int(spec.partition_seed))


@functools.lru_cache(maxsize=4)
def _synthetic(shape: tuple[int, ...], classes: int, samples: int, seed: int) -> RawDataset:
    d = int(np.prod(shape))
    means = _rng(seed, _STREAM_SYNTH_MEANS).standard_normal((classes, d))
    means *= _SYNTHETIC_SEPARATION / math.sqrt(2 * d)

    def draw(n: int, stream: int) -> tuple[Tensor, Tensor]:
        rng = _rng(seed, stream)
        y = rng.permutation(np.arange(n) % classes)
        x = means[y] + rng.standard_normal((n, d))
        return (torch.as_tensor(x, dtype=torch.float32).reshape(n, *shape),
                torch.as_tensor(y, dtype=torch.int64))

    train_x, train_y = draw(samples, _STREAM_SYNTH_TRAIN)
    test_x, test_y = draw(max(classes, round(0.2 * samples)), _STREAM_SYNTH_TEST)
    return RawDataset(train_x, train_y, test_x, test_y, num_classes=classes)


@dataclass(frozen=True)
class _TorchvisionSource:
    """How one torchvision dataset is read: its class, extra arguments, classes and the standard
    per-channel statistics of its [0, 1] training pixels."""

    cls_name: str
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    kwargs: tuple[tuple[str, Any], ...] = ()


_TORCHVISION_SOURCES: dict[str, _TorchvisionSource] = {
    "mnist": _TorchvisionSource("MNIST", 10, (0.1307,), (0.3081,)),
    "fashion_mnist": _TorchvisionSource("FashionMNIST", 10, (0.2860,), (0.3530,)),
    # byclass: digits, upper- and lower-case letters, the 62-class FEMNIST stand-in of SWB-DM.
    "emnist": _TorchvisionSource("EMNIST", 62, (0.1736,), (0.3316,), (("split", "byclass"),)),
    # The per-pixel standard deviations (not the 0.2023/0.1994/0.2010 of many CIFAR repositories,
    # which are averages of per-image deviations).
    "cifar10": _TorchvisionSource("CIFAR10", 10, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": _TorchvisionSource("CIFAR100", 100, (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}


def _make_torchvision_loader(name: str) -> Callable[[Any], RawDataset]:
    source = _TORCHVISION_SOURCES[name]

    def loader(spec: RunSpec) -> RawDataset:
        return _torchvision(name, os.path.abspath(os.path.expanduser(spec.data_root)))

    loader.__doc__ = (
        f"torchvision's {source.cls_name} read from ``data_root`` with download=False; "
        f"x = (v / 255 - mean_c) / std_c with mean {source.mean}, std {source.std}; "
        f"{source.num_classes} classes."
    )
    loader.__name__ = f"load_{name}"
    return loader


for _name in _TORCHVISION_SOURCES:
    DATASETS.register(_name, defaults={})(_make_torchvision_loader(_name))
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
    return type(base.__name__, (base,), {
        "train_list": [[file, None] for file, _ in base.train_list],
        "test_list": [[file, None] for file, _ in base.test_list],
        "meta": {**base.meta, "md5": None},
    })


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
        files = [f"emnist-{split}-{part}-{kind}-ubyte" for part in ("train", "test")
                 for kind in ("images-idx3", "labels-idx1")]
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
    except (pickle.UnpicklingError, EOFError, ValueError, KeyError, AssertionError, TypeError) as err:
        folder, _ = _expected_files(name, root)
        raise SpecError(f"dataset {name!r} in {folder} could not be read "
                        f"({type(err).__name__}: {err}); replace the files with torchvision's") from None

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


# --------------------------------------------------------------------------------------------
# One run's federated data
# --------------------------------------------------------------------------------------------


def load_federated(spec: RunSpec, device: torch.device | str) -> FederatedData:
    """The run's dataset split over ``spec.clients`` clients, moved to ``device`` once.

    Partition: ``dirichlet_partition(train_y, clients, dirichlet_alpha, partition_seed)``; root set:
    ``root_set(train_y, fltrust_root_size, partition_seed)``. The training set is gathered in client
    order and transferred as one block; each client's shard is a view of it.
    """
    device = torch.device(device)
    raw = DATASETS[spec.dataset](spec)
    labels = raw.train_y.numpy()
    parts = dirichlet_partition(labels, spec.clients, spec.dirichlet_alpha, spec.partition_seed)
    order = torch.from_numpy(np.concatenate(parts))
    sizes = [int(part.size) for part in parts]
    train_x = raw.train_x[order].to(device)
    train_y = raw.train_y[order].to(device)
    root = torch.from_numpy(root_set(labels, spec.fltrust_root_size, spec.partition_seed))
    return FederatedData(
        num_classes=raw.num_classes,
        input_shape=tuple(int(s) for s in raw.train_x.shape[1:]),
        client_x=list(train_x.split(sizes)),
        client_y=list(train_y.split(sizes)),
        test_x=raw.test_x.to(device),
        test_y=raw.test_y.to(device),
        root_x=raw.train_x[root].to(device),
        root_y=raw.train_y[root].to(device),
    )
