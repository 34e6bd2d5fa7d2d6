"""How a command runs its trials (the commands' layer, above robusttune.experiments.sweep): the runner it
hands its plan to, Ray Tune's streaming experiment or the in-process one with --local, and the
one Ray session around it. Used by `breakdown`, `calibrate`, `tune` and `horizon`."""

from __future__ import annotations

import contextlib
import sys
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from robusttune.engine.runners import InProcessRunner, Runner

__all__ = ["choose_runner", "ray_or_nothing"]


def choose_runner(
    out: Path,
    local: bool,
    resources: dict[str, float | str],
    max_concurrent: int = 0,
    notes: bool = True,
    tune_verbose: int = 0,
) -> Runner:
    """The runner trials go through: one Ray Tune experiment for the whole command whose trials
    are proposed as the command asks for runs (robusttune.experiments.sweep.stream; the experiment folder
    under OUT; drive the command's logic with `robusttune.engine.runners.drive`) or, with --local, one
    run after another in this process (no Ray). ``notes``: the sweep layer's one-line notes on
    stderr; ``tune_verbose``: Tune's own verbosity (0: none of its tables). The Ray session it
    runs in, local or joined with ``--address``, is `ray_or_nothing`'s."""
    if local:
        return InProcessRunner(out, threads=max(1, int(resources.get("cpu", 1) or 1)))
    from robusttune.experiments.sweep.stream import TuneStreamRunner

    return TuneStreamRunner(
        out,
        resources=resources,
        max_concurrent=max_concurrent,
        announce=_to_stderr if notes else None,
        verbose=tune_verbose,
    )


def _to_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def ray_or_nothing(local: bool, address: str | None) -> AbstractContextManager[Any]:
    """One Ray session around the command's experiment (Ray starts once), or nothing with
    --local."""
    if local:
        return contextlib.nullcontext()
    from robusttune.experiments.sweep.cluster import ray_session

    return ray_session(address, None)
