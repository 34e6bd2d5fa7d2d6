"""RunSpec: one federated run's knobs, validated (`robusttune.core.schema`) and resolved.

The resolver sits above the registries and reads what is keyed by name from their entries:
a dataset's defaults (``DATASETS.register(..., defaults=...)``), an algorithm's ``methods``,
``default_server_lr`` and ``aggregates_cache``, a rule's ``calibrated_trim_ratio``. Nothing
below it imports it, so there is no import circle.

Precedence of a value is explicit > method preset (algorithm, aggregator) > dataset default >
global default (the schema's: the SWB-DM setup on cifar10, with the embedded digits as the
dataset). A method preset fixes its algorithm and rule; a conflicting explicit ``algorithm`` or
``aggregator`` is an error, except where the algorithm's methods take any rule (``demoa``,
``fedcm``), and then the run is labelled ``ALGORITHM+RULE`` (what ran) unless a preset names it.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping
from typing import Any

from pydantic import ConfigDict, PrivateAttr, ValidationError

from robusttune.core.registries import AGGREGATORS, ALGORITHMS, ATTACKS, DATASETS, MODELS
from robusttune.core.registry import Registry, SpecError, plugin_keys, plugin_parameters
from robusttune.core.schema import RUNSPEC_KEYS, RunSchema, default_numerics
from robusttune.core.validation import check_model, check_value, spec_error

__all__ = ["RUNSPEC_KEYS", "RunSpec", "SpecError", "method_presets", "run_keys"]


def run_keys() -> frozenset[str]:
    """Every key a run may be given: the RunSpec's, and the own knobs of the plugin entries
    loaded in this process (`robusttune.core.plugins`)."""
    return RUNSPEC_KEYS | plugin_keys()


# Aggregator entries that are not rules of their own (a wrapper around another rule).
_NOT_METHODS = ("bucketing",)


def method_presets() -> dict[str, tuple[str, str]]:
    """method name -> (algorithm, aggregator), from the algorithms' ``methods`` (and, for the
    algorithm whose ``rule_methods`` is set, every rule's own name). Named presets first."""
    named: dict[str, tuple[str, str]] = {}
    by_rule: dict[str, tuple[str, str]] = {}
    for algorithm in ALGORITHMS.names():
        entry = ALGORITHMS[algorithm]
        for method, rule in entry.methods.items():
            named[method] = (algorithm, rule)
        if entry.rule_methods:
            by_rule.update(
                {
                    rule: (algorithm, rule)
                    for rule in AGGREGATORS.names()
                    if rule not in _NOT_METHODS
                }
            )
    return {**by_rule, **named}


