"""The run folder: rounds.csv (one row per RoundRecord), summary.json (the RunSummary: final
figures and the resolved RunSpec) and TensorBoard event files (per-round scalars and the run's
hyperparameters for the HParams view). Used by the `run` command and by every sweep trial alike;
a trial restored from a checkpoint reopens its folder with ``RunWriter(..., resume_at=k)``."""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from robusttune.core.files import write_json_atomic, write_text_atomic

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter
from robusttune.core.records import RoundRecord, RunSummary
from robusttune.core.runspec import RunSpec
from robusttune.engine.simulation import Simulation

# Scalars worth a TensorBoard curve; the rest of a record stays in rounds.csv.
TENSORBOARD_SCALARS = (
    "accuracy",
    "validation_accuracy",
    "loss",
    "param_norm",
    "nonfinite_params",
    "nonfinite_messages",
    "max_class_share",
    "byzantine_sampled",
    "byzantine_input_share",
    "train_seconds",
    "aggregate_seconds",
    "aggregation_error",
    "honest_input_spread",
)
# Hyperparameters shown in the HParams view: the knobs a sweep varies, not paths.
HPARAM_EXCLUDE = ("data_root",)
# The HParams view's metrics: (tag, display name, what it is).
RUN_METRICS = (
    ("final/accuracy", "final accuracy", "test accuracy after the last round (fraction)"),
    (
        "final/validation_accuracy",
        "final validation accuracy",
        "validation accuracy after the last round (fraction; what selection reads)",
    ),
    ("final/loss", "final loss", "test loss after the last round"),
    ("final/collapsed", "collapsed", "1: accuracy at chance + 0.5 points or non-finite parameters"),
)


def _hparam_values(values: Mapping[str, Any]) -> dict[str, Any]:
    return {
        k: (v if isinstance(v, (int, float, str, bool)) else str(v))
        for k, v in values.items()
        if k not in HPARAM_EXCLUDE
    }


def experiment_summary(params: Mapping[str, Any], varied: Sequence[str] = ()) -> Any:
    """The HParams experiment declared for TensorBoard: one column per RunSpec key of ``params``
    (a resolved spec), the keys the sweep ``varied`` first and marked as differing, the fixed
    ones after, and the run metrics (RUN_METRICS) named. TensorBoard orders its columns by
    (differs, name) and shows the first few by default, so the swept keys are what a user sees
    and the fixed ones are one tick away. Returns a Summary protobuf to write once per logdir."""
    from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboard.plugins.hparams import api_pb2, metadata
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData
    from torch.utils.tensorboard.summary import hparams

    inferred, _, _ = hparams(_hparam_values(params), {tag: 0.0 for tag, _, _ in RUN_METRICS})
    infos = {
        info.name: info
        for info in metadata.parse_experiment_plugin_data(
            inferred.value[0].metadata.plugin_data.content
        ).hparam_infos
    }
    order = [k for k in varied if k in infos] + sorted(k for k in infos if k not in varied)
    experiment = api_pb2.Experiment()
    for name in order:
        info = infos[name]
        info.differs = name in varied
        experiment.hparam_infos.append(info)
    for tag, display, description in RUN_METRICS:
        experiment.metric_infos.append(
            api_pb2.MetricInfo(
                name=api_pb2.MetricName(tag=tag), display_name=display, description=description
            )
        )
    content = HParamsPluginData(experiment=experiment, version=metadata.PLUGIN_DATA_VERSION)
    summary_metadata = SummaryMetadata(
        plugin_data=SummaryMetadata.PluginData(
            plugin_name=metadata.PLUGIN_NAME, content=content.SerializeToString()
        )
    )
    return Summary(value=[Summary.Value(tag=metadata.EXPERIMENT_TAG, metadata=summary_metadata)])


