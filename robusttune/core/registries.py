"""The registries of the concepts a RunSpec names: aggregation rules, attacks, server algorithms,
datasets and models. They live here, in the foundations, so the RunSpec can check a name without
importing the layers that hold the entries; each fills itself from its ``builtins`` module at
its first lookup (`Registry`), and an entry registers with ``@AGGREGATORS.register("name")``
from wherever it is defined."""

from __future__ import annotations

from typing import Any

from robusttune.core.registry import Registry
from robusttune.core.schema import RUNSPEC_KEYS

__all__ = ["AGGREGATORS", "ATTACKS", "ALGORITHMS", "DATASETS", "MODELS"]

AGGREGATORS: Registry[Any] = Registry("aggregator", RUNSPEC_KEYS, "robusttune.methods.aggregators")
ATTACKS: Registry[Any] = Registry("attack", RUNSPEC_KEYS, "robusttune.methods.attacks")
ALGORITHMS: Registry[Any] = Registry("algorithm", RUNSPEC_KEYS, "robusttune.methods.algorithms")
DATASETS: Registry[Any] = Registry("dataset", RUNSPEC_KEYS, "robusttune.problem.data")
MODELS: Registry[Any] = Registry("model", RUNSPEC_KEYS, "robusttune.problem.models")