class RunSpec(RunSchema):
    """Every knob of one federated run. Build it with ``RunSpec(...)`` or ``RunSpec.from_dict``;
    both validate and resolve defaults, so the engine never sees a bad value."""

    # a plugin entry's own knobs are kept beside the schema's keys (checked in __init__)
    model_config = ConfigDict(frozen=True, extra="allow", validate_default=True)

    _explicit: frozenset[str] = PrivateAttr(default=frozenset())

    def __init__(self, **values: Any) -> None:
        # "given" means passed, not "different from the default": RunSpec(dataset="digits",
        # lr=0.01) keeps lr=0.01 over the digits default.
        explicit = frozenset(values.pop("explicit", ())) | frozenset(values)
        if "numerics" not in values:
            # resolved here, never where the spec runs: a trial carries its driver's mode
            values["numerics"] = default_numerics()
            explicit |= {"numerics"}
        own = {k: values.pop(k) for k in list(values) if k not in RUNSPEC_KEYS}
        unknown = sorted(set(own) - plugin_keys())
        if unknown:
            raise SpecError(
                f"unknown key {unknown[0]!r}; allowed keys: {', '.join(sorted(run_keys()))}"
            )
        typed = check_model(RunSchema, values)
        resolved = _resolve({k: getattr(typed, k) for k in values}, explicit)
        own = _own_knobs(resolved, own)
        strength = resolved.get("attack_strength")
        if isinstance(strength, (int, float)) and not isinstance(strength, bool):
            # a strength outside the attack's meaningful range (IPM's eps < 0 sends +mu) is a
            # configuration error: found here, before any run folder or progress line exists
            ATTACKS.make(resolved.get("attack", "none"), attack_strength=strength, **own)
        try:
            super().__init__(**resolved, **own)
        except ValidationError as error:  # a resolved value out of range: one line, as ever
            raise spec_error(error, model=RunSchema) from None
        self._explicit = explicit

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> RunSpec:
        """Build from a mapping (YAML, ``--set``, a Tune config); unknown keys are errors."""
        return cls(**dict(values))

    @property
    def explicit(self) -> frozenset[str]:
        """The keys this spec was given (the rest were resolved)."""
        return self._explicit

    def updated(self, **changes: Any) -> RunSpec:
        """A new spec from this one's explicit values plus ``changes``, re-resolving defaults (so
        changing the dataset brings that dataset's defaults for keys that were not given)."""
        values = {k: getattr(self, k) for k in self._explicit}
        values.update(changes)
        return RunSpec.from_dict(values)

    def to_dict(self) -> dict[str, Any]:
        """The resolved values of every key, JSON-ready."""
        return self.model_dump()

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunSpec) and self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash(self.to_json())

    # -- what the engine asks of the resolved names -------------------------------------------
    @property
    def aggregates_cache(self) -> bool:
        """Whether the rule runs over all N cached rows (the algorithm's flag)."""
        return ALGORITHMS[self.algorithm].aggregates_cache

    def aggregator_params(self) -> dict[str, Any]:
        """The knobs a rule may take, spelled as RunSpec keys, and the plugin knobs this spec
        sets (a rule that does not take one drops it: `Registry.make`)."""
        keys = (
            "trim_ratio",
            "krum_m",
            "cclip_tau",
            "cclip_scale",
            "cclip_iters",
            "gm_iters",
            "bucket_size",
            "pre_aggregator",
            "swb_chunk",
            "swb_views",
            "swb_rotation",
            "median_even",
            "seed",
        )
        return {**{k: getattr(self, k) for k in keys}, **self.own_knobs}

    @property
    def own_knobs(self) -> dict[str, Any]:
        """The plugin entries' own knobs this spec holds (resolved: their defaults included)."""
        return dict(self.__pydantic_extra__ or {})

    def params_for(self, registry: Registry[Any], name: str) -> dict[str, Any]:
        """The plugin knobs entry ``name`` of ``registry`` takes, from this spec."""
        return {k: v for k, v in self.own_knobs.items() if registry.takes(name, k)}


def _resolve(given: dict[str, Any], explicit: frozenset[str]) -> dict[str, Any]:
    """The given values plus everything the registries say for them: dataset defaults, the
    method preset, the label of what runs, the assumed corruption, eta and SWB's trim."""
    values = dict(given)
    dataset = values.get("dataset", RunSchema.model_fields["dataset"].default)
    _known("dataset", dataset, DATASETS)
    for key, value in getattr(DATASETS[dataset], "defaults", {}).items():
        values.setdefault(key, value)

    algorithm, aggregator = _method(values, explicit)
    values["algorithm"], values["aggregator"] = algorithm, aggregator
    for key, registry in (("model", MODELS), ("attack", ATTACKS)):
        if key in values:
            _known(key, values[key], registry)
    values["method"] = _label(algorithm, aggregator, values.get("method"))

    beta = values.get("byzantine_fraction", 0.0)
    if values.get("assumed_byzantine_fraction") is None:
        values["assumed_byzantine_fraction"] = beta
    if values.get("server_lr") is None:
        values["server_lr"] = ALGORITHMS[algorithm].default_server_lr
    if values.get("aggregate_weights", "auto") == "auto":
        # the algorithm's paper default: FedAvg weighs by n_i, the robust-gradient papers do not
        values["aggregate_weights"] = ALGORITHMS[algorithm].default_weights
    if values.get("trim_ratio") is None:
        values["trim_ratio"] = AGGREGATORS[aggregator].calibrated_trim_ratio(
            values["assumed_byzantine_fraction"]
        )
    return values


