"""Every touch of a Ray API that is private, or a developer API Ray does not promise to keep, in
one place. Each is checked against the pinned Ray (``RAY_VERSION``) by tests/test_ray_compat.py,
so a Ray upgrade fails there, in one file, instead of somewhere in the middle of a sweep. The rest
of the sweep layer uses Ray's public API only."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

__all__ = [
    "ANALYSIS_LOGGER",
    "RAY_VERSION",
    "TUNE_INTERRUPTED",
    "TUNE_LOGGER",
    "TUNE_NOISE",
    "TrialStopped",
    "autoscaling_ceiling",
    "autoscaling_node_types",
    "config_node_types",
    "grid_trials",
    "quiet_analysis",
    "quiet_tune_logs",
    "restored_run_config",
    "trial_storage",
]

RAY_VERSION = "2.60.0"

# Ray 2.60 stops a function trainable (a scheduler's decision, or the sweep interrupted) by
# calling sys.exit(0) inside ``tune.report`` (ray/train/_internal/session.py,
# _report_training_result); there is no public "trial stopped" exception to catch instead.
TrialStopped = SystemExit


def autoscaling_ceiling() -> Mapping[str, float] | None:
    """The most of each resource the autoscaler's cluster config could ever provide, or None when
    Ray publishes no cluster config (a cluster started by hand, or a local Ray)."""
    try:
        from ray._private.state import state  # no public API for this in Ray 2.60

        return state.get_max_resources_from_cluster_config()
    except Exception:
        return None


def autoscaling_node_types() -> dict[str, dict[str, float]] | None:
    """The node types the autoscaler of the joined cluster can add, name -> the resources of one
    node, or None when they cannot be known here.

    Ray 2.60 has no public API for them. Two private sources: the cluster config Ray publishes in
    the GCS (autoscaler v2, KubeRay: ``node_group_configs``), else the autoscaling config file
    the head's autoscaler (``monitor.py``, autoscaler v1: ``ray up``'s clusters and ``ray start
    --head --autoscaling-config``) was started with, found on its command line through procfs:
    readable only on the head node, where ``ray job submit`` runs the driver. A type whose
    resources name no CPU count (left for the provider to fill in) makes the set unknown."""
    try:
        import ray
        from ray._private.state import state

        config = state.get_cluster_config()
        if config is not None and config.node_group_configs:
            return {
                group.name: dict(group.resources)
                for group in config.node_group_configs
                if group.max_count != 0
            }
        path = _monitor_config_path(ray.get_runtime_context().gcs_address)
        return None if path is None else config_node_types(path)
    except Exception:
        return None


def _monitor_config_path(gcs_address: str) -> str | None:
    """The ``--autoscaling-config`` of this machine's autoscaler for the GCS at ``gcs_address``
    (matched by port: the monitor may name the head by another of its addresses), if any."""
    from pathlib import Path

    port = gcs_address.rsplit(":", 1)[-1]
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            words = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if not any(word.endswith("autoscaler/_private/monitor.py") for word in words[:3]):
            continue
        options = dict(
            word[2:].split("=", 1) for word in words if word.startswith("--") and "=" in word
        )
        if options.get("gcs-address", "").rsplit(":", 1)[-1] == port and options.get(
            "autoscaling-config"
        ):
            return options["autoscaling-config"]
    return None


def config_node_types(path: str | os.PathLike[str]) -> dict[str, dict[str, float]] | None:
    """``available_node_types`` of an autoscaling config (YAML or JSON) that can have a node:
    the head type, and worker types with ``max_workers`` above 0; None when a type leaves its
    CPU count for the provider to fill in."""
    import yaml

    with open(os.path.expanduser(path)) as handle:
        config = yaml.safe_load(handle)
    types = {}
    for name, body in config["available_node_types"].items():
        resources = dict(body.get("resources") or {})
        if "CPU" not in resources:
            return None
        if name == config.get("head_node_type") or body.get("max_workers", 0) > 0:
            types[name] = {k: float(v) for k, v in resources.items()}
    return types


def restored_run_config(tuner: Any) -> Any:
    """The RunConfig a ``Tuner.restore`` brought back (its callbacks and verbosity), which the
    caller edits before ``fit``: Tuner exposes no public accessor for it."""
    return tuner._local_tuner.get_run_config()


def grid_trials(grid: Any) -> list[Any]:
    """The Trial objects behind a ResultGrid, with the status, config, last result and folder of
    every trial as the driver saw them when ``fit`` returned (``ExperimentAnalysis(path)`` reads
    the saved state instead, which lags an interruption)."""
    return list(grid._experiment_analysis.trials)


def trial_storage(context: Any) -> tuple[Any, str]:
    """(pyarrow filesystem, trial folder path on it) of the running trial, from its TuneContext
    (``get_storage`` is a developer API)."""
    storage = context.get_storage()
    return storage.storage_filesystem, storage.trial_fs_path


# What Ray 2.60's ``tune.run`` (ray/tune/tune.py, logger ``ray.tune.tune``) logs around an
# interrupted or partly failed fit: the Ctrl-C notice, a hint to call ``Tuner.restore(...)`` (a
# Python API the command's user never calls: the command says ``--resume``) and the list of
# incomplete trials (the command prints its own table). Matched by their text, which Ray does
# not promise to keep: tests/test_ray_compat.py checks it is still in the pinned source.
TUNE_LOGGER = "ray.tune.tune"
TUNE_INTERRUPTED = "Stop signal received"
TUNE_NOISE = (TUNE_INTERRUPTED, "Experiment has been interrupted", "Trials did not complete")


class _TuneNoiseFilter(logging.Filter):
    """Drops TUNE_NOISE records; tells ``on_interrupt`` when the Ctrl-C notice comes by."""

    def __init__(self, on_interrupt: Callable[[], None] | None) -> None:
        super().__init__()
        self.on_interrupt = on_interrupt

    def filter(self, record: logging.LogRecord) -> bool:
        text = str(record.msg)
        if not any(noise in text for noise in TUNE_NOISE):
            return True
        if TUNE_INTERRUPTED in text and self.on_interrupt is not None:
            self.on_interrupt()
        return False


# ExperimentAnalysis (built by `fit` for its ResultGrid, and by `trials.saved_statuses`) reads
# every trial's progress.csv and warns, in a block of lines per trial, "Failed to fetch metrics"
# for those that have none yet: trials created but not started when a sweep was stopped, which
# is expected of an interrupted or resumed sweep.
ANALYSIS_LOGGER = "ray.tune.analysis.experiment_analysis"


@contextlib.contextmanager
def quiet_analysis() -> Iterator[None]:
    """ExperimentAnalysis's warnings (ANALYSIS_LOGGER) off for the duration; errors stay."""
    logger = logging.getLogger(ANALYSIS_LOGGER)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


@contextlib.contextmanager
def quiet_tune_logs(on_interrupt: Callable[[], None] | None = None) -> Iterator[None]:
    """Without Tune's end-of-fit notices (TUNE_NOISE) for the duration; ``on_interrupt`` is
    called instead of Tune's Ctrl-C notice, so the command can say it in its own words; and
    without ExperimentAnalysis's warnings (`quiet_analysis`)."""
    logger = logging.getLogger(TUNE_LOGGER)
    noise = _TuneNoiseFilter(on_interrupt)
    logger.addFilter(noise)
    try:
        with quiet_analysis():
            yield
    finally:
        logger.removeFilter(noise)
