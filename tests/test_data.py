"""Datasets, the Dirichlet partition (Hsu et al., 2019) and the FLTrust root set.

The torchvision datasets are tested on tiny files written in their real on-disk formats (IDX for
the MNIST family, python pickles for CIFAR) in the folders torchvision 0.29 reads them from.
"""

from __future__ import annotations

import math
import pickle
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from robusttune.core.registry import SpecError
from robusttune.core.runspec import RunSpec
from robusttune.problem.data import (
    DATASETS,
    FederatedData,
    RawDataset,
    clear_dataset_cache,
    dirichlet_partition,
    installed,
    load_federated,
    root_set,
)
from robusttune.problem.data.torchvision_files import _TORCHVISION_SOURCES


def _labels(n_per_class: int = 100, classes: int = 10) -> np.ndarray:
    return np.repeat(np.arange(classes), n_per_class)


def _label_tv(labels: np.ndarray, parts: list[np.ndarray], classes: int) -> float:
    """Mean total-variation distance between each client's label mix and the global one."""
    overall = np.bincount(labels, minlength=classes) / labels.size
    tvs = [
        0.5 * np.abs(np.bincount(labels[p], minlength=classes) / p.size - overall).sum()
        for p in parts
    ]
    return float(np.mean(tvs))


# -- partition --------------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [0.05, 0.5, 10.0, math.inf])
def test_partition_is_a_disjoint_cover(alpha):
    labels = _labels()
    parts = dirichlet_partition(labels, 17, alpha, seed=3)
    assert len(parts) == 17
    joined = np.concatenate(parts)
    assert joined.size == labels.size
    assert np.array_equal(np.sort(joined), np.arange(labels.size))
    assert all(p.dtype.kind == "i" for p in parts)


def test_partition_is_seeded_by_its_seed_only():
    labels = _labels()
    a = dirichlet_partition(labels, 10, 0.5, seed=1)
    b = dirichlet_partition(labels, 10, 0.5, seed=1)
    c = dirichlet_partition(labels, 10, 0.5, seed=2)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))
    torch.manual_seed(0)
    np.random.seed(0)  # the global generators play no part
    d = dirichlet_partition(labels, 10, 0.5, seed=1)
    assert all(np.array_equal(x, y) for x, y in zip(a, d))


def test_small_alpha_skews_labels_and_inf_is_balanced():
    labels = _labels(200)
    skewed = _label_tv(labels, dirichlet_partition(labels, 10, 0.05, seed=0), 10)
    moderate = _label_tv(labels, dirichlet_partition(labels, 10, 1.0, seed=0), 10)
    iid_parts = dirichlet_partition(labels, 10, math.inf, seed=0)
    iid = _label_tv(labels, iid_parts, 10)
    # alpha = 0.05: each class sits on one or two clients, far from the global mix (TV near 0.8);
    # IID with 200 samples per client: TV is sampling noise, about 0.1.
    assert skewed > 0.6
    assert iid < 0.15
    assert iid < moderate < skewed
    assert {p.size for p in iid_parts} == {200}


def test_every_client_gets_a_sample_even_with_many_clients_and_tiny_alpha():
    labels = _labels(30)  # 300 samples
    for clients, alpha in [(300, 0.001), (250, 0.01), (100, 0.1), (299, math.inf)]:
        parts = dirichlet_partition(labels, clients, alpha, seed=5)
        assert min(p.size for p in parts) >= 1
        assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(labels.size))


def test_partition_refuses_more_clients_than_samples():
    with pytest.raises(SpecError, match="clients=11"):
        dirichlet_partition(np.zeros(10, dtype=int), 11, 0.5, seed=0)


# -- root set ---------------------------------------------------------------------------------


def test_root_set_is_class_balanced_and_seeded():
    rng = np.random.default_rng(0)
    labels = rng.choice(10, size=2000, p=np.linspace(1, 3, 10) / np.linspace(1, 3, 10).sum())
    idx = root_set(labels, 100, seed=7)
    assert idx.size == 100 and np.unique(idx).size == 100
    assert np.array_equal(np.bincount(labels[idx], minlength=10), np.full(10, 10))
    odd = np.bincount(labels[root_set(labels, 25, seed=7)], minlength=10)
    assert odd.sum() == 25 and odd.max() - odd.min() <= 1
    assert np.array_equal(idx, root_set(labels, 100, seed=7))
    assert not np.array_equal(idx, root_set(labels, 100, seed=8))


