"""The Ray Tune function trainable: a thin adapter around `Simulation` (STYLE.md: the engine
knows nothing of the scheduler).

Per round it reports one result with every RoundRecord field, ``last_accuracy``/``last_loss``
(the most recent evaluated figures, defined in every round) and the resolved RunSpec keys that
identify the run (the space's keys plus method, attack, byzantine_fraction ...). Every
``checkpoint_every`` rounds the result carries a checkpoint holding ``Simulation.state_dict()``
(global model, caches, RNG states), from which a resumed or paused trial continues bit for bit.
The trial folder also gets the run folder files (rounds.csv, summary.json, TensorBoard scalars and
HParams) through `RunWriter`, so ``tensorboard --logdir results/NAME`` shows the whole sweep.
A trial given a fraction of a GPU may allocate only that fraction of its memory
(`cuda_memory_fraction`).

A configuration error (a `SpecError` while the trial builds its run: data files missing on its
node, a drawn combination the rules reject) is not an exception for Tune: Tune retries every
exception ``FailureConfig.max_failures`` times, and the same configuration fails the same way
each time. The trial instead ends at once with one result that carries the message under
``CONFIG_ERROR`` (and the metrics as NaN, which Tune requires of a result) and writes it to
its folder's error.txt; the sweep counts it as errored (`trials.saved_statuses`). Retries
stay for what a retry can cure: a lost node, a killed worker.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from robusttune.core.plugins import load_plugins
from robusttune.core.registry import SpecError
from robusttune.core.runspec import RunSpec
from robusttune.experiments.sweep.ray_compat import TrialStopped, trial_storage
from robusttune.experiments.sweep.space import SweepSpec

CHECKPOINT_FILE = "simulation.pt"
# beside it: the rounds the trial had continued from when the checkpoint was taken (a JSON list)
RESTORED_FILE = "restored_from_rounds.json"
# The result key of a trial that ended on a configuration error (its value: the one-line message)
CONFIG_ERROR = "config_error"
ERROR_FILE = "error.txt"
# Keys every result row carries even when the space does not vary them, so rows from several
# sweeps can be put side by side.
IDENTITY_KEYS = (
    "dataset",
    "method",
    "algorithm",
    "aggregator",
    "attack",
    "byzantine_fraction",
    "participation",
    "participation_mode",
    "clients",
    "rounds",
    "seed",
)


def trial_device(requested: str, gpu_ids: list[Any]) -> str:
    """The device a trial runs on, from the resources Ray gave it (not from whether this node has
    a GPU: a CPU trial beside GPU trials must stay off the GPU). ``cpu`` stays cpu. Ray shows a
    trial only its own GPUs, numbered from 0, so ``cuda:N`` beyond them means the trial's first."""
    if requested == "cpu" or not gpu_ids:
        return "cpu"
    if requested.startswith("cuda:") and int(requested.split(":", 1)[1]) < len(gpu_ids):
        return requested
    return "cuda"


def cuda_memory_fraction(resources: Mapping[str, float]) -> float | None:
    """The share of its GPU's memory a trial may allocate: its GPU fraction when below one, so
    trials packed onto one GPU (gpu: 0.25 -> four per GPU) cannot run each other out of memory;
    None (no cap) for whole GPUs or none. Ray hands out fractions of one GPU only."""
    gpu = float(resources.get("GPU", 0.0))
    return gpu if 0.0 < gpu < 1.0 else None


def place_trial(requested: str, resources: Mapping[str, float], gpu_ids: list[Any]) -> str:
    """The trial's device (``trial_device`` of the GPUs Ray gave it, none when it asked for no
    GPU), with its share of that GPU's memory capped at its GPU fraction
    (``torch.cuda.set_per_process_memory_fraction``, process-wide, so once per trial process
    before anything is allocated). Ray makes the trial's GPUs the only visible ones
    (CUDA_VISIBLE_DEVICES), so the index is within what torch sees."""
    device = trial_device(requested, list(gpu_ids) if float(resources.get("GPU", 0.0)) > 0 else [])
    fraction = cuda_memory_fraction(resources)
    if fraction is not None and device.startswith("cuda") and torch.cuda.is_available():
        torch.cuda.set_per_process_memory_fraction(fraction, torch.device(device).index or 0)
    return device


