"""Where a sweep's results live and the files kept beside them. Results go to ``STORAGE/NAME``
(default ``./results/NAME``), a local folder or an object-store URI (``s3://bucket/results``):
one folder per trial, Tune's experiment state, ``sweep.yaml`` (the space as run, so ``--resume``
rebuilds the same sweep) and ``trials.csv`` (one row per trial). Local files are written
atomically (`robusttune.core.files.write_text_atomic`); remote ones through pyarrow's filesystems.
Imports no ray except in `restorable`."""

from __future__ import annotations

from pathlib import Path

from robusttune.core.files import write_text_atomic
from robusttune.core.registry import SpecError
from robusttune.core.yaml_input import MAX_YAML_BYTES, parse_yaml, read_yaml_text
from robusttune.experiments.sweep.space import SweepSpec, parse_sweep

__all__ = [
    "DEFAULT_STORAGE",
    "SWEEP_FILE",
    "TRIALS_FILE",
    "experiment_path",
    "is_local",
    "read_text",
    "restorable",
    "storage_path",
    "stored_sweep",
    "write_text",
]

SWEEP_FILE = "sweep.yaml"
TRIALS_FILE = "trials.csv"
DEFAULT_STORAGE = "./results"


def is_local(storage: str) -> bool:
    return "://" not in storage or storage.startswith("file://")


def experiment_path(storage: str, name: str) -> str:
    if is_local(storage):
        return str(Path(storage.removeprefix("file://")).expanduser().resolve() / name)
    # A URI's query (s3://bucket/results?region=us-west-2) stays at the end, after the name.
    base, mark, query = storage.partition("?")
    return f"{base.rstrip('/')}/{name}{mark}{query}"


def storage_path(storage: str) -> str:
    """The storage root as Tune's RunConfig takes it: a local one absolute, a URI as it is."""
    return (
        str(Path(storage.removeprefix("file://")).expanduser().resolve())
        if is_local(storage)
        else storage
    )


def write_text(folder: str, filename: str, text: str) -> None:
    """Write a file beside the results; locally through a temporary file and a rename, so an
    interrupted write never leaves half a sweep.yaml for ``--resume`` to misread (object stores
    publish a file only when its upload completes)."""
    if is_local(folder):
        Path(folder).mkdir(parents=True, exist_ok=True)
        write_text_atomic(Path(folder) / filename, text)
        return
    import pyarrow.fs

    filesystem, path = pyarrow.fs.FileSystem.from_uri(folder)
    filesystem.create_dir(path, recursive=True)
    with filesystem.open_output_stream(f"{path}/{filename}") as stream:
        stream.write(text.encode())


def read_text(folder: str, filename: str) -> str | None:
    """A YAML file beside the results (UTF-8, at most MAX_YAML_BYTES: `read_yaml_text`), or None
    when there is none."""
    if is_local(folder):
        path = Path(folder) / filename
        return read_yaml_text(path) if path.exists() else None
    import pyarrow.fs

    filesystem, path = pyarrow.fs.FileSystem.from_uri(folder)
    try:
        with filesystem.open_input_stream(f"{path}/{filename}") as stream:
            data = stream.read(MAX_YAML_BYTES + 1)
    except (FileNotFoundError, OSError):
        return None
    where = f"{folder}/{filename}"
    if len(data) > MAX_YAML_BYTES:
        raise SpecError(
            f"{where}: larger than {MAX_YAML_BYTES:,} bytes; allowed: the YAML file a sweep wrote"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise SpecError(
            f"{where}: not UTF-8 text (byte 0x{data[error.start]:02x} at offset "
            f"{error.start}); allowed: the YAML file a sweep wrote"
        ) from None


def stored_sweep(path: str) -> SweepSpec | None:
    """The SweepSpec stored beside a sweep's results (what ``--resume`` runs)."""
    text = read_text(path, SWEEP_FILE)
    if text is None:
        return None
    source = f"{path}/{SWEEP_FILE}"
    mapping = parse_yaml(text, source)
    name = mapping.get("name") if isinstance(mapping, dict) else None
    return parse_sweep(mapping, name=name or Path(path).name, source=source)


def restorable(path: str) -> bool:
    """Whether ``path`` holds Tune experiment state that ``Tuner.restore`` can continue."""
    from ray.tune import Tuner

    return Tuner.can_restore(path)
