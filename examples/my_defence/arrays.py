"""Your own data: a dataset read from arrays in an .npz file (x_train, y_train, x_test,
y_test), and a small model for it."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch
from torch import nn

from robusttune.core.registries import DATASETS, MODELS
from robusttune.core.registry import SpecError
from robusttune.problem.data.base import DataShape, RawDataset

# where make_arrays.py writes the example's arrays
DEFAULT_ARRAYS = str(Path(__file__).resolve().parent.parent / "arrays.npz")


def arrays_shape(spec, arrays_path: str = DEFAULT_ARRAYS) -> DataShape | None:
    """The arrays' shape from the file's headers alone (memory-mapped, nothing read), so that a
    driver can size a run for a GPU before any trial loads it; None without the file."""
    path = Path(arrays_path).expanduser()
    if not path.exists():
        return None
    with np.load(path, mmap_mode="r") as arrays:
        x_train, x_test = arrays["x_train"], arrays["x_test"]
        classes = int(max(arrays["y_train"].max(), arrays["y_test"].max())) + 1
        return DataShape(tuple(x_train.shape[1:]), classes, len(x_train) + len(x_test))


@DATASETS.register("my_arrays", defaults={"model": "tiny_mlp"}, data_shape=arrays_shape)
def my_arrays(spec, arrays_path: str = DEFAULT_ARRAYS) -> RawDataset:
    """Arrays from an .npz file (x_train, y_train, x_test, y_test), each feature standardised
    with the training set's mean and standard deviation. ``arrays_path`` is this dataset's own
    knob (``--set arrays_path=/data/mine.npz``)."""
    return _read(str(Path(arrays_path).expanduser().resolve()))


@functools.lru_cache(maxsize=4)   # a sweep builds many runs from one file
def _read(path: str) -> RawDataset:
    if not Path(path).exists():
        raise SpecError(f"arrays_path {path!r} does not exist; allowed: an .npz with x_train, "
                        f"y_train, x_test, y_test (python examples/make_arrays.py writes one)")
    with np.load(path) as arrays:
        missing = {"x_train", "y_train", "x_test", "y_test"} - set(arrays.files)
        if missing:
            raise SpecError(f"arrays_path {path!r} lacks {', '.join(sorted(missing))}")
        x_train, x_test = (arrays[k].astype(np.float32) for k in ("x_train", "x_test"))
        y_train, y_test = (arrays[k].astype(np.int64) for k in ("y_train", "y_test"))
    mean, std = x_train.mean(axis=0), x_train.std(axis=0) + 1e-6
    return RawDataset(train_x=torch.from_numpy((x_train - mean) / std),
                      train_y=torch.from_numpy(y_train),
                      test_x=torch.from_numpy((x_test - mean) / std),
                      test_y=torch.from_numpy(y_test),
                      num_classes=int(max(y_train.max(), y_test.max())) + 1)


@MODELS.register("tiny_mlp")
class TinyMLP(nn.Sequential):
    """flatten -> linear(d -> hidden) tanh -> linear(hidden -> K): ``hidden`` is its own knob."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, hidden: int = 32) -> None:
        features = int(np.prod(input_shape))
        super().__init__(nn.Flatten(), nn.Linear(features, hidden), nn.Tanh(),
                         nn.Linear(hidden, num_classes))