def test_root_set_fills_in_when_a_class_runs_out():
    labels = np.array([0] * 2 + [1] * 50 + [2] * 50)
    counts = np.bincount(labels[root_set(labels, 30, seed=0)], minlength=3)
    assert counts.tolist() == [2, 14, 14]
    assert root_set(labels, 1000, seed=0).size == labels.size


# -- embedded datasets ------------------------------------------------------------------------


def test_digits_shapes_counts_and_normalisation():
    raw = DATASETS["digits"](RunSpec(dataset="digits"))
    assert isinstance(raw, RawDataset)
    assert raw.train_x.shape == (1437, 1, 8, 8) and raw.test_x.shape == (360, 1, 8, 8)
    assert raw.train_x.dtype == torch.float32 and raw.train_y.dtype == torch.int64
    assert raw.num_classes == 10
    assert set(raw.train_y.tolist()) == set(range(10)) == set(raw.test_y.tolist())
    assert abs(raw.train_x.mean().item()) < 1e-4 and abs(raw.train_x.std().item() - 1) < 1e-3
    # stratified: each class has 35 or 36 test images out of 360
    assert np.bincount(raw.test_y.numpy()).min() >= 35


def test_digits_are_sklearns_split_bit_for_bit(monkeypatch):
    # independent: scikit-learn's own loader and stratified split, as the dataset was defined
    from sklearn.datasets import load_digits as sk_load_digits
    from sklearn.model_selection import train_test_split

    from robusttune.problem.data import embedded

    x, y = sk_load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        x / 16.0, y, test_size=360, stratify=y, random_state=0
    )
    mean, std = x_train.mean(), x_train.std()
    expected = [
        torch.as_tensor((x_train - mean) / std, dtype=torch.float32).reshape(-1, 1, 8, 8),
        torch.as_tensor(y_train),
        torch.as_tensor((x_test - mean) / std, dtype=torch.float32).reshape(-1, 1, 8, 8),
        torch.as_tensor(y_test),
    ]
    for lookup in ("the package's file", "sklearn's loader"):
        clear_dataset_cache()
        if lookup == "sklearn's loader":  # its data file not found: sklearn reads it
            monkeypatch.setattr(embedded.importlib.util, "find_spec", lambda name: None)
        raw = DATASETS["digits"](RunSpec(dataset="digits"))
        got = [raw.train_x, raw.train_y, raw.test_x, raw.test_y]
        assert all(torch.equal(a, b) for a, b in zip(got, expected)), lookup
    clear_dataset_cache()