def _own_knobs(resolved: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """The plugin knobs of a run: each given one checked against the annotation of an entry
    that takes it (the run's own entries first), then the defaults of the run's entries' knobs
    that were not given; a knob without a default that the run's entry needs is an error."""
    entries = [
        (AGGREGATORS, resolved["aggregator"]),
        (ATTACKS, resolved.get("attack", "none")),
        (ALGORITHMS, resolved["algorithm"]),
        (DATASETS, resolved.get("dataset", RunSchema.model_fields["dataset"].default)),
        (MODELS, resolved.get("model", RunSchema.model_fields["model"].default)),
    ]
    own = dict(given)
    declared = plugin_parameters()
    for key, value in given.items():
        mine = [(r, n, p) for r, n, p in declared[key] if (r, n) in entries]
        registry, name, parameter = (mine or declared[key])[0]
        if parameter.annotation is not inspect.Parameter.empty and not isinstance(
            parameter.annotation, str
        ):
            own[key] = check_value(key, value, parameter.annotation)
    for registry, name in entries:
        for key, parameter in registry.own_parameters(name).items():
            if key in own:
                continue
            if parameter.default is inspect.Parameter.empty:
                raise SpecError(
                    f"{registry.concept} {name!r} needs {key!r}; allowed: set it "
                    f"in the run (run: in YAML, or --set {key}=VALUE)"
                )
            if isinstance(parameter.default, (type(None), bool, int, float, str)):
                own[key] = parameter.default  # shown in the run's summary and tables
    return own


def _known(key: str, value: Any, registry: Any) -> None:
    if value not in registry:
        raise SpecError(f"{key} {value!r} is unknown; allowed: {', '.join(registry.names())}")


def _method(values: dict[str, Any], explicit: frozenset[str]) -> tuple[str, str]:
    """(algorithm, aggregator) from the method preset and the explicit keys; conflicts are
    errors unless the preset's algorithm takes any rule."""
    defaults = RunSchema.model_fields
    algorithm = values.get("algorithm", defaults["algorithm"].default)
    aggregator = values.get("aggregator", defaults["aggregator"].default)
    method = values.get("method")
    if method is not None:
        presets = method_presets()
        if method in presets:
            preset_algorithm, preset_rule = presets[method]
        elif method.count("+") == 1:
            # the label of a combination no preset names ("state_cache+mean"): a resolved spec
            # written to summary.json must read back (RunSpec.from_dict(spec.to_dict()))
            preset_algorithm, preset_rule = method.split("+")
        else:
            raise SpecError(
                f"method {method!r} is unknown; allowed: {', '.join(sorted(presets))}"
                f", or ALGORITHM+AGGREGATOR"
            )
        if "algorithm" in explicit and algorithm != preset_algorithm:
            raise SpecError(
                f"method {method!r} runs algorithm {preset_algorithm!r}, not "
                f"{algorithm!r}; leave algorithm out, or choose a method of "
                f"{algorithm!r} (or {algorithm}+{aggregator})"
            )
        _known("algorithm", preset_algorithm, ALGORITHMS)
        overridable = ALGORITHMS[preset_algorithm].rule_overridable and "+" not in method
        if "aggregator" in explicit and aggregator != preset_rule and not overridable:
            raise SpecError(
                f"method {method!r} runs aggregator {preset_rule!r}, not "
                f"{aggregator!r}; leave aggregator out, or use method "
                f"{_label(preset_algorithm, aggregator, None)!r}"
            )
        algorithm = preset_algorithm
        aggregator = aggregator if "aggregator" in explicit else preset_rule
    _known("algorithm", algorithm, ALGORITHMS)
    _known("aggregator", aggregator, AGGREGATORS)
    return algorithm, aggregator


def _label(algorithm: str, aggregator: str, requested: str | None) -> str:
    """The method label of what runs: the requested preset when it is exactly that, else a
    named preset of the pair, else ALGORITHM+AGGREGATOR."""
    presets = method_presets()
    if requested in presets and presets[requested] == (algorithm, aggregator):
        return requested
    named = [m for algorithm_name in ALGORITHMS.names() for m in ALGORITHMS[algorithm_name].methods]
    matching = [m for m, pair in presets.items() if pair == (algorithm, aggregator)]
    preferred = [m for m in matching if m in named] or matching
    return preferred[0] if preferred else f"{algorithm}+{aggregator}"
