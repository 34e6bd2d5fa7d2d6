"""Datasets that need no files: scikit-learn's 8x8 digits (the embedded default) and a seeded
Gaussian mixture of any shape for tests and benchmarks."""

from __future__ import annotations

import functools
import importlib.util
import math
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from robusttune.core.schema import RunSchema
from robusttune.problem.data.base import (
    DATASETS,
    STREAM_SYNTH_MEANS,
    STREAM_SYNTH_TEST,
    STREAM_SYNTH_TRAIN,
    DataShape,
    RawDataset,
    seeded_rng,
)


# Dataset defaults: the global ones (the SWB-DM cifar10 setup) cannot learn digits (1,437
# training images, ~70 per client): ~20% after 10 rounds, where lr 0.05, batch 16, 5 local
# epochs reached 93%.
@DATASETS.register(
    "digits",
    defaults={"lr": 0.05, "batch_size": 16, "local_epochs": 5},
    data_shape=DataShape((1, 8, 8), 10, 1797),
)
def load_digits(spec: RunSchema) -> RawDataset:
    """scikit-learn's 8x8 digits: train 1,437 / test 360, stratified, fixed split seed 0.

    x = (v / 16 - m) / s, v in {0..16} the pixel value, m and s the mean and standard deviation of
    all training pixels (one channel). Shape (1, 8, 8), 10 classes. The split seed is fixed, not
    the run or partition seed, so every run evaluates on the same 360 images.
    """
    return _digits()


# scikit-learn's stratified split of the 1,797 images (train_test_split, test_size 360,
# random_state 0): the 1,437 training indices in its order, then the 360 test ones. Kept here so
# that a run needs neither sklearn's import (1.2 s, scipy.stats with it: the first run of every
# Ray worker paid it) nor a future sklearn's split; tests/test_data.py recomputes it with sklearn.
DIGITS_SPLIT = Path(__file__).with_name("digits_split.npy")
DIGITS_TRAIN = 1437


@functools.lru_cache(maxsize=1)
def _digits() -> RawDataset:
    values = digits_table()
    x, y = values[:, :-1], values[:, -1].astype(np.int64)
    order = np.load(DIGITS_SPLIT).astype(np.int64)
    train, test = order[:DIGITS_TRAIN], order[DIGITS_TRAIN:]
    x_train, x_test, y_train, y_test = x[train] / 16.0, x[test] / 16.0, y[train], y[test]
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


def digits_table() -> np.ndarray:
    """scikit-learn's digits file as one array: 1,797 rows of 64 pixel values in {0..16} and the
    label (what ``sklearn.datasets.load_digits`` reads), found without importing sklearn."""
    found = importlib.util.find_spec("sklearn")
    locations = list(found.submodule_search_locations or []) if found is not None else []
    for location in locations:
        path = Path(location) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            return np.loadtxt(path, delimiter=",")
    from sklearn.datasets import load_digits as sk_load_digits  # its files moved: ask sklearn

    x, y = sk_load_digits(return_X_y=True)
    return np.column_stack([x, y])


# Expected distance between two class means, in units of the noise standard deviation. With
# 10 classes, 2,000 samples and d = 20, 64 or 3,072, nearest-mean (Bayes) accuracy was 97-99% and
# logistic regression 95-97% at 6.0 (83% / 78% at 4.0): learnable in a few rounds, not trivial.
_SYNTHETIC_SEPARATION = 6.0


def _synthetic_test_samples(classes: int, samples: int) -> int:
    return max(classes, round(0.2 * samples))


def synthetic_shape(spec: RunSchema) -> DataShape:
    """The synthetic set's shape: ``synthetic_shape``, ``synthetic_classes``, and
    ``synthetic_samples`` training plus max(K, round(0.2 * samples)) test inputs."""
    shape = tuple(int(part) for part in spec.synthetic_shape.split("x"))
    classes, samples = int(spec.synthetic_classes), int(spec.synthetic_samples)
    return DataShape(shape, classes, samples + _synthetic_test_samples(classes, samples))


@DATASETS.register(
    "synthetic",
    defaults={"model": "mlp", "lr": 0.05, "batch_size": 16, "local_epochs": 2},
    data_shape=synthetic_shape,
)
def load_synthetic(spec: RunSchema) -> RawDataset:
    """A Gaussian mixture: x = mu_y + eps, eps ~ N(0, I_d), mu_k = (S / sqrt(2d)) z_k, z_k ~ N(0, I_d).

    Then E||mu_a - mu_b||^2 = S^2 with S = ``_SYNTHETIC_SEPARATION``. Shape ``synthetic_shape``
    ("1x8x8" -> (1, 8, 8), "20" -> (20,)), K = ``synthetic_classes``, ``synthetic_samples``
    training samples and max(K, round(0.2 * samples)) test samples, labels balanced (i mod K, then
    shuffled). Everything is drawn from the partition seed, so the task is the same for every run
    seed; the means have their own stream, so the task stays the same when the sample count changes.
    """
    shape = tuple(int(part) for part in spec.synthetic_shape.split("x"))
    return _synthetic(
        shape, int(spec.synthetic_classes), int(spec.synthetic_samples), int(spec.partition_seed)
    )


@functools.lru_cache(maxsize=4)
def _synthetic(shape: tuple[int, ...], classes: int, samples: int, seed: int) -> RawDataset:
    d = int(np.prod(shape))
    means = seeded_rng(seed, STREAM_SYNTH_MEANS).standard_normal((classes, d))
    means *= _SYNTHETIC_SEPARATION / math.sqrt(2 * d)

    def draw(n: int, stream: int) -> tuple[Tensor, Tensor]:
        rng = seeded_rng(seed, stream)
        y = rng.permutation(np.arange(n) % classes)
        x = means[y] + rng.standard_normal((n, d))
        return (
            torch.as_tensor(x, dtype=torch.float32).reshape(n, *shape),
            torch.as_tensor(y, dtype=torch.int64),
        )

    train_x, train_y = draw(samples, STREAM_SYNTH_TRAIN)
    test_x, test_y = draw(_synthetic_test_samples(classes, samples), STREAM_SYNTH_TEST)
    return RawDataset(train_x, train_y, test_x, test_y, num_classes=classes)
