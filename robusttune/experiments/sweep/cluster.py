"""The Ray the sweep runs on, and whether it can hold the sweep's trials. Default: a local Ray
started and stopped here (``ray.init(num_cpus=..., include_dashboard=False)`` with
``RAY_AUTH_MODE=disabled``); ``address`` joins a running cluster (``ray up cluster.yaml``) instead
and leaves it running, with the token authentication the process's environment names
(``RAY_AUTH_MODE=token``: the cluster files turn it on). Ray is imported inside the functions
only."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator

from robusttune.core.plugins import declared, shipping_folder
from robusttune.core.registry import SpecError
from robusttune.experiments.sweep.gpu_share import AUTO
from robusttune.experiments.sweep.ray_compat import autoscaling_ceiling, autoscaling_node_types
from robusttune.experiments.sweep.space import SweepSpec, format_value

__all__ = ["check_cluster", "holds", "ray_session", "refused_token", "shape_problem"]


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
        # the plugin files travel with the job: a node without them imports the copies
        shipped = shipping_folder(declared())
        runtime_env = {"py_modules": [str(shipped)]} if shipped is not None else None
        try:
            ray.init(address=address, logging_config=quiet, runtime_env=runtime_env)
        except ConnectionError as error:
            if refused_token(error):
                mode = os.environ.get("RAY_AUTH_MODE", "disabled")
                raise SpecError(
                    f"--address {address}: the cluster refused this process's token "
                    f"(RAY_AUTH_MODE={mode}); allowed: RAY_AUTH_MODE=token with the "
                    f"cluster's token in ~/.ray/auth_token or RAY_AUTH_TOKEN "
                    f"(docs/how-to/cluster.md, token authentication)"
                ) from None
            raise SpecError(
                f"--address {address}: no Ray cluster reachable there "
                f"({str(error).splitlines()[0]}); allowed: auto on a cluster node, "
                f"or the head's HOST:PORT"
            ) from None
    else:
        # A Ray this command starts for itself serves this command alone and stops with it; a
        # laptop or CI machine has no cluster token. Ray reads the mode as it is imported, so
        # one the environment set before the command started (token) is kept as it is
        # (docs/explanations/security.md)
        if os.environ.get("RAY_AUTH_MODE") != "token":
            os.environ["RAY_AUTH_MODE"] = "disabled"
        ray.init(
            num_cpus=num_cpus or os.cpu_count(),
            include_dashboard=False,
            configure_logging=True,
            logging_level=logging.WARNING,
            logging_config=quiet,
        )
    try:
        yield True
    finally:
        ray.shutdown()


def refused_token(error: BaseException) -> bool:
    """Whether Ray's failure to join a cluster was its token authentication refusing this
    process (the GCS answers ``Unauthenticated: ... InvalidAuthToken``), as the chained causes
    of Ray's ConnectionError tell it."""
    seen: BaseException | None = error
    while seen is not None:
        text = str(seen)
        if "InvalidAuthToken" in text or "Unauthenticated" in text:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def check_cluster(
    spec: SweepSpec, *, joined: bool = False, announce: Callable[[str], None] | None = None
) -> None:
    """Fail with one line instead of leaving trials pending forever for resources that the
    cluster does not have. A trial is one bundle of ``resources.cpu`` CPUs and ``resources.gpu``
    GPUs (``auto``: a share of a GPU only where there are GPUs, so its CPUs are checked), placed
    on one node. A joined cluster (``--address``) may autoscale from zero workers
    (cluster.yaml's GPU nodes start at 0): there the request is an error when no node type of
    its autoscaler (`autoscaling_node_types`) can hold one trial, or the autoscaler's ceiling
    cannot cover it, and otherwise a note."""
    import ray

    say = announce or print
    # gpu auto asks for a share only of GPUs the cluster has (`gpu_share`): its CPUs must fit
    gpu = 0.0 if spec.resources.gpu == AUTO else spec.resources.gpu
    wanted = {r: a for r, a in (("CPU", spec.resources.cpu), ("GPU", gpu)) if a > 0}
    nodes = [node["Resources"] for node in ray.nodes() if node.get("Alive")]
    if any(holds(node, wanted) for node in nodes):
        return
    types = autoscaling_node_types() if joined else None
    if types is not None:
        problem = shape_problem(wanted, nodes, types)
        if problem is not None:
            raise SpecError(problem)
        able = [name for name, resources in types.items() if holds(resources, wanted)]
        say(
            f"note: no node of the Ray cluster holds a trial ({_shape(wanted)}) now; trials wait "
            f"for the autoscaler to add {' or '.join(able)} nodes"
        )
        return
    available = ray.cluster_resources()
    for resource, amount in wanted.items():
        have = available.get(resource, 0.0)
        if amount <= have:
            continue
        key = resource.lower()
        problem = (
            f"resources.{key} {format_value(amount)} per trial, but the Ray cluster has "
            f"{format_value(have)} {resource}; allowed: "
        )
        problem += (
            "gpu 0 (--gpus-per-trial 0) or a cluster with GPUs (--address)"
            if key == "gpu"
            else f"at most {format_value(have)}"
        )
        ceiling = autoscaling_ceiling() if joined else None
        if not joined or (ceiling is not None and ceiling.get(resource, 0) < amount):
            raise SpecError(problem)
        say(
            f"note: {problem} now; trials wait for the autoscaler to add nodes "
            f"(Ctrl-C if this cluster does not autoscale)"
        )
        return
    if joined:  # enough in total, but no one node holds a trial
        say(
            f"note: no node of the Ray cluster holds a trial ({_shape(wanted)}) now; trials wait "
            f"for the autoscaler to add nodes (Ctrl-C if this cluster does not autoscale)"
        )


