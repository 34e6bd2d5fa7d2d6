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

Errors are ``SpecError`` with one line naming the file, the key, what is allowed and the value.

The file's sections are validated by the pydantic models of `space_file`; an axis's values and
their Tune translation are `domains`; this module holds the SweepSpec: the grid's expansion, the
constraints, the configurations, and `load_sweep` / `parse_sweep` (the command line's flags
are written into the mapping first: `space_overrides`).
"""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from robusttune.core.plugins import declare_plugins
from robusttune.core.registry import SpecError
from robusttune.core.runspec import RunSpec
from robusttune.core.schema import default_numerics
from robusttune.core.validation import check_model
from robusttune.core.yaml_input import read_yaml
from robusttune.experiments.sweep.constraints import constraint_violation
from robusttune.experiments.sweep.domains import (
    DOMAIN_KINDS,
    RANDOM_KINDS,
    Axis,
    Domain,
    describe_values,
    format_value,
)
from robusttune.experiments.sweep.space_file import (
    INVALID_POLICIES,
    SAMPLERS,
    SCHEDULERS,
    SEARCH_ALGORITHMS,
    ConstraintSpec,
    ResourceSpec,
    SchedulerSpec,
    SearchSpec,
    SweepFile,
    check_sections,
)
from robusttune.experiments.sweep.space_overrides import (
    deep_copy,
    file_assignments,
    override_sweep_mapping,
)

__all__ = [
    "DOMAIN_KINDS",
    "INVALID_POLICIES",
    "RANDOM_KINDS",
    "SAMPLERS",
    "SCHEDULERS",
    "SEARCH_ALGORITHMS",
    "TOP_KEYS",
    "Axis",
    "ConstraintSpec",
    "Domain",
    "Expansion",
    "ResourceSpec",
    "SchedulerSpec",
    "SearchSpec",
    "SweepSpec",
    "check_sections",
    "format_value",
    "load_sweep",
    "parse_sweep",
]

TOP_KEYS: tuple[str, ...] = tuple(SweepFile.model_fields)
# Above this many discrete combinations, an Optuna space is checked on a seeded sample of them.
OPTUNA_CHECK_LIMIT = 4096


@dataclass(frozen=True)
class Expansion:
    """A grid expanded: ``points`` are Tune configs (axis name -> value), one per trial, in
    order; ``dropped`` counts combinations left out, by reason; ``combinations`` is the size of
    the full product before dropping (times num_samples)."""

    points: list[dict[str, Any]]
    dropped: Counter[str]
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
    # what every trial loads before it builds its run (robusttune.core.plugins; set by run_sweep)
    plugins: tuple[Any, ...] = field(default=(), repr=False, compare=False)

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
        return describe_values(values)

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
        dropped: Counter[str] = Counter()
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
            assert spec is not None  # _check gives a spec whenever it gives no reason
            fingerprint = spec.to_json()
            if fingerprint in seen:
                dropped["same RunSpec as an earlier combination"] += 1
                continue
            seen.add(fingerprint)
            kept.append(point)
        if not kept:
            raise SpecError(
                f"{self.source}: every combination of the grid was dropped "
                f"({_reasons(dropped)}); nothing to run"
            )
        self._check_random_axes(kept[0])
        points = [dict(p) for _ in range(self.search.num_samples) for p in kept]
        return Expansion(
            points=points,
            dropped=Counter({k: v * self.search.num_samples for k, v in dropped.items()}),
            combinations=len(combos) * self.search.num_samples,
        )

    def trial_count(self) -> int:
        if self.search.algorithm == "grid":
            return len(self.expand().points)
        return self.search.num_samples

    def configurations(self) -> Any:
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
        rows = [
            {
                "axis": a.name,
                "keys": ", ".join(a.keys),
                "domain": a.domain.describe()
                if a.groups is None
                else f"{'grid' if a.domain.is_grid else 'choice'} of {len(a.groups)} joint values",
            }
            for a in self.axes
        ]
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
                candidates.append(int(axis.domain.bounds[1]))
        return max(candidates)

    # -- Tune objects (the runner calls these; they import ray) -------------------------------
    def param_space(self) -> dict[str, Any]:
        """The Tune param_space: one domain per axis (a joint axis is a choice of its labels).
        Under grid search every grid axis is a categorical that the expanded points fill in."""
        return {axis.name: axis.domain.to_tune() for axis in self.axes}

    def with_overrides(self, **changes: Any) -> SweepSpec:
        """A new spec with command-line overrides (`override_sweep_mapping`), validated like the
        file."""
        raw, given = override_sweep_mapping(self.raw, **changes)
        # a bad value given on the command line is named as the user typed it
        source = f"{self.source} with {' '.join(given)}" if given else self.source
        return parse_sweep(raw, name=self.name, source=source)

    # -- validation helpers ------------------------------------------------------------------
    def _check(
        self, point: Mapping[str, Any], random_values: Mapping[str, Any]
    ) -> tuple[RunSpec | None, str | None]:
        """Build one configuration; return (spec, None) or (None, reason it is dropped)."""
        try:
            spec = self.run_spec({**random_values, **point})
        except SpecError as error:
            if self.constraints.invalid == "drop":
                return None, f"invalid: {error}"
            raise SpecError(
                f"{self.source}: configuration {self.describe(point)} is invalid: {error}"
            ) from None
        reason = constraint_violation(spec, self.constraints)
        return (None, reason) if reason else (spec, None)

    def example_point(self) -> dict[str, Any]:
        """One configuration of the space (a Tune config): the first grid point (or each
        discrete axis' first value under Optuna) with drawn axes at the middle of their domain."""
        if self.search.algorithm == "grid":
            points = self.expand().points
            if points:
                return {**self._middle_of_random_axes(), **points[0]}
        return {
            **{a.name: a.domain.discrete_values()[0] for a in self.axes if a.domain.is_discrete},
            **self._middle_of_random_axes(),
        }

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
                    "make it a grid axis or pair it with the keys it depends on in a joint axis",
                )

    def _require_runnable(self, config: dict[str, Any], proposal: str, remedy: str) -> None:
        """One line naming the proposal when ``config`` is an invalid or excluded run."""
        try:
            spec = self.run_spec(config)
        except SpecError as error:
            raise SpecError(f"{self.source}: {proposal}, which is invalid: {error}") from None
        reason = constraint_violation(spec, self.constraints)
        if reason:
            raise SpecError(
                f"{self.source}: {proposal}, which constraints exclude ({reason}); {remedy}"
            )

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
                    config,
                    f"the optuna space can propose {self.describe(config)}",
                    "optuna cannot skip a proposal: pair those keys in a joint axis",
                )


