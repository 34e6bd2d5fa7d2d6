"""Search-space YAML -> a typed, validated SweepSpec (no Ray needed: ``--dry-run`` uses only this).

A search space is one YAML mapping::

    name: quickstart                  # optional; default: the file name without .yaml
    run:                              # the base RunSpec: every key is a RunSpec key
      dataset: digits
      rounds: 5
    space:                            # key -> domain
      method: {grid: [fedavg, median, krum]}
      trim_ratio: {uniform: [0.0, 0.4]}
      lr: {loguniform: [0.001, 0.1]}
      local_epochs: {int: [1, 5]}     # both ends included; optional step: 2
      seed: {choice: [1, 2, 3]}
      threat:                         # a *joint* axis: its name is a free label (not a RunSpec key)
        grid:                         # and each value is a mapping of RunSpec keys set together
          - {attack: none, byzantine_fraction: 0.0}
          - {attack: alie, byzantine_fraction: 0.2}
    search:
      algorithm: grid                 # grid | optuna
      sampler: tpe                    # optuna only: tpe | gp | nsga2 | cmaes
      seed: 0                         # seeds Optuna's sampler and Tune's random draws
      num_samples: 1                  # grid: repeats of the grid; optuna: number of trials
      metric: accuracy                # or a list (multi-objective, optuna only)
      mode: max                       # or a list; default: min for losses and seconds, else max
    scheduler: none                   # none | asha | {type: asha, grace_period, reduction_factor, max_t}
    resources: {cpu: 1, gpu: 0}       # per trial; fractions allowed
    max_concurrent: 0                 # 0: as many trials side by side as the resources allow
    constraints:
      attack_matches_byzantine: true  # attack none <=> no Byzantine client (the default)
      drop:                           # further combinations to leave out (grid search only)
        - {method: bulyan, participation: 0.1}
      invalid: error                  # error | drop: a combination RunSpec rejects

Domains. ``grid`` is exhaustive (Tune's grid search); ``choice``, ``uniform``, ``loguniform`` and
``int`` are drawn, ``num_samples`` times per grid point under grid search, or proposed by the
Optuna sampler (where a ``grid`` axis is one more categorical, since Optuna does not enumerate).

Constraints are applied by expanding the grid and dropping what they exclude, before Ray starts;
the dry run reports how many combinations each rule dropped. Optuna cannot be told to skip a
proposal, so under ``optuna`` a space that can reach an excluded combination is an error: pair
such keys in a joint axis instead. Every configuration a grid will run is built as a RunSpec here,
so a bad value fails before Ray starts.

Errors are ``SpecError`` with one line naming the file, the key and the allowed values.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import math
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from robusttune.config import RUNSPEC_KEYS, RunSpec
from robusttune.records import RoundRecord
from robusttune.registry import SpecError
from robusttune.yaml_input import read_yaml

__all__ = [
    "Domain", "Axis", "SearchSpec", "SchedulerSpec", "ResourceSpec", "ConstraintSpec", "SweepSpec",
    "Expansion", "load_sweep", "parse_sweep", "report_metrics", "DOMAIN_KINDS", "SAMPLERS",
]

DOMAIN_KINDS = ("grid", "choice", "uniform", "loguniform", "int")
RANDOM_KINDS = ("choice", "uniform", "loguniform", "int")
SEARCH_ALGORITHMS = ("grid", "optuna")
SAMPLERS = ("tpe", "gp", "nsga2", "cmaes")
SCHEDULERS = ("none", "asha")
TOP_KEYS = ("name", "run", "space", "search", "scheduler", "resources", "max_concurrent",
            "constraints")
SEARCH_KEYS = ("algorithm", "sampler", "seed", "num_samples", "metric", "mode")
ASHA_KEYS = ("type", "grace_period", "reduction_factor", "max_t")
RESOURCE_KEYS = ("cpu", "gpu")
CONSTRAINT_KEYS = ("attack_matches_byzantine", "drop", "invalid")
INVALID_POLICIES = ("error", "drop")
# Metrics the trainable reports besides every RoundRecord field: the most recent evaluated
# accuracy and loss, so a metric is defined in rounds that were not evaluated (eval_every > 1).
EXTRA_METRICS = ("last_accuracy", "last_loss")
# Above this many discrete combinations, an Optuna space is checked on a seeded sample of them.
OPTUNA_CHECK_LIMIT = 4096


def report_metrics() -> tuple[str, ...]:
    """Every metric a trial reports: the numeric RoundRecord fields plus EXTRA_METRICS."""
    return tuple(f.name for f in dataclasses.fields(RoundRecord)) + EXTRA_METRICS


def default_mode(metric: str) -> str:
    """min for losses, times and counts of bad events; max otherwise (accuracy)."""
    lowered = metric.lower()
    if "loss" in lowered or lowered.endswith("seconds") or lowered.startswith(("nonfinite", "byzantine")):
        return "min"
    return "max"


def format_value(value: Any) -> str:
    """A compact, unambiguous text for a value (labels, tables, trial folder names)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


