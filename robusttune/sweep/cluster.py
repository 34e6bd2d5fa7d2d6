"""The Ray the sweep runs on, and whether it can hold the sweep's trials. Default: a local Ray
started and stopped here (``ray.init(num_cpus=..., include_dashboard=False)`` with
``RAY_AUTH_MODE=disabled``); ``address`` joins a running cluster (``ray up cluster.yaml``) instead
and leaves it running. Ray is imported inside the functions only."""

from __future__ import annotations

import contextlib
import os
from typing import Callable, Iterator

from robusttune.registry import SpecError
from robusttune.sweep.ray_compat import autoscaling_ceiling
from robusttune.sweep.space import SweepSpec, format_value

__all__ = ["ray_session", "check_cluster"]


# ---------------------------------------------------------------------------------------------
@contextlib.contextmanager
def ray_session(address: str | None, num_cpus: int | None) -> Iterator[bool]:
    """Use the running Ray of this process, join ``address``, or start a local Ray (and stop it
    afterwards). Yields whether this call started Ray."""
    import ray

    if ray.is_initialized():
        yield False
        return
    # Warnings and errors from the trials reach the terminal; Ray's per-checkpoint INFO lines
    # would drown the one line per trial that the command prints.
    quiet = ray.LoggingConfig(log_level="WARNING")
    if address:
        try:
            ray.init(address=address, logging_config=quiet)
        except ConnectionError as error:
            raise SpecError(f"--address {address}: no Ray cluster reachable there "
                            f"({str(error).splitlines()[0]}); allowed: auto on a cluster node, "
                            f"or the head's HOST:PORT") from None
    else:
        # A laptop or CI machine has no cluster token: a local Ray needs no authentication.
        os.environ["RAY_AUTH_MODE"] = "disabled"
        ray.init(num_cpus=num_cpus or os.cpu_count(), include_dashboard=False,
                 configure_logging=True, logging_level="WARNING", logging_config=quiet)
    try:
        yield True
    finally:
        ray.shutdown()


def check_cluster(spec: SweepSpec, *, joined: bool = False,
                  announce: Callable[[str], None] | None = None) -> None:
    """Fail with one line instead of leaving trials pending forever for resources that the
    cluster does not have. A joined cluster (``--address``) may autoscale from zero workers
    (cluster.yaml's GPU nodes start at 0): there the shortfall is an error only when the
    autoscaler's config cannot cover it either, and otherwise a note."""
    import ray

    available = ray.cluster_resources()
    wanted = {"GPU": spec.resources.gpu, "CPU": spec.resources.cpu}
    for resource, amount in wanted.items():
        have = available.get(resource, 0.0)
        if amount <= 0 or amount <= have:
            continue
        key = resource.lower()
        problem = (f"resources.{key} {format_value(amount)} per trial, but the Ray cluster has "
                   f"{format_value(have)} {resource}; allowed: ")
        problem += ("gpu 0 (--gpus-per-trial 0) or a cluster with GPUs (--address)" if key == "gpu"
                    else f"at most {format_value(have)}")
        ceiling = autoscaling_ceiling() if joined else None
        if not joined or (ceiling is not None and ceiling.get(resource, 0) < amount):
            raise SpecError(problem)
        (announce or print)(f"note: {problem} now; trials wait for the autoscaler to add nodes "
                            f"(Ctrl-C if this cluster does not autoscale)")
        return