def trial_threads(resources: Mapping[str, float]) -> int:
    """Torch threads = the trial's whole CPUs (at least one): trials side by side with one thread
    each fill a CPU machine better than one trial with many (DESIGN.md, local training). In the
    default portable numerics the run then pins one thread (robusttune.core.numerics)."""
    return max(1, math.floor(float(resources.get("CPU", 1.0)) + 1e-9))


def identity(spec: RunSpec, keys: tuple[str, ...]) -> dict[str, Any]:
    """The RunSpec values every result row of a trial carries: IDENTITY_KEYS and the space's keys."""
    resolved = spec.to_dict()
    columns = {}
    for key in dict.fromkeys(IDENTITY_KEYS + keys):
        value = resolved[key]
        columns[key] = (
            value if value is None or isinstance(value, (bool, int, float, str)) else str(value)
        )
    return columns


def result_row(
    record_dict: Mapping[str, Any],
    columns: Mapping[str, Any],
    last_accuracy: float,
    last_loss: float,
    last_validation_accuracy: float = math.nan,
) -> dict[str, Any]:
    """One Tune result: the record, the carried-forward figures and the identifying RunSpec keys."""
    row = dict(record_dict)
    row["last_accuracy"] = float(last_accuracy)
    row["last_loss"] = float(last_loss)
    row["last_validation_accuracy"] = float(last_validation_accuracy)
    row.update(columns)
    return row


def federated_trainable(config: dict[str, Any], sweep: SweepSpec) -> None:
    """One trial = one federated run. ``config`` holds the space's axis values (Tune's config);
    ``sweep`` (bound with ``tune.with_parameters``) turns it into a RunSpec."""
    import ray
    from ray import tune

    from robusttune.engine.recording import RunWriter
    from robusttune.engine.simulation import Simulation

    started = time.perf_counter()
    context = tune.get_context()
    resources = context.get_trial_resources().required_resources
    torch.set_num_threads(trial_threads(resources))

    values = sweep.resolve(config)
    requested = str(values.get("device", "auto"))
    device = place_trial(
        requested, resources, ray.get_gpu_ids() if resources.get("GPU", 0) > 0 else []
    )
    run_folder = trial_folder(context)
    try:
        load_plugins(sweep.plugins)  # a plugin missing here ends the trial, not retried
        spec = RunSpec.from_dict({**values, "device": device})
        simulation = Simulation(spec)
    except SpecError as error:
        report_config_error(str(error), sweep.search.metrics, run_folder)
        return
    restored = restore_checkpoint(simulation, context, run_folder)
    # the sweep declared the HParams experiment in its folder; a trial adds its values only
    writer = RunWriter(
        run_folder, spec, resume_at=simulation.rounds_done, declares_experiment=False
    )
    columns = identity(spec, tuple(k for k in sweep.varied_keys if k != "device"))
    every = spec.checkpoint_every
    try:
        for record in simulation:
            writer.write(record)
            row = result_row(
                record.to_dict(),
                columns,
                simulation.last_accuracy,
                simulation.last_loss,
                simulation.last_validation_accuracy,
            )
            if every and simulation.rounds_done % every == 0:
                # Scalars up to a checkpoint must be on disk before the checkpoint exists: a
                # resumed trial only writes the rounds after it.
                writer.flush()
                with tempfile.TemporaryDirectory(prefix="robusttune-ckpt-") as folder:
                    save_checkpoint(simulation, restored, Path(folder))
                    tune.report(row, checkpoint=tune.Checkpoint.from_directory(folder))
            else:
                tune.report(row)
    except TrialStopped:
        # Tune stopped the trial (a scheduler such as ASHA, or the sweep being interrupted): the
        # summary says so; a resumed trial replaces it.
        summary = simulation.summary(time.perf_counter() - started)
        writer.close(summary.restored_from(restored).stopped())
        raise
    except BaseException:
        # A crash: keep what was written, but no summary.json (it would claim a finished run).
        writer.abort()
        raise
    writer.close(simulation.summary(time.perf_counter() - started).restored_from(restored))