def test_digits_load_without_importing_sklearn():
    code = (
        "import sys; from robusttune.core.runspec import RunSpec; "
        "from robusttune.problem.data import DATASETS; "
        "raw = DATASETS['digits'](RunSpec(dataset='digits')); "
        "print(len(raw.train_y), 'sklearn' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.stdout.split() == ["1437", "False"], out.stderr[-2000:]


@pytest.mark.parametrize(("shape", "classes"), [("1x8x8", 10), ("20", 3), ("3x4x5", 7)])
def test_synthetic_follows_its_keys_and_is_deterministic(shape, classes):
    spec = RunSpec(
        dataset="synthetic", synthetic_shape=shape, synthetic_classes=classes, synthetic_samples=500
    )
    raw = DATASETS["synthetic"](spec)
    dims = tuple(int(s) for s in shape.split("x"))
    assert raw.train_x.shape == (500, *dims) and raw.test_x.shape == (100, *dims)
    assert raw.num_classes == classes
    assert set(raw.train_y.tolist()) == set(range(classes))
    clear_dataset_cache()  # a fresh draw, not the cached object, must be identical
    again = DATASETS["synthetic"](spec.updated(seed=99))
    assert torch.equal(raw.train_x, again.train_x) and torch.equal(raw.test_y, again.test_y)
    other = DATASETS["synthetic"](spec.updated(partition_seed=5))
    assert not torch.equal(raw.train_x, other.train_x)


def test_synthetic_is_learnable():
    raw = DATASETS["synthetic"](RunSpec(dataset="synthetic", synthetic_samples=2000))
    x, y = raw.train_x.flatten(1), raw.train_y
    means = torch.stack([x[y == k].mean(0) for k in range(raw.num_classes)])
    predicted = torch.cdist(raw.test_x.flatten(1), means).argmin(1)
    assert (predicted == raw.test_y).float().mean().item() > 0.9


# -- one run's data ---------------------------------------------------------------------------


def test_load_federated_sizes_root_and_shapes():
    spec = RunSpec(dataset="digits", clients=13, dirichlet_alpha=0.3, fltrust_root_size=50)
    data = load_federated(spec, torch.device("cpu"))
    assert isinstance(data, FederatedData)
    assert data.num_classes == 10 and data.input_shape == (1, 8, 8)
    assert len(data.client_x) == len(data.client_y) == 13
    assert sum(data.client_sizes) == 1437 and min(data.client_sizes) >= 1
    assert all(x.shape[0] == y.shape[0] for x, y in zip(data.client_x, data.client_y))
    # the 360 held-out images, half per class (validation_fraction 0.5) in validation
    assert data.test_x.shape[0] + data.validation_x.shape[0] == 360
    assert data.validation_x.shape[1:] == (1, 8, 8)
    assert np.array_equal(np.bincount(data.root_y.numpy(), minlength=10), np.full(10, 5))
    # same partition seed -> same split whatever the run seed
    other = load_federated(spec.updated(seed=7), "cpu")
    assert all(torch.equal(a, b) for a, b in zip(data.client_y, other.client_y))


# -- torchvision datasets from tiny files in their real formats -------------------------------


def _write_idx(path: Path, array: np.ndarray) -> None:
    """IDX: big-endian magic 0x0000 08 ndim (2049 labels, 2051 images), the dims, uint8 data."""
    path.parent.mkdir(parents=True, exist_ok=True)
    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = struct.pack(">I", 0x0800 | array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + array.tobytes())


def _write_pickle(path: Path, obj: dict) -> None:
    # The real files are Python 2 pickles whose str keys torchvision reads back as str
    # (encoding="latin1"), so the fixtures use str keys.
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)


