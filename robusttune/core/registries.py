"""The registries of the concepts a RunSpec names: aggregation rules, attacks, server algorithms,
datasets and models. They live here, in the foundations, so the RunSpec can check a name without
importing the layers that hold the entries; each fills itself from its ``builtins`` module at
its first lookup (`Registry`), and an entry registers with ``@AGGREGATORS.register("name")``
from wherever it is defined."""

from __future__ import annotations

import threading
from typing import Any

from robusttune.core.plugin_records import load_entry_points
from robusttune.core.registry import _REGISTRIES, Registry
from robusttune.core.schema import RUNSPEC_KEYS

__all__ = [
    "AGGREGATORS",
    "ALGORITHMS",
    "ATTACKS",
    "DATASETS",
    "MODELS",
    "REGISTRIES",
    "builtins_then_installed",
]

# What a plugin entry subclasses, and the parameters the tool itself passes every entry of a
# concept (so they are not the entry's own knobs): a rule's wrapped rule, an algorithm's
# run, initial model, sample counts and Byzantine mask, a dataset loader's run, a model's shape.
AGGREGATORS: Registry[Any] = Registry(
    "aggregator",
    RUNSPEC_KEYS,
    "robusttune.methods.aggregators",
    base="robusttune.methods.aggregators.base:Aggregator",
    standard=frozenset({"inner"}),
)
ATTACKS: Registry[Any] = Registry(
    "attack",
    RUNSPEC_KEYS,
    "robusttune.methods.attacks",
    base="robusttune.methods.attacks.base:Attack",
)
ALGORITHMS: Registry[Any] = Registry(
    "algorithm",
    RUNSPEC_KEYS,
    "robusttune.methods.algorithms",
    base="robusttune.methods.algorithms.base:ServerAlgorithm",
    standard=frozenset({"spec", "initial", "sample_counts", "byzantine"}),
)
DATASETS: Registry[Any] = Registry(
    "dataset", RUNSPEC_KEYS, "robusttune.problem.data", standard=frozenset({"spec"})
)
MODELS: Registry[Any] = Registry(
    "model",
    RUNSPEC_KEYS,
    "robusttune.problem.models",
    standard=frozenset({"input_shape", "num_classes"}),
)

# the concepts in the order `robusttune list` shows them
REGISTRIES: tuple[Registry[Any], ...] = (AGGREGATORS, ATTACKS, ALGORITHMS, DATASETS, MODELS)
_REGISTRIES.extend(REGISTRIES)

_installed_lock = threading.RLock()
_installed_done = False


def builtins_then_installed() -> None:
    """Every registry's built-ins, then the ``robusttune.plugins`` entry points of the installed
    packages, once per process (`Registry.after_builtins`): a plugin's name must meet every
    built-in name before it is registered, so a clash is always the plugin's."""
    global _installed_done  # noqa: PLW0603 - once per process, under the lock
    if _installed_done:
        return
    with _installed_lock:
        if _installed_done:
            return
        _installed_done = True  # first: the loads below look names up and come back here
        try:
            for registry in _REGISTRIES:
                registry._load()
            load_entry_points()
        except BaseException:
            _installed_done = False
            raise


# the first lookup of any registry loads every registry's built-ins, then installed plugins
Registry.after_builtins = staticmethod(builtins_then_installed)