def declare_experiment(
    folder: str | Path, params: Mapping[str, Any], varied: Sequence[str] = ()
) -> None:
    """Write the sweep's HParams experiment (`experiment_summary`) into ``folder``, the logdir
    TensorBoard is pointed at; its trials then write only their own hyperparameter values."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(folder))
    assert writer.file_writer is not None  # opened by the constructor
    writer.file_writer.add_summary(experiment_summary(params, varied))
    writer.close()


class RunWriter:
    """Writes one run folder as records arrive. Append-safe: a resumed run continues its CSV.

    ``resume_at=k`` reopens the folder of a run restored after round k: rounds.csv keeps only its
    rows up to k (the rounds after the checkpoint run again), a summary.json from an earlier end
    is removed (rewritten when the run ends), and TensorBoard hides the old scalars from step
    k + 1 on (``SummaryWriter(purge_step=k + 1)``), so no round appears twice. ``resume_at=0`` is
    a run starting from round 1 in a folder an earlier attempt may have left rows in."""

    def __init__(
        self,
        folder: str | Path,
        spec: RunSpec,
        tensorboard: bool = True,
        resume_at: int | None = None,
        declares_experiment: bool = True,
    ) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.spec = spec
        # a lone run declares its own HParams experiment; a sweep's trials leave that to the
        # sweep (`declare_experiment`): TensorBoard takes the first experiment it finds
        self.declares_experiment = declares_experiment
        self.csv_path = self.folder / "rounds.csv"
        self._csv_file: TextIO | None = None
        self._csv: csv.DictWriter[str] | None = None
        self._tensorboard: SummaryWriter | None = None
        purge_step = None
        if resume_at is not None:
            self._cut(resume_at)
            if any(self.folder.glob("events.out.tfevents.*")):
                purge_step = resume_at + 1
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tensorboard = SummaryWriter(log_dir=str(self.folder), purge_step=purge_step)

    def _cut(self, rounds_done: int) -> None:
        if self.csv_path.exists():
            with self.csv_path.open(newline="") as handle:
                reader = csv.DictReader(handle)
                names = reader.fieldnames
                rows = [row for row in reader if int(row["round"]) <= rounds_done]
            if names and rows:
                # the rows after the cut are appended with today's RoundRecord columns: a folder
                # written before a column existed gets that column (empty for its old rows)
                # instead of rows shifted under the old header
                text = io.StringIO()
                columns = [field.name for field in dataclasses.fields(RoundRecord)]
                out = csv.DictWriter(text, fieldnames=columns, restval="", extrasaction="ignore")
                out.writeheader()
                out.writerows(rows)
                write_text_atomic(self.csv_path, text.getvalue())
            else:
                self.csv_path.unlink()
        (self.folder / "summary.json").unlink(missing_ok=True)

    def write(self, record: RoundRecord) -> None:
        row = record.to_dict()
        if self._csv is None:
            fresh = not self.csv_path.exists() or self.csv_path.stat().st_size == 0
            self._csv_file = self.csv_path.open("a", newline="")
            self._csv = csv.DictWriter(self._csv_file, fieldnames=list(row))
            if fresh:
                self._csv.writeheader()
        assert self._csv_file is not None  # opened with the writer
        self._csv.writerow(row)
        self._csv_file.flush()
        if self._tensorboard is not None:
            for key in TENSORBOARD_SCALARS:
                value = float(row[key])
                if math.isfinite(value):
                    self._tensorboard.add_scalar(f"round/{key}", value, record.round)

    def flush(self) -> None:
        """Put every row and scalar written so far on disk (e.g. before a checkpoint)."""
        if self._tensorboard is not None:
            self._tensorboard.flush()
        if self._csv_file is not None:
            self._csv_file.flush()

    def abort(self) -> None:
        """Close every file without a summary.json (a crashed run must not claim to have ended)."""
        if self._tensorboard is not None:
            self._tensorboard.close()
        if self._csv_file is not None:
            self._csv_file.close()

    def close(self, summary: RunSummary) -> None:
        """Write summary.json and the HParams entry, then close every file."""
        write_json_atomic(self.folder / "summary.json", summary.to_dict())
        if self._tensorboard is not None:
            self._write_hparams(self._tensorboard, summary)
            self._tensorboard.close()
        if self._csv_file is not None:
            self._csv_file.close()

    def _write_hparams(self, writer: SummaryWriter, summary: RunSummary) -> None:
        from torch.utils.tensorboard.summary import hparams

        metrics = {
            "final/accuracy": summary.final_accuracy,
            "final/validation_accuracy": summary.final_validation_accuracy,
            "final/loss": summary.final_loss,
            "final/collapsed": float(summary.collapsed),
        }
        _, session_start, session_end = hparams(_hparam_values(self.spec.to_dict()), metrics)
        entries = [session_start, session_end]
        if self.declares_experiment:
            entries.insert(0, experiment_summary(self.spec.to_dict()))
        assert writer.file_writer is not None  # opened by the constructor
        for entry in entries:
            writer.file_writer.add_summary(entry)
        for key, value in metrics.items():
            writer.add_scalar(key, value, summary.rounds_run)


def run_to_folder(
    spec: RunSpec,
    folder: str | Path | None,
    *,
    tensorboard: bool = True,
    on_record: Callable[[RoundRecord], None] | None = None,
) -> RunSummary:
    """Run ``spec`` to the end, writing its run folder when ``folder`` is given, and return its
    summary (pointing at ``folder``). The simulation is built (data loaded, spec checked) before
    the folder is created, so bad input never leaves a half-written folder behind."""
    started = time.perf_counter()
    simulation = Simulation(spec)
    # resume_at 0: a folder a killed run left behind (no summary.json) starts over, not appended to
    writer = (
        None if folder is None else RunWriter(folder, spec, tensorboard=tensorboard, resume_at=0)
    )
    for record in simulation:
        if writer is not None:
            writer.write(record)
        if on_record is not None:
            on_record(record)
    summary = simulation.summary(time.perf_counter() - started)
    if writer is None:
        return summary
    writer.close(summary)  # summary.json does not name its own folder: folders get moved
    return summary.at(str(folder))