def _mnist_like(
    root: Path, folder: str, names: dict[str, str], classes: int, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    arrays = {
        "train_x": rng.integers(0, 256, (20, 28, 28)),
        "train_y": np.arange(20) % classes,
        "test_x": rng.integers(0, 256, (6, 28, 28)),
        "test_y": np.arange(6) % classes,
    }
    for key, name in names.items():
        _write_idx(root / folder / "raw" / name, arrays[key])
    return arrays


MNIST_NAMES = {
    "train_x": "train-images-idx3-ubyte",
    "train_y": "train-labels-idx1-ubyte",
    "test_x": "t10k-images-idx3-ubyte",
    "test_y": "t10k-labels-idx1-ubyte",
}
EMNIST_NAMES = {
    "train_x": "emnist-byclass-train-images-idx3-ubyte",
    "train_y": "emnist-byclass-train-labels-idx1-ubyte",
    "test_x": "emnist-byclass-test-images-idx3-ubyte",
    "test_y": "emnist-byclass-test-labels-idx1-ubyte",
}


def _write_dataset(name: str, root: Path) -> dict[str, np.ndarray]:
    """Tiny files for ``name``; returns the uint8 arrays as [N, C, H, W] and the labels."""
    rng = np.random.default_rng(0)
    if name in ("mnist", "fashion_mnist", "emnist"):
        folder, names, classes = {
            "mnist": ("MNIST", MNIST_NAMES, 10),
            "fashion_mnist": ("FashionMNIST", MNIST_NAMES, 10),
            "emnist": ("EMNIST", EMNIST_NAMES, 62),
        }[name]
        arrays = _mnist_like(root, folder, names, classes, rng)
        arrays["train_x"] = arrays["train_x"][:, None]
        arrays["test_x"] = arrays["test_x"][:, None]
        return arrays
    # CIFAR rows: 3,072 bytes = the 1,024 red, then green, then blue values of a 32x32 image.
    rows = {
        "train": rng.integers(0, 256, (15, 3072), dtype=np.uint8),
        "test": rng.integers(0, 256, (4, 3072), dtype=np.uint8),
    }
    classes = 10 if name == "cifar10" else 100
    labels = {"train": list(range(15)), "test": [3, 1, 4, 1]}
    labels = {k: [v % classes for v in vals] for k, vals in labels.items()}
    if name == "cifar10":
        folder = root / "cifar-10-batches-py"
        for b in range(5):  # torchvision concatenates data_batch_1..5 in this order
            sl = slice(3 * b, 3 * b + 3)
            _write_pickle(
                folder / f"data_batch_{b + 1}",
                {"data": rows["train"][sl], "labels": labels["train"][sl]},
            )
        _write_pickle(folder / "test_batch", {"data": rows["test"], "labels": labels["test"]})
        _write_pickle(folder / "batches.meta", {"label_names": [f"c{i}" for i in range(10)]})
    else:
        folder = root / "cifar-100-python"
        for split in ("train", "test"):
            _write_pickle(
                folder / split,
                {
                    "data": rows[split],
                    "fine_labels": labels[split],
                    "coarse_labels": [v % 20 for v in labels[split]],
                },
            )
        _write_pickle(folder / "meta", {"fine_label_names": [f"c{i}" for i in range(100)]})
    return {
        "train_x": rows["train"].reshape(-1, 3, 32, 32),
        "train_y": np.array(labels["train"]),
        "test_x": rows["test"].reshape(-1, 3, 32, 32),
        "test_y": np.array(labels["test"]),
    }


TORCHVISION = {
    "mnist": (1, 10),
    "fashion_mnist": (1, 10),
    "emnist": (1, 62),
    "cifar10": (3, 10),
    "cifar100": (3, 100),
}


@pytest.mark.parametrize("name", sorted(TORCHVISION))
def test_torchvision_dataset_reads_its_on_disk_format(name, tmp_path):
    expected = _write_dataset(name, tmp_path)
    spec = RunSpec(dataset=name, data_root=str(tmp_path))
    raw = DATASETS[name](spec)
    channels, classes = TORCHVISION[name]
    assert raw.num_classes == classes
    assert raw.train_x.shape == expected["train_x"].shape and raw.train_x.shape[1] == channels
    assert raw.test_x.shape == expected["test_x"].shape
    assert raw.train_x.dtype == torch.float32 and raw.train_y.dtype == torch.int64
    assert raw.train_y.tolist() == expected["train_y"].tolist()
    assert raw.test_y.tolist() == expected["test_y"].tolist()
    # undo the per-channel normalisation: back to the stored pixels, in C, H, W order
    mean = torch.tensor(_TORCHVISION_SOURCES[name].mean).view(1, -1, 1, 1)
    std = torch.tensor(_TORCHVISION_SOURCES[name].std).view(1, -1, 1, 1)
    pixels = torch.round((raw.train_x * std + mean) * 255).to(torch.int64)
    assert torch.equal(pixels, torch.as_tensor(expected["train_x"], dtype=torch.int64))
    data = load_federated(spec.updated(clients=4, fltrust_root_size=4), "cpu")
    assert sum(data.client_sizes) == expected["train_x"].shape[0]
    assert data.input_shape == expected["train_x"].shape[1:]


@pytest.mark.parametrize(
    ("name", "folder"),
    [
        ("mnist", "MNIST/raw"),
        ("fashion_mnist", "FashionMNIST/raw"),
        ("emnist", "EMNIST/raw"),
        ("cifar10", "cifar-10-batches-py"),
        ("cifar100", "cifar-100-python"),
    ],
)
def test_missing_dataset_is_one_clear_line(name, folder, tmp_path, monkeypatch):
    # fashion_mnist falls back to Debian's package, installed by `make data`: here it is not
    monkeypatch.setattr(installed, "DEBIAN_FASHION_MNIST", tmp_path / "no-debian-package")
    with pytest.raises(SpecError) as info:
        DATASETS[name](RunSpec(dataset=name, data_root=str(tmp_path)))
    message = str(info.value)
    assert "\n" not in message
    assert name in message and "no download" in message
    assert str(tmp_path / folder) in message


def test_partly_missing_dataset_names_the_missing_file(tmp_path):
    _write_dataset("mnist", tmp_path)
    (tmp_path / "MNIST" / "raw" / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(SpecError, match="missing: t10k-labels-idx1-ubyte"):
        DATASETS["mnist"](RunSpec(dataset="mnist", data_root=str(tmp_path)))


# -- the validation split of the held-out set ---------------------------------------------------


@pytest.mark.parametrize("fraction", [0.2, 0.5])
def test_validation_split_is_stratified_seeded_and_disjoint(fraction):
    from robusttune.problem.data import validation_split

    labels = np.repeat(np.arange(4), [10, 7, 1, 22])
    validation, test = validation_split(labels, fraction, seed=3)
    assert np.intersect1d(validation, test).size == 0
    assert np.array_equal(np.sort(np.concatenate([validation, test])), np.arange(labels.size))
    # v = round(fraction n) in all, each class floor or ceil of fraction x n_k
    assert validation.size == {0.2: 8, 0.5: 20}[fraction]
    per_class = np.bincount(labels[validation], minlength=4)
    sizes = np.array([10, 7, 1, 22])
    assert np.all(
        (per_class >= np.floor(fraction * sizes)) & (per_class <= np.ceil(fraction * sizes))
    )
    again, _ = validation_split(labels, fraction, seed=3)
    other, _ = validation_split(labels, fraction, seed=4)
    assert np.array_equal(validation, again) and not np.array_equal(validation, other)
    none, everything = validation_split(labels, 0.0, seed=3)
    assert none.size == 0 and everything.size == labels.size
    with pytest.raises(SpecError, match=r"validation_fraction 0.01 leaves no validation sample"):
        validation_split(labels, 0.01, seed=3)
    with pytest.raises(SpecError, match=r"validation_fraction 0.99 leaves no test sample"):
        validation_split(labels, 0.99, seed=3)


def test_the_validation_part_leaves_training_untouched_and_is_held_out():
    spec = RunSpec(dataset="digits", clients=5)
    split = load_federated(spec, "cpu")
    whole = load_federated(spec.updated(validation_fraction=0.0), "cpu")
    assert all(torch.equal(a, b) for a, b in zip(split.client_x, whole.client_x))
    assert torch.equal(split.root_x, whole.root_x)
    assert whole.validation_y.numel() == 0 and whole.test_y.numel() == 360
    # every held-out image is in exactly one part, none in a client's data
    held_out = torch.cat([split.test_x, split.validation_x]).flatten(1)
    assert held_out.shape[0] == 360
    assert (
        torch.unique(held_out, dim=0).shape[0]
        == torch.unique(whole.test_x.flatten(1), dim=0).shape[0]
    )
    bad = pytest.raises(SpecError, match="validation_fraction")
    with bad:
        RunSpec(dataset="digits", validation_fraction=1.0)


# -- a stratified subset of the training set (train_samples) ---------------------------------------


def test_training_subset_is_stratified_seeded_nested_and_bounded():
    from robusttune.problem.data import training_subset

    sizes = np.array([10, 7, 1, 22, 60])
    labels = np.random.default_rng(0).permutation(np.repeat(np.arange(5), sizes))
    subset = training_subset(labels, 25, seed=3)
    assert subset.size == 25 and np.array_equal(subset, np.unique(subset))
    # each class floor or ceil of size x n_k / n: the training set's proportions
    share = 25 * sizes / sizes.sum()
    per_class = np.bincount(labels[subset], minlength=5)
    assert np.all((per_class >= np.floor(share)) & (per_class <= np.ceil(share))), per_class
    assert np.array_equal(subset, training_subset(labels, 25, seed=3))
    assert not np.array_equal(subset, training_subset(labels, 25, seed=4))
    # a larger subset holds a smaller one (the same keys, more of them taken)
    assert np.isin(subset, training_subset(labels, 60, seed=3)).all()
    assert np.array_equal(training_subset(labels, 100, seed=3), np.arange(100))
    with pytest.raises(
        SpecError,
        match=r"train_samples must be in \[1, 100\] \(toy has 100 training samples\); got 101",
    ):
        training_subset(labels, 101, seed=3, dataset="toy")


def test_train_samples_shrinks_every_clients_data_and_the_root_set_to_the_subset():
    spec = RunSpec(dataset="digits", clients=5, train_samples=300, fltrust_root_size=20)
    small = load_federated(spec, "cpu")
    whole = load_federated(spec.updated(train_samples=None), "cpu")
    assert sum(y.numel() for y in small.client_y) == 300
    assert sum(y.numel() for y in whole.client_y) == 1437
    pool = torch.cat(small.client_x).flatten(1)
    # the root set is drawn from the subset; the held-out parts are untouched
    assert all((pool == row).all(dim=1).any() for row in small.root_x.flatten(1))
    assert torch.equal(small.test_x, whole.test_x) and torch.equal(
        small.validation_y, whole.validation_y
    )
    with pytest.raises(SpecError, match="train_samples must be in"):
        load_federated(spec.updated(train_samples=5000), "cpu")
