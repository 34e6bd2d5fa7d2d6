"""The sweep's pre-flight: before Ray starts, build on the driver what every trial builds first
(its data, model, aggregation rule and attack) once for each distinct setting of the space, so a
configuration error that every trial would hit (a data_root without the dataset's files, a model
that does not fit the data) is one line and exit status 2 within seconds, instead of one
traceback per trial, each retried by Tune's FailureConfig. Imports no ray.

What is built (CONTRACTS.md's constructors, on the CPU): ``load_federated(spec, "cpu")`` and
``make_model(spec.model, input_shape, num_classes)`` once per distinct data setting (dataset,
data_root, model and the keys that shape the data: clients, partition, synthetic shape), and
``make_rule`` / ``make_attack`` once per distinct rule and attack. Not a `Simulation`: its
caches are allocated up front (N x d floats: 44 GB for 1000 clients of a ResNet-18).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from robusttune.core.registry import SpecError
from robusttune.core.runspec import RunSpec
from robusttune.experiments.sweep.space import SweepSpec

__all__ = ["DATA_KEYS", "preflight", "preflight_specs", "with_absolute_data_root"]

# The RunSpec keys that decide what load_federated and make_model build: runs that agree on
# these build the same data and model, so one of them stands for all.
DATA_KEYS = (
    "dataset",
    "data_root",
    "model",
    "clients",
    "dirichlet_alpha",
    "partition_seed",
    "fltrust_root_size",
    "synthetic_shape",
    "synthetic_classes",
    "synthetic_samples",
)


def with_absolute_data_root(spec: SweepSpec) -> SweepSpec:
    """Trials run in their own working directories: a relative data_root is made absolute at the
    driver (on a cluster, give a data_root that exists on every node)."""
    if any("data_root" in axis.keys for axis in spec.axes):
        return spec
    root = str(spec.run.get("data_root", "./data"))
    if "://" in root or os.path.isabs(root):
        return spec
    return spec.with_overrides(run={"data_root": str(Path(root).resolve())})


def _points(spec: SweepSpec) -> Iterator[dict[str, Any]]:
    """Tune configs that cover every value a trial can give the data and rule keys: the whole
    grid; under Optuna each value of each discrete axis with the others at the example point
    (continuous axes never name a dataset, model or rule)."""
    if spec.search.algorithm == "grid":
        middle = spec.example_point()
        for point in spec.expand().points:
            yield {**middle, **point}
        return
    example = spec.example_point()
    yield example
    for axis in spec.axes:
        if axis.domain.is_discrete:
            for value in axis.domain.discrete_values():
                yield {**example, axis.name: value}


def preflight_specs(spec: SweepSpec) -> tuple[list[RunSpec], list[RunSpec]]:
    """(one RunSpec per distinct data setting, one per distinct rule and attack) of the space."""
    data: dict[tuple[Any, ...], RunSpec] = {}
    rules: dict[str, RunSpec] = {}
    for point in _points(spec):
        try:
            run = spec.run_spec(point, device="cpu")
        except SpecError:
            continue  # a combination the space itself rejects or drops; never a trial
        values = run.to_dict()
        data.setdefault(tuple(str(values.get(k)) for k in DATA_KEYS), run)
        # the seed only seeds a rule's randomness: rules that differ in it alone build alike
        knobs = sorted((k, v) for k, v in run.aggregator_params().items() if k != "seed")
        rule = (run.aggregator, knobs, run.attack, run.attack_strength)
        rules.setdefault(repr(rule), run)
    return list(data.values()), list(rules.values())


def _label(run: RunSpec, keys: tuple[str, ...]) -> str:
    values: Mapping[str, Any] = run.to_dict()
    return ", ".join(f"{k}={values[k]}" for k in keys if k in values)


def preflight(
    spec: SweepSpec, *, joined: bool = False, announce: Callable[[str], None] | None = None
) -> int:
    """Build each distinct setting's data, model, rule and attack on the driver; raise SpecError
    (one line, naming the setting) at the first that fails. ``joined`` (``--address``): the data
    lives on the cluster's nodes, which may not be this machine, so a data error is a note there
    and the trials load their data where they run. Returns the number of settings checked."""
    from robusttune.core.numerics import pin
    from robusttune.methods.aggregators import make_rule
    from robusttune.methods.attacks import make_attack
    from robusttune.problem.data import clear_dataset_cache

    data_runs, rule_runs = preflight_specs(spec)
    if data_runs:  # one mode per sweep (space_file); the driver builds data below, and a local
        pin(data_runs[0].numerics)  # Ray started after this inherits the pinned environment
    try:
        _build_data_and_models(spec, data_runs, joined, announce)
    finally:
        # the driver trains nothing: a cached cifar10 (600 MB as float32) would stay for the sweep
        clear_dataset_cache()
    for run in rule_runs:
        try:
            make_rule(run.aggregator, **run.aggregator_params())
            make_attack(
                run.attack,
                attack_strength=run.attack_strength,
                attack_direction=run.attack_direction,
            )
        except SpecError as error:
            where = _label(run, ("aggregator", "attack"))
            raise SpecError(f"{spec.source}: pre-flight ({where}): {error}") from None
    return len(data_runs) + len(rule_runs)


def _build_data_and_models(
    spec: SweepSpec, data_runs: list[RunSpec], joined: bool, announce: Callable[[str], None] | None
) -> None:
    """`preflight`'s data part: ``load_federated`` and ``make_model`` per data setting."""
    import torch

    from robusttune.problem.data import load_federated
    from robusttune.problem.models import make_model

    for run in data_runs:
        where = _label(run, ("dataset", "data_root", "model"))
        try:
            data = load_federated(run, "cpu")
        except SpecError as error:
            if joined:
                (announce or print)(
                    f"note: pre-flight ({where}) on this machine: {error}; "
                    f"trials load their data on the nodes they run on"
                )
                continue
            raise SpecError(f"{spec.source}: pre-flight ({where}): {error}") from None
        try:
            with torch.device("meta"):  # the shapes are what can fail; no weights are needed
                make_model(run.model, data.input_shape, data.num_classes)
        except SpecError as error:
            raise SpecError(f"{spec.source}: pre-flight ({where}): {error}") from None
