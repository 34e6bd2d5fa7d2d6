"""Your own data: a dataset read from arrays in an .npz file (x_train, y_train, x_test,
y_test), and a small model for it."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch
from torch import nn

from robusttune.plugin import DATASETS, MODELS, DataShape, RawDataset, SpecError

# where make_arrays.py writes the example's arrays
DEFAULT_ARRAYS = str(Path(__file__).resolve().parent.parent / "arrays.npz")


# what the file may hold once decompressed: an .npz is a zip, whose members can expand far
# beyond the file's own size, so the arrays' sizes are read from their headers and checked first
MAX_ARRAY_BYTES = 8 * 1024**3
ARRAYS = ("x_train", "y_train", "x_test", "y_test")


def array_headers(path: Path) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Each array's (shape, dtype) from its .npy header inside the .npz, nothing decompressed
    beyond the headers; one SpecError line for a file that is not such an archive, lacks an
    array, holds objects (never unpickled), or would expand past MAX_ARRAY_BYTES."""
    import zipfile

    where = f"arrays_path {str(path)!r}"
    headers = {}
    missing: list[str] = []
    try:
        with zipfile.ZipFile(path) as archive:
            names = {name.removesuffix(".npy"): name for name in archive.namelist()}
            missing = [k for k in ARRAYS if k not in names]
            for key in ARRAYS if not missing else ():
                with archive.open(names[key]) as member:
                    version = np.lib.format.read_magic(member)
                    read_header = (
                        np.lib.format.read_array_header_1_0
                        if version == (1, 0)
                        else np.lib.format.read_array_header_2_0
                    )
                    shape, _, dtype = read_header(member)
                headers[key] = (tuple(int(n) for n in shape), np.dtype(dtype))
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as error:
        raise SpecError(
            f"{where} is not a readable .npz of arrays ({type(error).__name__}); "
            f"allowed: an .npz with {', '.join(ARRAYS)} (python "
            f"examples/make_arrays.py writes one)"
        ) from None
    if missing:
        raise SpecError(
            f"{where} lacks {', '.join(missing)}; allowed: an .npz with {', '.join(ARRAYS)}"
        )
    size = sum(int(np.prod(shape)) * dtype.itemsize for shape, dtype in headers.values())
    if any(dtype.hasobject for _, dtype in headers.values()) or size > MAX_ARRAY_BYTES:
        raise SpecError(
            f"{where}: arrays of {size:,} bytes or of Python objects; allowed: "
            f"numeric arrays of at most {MAX_ARRAY_BYTES:,} bytes"
        )
    (x_train, _), (y_train, _), (x_test, _), (y_test, _) = (headers[k] for k in ARRAYS)
    if (
        len(x_train) < 2
        or len(y_train) != 1
        or x_train[0] != y_train[0]
        or x_test[1:] != x_train[1:]
        or len(y_test) != 1
        or x_test[0] != y_test[0]
    ):
        raise SpecError(
            f"{where}: shapes x_train {x_train}, y_train {y_train}, x_test "
            f"{x_test}, y_test {y_test}; allowed: x of shape (n, features ...), y "
            f"of shape (n,), train and test alike but for n"
        )
    return headers


def arrays_shape(spec, arrays_path: str = DEFAULT_ARRAYS) -> DataShape | None:
    """The arrays' shape from the file's headers and labels alone (the inputs are not
    decompressed), so that a driver can size a run for a GPU before any trial loads it; None
    without the file."""
    path = Path(arrays_path).expanduser()
    if not path.exists():
        return None
    headers = array_headers(path)
    x_train, x_test = headers["x_train"][0], headers["x_test"][0]
    with np.load(path, allow_pickle=False) as arrays:
        classes = int(max(arrays["y_train"].max(), arrays["y_test"].max())) + 1
    return DataShape(tuple(x_train[1:]), classes, x_train[0] + x_test[0])


@DATASETS.register("my_arrays", defaults={"model": "tiny_mlp"}, data_shape=arrays_shape)
def my_arrays(spec, arrays_path: str = DEFAULT_ARRAYS) -> RawDataset:
    """Arrays from an .npz file (x_train, y_train, x_test, y_test), each feature standardised
    with the training set's mean and standard deviation. ``arrays_path`` is this dataset's own
    knob (``--set arrays_path=/data/mine.npz``)."""
    return _read(str(Path(arrays_path).expanduser().resolve()))


@functools.lru_cache(maxsize=4)  # a sweep builds many runs from one file
def _read(path: str) -> RawDataset:
    if not Path(path).exists():
        raise SpecError(
            f"arrays_path {path!r} does not exist; allowed: an .npz with x_train, "
            f"y_train, x_test, y_test (python examples/make_arrays.py writes one)"
        )
    array_headers(Path(path))  # sizes and shapes checked before anything is decompressed
    with np.load(path, allow_pickle=False) as arrays:
        x_train, x_test = (arrays[k].astype(np.float32) for k in ("x_train", "x_test"))
        y_train, y_test = (arrays[k] for k in ("y_train", "y_test"))
    labels = np.concatenate([y_train.ravel(), y_test.ravel()])
    if (
        not np.issubdtype(labels.dtype, np.integer)
        or labels.min() < 0
        or not np.isfinite(x_train).all()
        or not np.isfinite(x_test).all()
    ):
        raise SpecError(
            f"arrays_path {path!r}: labels of {labels.dtype} from {labels.min()} or "
            f"non-finite inputs; allowed: integer labels from 0, finite inputs"
        )
    y_train, y_test = y_train.astype(np.int64), y_test.astype(np.int64)
    mean, std = x_train.mean(axis=0), x_train.std(axis=0) + 1e-6
    return RawDataset(
        train_x=torch.from_numpy((x_train - mean) / std),
        train_y=torch.from_numpy(y_train),
        test_x=torch.from_numpy((x_test - mean) / std),
        test_y=torch.from_numpy(y_test),
        num_classes=int(max(y_train.max(), y_test.max())) + 1,
    )


@MODELS.register("tiny_mlp")
class TinyMLP(nn.Sequential):
    """flatten -> linear(d -> hidden) tanh -> linear(hidden -> K): ``hidden`` is its own knob."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, hidden: int = 32) -> None:
        features = int(np.prod(input_shape))
        super().__init__(
            nn.Flatten(), nn.Linear(features, hidden), nn.Tanh(), nn.Linear(hidden, num_classes)
        )