# ---------------------------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------------------------
def load_sweep(path: str | Path, assignments: Sequence[str] = (), **overrides: Any) -> SweepSpec:
    """Read and validate a search-space YAML file, with command-line ``overrides``
    (`override_sweep_mapping`) and ``--set`` ``assignments`` written into it first: the file and
    its flags are validated together (a flag may settle what the file alone leaves wrong, and a
    bad flag is named as typed)."""
    path = Path(path)
    mapping = read_yaml(path, "search space")
    if assignments:
        overrides["run"] = {
            **(overrides.get("run") or {}),
            **file_assignments(mapping, path.name, assignments),
        }
    raw, given = override_sweep_mapping(mapping, **overrides)
    source = f"{path.name} with {' '.join(given)}" if given else path.name
    return parse_sweep(raw, name=path.stem, source=source)


def parse_sweep(mapping: Any, *, name: str = "sweep", source: str = "<mapping>") -> SweepSpec:
    """Validate a search-space mapping (see the module docstring for the format); ``name`` is
    the sweep's name unless the mapping sets one."""
    if not isinstance(mapping, Mapping):
        raise SpecError(f"{source}: a search space is a mapping with keys {', '.join(TOP_KEYS)}")
    raw = deep_copy(dict(mapping))
    declare_plugins(raw, source)
    parsed: SweepFile = check_model(SweepFile, {"name": name, **raw}, where=source)
    run = dict(parsed.run)
    if "numerics" not in run:
        # written into the sweep as stored, so every trial (on any node) and a --resume train in
        # the mode the sweep was started in, whatever their environment's default
        run["numerics"] = default_numerics()
        raw["run"] = {**(raw.get("run") or {}), "numerics": run["numerics"]}
    spec = SweepSpec(
        name=parsed.name,
        run=run,
        axes=parsed.axes,
        search=parsed.search,
        scheduler=parsed.scheduler,
        resources=parsed.resources,
        max_concurrent=parsed.max_concurrent,
        constraints=parsed.constraints,
        raw=raw,
        source=source,
    )
    # Every configuration is built as a RunSpec now, so a bad value fails before Ray starts.
    if spec.search.algorithm == "grid":
        spec.expand()
    else:
        spec.validate_optuna()
    return spec


# ---------------------------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------------------------
def _reasons(dropped: Counter[str]) -> str:
    return "; ".join(f"{n} {reason}" for reason, n in dropped.most_common())