def restore_checkpoint(simulation: Any, context: Any, folder: Path) -> tuple[int, ...]:
    """The checkpointed rounds this trial has continued from, this (re)start's last: its last
    checkpoint's round, loaded into ``simulation`` with the run folder's files brought back
    (`fetch_run_files`), after the rounds its earlier restarts continued from (saved beside the
    checkpoint by `save_checkpoint`); () for a first start. A trial restarted without a
    checkpoint (killed before its first one, or checkpoint_every 0) runs again from round 1:
    RunWriter's resume_at 0 clears the rows and scalars its first attempt left."""
    from ray import tune

    from robusttune.engine.simulation import load_checkpoint

    checkpoint = tune.get_checkpoint()
    if checkpoint is None:
        return ()
    with checkpoint.as_directory() as saved:
        simulation.load_state_dict(load_checkpoint(Path(saved) / CHECKPOINT_FILE))
        earlier = Path(saved) / RESTORED_FILE
        # a checkpoint written before restarts were recorded has no such file
        before = json.loads(earlier.read_text()) if earlier.exists() else []
    fetch_run_files(context, folder)
    return (*(int(r) for r in before), simulation.rounds_done)


def save_checkpoint(simulation: Any, restored: Sequence[int], folder: Path) -> None:
    """Write ``simulation``'s state (`Simulation.state_dict`) and the rounds its trial has
    continued from so far into ``folder``, which becomes a Tune checkpoint."""
    torch.save(simulation.state_dict(), folder / CHECKPOINT_FILE)
    (folder / RESTORED_FILE).write_text(json.dumps([int(r) for r in restored]))


def report_config_error(message: str, metrics: Sequence[str], folder: Path, **extra: Any) -> None:
    """End the trial on a configuration error without an exception (so Tune does not retry
    it): one result with the message, NaN ``metrics`` (Tune requires them of a result) and
    ``extra``, and the message in error.txt."""
    from ray import tune

    folder.mkdir(parents=True, exist_ok=True)
    (folder / ERROR_FILE).write_text(f"configuration error: {message}\n")
    tune.report({**dict.fromkeys(metrics, math.nan), CONFIG_ERROR: message, **extra})


def trial_folder(context: Any) -> Path:
    """Where the run folder files go. Local (or shared) storage: straight into the trial folder
    under STORAGE/NAME, so TensorBoard sees rounds as they come. Remote storage (s3://, gs://):
    the trial's working directory, which Ray copies there (SyncConfig(sync_artifacts=True)).
    (``get_trial_dir()`` is neither in Ray 2.60: it is a staging folder that changes when an
    actor is reused.)"""
    import pyarrow.fs

    filesystem, path = trial_storage(context)
    if isinstance(filesystem, pyarrow.fs.LocalFileSystem):
        return Path(path)
    return Path(os.getcwd())


def fetch_run_files(context: Any, folder: Path) -> None:
    """Remote storage: a restored trial (its node lost, or the sweep resumed) starts in a new,
    empty working directory, on whichever node runs it. Bring back the run folder files it had
    uploaded (rounds.csv, TensorBoard event files), so ``RunWriter(..., resume_at=k)`` cuts them
    at the checkpoint and the next upload does not replace rounds.csv by only the rounds after it.
    Nothing to do when the folder is the trial folder itself (local or shared storage)."""
    import pyarrow.fs

    source, stored = trial_storage(context)
    if Path(stored) == folder and isinstance(source, pyarrow.fs.LocalFileSystem):
        return
    selector = pyarrow.fs.FileSelector(stored, allow_not_found=True)
    for info in source.get_file_info(selector):
        name = info.base_name
        wanted = name == "rounds.csv" or name.startswith("events.out.tfevents.")
        if info.type == pyarrow.fs.FileType.File and wanted and not (folder / name).exists():
            pyarrow.fs.copy_files(
                info.path,
                str(folder / name),
                source_filesystem=source,
                destination_filesystem=pyarrow.fs.LocalFileSystem(),
            )