def holds(node: dict[str, float], wanted: dict[str, float]) -> bool:
    """Whether one node with resources ``node`` can hold a trial's bundle ``wanted``."""
    return all(node.get(resource, 0.0) >= amount for resource, amount in wanted.items())


def _shape(resources: dict[str, float]) -> str:
    return (
        ", ".join(f"{r} {format_value(a)}" for r, a in resources.items() if r in ("CPU", "GPU"))
        or "CPU 0"
    )


def shape_problem(
    wanted: dict[str, float], nodes: list[dict[str, float]], types: dict[str, dict[str, float]]
) -> str | None:
    """None when a trial's bundle ``wanted`` ({"CPU": c, "GPU": g}) fits one of the cluster's
    ``nodes`` or node ``types`` (resources of one node each), else the one line that says which
    per-trial amount no node can hold and what is allowed."""
    if any(holds(node, wanted) for node in [*nodes, *types.values()]):
        return None
    shapes = "; ".join(f"{name}: {_shape(resources)}" for name, resources in types.items())
    where = (
        f"no node of the Ray cluster holds it, nor any node type its autoscaler can add ({shapes})"
    )
    largest = {
        r: max([n.get(r, 0.0) for n in nodes] + [t.get(r, 0.0) for t in types.values()])
        for r in wanted
    }
    short = [r for r in wanted if wanted[r] > largest[r]]
    if not short:  # each amount exists on some node type, never together
        asked = ", ".join(f"{r.lower()} {format_value(a)}" for r, a in wanted.items())
        return (
            f"resources {asked} per trial: {where}; allowed: cpu and gpu that one node type "
            f"holds together (--cpus-per-trial, --gpus-per-trial)"
        )
    resource = short[0]
    key, flag = resource.lower(), "--gpus-per-trial" if resource == "GPU" else "--cpus-per-trial"
    allowed = (
        f"gpu 0 ({flag} 0), or a node type with GPUs in the cluster config"
        if largest[resource] == 0 and resource == "GPU"
        else f"at most {format_value(largest[resource])} ({flag}), or a larger node type "
        f"in the cluster config"
    )
    return (
        f"resources.{key} {format_value(wanted[resource])} per trial: {where}; allowed: {allowed}"
    )
