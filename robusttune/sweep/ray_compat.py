"""Every touch of a Ray API that is private, or a developer API Ray does not promise to keep, in
one place. Each is checked against the pinned Ray (``RAY_VERSION``) by tests/test_ray_compat.py,
so a Ray upgrade fails there, in one file, instead of somewhere in the middle of a sweep. The rest
of the sweep layer uses Ray's public API only."""

from __future__ import annotations

from typing import Any

__all__ = ["RAY_VERSION", "TrialStopped", "autoscaling_ceiling", "restored_run_config",
           "grid_trials", "trial_storage"]

RAY_VERSION = "2.60.0"

# Ray 2.60 stops a function trainable (a scheduler's decision, or the sweep interrupted) by
# calling sys.exit(0) inside ``tune.report`` (ray/train/_internal/session.py,
# _report_training_result); there is no public "trial stopped" exception to catch instead.
TrialStopped = SystemExit


def autoscaling_ceiling() -> dict[str, float] | None:
    """The most of each resource the autoscaler's cluster config could ever provide, or None when
    Ray publishes no cluster config (a cluster started by hand, or a local Ray)."""
    try:
        from ray._private.state import state  # no public API for this in Ray 2.60

        return state.get_max_resources_from_cluster_config()
    except Exception:  # noqa: BLE001 - absent or changed private API: treat as unknown
        return None


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