# ---------------------------------------------------------------------------------------------
# Domains and axes
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Domain:
    """One axis's set of values. ``values`` for grid/choice; ``low``/``high``/``step`` for the
    ranges (``int`` includes both ends; ``uniform``/``loguniform`` draw from [low, high))."""

    kind: str
    values: tuple[Any, ...] = ()
    low: float | None = None
    high: float | None = None
    step: float | None = None

    @property
    def is_grid(self) -> bool:
        return self.kind == "grid"

    @property
    def is_discrete(self) -> bool:
        return self.kind in ("grid", "choice") or (self.kind == "int" and self.size <= 64)

    @property
    def size(self) -> int:
        if self.kind in ("grid", "choice"):
            return len(self.values)
        if self.kind == "int":
            step = int(self.step or 1)
            return (int(self.high) - int(self.low)) // step + 1
        return math.inf  # type: ignore[return-value]

    def discrete_values(self) -> list[Any]:
        if self.kind in ("grid", "choice"):
            return list(self.values)
        if self.kind == "int":
            return list(range(int(self.low), int(self.high) + 1, int(self.step or 1)))
        raise ValueError(f"{self.kind} is not discrete")

    def probes(self) -> list[Any]:
        """Values that stand for the whole domain when validating: both ends and the middle."""
        if self.is_discrete:
            return self.discrete_values()
        low, high = float(self.low), float(self.high)
        if self.kind == "int":
            return [int(low), int((low + high) // 2), int(high)]
        if self.kind == "loguniform":
            middle = math.sqrt(low * high)
        else:
            middle = (low + high) / 2
        below_high = math.nextafter(high, low)  # uniform draws never reach ``high`` itself
        return [low, middle, below_high]

    def describe(self) -> str:
        if self.kind in ("grid", "choice"):
            return f"{self.kind}[{', '.join(format_value(v) for v in self.values)}]"
        step = f", step {format_value(self.step)}" if self.step else ""
        return f"{self.kind}({format_value(self.low)}, {format_value(self.high)}{step})"

    def to_tune(self) -> Any:
        """The Ray Tune domain (imports ray.tune: only the runner calls this). A grid is a
        categorical too: under grid search the expanded points fill it in one by one, under
        Optuna it is one more categorical to propose from."""
        from ray import tune

        if self.kind in ("grid", "choice"):
            return tune.choice(list(self.values))
        if self.kind == "uniform":
            return tune.quniform(self.low, self.high, self.step) if self.step else tune.uniform(self.low, self.high)
        if self.kind == "loguniform":
            return tune.loguniform(self.low, self.high)
        # int: tune.randint excludes its upper end, tune.qrandint includes it.
        if self.step and int(self.step) > 1:
            return tune.qrandint(int(self.low), int(self.high), int(self.step))
        return tune.randint(int(self.low), int(self.high) + 1)


@dataclass(frozen=True)
class Axis:
    """One ``space:`` entry. A joint axis (``groups`` set) has a free label as its name and its
    values are labels of mappings of RunSpec keys set together."""

    name: str
    domain: Domain
    groups: dict[str, dict[str, Any]] | None = None

    @property
    def keys(self) -> tuple[str, ...]:
        """The RunSpec keys this axis sets."""
        if self.groups is None:
            return (self.name,)
        seen: dict[str, None] = {}
        for mapping in self.groups.values():
            seen.update(dict.fromkeys(mapping))
        return tuple(seen)

    def assign(self, value: Any) -> dict[str, Any]:
        """RunSpec values for one value of this axis."""
        if self.groups is None:
            return {self.name: value}
        try:
            return dict(self.groups[value])
        except (KeyError, TypeError):
            raise SpecError(f"space.{self.name}: {value!r} is not one of its labels; allowed: "
                            f"{', '.join(self.groups)}") from None


@dataclass(frozen=True)
class SearchSpec:
    algorithm: str = "grid"
    sampler: str = "tpe"
    seed: int = 0
    num_samples: int = 1
    metrics: tuple[str, ...] = ("accuracy",)
    modes: tuple[str, ...] = ("max",)

    @property
    def metric(self) -> str:
        return self.metrics[0]

    @property
    def mode(self) -> str:
        return self.modes[0]

    @property
    def multi_objective(self) -> bool:
        return len(self.metrics) > 1


@dataclass(frozen=True)
class SchedulerSpec:
    kind: str = "none"
    grace_period: int = 1
    reduction_factor: float = 4.0
    max_t: int | None = None  # default: the largest number of rounds in the space


@dataclass(frozen=True)
class ResourceSpec:
    cpu: float = 1.0
    gpu: float = 0.0

    def as_tune(self) -> dict[str, float]:
        return {"cpu": self.cpu, "gpu": self.gpu}


@dataclass(frozen=True)
class ConstraintSpec:
    attack_matches_byzantine: bool = True
    drop: tuple[dict[str, tuple[Any, ...]], ...] = ()
    invalid: str = "error"


@dataclass(frozen=True)
class Expansion:
    """A grid expanded: ``points`` are Tune configs (axis name -> value), one per trial, in
    order; ``dropped`` counts combinations left out, by reason; ``combinations`` is the size of
    the full product before dropping (times num_samples)."""

    points: list[dict[str, Any]]
    dropped: Counter
    combinations: int

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())


@dataclass(frozen=True)
class SweepSpec:
    """A validated search space. ``raw`` is the mapping it came from (with overrides applied), so
    the runner can store it next to the results and ``--resume`` rebuilds the same sweep."""

    name: str
    run: dict[str, Any]
    axes: tuple[Axis, ...]
    search: SearchSpec
    scheduler: SchedulerSpec
    resources: ResourceSpec
    max_concurrent: int
    constraints: ConstraintSpec
    raw: dict[str, Any] = field(repr=False, compare=False)
    source: str = "<mapping>"

    # -- configurations ----------------------------------------------------------------------
    @property
    def grid_axes(self) -> tuple[Axis, ...]:
        return tuple(a for a in self.axes if a.domain.is_grid)

    @property
    def random_axes(self) -> tuple[Axis, ...]:
        return tuple(a for a in self.axes if not a.domain.is_grid)

    @property
    def varied_keys(self) -> tuple[str, ...]:
        """The RunSpec keys the space varies, in axis order."""
        seen: dict[str, None] = {}
        for axis in self.axes:
            seen.update(dict.fromkeys(axis.keys))
        return tuple(seen)

    def resolve(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """RunSpec values for one Tune config (axis name -> value; other keys are ignored)."""
        values = dict(self.run)
        for axis in self.axes:
            if axis.name in config:
                values.update(axis.assign(config[axis.name]))
        return values

    def describe(self, config: Mapping[str, Any]) -> str:
        """``key=value, ...`` for the RunSpec keys a config sets (joint axes spelled out)."""
        values: dict[str, Any] = {}
        for axis in self.axes:
            if axis.name in config:
                values.update(axis.assign(config[axis.name]))
        return _describe(values)

    def run_spec(self, config: Mapping[str, Any], **overrides: Any) -> RunSpec:
        return RunSpec.from_dict({**self.resolve(config), **overrides})

    def expand(self) -> Expansion:
        """The grid's trials (grid search only), constraints applied; every kept configuration
        has been built as a RunSpec. Random axes stay unset: Tune draws them per trial."""
        if self.search.algorithm != "grid":
            raise SpecError(f"{self.source}: expand() needs search.algorithm grid")
        cached = self.__dict__.get("_expansion")
        if cached is not None:
            return cached
        expansion = self._expand()
        object.__setattr__(self, "_expansion", expansion)  # frozen: computed once, then kept
        return expansion

    def _expand(self) -> Expansion:
        grid = self.grid_axes
        dropped: Counter = Counter()
        kept: list[dict[str, Any]] = []
        seen: set[str] = set()
        base_random = self._middle_of_random_axes()
        combos = list(itertools.product(*(a.domain.values for a in grid)))
        for combo in combos:
            point = dict(zip((a.name for a in grid), combo))
            spec, reason = self._check(point, base_random)
            if reason is not None:
                dropped[reason] += 1
                continue
            fingerprint = spec.to_json()
            if fingerprint in seen:
                dropped["same RunSpec as an earlier combination"] += 1
                continue
            seen.add(fingerprint)
            kept.append(point)
        if not kept:
            raise SpecError(f"{self.source}: every combination of the grid was dropped "
                            f"({_reasons(dropped)}); nothing to run")
        self._check_random_axes(kept[0])
        points = [dict(p) for _ in range(self.search.num_samples) for p in kept]
        return Expansion(points=points, dropped=Counter({k: v * self.search.num_samples
                                                        for k, v in dropped.items()}),
                         combinations=len(combos) * self.search.num_samples)

    def trial_count(self) -> int:
        if self.search.algorithm == "grid":
            return len(self.expand().points)
        return self.search.num_samples

    def configurations(self) -> "Any":
        """A pandas DataFrame: one row per trial (grid) with the RunSpec keys the space varies,
        or one row per axis with its domain (optuna)."""
        import pandas as pd

        if self.search.algorithm == "grid":
            rows = []
            for index, point in enumerate(self.expand().points):
                values = self.resolve(point)
                row: dict[str, Any] = {"trial": index}
                for axis in self.axes:
                    if axis.domain.is_grid:
                        row.update({k: values.get(k) for k in axis.keys})
                    else:
                        row[axis.name] = axis.domain.describe()
                rows.append(row)
            return pd.DataFrame(rows).set_index("trial")
        rows = [{"axis": a.name, "keys": ", ".join(a.keys),
                 "domain": a.domain.describe() if a.groups is None
                 else f"{'grid' if a.domain.is_grid else 'choice'} of {len(a.groups)} joint values"}
                for a in self.axes]
        return pd.DataFrame(rows).set_index("axis")

    def max_rounds(self) -> int:
        """The largest ``rounds`` any trial can have (ASHA's max_t)."""
        candidates = [int(self.run.get("rounds", RunSpec.rounds))]
        for axis in self.axes:
            if "rounds" not in axis.keys:
                continue
            if axis.groups is not None:
                candidates += [int(g["rounds"]) for g in axis.groups.values() if "rounds" in g]
            elif axis.domain.is_discrete:
                candidates += [int(v) for v in axis.domain.discrete_values()]
            else:
                candidates.append(int(axis.domain.high))
        return max(candidates)

    # -- Tune objects (the runner calls these; they import ray) -------------------------------
    def param_space(self) -> dict[str, Any]:
        """The Tune param_space: one domain per axis (a joint axis is a choice of its labels).
        Under grid search every grid axis is a categorical that the expanded points fill in."""
        return {axis.name: axis.domain.to_tune() for axis in self.axes}

    def with_overrides(self, **changes: Any) -> "SweepSpec":
        """A new spec with command-line overrides (name, num_samples, max_concurrent, cpu, gpu,
        run keys via ``run={...}``), validated like the file."""
        raw = _deep_copy(self.raw)
        for key, value in changes.items():
            if value is None:
                continue
            if key == "name":
                raw["name"] = value
            elif key == "num_samples":
                raw.setdefault("search", {})
                raw["search"]["num_samples"] = value
            elif key == "max_concurrent":
                raw["max_concurrent"] = value
            elif key in ("cpu", "gpu"):
                raw.setdefault("resources", {})
                raw["resources"][key] = value
            elif key == "run":
                raw.setdefault("run", {})
                raw["run"].update(value)
            else:
                raise ValueError(f"unknown override {key!r}")
        return parse_sweep(raw, name=self.name, source=self.source)

    # -- validation helpers ------------------------------------------------------------------
    def _check(self, point: Mapping[str, Any], random_values: Mapping[str, Any]) -> tuple[RunSpec | None, str | None]:
        """Build one configuration; return (spec, None) or (None, reason it is dropped)."""
        try:
            spec = self.run_spec({**random_values, **point})
        except SpecError as error:
            if self.constraints.invalid == "drop":
                return None, f"invalid: {error}"
            raise SpecError(f"{self.source}: configuration {self.describe(point)} is invalid: {error}") from None
        reason = constraint_violation(spec, self.constraints)
        return (None, reason) if reason else (spec, None)

    def _middle_of_random_axes(self) -> dict[str, Any]:
        """Drawn axes stand at the middle of their domain while the grid is expanded; their
        ends are checked separately (`_check_random_axes`)."""
        middle = {}
        for axis in self.random_axes:
            probes = axis.domain.probes()
            middle[axis.name] = probes[len(probes) // 2]
        return middle

    def _check_random_axes(self, point: Mapping[str, Any]) -> None:
        """Every probe of every drawn axis must be valid and allowed with one grid point."""
        base = self._middle_of_random_axes()
        for axis in self.random_axes:
            for probe in axis.domain.probes():
                self._require_runnable(
                    {**base, axis.name: probe, **point},
                    f"space.{axis.name} can draw {format_value(probe)}",
                    "make it a grid axis or pair it with the keys it depends on in a joint axis")

    def _require_runnable(self, config: dict[str, Any], proposal: str, remedy: str) -> None:
        """One line naming the proposal when ``config`` is an invalid or excluded run."""
        try:
            spec = self.run_spec(config)
        except SpecError as error:
            raise SpecError(f"{self.source}: {proposal}, which is invalid: {error}") from None
        reason = constraint_violation(spec, self.constraints)
        if reason:
            raise SpecError(f"{self.source}: {proposal}, which constraints exclude ({reason}); {remedy}")

    def validate_optuna(self) -> None:
        """Under Optuna every proposal must be runnable: check every combination of the discrete
        axes (a seeded sample of them above OPTUNA_CHECK_LIMIT) at the ends and middle of the
        continuous ones."""
        discrete = [a for a in self.axes if a.domain.is_discrete]
        continuous = [a for a in self.axes if not a.domain.is_discrete]
        value_lists = [a.domain.discrete_values() for a in discrete]
        total = math.prod(len(v) for v in value_lists) if value_lists else 1
        combos: Iterable[tuple[Any, ...]]
        if total <= OPTUNA_CHECK_LIMIT:
            combos = itertools.product(*value_lists)
        else:
            rng = random.Random(self.search.seed)
            combos = [tuple(rng.choice(v) for v in value_lists) for _ in range(OPTUNA_CHECK_LIMIT)]
        probe_sets = [[(a.name, p) for p in a.domain.probes()] for a in continuous]
        for combo in combos:
            point = dict(zip((a.name for a in discrete), combo))
            for probe in itertools.product(*probe_sets) if probe_sets else [()]:
                config = {**point, **dict(probe)}
                self._require_runnable(
                    config, f"the optuna space can propose {self.describe(config)}",
                    "optuna cannot skip a proposal: pair those keys in a joint axis")


def constraint_violation(spec: RunSpec, constraints: ConstraintSpec) -> str | None:
    """Why ``spec`` is excluded by ``constraints``, or None.

    attack_matches_byzantine: the clean attack ``none`` only without Byzantine clients, and any
    other attack only with at least one (an attack with no attacker repeats the clean run)."""
    if constraints.attack_matches_byzantine:
        if spec.attack == "none" and spec.n_byzantine > 0:
            return "attack none with Byzantine clients (attack_matches_byzantine)"
        if spec.attack != "none" and spec.n_byzantine == 0:
            return "an attack without Byzantine clients (attack_matches_byzantine)"
    for rule in constraints.drop:
        if all(getattr(spec, key) in allowed for key, allowed in rule.items()):
            return f"constraints.drop {_describe({k: v[0] if len(v) == 1 else list(v) for k, v in rule.items()})}"
    return None


# ---------------------------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------------------------
def load_sweep(path: str | Path) -> SweepSpec:
    """Read and validate a search-space YAML file."""
    path = Path(path)
    return parse_sweep(read_yaml(path, "search space"), name=path.stem, source=path.name)


def parse_sweep(mapping: Any, *, name: str = "sweep", source: str = "<mapping>") -> SweepSpec:
    """Validate a search-space mapping (see the module docstring for the format)."""
    where = source
    if not isinstance(mapping, Mapping):
        raise SpecError(f"{where}: a search space is a mapping with keys {', '.join(TOP_KEYS)}")
    raw = _deep_copy(dict(mapping))
    _unknown(raw, TOP_KEYS, where, "")

    sweep_name = raw.get("name", name)
    if not isinstance(sweep_name, str) or not sweep_name or any(c in sweep_name for c in "/\\ "):
        raise SpecError(f"{where}: name must be a non-empty word without '/' or spaces; got {sweep_name!r}")

    run = raw.get("run") or {}
    if not isinstance(run, Mapping):
        raise SpecError(f"{where}: run must be a mapping of RunSpec keys")
    for key in run:
        _runspec_key(key, where, "run")

    axes = _parse_space(raw.get("space") or {}, where)
    search = _parse_search(raw.get("search") or {}, where)
    scheduler = _parse_scheduler(raw.get("scheduler", "none"), search, where)
    resources = _parse_resources(raw.get("resources") or {}, where)
    max_concurrent = _int(raw.get("max_concurrent", 0), "max_concurrent", where, minimum=0)
    constraints = _parse_constraints(raw.get("constraints") or {}, where)

    if search.algorithm == "optuna":
        if constraints.drop:
            raise SpecError(f"{where}: constraints.drop needs search.algorithm grid (optuna cannot "
                            f"skip a proposal); allowed under optuna: attack_matches_byzantine, invalid: error")
        if constraints.invalid == "drop":
            raise SpecError(f"{where}: constraints.invalid drop needs search.algorithm grid; allowed "
                            f"under optuna: error")
        if not axes:
            raise SpecError(f"{where}: search.algorithm optuna needs at least one space: axis")

    device = run.get("device", "auto")
    if isinstance(device, str) and device.startswith("cuda") and resources.gpu == 0:
        raise SpecError(f"{where}: run.device {device} needs resources.gpu > 0; allowed: "
                        f"device auto or cpu without a GPU")
    if device == "cpu" and resources.gpu > 0:
        raise SpecError(f"{where}: run.device cpu with resources.gpu {format_value(resources.gpu)} "
                        f"reserves a GPU no trial uses; allowed: device auto or cuda, or gpu: 0")

    spec = SweepSpec(name=sweep_name, run=dict(run), axes=axes, search=search, scheduler=scheduler,
                     resources=resources, max_concurrent=max_concurrent, constraints=constraints,
                     raw=raw, source=source)
    _check_metrics(spec, where)
    # Every configuration is built as a RunSpec now, so a bad value fails before Ray starts.
    if search.algorithm == "grid":
        spec.expand()
    else:
        spec.validate_optuna()
    return spec


def _parse_space(space: Any, where: str) -> tuple[Axis, ...]:
    if not isinstance(space, Mapping):
        raise SpecError(f"{where}: space must be a mapping of key -> domain "
                        f"({' | '.join(DOMAIN_KINDS)})")
    axes: list[Axis] = []
    owner: dict[str, str] = {}
    for name, body in space.items():
        key = f"space.{name}"
        if not isinstance(body, Mapping) or len(set(body) & set(DOMAIN_KINDS)) != 1:
            raise SpecError(f"{where}: {key} must be one domain, e.g. {{grid: [...]}}; allowed: "
                            f"{', '.join(DOMAIN_KINDS)}")
        kind = next(k for k in body if k in DOMAIN_KINDS)
        extra = set(body) - {kind, "step"}
        if extra or ("step" in body and kind not in ("int", "uniform")):
            bad = sorted(extra)[0] if extra else "step"
            allowed = "step" if kind in ("int", "uniform") else "nothing else"
            raise SpecError(f"{where}: {key}.{bad} is not allowed beside {kind}; allowed: {allowed}")
        joint = name not in RUNSPEC_KEYS
        if kind in ("grid", "choice"):
            values = body[kind]
            if not isinstance(values, list) or not values:
                raise SpecError(f"{where}: {key}.{kind} must be a non-empty list")
            if joint:
                axis = _joint_axis(name, kind, values, where)
            else:
                if any(isinstance(v, (Mapping, list)) for v in values):
                    raise SpecError(f"{where}: {key}.{kind} values must be scalars; a list of "
                                    f"mappings needs a joint axis whose name is not a RunSpec key")
                if len({format_value(v) for v in values}) != len(values):
                    raise SpecError(f"{where}: {key}.{kind} lists a value twice")
                axis = Axis(name, Domain(kind, values=tuple(values)))
        else:
            if joint:
                _runspec_key(name, where, "space")
            axis = Axis(name, _range_domain(kind, body, key, where))
        for runspec_key in axis.keys:
            if runspec_key in owner:
                raise SpecError(f"{where}: {key} sets {runspec_key}, which {owner[runspec_key]} "
                                f"sets too; allowed: one axis per RunSpec key")
            owner[runspec_key] = key
        axes.append(axis)
    return tuple(axes)


def _joint_axis(name: str, kind: str, values: list[Any], where: str) -> Axis:
    key = f"space.{name}"
    if not all(isinstance(v, Mapping) and v for v in values):
        raise SpecError(f"{where}: unknown RunSpec key {name!r} in space; allowed: "
                        f"{', '.join(sorted(RUNSPEC_KEYS))} (a joint axis with a free name "
                        f"lists mappings of RunSpec keys)")
    groups: dict[str, dict[str, Any]] = {}
    for value in values:
        for inner in value:
            _runspec_key(inner, where, key)
            if isinstance(value[inner], (Mapping, list)):
                raise SpecError(f"{where}: {key}.{inner} must be a scalar; got {value[inner]!r}")
        label = ",".join(f"{k}={format_value(v)}" for k, v in value.items())
        if label in groups:
            raise SpecError(f"{where}: {key}.{kind} lists {label} twice")
        groups[label] = dict(value)
    return Axis(name, Domain(kind, values=tuple(groups)), groups=groups)


def _range_domain(kind: str, body: Mapping[str, Any], key: str, where: str) -> Domain:
    bounds = body[kind]
    if not isinstance(bounds, list) or len(bounds) != 2:
        raise SpecError(f"{where}: {key}.{kind} must be [low, high]")
    if not all(isinstance(b, (int, float)) and not isinstance(b, bool) and math.isfinite(b) for b in bounds):
        raise SpecError(f"{where}: {key}.{kind} bounds must be finite numbers; got {bounds!r}")
    low, high = bounds
    step = body.get("step")
    if kind == "int":
        if not all(float(b).is_integer() for b in bounds):
            raise SpecError(f"{where}: {key}.int bounds must be integers; got {bounds!r}")
        low, high = int(low), int(high)
        if low > high:
            raise SpecError(f"{where}: {key}.int needs low <= high; got {bounds!r}")
        if step is not None:
            step = _int(step, f"{key}.step", where, minimum=1)
    else:
        low, high = float(low), float(high)
        if not low < high:
            raise SpecError(f"{where}: {key}.{kind} needs low < high; got {bounds!r}")
        if kind == "loguniform" and low <= 0:
            raise SpecError(f"{where}: {key}.loguniform needs low > 0; got {bounds!r}")
        if step is not None:
            if isinstance(step, bool) or not isinstance(step, (int, float)) or step <= 0:
                raise SpecError(f"{where}: {key}.step must be a number > 0; got {step!r}")
            step = float(step)
    return Domain(kind, low=low, high=high, step=step)


def _parse_search(search: Any, where: str) -> SearchSpec:
    if isinstance(search, str):
        search = {"algorithm": search}
    if not isinstance(search, Mapping):
        raise SpecError(f"{where}: search must be a mapping with keys {', '.join(SEARCH_KEYS)}")
    _unknown(search, SEARCH_KEYS, where, "search.")
    algorithm = _choice(search.get("algorithm", "grid"), SEARCH_ALGORITHMS, "search.algorithm", where)
    if algorithm == "grid" and "sampler" in search:
        raise SpecError(f"{where}: search.sampler applies to search.algorithm optuna only; "
                        f"allowed with grid: algorithm, seed, num_samples, metric, mode")
    sampler = _choice(search.get("sampler", "tpe"), SAMPLERS, "search.sampler", where)
    if algorithm == "optuna" and sampler == "cmaes" and importlib.util.find_spec("cmaes") is None:
        raise SpecError(f"{where}: search.sampler cmaes needs the 'cmaes' package (pip install "
                        f"cmaes); allowed without it: tpe, gp, nsga2")
    seed = _int(search.get("seed", 0), "search.seed", where, minimum=0)
    num_samples = _int(search.get("num_samples", 1 if algorithm == "grid" else 10),
                       "search.num_samples", where, minimum=1)
    metric = search.get("metric", "accuracy")
    metrics = tuple(metric) if isinstance(metric, list) else (metric,)
    if not metrics or not all(isinstance(m, str) for m in metrics):
        raise SpecError(f"{where}: search.metric must be a metric name or a list of them")
    if len(set(metrics)) != len(metrics):
        raise SpecError(f"{where}: search.metric lists a metric twice")
    mode = search.get("mode")
    if mode is None:
        modes = tuple(default_mode(m) for m in metrics)
    else:
        modes = tuple(mode) if isinstance(mode, list) else (mode,) * len(metrics)
        if len(modes) != len(metrics):
            raise SpecError(f"{where}: search.mode needs one mode per metric ({len(metrics)}); "
                            f"got {len(modes)}")
        for m in modes:
            _choice(m, ("max", "min"), "search.mode", where)
    if len(metrics) > 1 and algorithm == "optuna" and sampler == "cmaes":
        raise SpecError(f"{where}: search.sampler cmaes is single-objective; allowed with several "
                        f"metrics: tpe, gp, nsga2")
    return SearchSpec(algorithm=algorithm, sampler=sampler, seed=seed, num_samples=num_samples,
                      metrics=metrics, modes=modes)


def _parse_scheduler(scheduler: Any, search: SearchSpec, where: str) -> SchedulerSpec:
    if scheduler is None:
        scheduler = "none"
    if isinstance(scheduler, str):
        scheduler = {"type": scheduler}
    if not isinstance(scheduler, Mapping):
        raise SpecError(f"{where}: scheduler must be one of {', '.join(SCHEDULERS)} or "
                        f"{{type: asha, grace_period, reduction_factor, max_t}}")
    kind = _choice(scheduler.get("type", "none"), SCHEDULERS, "scheduler", where)
    if kind == "none":
        _unknown(scheduler, ("type",), where, "scheduler.")
        return SchedulerSpec()
    _unknown(scheduler, ASHA_KEYS, where, "scheduler.")
    if search.multi_objective:
        raise SpecError(f"{where}: scheduler asha stops trials on one metric; search.metric lists "
                        f"{len(search.metrics)}; allowed: one metric, or scheduler none")
    grace = _int(scheduler.get("grace_period", 1), "scheduler.grace_period", where, minimum=1)
    factor = scheduler.get("reduction_factor", 4)
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or factor <= 1:
        raise SpecError(f"{where}: scheduler.reduction_factor must be a number > 1; got {factor!r}")
    max_t = scheduler.get("max_t")
    if max_t is not None:
        max_t = _int(max_t, "scheduler.max_t", where, minimum=1)
    return SchedulerSpec(kind="asha", grace_period=grace, reduction_factor=float(factor), max_t=max_t)


def _parse_resources(resources: Any, where: str) -> ResourceSpec:
    if not isinstance(resources, Mapping):
        raise SpecError(f"{where}: resources must be a mapping with keys {', '.join(RESOURCE_KEYS)}")
    _unknown(resources, RESOURCE_KEYS, where, "resources.")
    cpu, gpu = resources.get("cpu", 1), resources.get("gpu", 0)
    for key, value, low_ok in (("cpu", cpu, False), ("gpu", gpu, True)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or value < 0 or (value == 0 and not low_ok):
            bound = ">= 0" if low_ok else "> 0"
            raise SpecError(f"{where}: resources.{key} must be a number {bound} (fractions allowed); got {value!r}")
    if gpu > 1 and not float(gpu).is_integer():
        raise SpecError(f"{where}: resources.gpu above 1 must be a whole number (Ray shares only "
                        f"fractions of one GPU); got {gpu}")
    return ResourceSpec(cpu=float(cpu), gpu=float(gpu))


def _parse_constraints(constraints: Any, where: str) -> ConstraintSpec:
    if not isinstance(constraints, Mapping):
        raise SpecError(f"{where}: constraints must be a mapping with keys {', '.join(CONSTRAINT_KEYS)}")
    _unknown(constraints, CONSTRAINT_KEYS, where, "constraints.")
    matches = constraints.get("attack_matches_byzantine", True)
    if not isinstance(matches, bool):
        raise SpecError(f"{where}: constraints.attack_matches_byzantine must be true or false; got {matches!r}")
    invalid = _choice(constraints.get("invalid", "error"), INVALID_POLICIES, "constraints.invalid", where)
    drop_list = constraints.get("drop") or []
    if not isinstance(drop_list, list):
        raise SpecError(f"{where}: constraints.drop must be a list of mappings of RunSpec keys")
    rules = []
    for index, rule in enumerate(drop_list):
        if not isinstance(rule, Mapping) or not rule:
            raise SpecError(f"{where}: constraints.drop[{index}] must be a mapping of RunSpec keys")
        parsed = {}
        for key, value in rule.items():
            _runspec_key(key, where, f"constraints.drop[{index}]")
            parsed[key] = tuple(value) if isinstance(value, list) else (value,)
        rules.append(parsed)
    return ConstraintSpec(attack_matches_byzantine=matches, drop=tuple(rules), invalid=invalid)


def _check_metrics(spec: SweepSpec, where: str) -> None:
    allowed = report_metrics()
    for metric in spec.search.metrics:
        if metric not in allowed:
            raise SpecError(f"{where}: search.metric {metric!r} is not reported; allowed: {', '.join(allowed)}")
    if spec.scheduler.kind == "asha" and spec.search.metric in ("accuracy", "loss", "max_class_share"):
        every = [spec.run.get("eval_every", 1)]
        for axis in spec.axes:
            if "eval_every" in axis.keys:
                every.append(2)  # any varied eval_every may skip rounds
        if any(int(e) > 1 for e in every):
            raise SpecError(f"{where}: scheduler asha compares {spec.search.metric} every round, but "
                            f"eval_every > 1 leaves it NaN between evaluations; allowed metrics: "
                            f"last_accuracy, last_loss")


# ---------------------------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------------------------
def _unknown(mapping: Mapping[str, Any], allowed: Sequence[str], where: str, prefix: str) -> None:
    for key in mapping:
        if key not in allowed:
            raise SpecError(f"{where}: unknown key {prefix}{key}; allowed: {', '.join(allowed)}")


def _runspec_key(key: Any, where: str, section: str) -> None:
    if key not in RUNSPEC_KEYS:
        raise SpecError(f"{where}: unknown RunSpec key {key!r} in {section}; allowed: "
                        f"{', '.join(sorted(RUNSPEC_KEYS))}")


def _choice(value: Any, allowed: Sequence[str], key: str, where: str) -> str:
    if value not in allowed:
        raise SpecError(f"{where}: {key} {value!r} is not allowed; allowed: {', '.join(allowed)}")
    return value


def _int(value: Any, key: str, where: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not float(value).is_integer() \
            or value < minimum:
        raise SpecError(f"{where}: {key} must be an integer >= {minimum}; got {value!r}")
    return int(value)


def _describe(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={format_value(v)}" for k, v in values.items()) or "(base run)"


def _reasons(dropped: Counter) -> str:
    return "; ".join(f"{n} {reason}" for reason, n in dropped.most_common())


def _deep_copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value

