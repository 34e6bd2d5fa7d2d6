"""Ray Tune's own cost per trial, with the settings of a command's streaming experiment.

A map's runs are short (the bench map's 0.1-0.2 s, the default map's 0.5-0.7 s), and every run
is one trial (issue 45), so what Tune spends between one trial's end and the next one's start,
on the driver and in the worker, is paid once per run. This measures it without robusttune's
runs: TRIALS trials of WORK seconds of busy CPU each (a loop on the thread's CPU clock, so a
trial's work is the same however the machine shares its cores), through Ray Tune on every core
(function trainable, one CPU per trial, ``reuse_actors``, Tune's JSON logger, as
`robusttune.experiments.sweep.stream` runs them), against the same work one after another in
this process on one core. Ray's start and end are left out: the clock runs from ``Tuner.fit``'s
call to its return, and the trials' own clocks split it into Tune's start (to the first trial's
start: the trial actors' processes) and the trials' window (to the last trial's end). The figures:

    ideal_seconds      = TRIALS x WORK / slots
    overhead_per_trial = (window - ideal_seconds) x slots / TRIALS     (one slot's handover)
    tune_floor_efficiency = ideal_seconds / window

and last the ratio the map bench compares, runs per second through Tune over runs per second in
process on one core (target 0.7 x cores), for runs of WORK seconds:

    tune_vs_one_core_in_process = (TRIALS / fit seconds) / (1 / in-process seconds per trial)

    python bench/tune_floor.py                    # 200 trials of 0.1 s and 60 of 0.5 s
    python bench/tune_floor.py --tiny             # 20 trials of 0.05 s: a smoke run
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def busy(seconds: float) -> int:
    """Spin on this thread's CPU clock for ``seconds`` of CPU time."""
    end, count = time.thread_time() + seconds, 0
    while time.thread_time() < end:
        count += 1
    return count


def trial(config: dict) -> None:
    from ray import tune

    began = time.time()
    busy(config["work"])
    tune.report({"accuracy": 1.0, "began": began, "ended": time.time()})


def through_tune(
    trials: int, work: float, slots: int, storage: str
) -> tuple[float, float, float, float]:
    """(seconds of Tuner.fit, seconds from its call to the first trial's start, seconds from the
    first trial's start to the last one's end, the driver's CPU seconds) for ``trials`` trials."""
    from ray import tune
    from ray.tune.logger import JsonLoggerCallback

    from robusttune.experiments.sweep.tuner import tune_environment

    tuner = tune.Tuner(
        tune.with_resources(trial, {"cpu": 1}),
        param_space={"work": work, "index": tune.grid_search(list(range(trials)))},
        tune_config=tune.TuneConfig(reuse_actors=True, max_concurrent_trials=slots),
        run_config=tune.RunConfig(
            storage_path=storage, callbacks=[JsonLoggerCallback()], verbose=0
        ),
    )
    before = resource.getrusage(resource.RUSAGE_SELF)
    started, started_at = time.perf_counter(), time.time()
    with tune_environment(
        quiet=True,
        extra={"TUNE_MAX_PENDING_TRIALS_PG": str(max(2, slots)), "TUNE_GLOBAL_CHECKPOINT_S": "600"},
    ):
        results = tuner.fit()
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    first = min(result.metrics["began"] for result in results)
    last = max(result.metrics["ended"] for result in results)
    return seconds, first - started_at, last - first, cpu


def in_process(trials: int, work: float) -> float:
    """Wall seconds per trial of the same work one after another in this process."""
    started = time.perf_counter()
    for _ in range(trials):
        busy(work)
    return (time.perf_counter() - started) / trials


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="20 trials of 0.05 s: a smoke run")
    args = parser.parse_args()
    cases = [(20, 0.05)] if args.tiny else [(200, 0.1), (60, 0.5)]
    import ray

    os.environ["RAY_AUTH_MODE"] = "disabled"
    slots = os.cpu_count() or 1
    ray.init(num_cpus=slots, include_dashboard=False, logging_level="WARNING")
    ratio = float("nan")
    try:
        with tempfile.TemporaryDirectory(prefix="robusttune-tune-floor-") as storage:
            for trials, work in cases:
                fit_s, to_first, window, driver_cpu = through_tune(trials, work, slots, storage)
                per_trial = in_process(min(trials, 20), work)
                ideal = trials * work / slots
                print(
                    f"{trials} trials of {work:g} s on {slots} slots: Tuner.fit {fit_s:.2f} s, "
                    f"{to_first:.2f} s of it before the first trial began and "
                    f"{window:.2f} s from then to the last trial's end, against {ideal:.2f} s "
                    f"of work per slot; in process {per_trial:.3f} s a trial; the driver's CPU "
                    f"{driver_cpu:.2f} s ({1000 * driver_cpu / trials:.0f} ms a trial)",
                    flush=True,
                )
                print(
                    f"overhead_per_trial_ms_{work:g}: {1000 * (window - ideal) * slots / trials:.1f}"
                )
                print(f"tune_floor_efficiency_{work:g}: {ideal / window:.2f}")
                ratio = (trials / fit_s) * per_trial
    finally:
        ray.shutdown()
    print(f"target: {0.7 * slots:.2f} (0.7 x {slots} cores)")
    print(f"tune_vs_one_core_in_process: {ratio:.2f}")


if __name__ == "__main__":
    main()
