"""The one module a plugin imports: everything needed to put your own aggregation rule, attack,
server algorithm, dataset or model on robusttune's map, in one place that stays put when the
package's internals move (as ``optuna.samplers`` and ``flwr.server.strategy`` are for theirs).

    from robusttune.plugin import AGGREGATORS, Aggregator, SpecError

    @AGGREGATORS.register("meamed")
    class MeanAroundMedian(Aggregator):
        '''Mean around the median (Xie et al., 2018): the formula, the paper.'''

        def __init__(self, keep_fraction: float | None = None, f: int | None = None) -> None:
            super().__init__(f)                      # its own knob beside the RunSpec's f
            if keep_fraction is not None and not 0 < keep_fraction <= 1:
                raise SpecError(f"keep_fraction must be in (0, 1] or none; got {keep_fraction!r}")
            self.keep_fraction = keep_fraction

        def aggregate(self, x, *, f, **context):     # Tensor[n, d] -> Tensor[d]
            ...

(examples/my_defence/ holds it whole, with an attack and a dataset.)

Then name the file in a YAML (``plugins: [my_defence/]``), on the command line
(``--plugin my_defence/``) or as a ``robusttune.plugins`` entry point, and the driver and every
Ray worker import it before building a run (docs: explanations/plugins).

What this module gives, each the very object the package uses:

- the registries: ``AGGREGATORS``, ``ATTACKS``, ``ALGORITHMS``, ``DATASETS``, ``MODELS``
  (``@REGISTRY.register("name", ...)``; a rule's, attack's or algorithm's knobs are its
  constructor's parameters, a dataset's and a model's its function's or class's);
- the base classes: ``Aggregator`` (a robust rule: ``aggregate(updates, **context)``),
  ``Attack`` and ``AttackRound`` (what a Byzantine client sends, and what one round shows it),
  ``ServerAlgorithm`` (what the server runs each round: FedAvg, DeMoA ...);
- the data types: ``RawDataset`` (a whole dataset: train and test tensors, the classes) and
  ``DataShape`` (its shape, declared so a run can be sized before it loads);
- ``SpecError``: raise it with one line naming the key, the value and what is allowed, and the
  command line prints that line and exits with status 2.

Importing this module is light (no torch): each name is imported the first time it is used.
The registries and ``SpecError`` need no torch either; the base classes and the data types do
(their modules hold tensors), so a plugin that registers only a function of its own pays for
torch when a run builds it, not when it is imported.

These names are the plugin API and follow semantic versioning: within a major version none is
removed or changes meaning; one that is to go is first deprecated for a minor release (it warns
with a DeprecationWarning that names its replacement). Everything else under ``robusttune.``
(but the commands as functions, ``robusttune.run``, ``robusttune.breakdown`` ...) is internal and
may move in any release.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what static checkers and editors see; at run time each name loads on use
    pass

# name -> the module that defines it
_HOMES = {
    "AGGREGATORS": "robusttune.core.registries",
    "ATTACKS": "robusttune.core.registries",
    "ALGORITHMS": "robusttune.core.registries",
    "DATASETS": "robusttune.core.registries",
    "MODELS": "robusttune.core.registries",
    "Aggregator": "robusttune.methods.aggregators.base",
    "Attack": "robusttune.methods.attacks.base",
    "AttackRound": "robusttune.methods.attacks.base",
    "ServerAlgorithm": "robusttune.methods.algorithms.base",
    "RawDataset": "robusttune.problem.data.base",
    "DataShape": "robusttune.problem.data.base",
    "SpecError": "robusttune.core.registry",
}

__all__ = list(_HOMES)


def __getattr__(name: str) -> Any:
    """A plugin-API name, imported from its home the first time it is asked for (PEP 562)."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(
            f"module 'robusttune.plugin' has no attribute {name!r}; the plugin "
            f"API is {', '.join(__all__)}"
        )
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*__all__, "__doc__", "__name__"])
