"""The breakdown YAML: `load_plan` reads a breakdown space into a `BreakdownPlan` (the cells from
the sweep-layer space's grid axes, the defence knobs to tune from its drawn axes, and the
``breakdown:`` section, keys `PLAN_KEYS`). Parsing and validating the space is the sweep layer's
(`robusttune.experiments.sweep.space.parse_sweep`); this module only maps its axes onto cells and knobs."""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from robusttune.core.plugins import declare_plugins
from robusttune.core.registry import SpecError
from robusttune.core.runspec import RunSpec, run_keys
from robusttune.core.validation import Checked, Number, optional_finite
from robusttune.core.yaml_input import read_yaml
from robusttune.experiments.breakdown.bisection import DEFAULT_CLEAN_MARGIN, Cell
from robusttune.experiments.sweep.domains import format_value
from robusttune.experiments.sweep.space import check_sections, parse_sweep
from robusttune.experiments.sweep.space_overrides import file_assignments

__all__ = [
    "PLAN_KEYS",
    "BreakdownPlan",
    "CellCost",
    "load_plan",
    "override_plan_mapping",
    "parse_plan",
    "plan_costs",
    "replicate_costs",
    "rounds_for_participation",
]


class BreakdownSection(Checked):
    """The ``breakdown:`` section of a breakdown space (and the command line's overrides of it).
    Accuracies are fractions in [0, 1]."""

    section: ClassVar[str] = "breakdown"

    seeds: Annotated[list[Annotated[int, Number, Field(ge=0)]], Field(min_length=1)] = [42]  # noqa: RUF012 - pydantic copies a default per model
    threshold: optional_finite(ge=0, le=1) = None
    relative_threshold: Annotated[float, Number, Field(gt=0, le=1)] = 0.5
    # a clean run must beat chance (1/K) by this much for its cell to have a breakdown point
    clean_margin: Annotated[float, Number, Field(ge=0, lt=1)] = DEFAULT_CLEAN_MARGIN
    max_fraction: Annotated[float, Number, Field(gt=0, lt=1)] = 0.5
    budget: Annotated[int, Number, Field(ge=1)] = 4
    verify_radius: Annotated[int, Number, Field(ge=0)] = 1
    on_non_monotone: Literal["flag", "scan"] = "flag"
    # a mapping narrows or widens the worst case; "adaptive" adds a strength search to each
    # attack's ladder (robusttune.methods.adaptive), adaptive_budget runs per point
    adversary: Literal["adaptive"] | dict[str, Annotated[list[Any], Field(min_length=1)]] = {}  # noqa: RUF012 - pydantic copies it
    adaptive_budget: Annotated[int, Number, Field(ge=1)] = 4
    min_client_rounds: optional_finite(gt=0) = None
    # an earlier map of the same cells (its folder or breakdown.csv, relative to where the
    # command runs) whose answers the bisection starts from (robusttune.experiments.breakdown.prior)
    start_from: Annotated[str, Field(min_length=1)] | None = None


PLAN_KEYS = tuple(BreakdownSection.model_fields)


class BreakdownSearch(Checked):
    """A breakdown space's ``search:`` (the Optuna study that tunes the defence knobs)."""

    section: ClassVar[str] = "search"

    algorithm: str | None = None  # the map always bisects; a grid/optuna word is accepted
    sampler: Literal["tpe"] = "tpe"
    seed: Annotated[int, Number, Field(ge=0)] = 0


@dataclass
class BreakdownPlan:
    """A breakdown search space: a sweep-layer search space (``run``, ``space``, ``resources``
    ...) whose grid axes are the cells and whose drawn axes are the defence knobs tuned at each
    point, plus a ``breakdown:`` section (keys PLAN_KEYS).

    ``raw`` is the mapping as run (the file with the command line's overrides written into it):
    what a results folder keeps as plan.yaml, so ``--resume`` can tell whether it is asked to
    continue the same map. ``given`` lists those overrides as typed (``--set rounds=2``)."""

    name: str
    base: dict[str, Any]
    cells: list[Cell]
    tune: dict[str, Any]
    seeds: list[int] = field(default_factory=lambda: [42])
    threshold: float | None = None
    relative_threshold: float = 0.5
    clean_margin: float = DEFAULT_CLEAN_MARGIN
    max_fraction: float = 0.5
    budget: int = 4
    verify_radius: int = 1
    on_non_monotone: str = "flag"
    adversary: dict[str, list[Any]] = field(default_factory=dict)
    adaptive: int = 0  # runs of the adaptive strength search per point (0: the ladder only)
    min_client_rounds: float | None = None
    start_from: str | None = None
    sampler_seed: int = 0
    resources: dict[str, float | str] = field(default_factory=dict)
    max_concurrent: int = 0
    raw: dict[str, Any] = field(default_factory=dict)
    source: str = "<mapping>"
    given: tuple[str, ...] = ()

    def with_overrides(self, **overrides: Any) -> BreakdownPlan:
        """The plan with command-line values (`override_plan_mapping`) written into its mapping,
        which is parsed again, so they are validated exactly as the YAML's values are, and a bad
        one is named as typed."""
        raw, given = override_plan_mapping(self.raw, self.given, **overrides)
        if len(given) == len(self.given):
            return self
        return parse_plan(raw, source=self.source, default_name=self.name, given=given)

    def identity(self) -> dict[str, Any]:
        """What decides the map's outcomes: the mapping without its name, resources and
        max_concurrent (where and how fast it runs) and without breakdown.seeds. A resumed map
        must match it. The seeds may change on a resume: each seed's replicates are a
        deterministic function of the plan and their own runs (the first seed's answers, for
        the later seeds' starts), and runs are kept by their RunSpec, seed included, so a longer
        list runs only the new seeds' runs."""
        return self.identity_of(self.raw)

    @staticmethod
    def identity_of(mapping: Mapping[str, Any]) -> dict[str, Any]:
        """`identity` of a stored plan.yaml's mapping (what `MapStore.open` compares)."""
        kept = {
            k: v
            for k, v in mapping.items()
            if k not in ("name", "resources", "max_concurrent", "plugins")
        }
        section = kept.get("breakdown")
        if isinstance(section, dict) and "seeds" in section:
            kept["breakdown"] = {k: v for k, v in section.items() if k != "seeds"}
            if not kept["breakdown"]:
                kept.pop("breakdown")
        return kept


def _override_grids(space: Any, key: str, value: Any) -> Any:
    """``space`` with ``key`` set to ``value`` wherever a grid axis sets it: a plain grid axis
    named ``key`` becomes the one value, a joint axis' entries that set ``key`` take it (what
    ``--set key=value`` means for a map; min_client_rounds still raises rounds after it)."""
    if not isinstance(space, dict):
        return space
    out = {}
    for name, axis in space.items():
        if isinstance(axis, dict) and isinstance(axis.get("grid"), list):
            if name == key:
                axis = {**axis, "grid": [value]}
            else:
                axis = {
                    **axis,
                    "grid": [
                        {**entry, key: value} if isinstance(entry, dict) and key in entry else entry
                        for entry in axis["grid"]
                    ],
                }
        out[name] = axis
    return out


def load_plan(path: str | Path, assignments: Sequence[str] = (), **overrides: Any) -> BreakdownPlan:
    """Read a breakdown YAML (see `parse_plan`) with command-line ``overrides``
    (`override_plan_mapping`) and ``--set`` ``assignments`` written in first: the file and its
    flags are validated together (a flag may settle what the file alone leaves wrong); errors
    name the file and the flags."""
    path = Path(path)
    mapping = read_yaml(path, "breakdown space")
    if assignments:
        overrides["run"] = {
            **(overrides.get("run") or {}),
            **file_assignments(mapping, path.name, assignments),
        }
    raw, given = override_plan_mapping(mapping, (), **overrides)
    return parse_plan(raw, source=path.name, default_name=path.stem, given=given)


def override_plan_mapping(
    mapping: Any,
    given: tuple[str, ...] = (),
    *,
    name: str | None = None,
    run: Mapping[str, Any] | None = None,
    cpu: float | None = None,
    gpu: float | str | None = None,
    max_concurrent: int | None = None,
    **section: Any,
) -> tuple[Any, tuple[str, ...]]:
    """(a copy of a breakdown ``mapping`` with command-line values written in, ``given`` and
    the flags as typed). None is not given: ``name``, ``run`` (RunSpec keys of the base run,
    ``--set``), per-trial ``cpu``/``gpu``, ``max_concurrent`` and the ``breakdown:`` keys
    (PLAN_KEYS)."""
    unknown = set(section) - set(PLAN_KEYS)
    if unknown:
        raise ValueError(f"unknown override {sorted(unknown)}")
    if not isinstance(mapping, dict):  # parse_plan says what a breakdown space is
        return mapping, tuple(given)
    raw = copy.deepcopy(mapping)
    typed = list(given)
    if name is not None:
        raw["name"] = name
        typed.append(f"--name {name}")
    for key, value in (run or {}).items():
        raw["run"] = {**(raw.get("run") or {}), key: value}
        # a cell that sets the key itself (the joint axis' rounds) takes the typed value too
        raw["space"] = _override_grids(raw.get("space"), key, value)
        typed.append(f"--set {key}={format_value(value)}")
    if run is not None and "seed" in run and "seeds" in (raw.get("breakdown") or {}):
        # `--set seed=S` is a map at seed S: the file's breakdown.seeds must not win silently
        raw["breakdown"] = {**raw["breakdown"], "seeds": [run["seed"]]}
    for key, value, flag in (("cpu", cpu, "--cpus-per-trial"), ("gpu", gpu, "--gpus-per-trial")):
        if value is not None:
            raw["resources"] = {**(raw.get("resources") or {}), key: value}
            typed.append(f"{flag} {format_value(value)}")
    if max_concurrent is not None:
        raw["max_concurrent"] = max_concurrent
        typed.append(f"--max-concurrent {max_concurrent}")
    for key, value in section.items():
        if value is not None:
            raw["breakdown"] = {**(raw.get("breakdown") or {}), key: value}
            typed.append(f"--{key.replace('_', '-')} {format_value(value)}")
    return raw, tuple(typed)


def parse_plan(
    mapping: Any, *, source: str, default_name: str, given: tuple[str, ...] = ()
) -> BreakdownPlan:
    """Validate a breakdown mapping. The cells come from the space's grid axes (every
    combination, expanded and validated by the sweep layer's parser); byzantine_fraction is the
    lattice's, so the space must not set it. ``given`` (overrides already written into the
    mapping) is named in every error, so a bad command-line value is not blamed on the file."""
    where = f"{source} with {' '.join(given)}" if given else source
    if not isinstance(mapping, dict):
        raise SpecError(f"{where}: a breakdown space is a mapping (run, space, breakdown ...)")
    check_sections(mapping, where)
    kept = copy.deepcopy(mapping)
    declare_plugins(kept, where)  # first: the names a plugin registers are checked below
    raw = copy.deepcopy(kept)
    section_values = raw.pop("breakdown", None) or {}
    if not isinstance(section_values, dict):
        raise SpecError(f"{where}: breakdown must be a mapping with keys {', '.join(PLAN_KEYS)}")
    search_values = raw.pop("search", None) or {}
    if not isinstance(search_values, dict):
        raise SpecError(
            f"{where}: search in a breakdown space is a mapping of sampler (tpe) and seed"
        )
    try:
        search = BreakdownSearch(**search_values)
        seeds = section_values.get("seeds", [(raw.get("run") or {}).get("seed", 42)])
        section = BreakdownSection(**{**section_values, "seeds": seeds})
    except SpecError as error:
        raise SpecError(f"{where}: {error}") from None
    if len(set(section.seeds)) != len(section.seeds):
        raise SpecError(
            f"{where}: breakdown.seeds {section.seeds} lists a seed twice; allowed: "
            f"distinct seeds, each a replicate"
        )
    space = raw.get("space") or {}
    if "byzantine_fraction" in space or "byzantine_fraction" in (raw.get("run") or {}):
        raise SpecError(
            f"{where}: byzantine_fraction is the breakdown lattice's; remove it from run and space"
        )
    if "seed" in space:
        raise SpecError(
            f"{where}: space.seed: a map's seeds are replicates of every cell; "
            f"allowed: breakdown.seeds: [s1, s2, ...] (run.seed sets a one-seed map)"
        )
    # the lattice sets byzantine_fraction later; an attacked cell is legal at k = 0
    raw["constraints"] = {**(raw.get("constraints") or {}), "attack_matches_byzantine": False}
    raw["search"] = {"algorithm": "grid"}
    sweep = parse_sweep(raw, name=default_name, source=where)

    settings = section.model_dump()
    adaptive_budget = settings.pop("adaptive_budget")
    adaptive = adaptive_budget if section.adversary == "adaptive" else 0
    if "adaptive_budget" in section_values and not adaptive:
        raise SpecError(f"{where}: breakdown.adaptive_budget applies to adversary: adaptive only")
    if section.adversary == "adaptive":
        settings["adversary"] = {}
    cells = []
    attacks_listed = settings["adversary"].get("attack")
    for point in sweep.expand().points:
        values = {
            k: v for axis in sweep.grid_axes for k, v in axis.assign(point[axis.name]).items()
        }
        spec = RunSpec.from_dict(sweep.resolve(point))
        if section.min_client_rounds is not None:
            values["rounds"] = rounds_for_participation(spec, section.min_client_rounds)
        cell = Cell.of(spec.clients, **values)
        if spec.attack == "none" and not attacks_listed:
            # it would report "survives all" for a map nobody attacked
            raise SpecError(
                f"{where}: cell {cell.label} has no attack (attack: none), so "
                f"nothing can break it; allowed: any other attack, in run, space or "
                f"breakdown.adversary.attack"
            )
        cells.append(cell)
    tune = {axis.name: axis.domain for axis in sweep.random_axes}
    if any(axis.groups is not None for axis in sweep.random_axes):
        raise SpecError(f"{where}: a drawn joint axis cannot be tuned per point; use grid")

    plan = BreakdownPlan(
        name=sweep.name,
        base=dict(sweep.run),
        cells=cells,
        tune=tune,
        **settings,
        adaptive=adaptive,
        sampler_seed=search.seed,
        resources={"cpu": sweep.resources.cpu, "gpu": sweep.resources.gpu},
        max_concurrent=sweep.max_concurrent,
        raw=kept,
        source=source,
        given=given,
    )
    adversary = plan.adversary
    cell_keys = {k for cell in cells for k in cell.as_dict()}
    for key in adversary:
        if key not in run_keys():
            raise SpecError(f"{where}: breakdown.adversary.{key} is not a RunSpec key")
        if key in cell_keys or key in tune or key == "byzantine_fraction":
            raise SpecError(
                f"{where}: breakdown.adversary.{key} is also set by space; allowed: one of them"
            )
    return plan


def rounds_for_participation(spec: RunSpec, client_rounds: float) -> int:
    """A cell's rounds under ``breakdown.min_client_rounds`` = R: enough that every client takes
    part in R rounds in expectation,

        T = max(rounds, ceil(R / q)),   q = n / N (fixed-size: n the sample size) or p (Bernoulli),

    q the chance that a round samples a given client. A cell at low participation otherwise
    trains on a handful of client updates (5 rounds at p = 0.1 are 10 of them) and has no clean
    baseline to measure a breakdown against, and a cache of N slots stays partly empty (a slot
    is never written with probability (1 - q)^T)."""
    rate = (
        spec.expected_sample_size / spec.clients
        if spec.participation_mode == "fixed"
        else spec.participation
    )
    return max(spec.rounds, math.ceil(client_rounds / rate - 1e-9))


@dataclass(frozen=True)
class CellCost:
    """What one cell of a plan costs: its lattice top k_max (points 0 .. k_max of N), the
    adversary variants an attacked point runs, and trials for the full lattice (``bound``) and
    for the bisection (``expected``). Per seed: the clean point's trials and an attacked point's;
    the first seed's expected points (the clean point, ceil(log2(k_max + 1)) midpoints and up to
    2 x verify_radius verification points, at most the whole lattice; started from an earlier
    answer that still holds: the clean point, b0, b0 + 1 and the verification points) and each
    later seed's (``later_points``: the clean point, b1 and b1 + 1 where the first seed's answer
    b1 holds, `robusttune.experiments.breakdown.replicates`)."""

    cell: Cell
    k_max: int
    variants: list[dict[str, Any]]
    clean_trials: int  # trials of the clean point, one seed: budget
    attacked_trials: int  # trials of a point with k > 0, one seed: variants x budget
    expected_points: int  # the first seed's
    seeds: int = 1
    later_points: int = 0  # each later seed's

    @property
    def bound(self) -> int:
        return self.seeds * (self.clean_trials + self.k_max * self.attacked_trials)

    @property
    def points(self) -> int:
        """Lattice points expected over every seed."""
        return self.expected_points + (self.seeds - 1) * self.later_points

    @property
    def expected(self) -> int:
        return self.seeds * self.clean_trials + (self.points - self.seeds) * self.attacked_trials

    @property
    def lattice(self) -> str:
        N = self.cell.clients
        return (
            "{0}"
            if self.k_max == 0
            else f"{{0, 1/{N}}}"
            if self.k_max == 1
            else f"{{0, 1/{N}, ..., {self.k_max}/{N}}}"
        )


def plan_costs(plan: BreakdownPlan) -> list[CellCost]:
    """Every cell's `CellCost` under ``plan``, over all its seeds (what ``--dry-run`` prints)."""
    from robusttune.experiments.breakdown.bisection import lattice_top
    from robusttune.methods.adversary import Adversary

    budget = plan.budget if plan.tune else 1  # without drawn knobs there is nothing to tune
    costs = []
    for cell in plan.cells:
        k_max = lattice_top(cell.clients, plan.max_fraction)
        attack = cell.as_dict().get("attack", plan.base.get("attack", "none"))
        threat = Adversary.of(plan.adversary or None, plan.adaptive)
        steps = math.ceil(math.log2(k_max + 1)) if k_max > 0 else 0
        if plan.start_from is not None:
            steps = min(2, k_max)
        expected = min(k_max + 1, 1 + steps + 2 * plan.verify_radius)
        costs.append(
            CellCost(
                cell,
                k_max,
                threat.variants(attack),
                budget,
                threat.runs_per_point(attack) * budget,
                expected,
                seeds=len(plan.seeds),
                later_points=min(k_max + 1, 3),
            )
        )
    return costs


def replicate_costs(plan: BreakdownPlan) -> list[CellCost]:
    """One `CellCost` per cell and seed (the replicates the map bisects: the progress display's
    estimate of the time left counts them down), the first seed's and the later seeds'."""
    from robusttune.experiments.breakdown.replicates import replicate

    costs = []
    for cost in plan_costs(plan):
        for n, seed in enumerate(plan.seeds):
            costs.append(
                CellCost(
                    replicate(cost.cell, seed),
                    cost.k_max,
                    cost.variants,
                    cost.clean_trials,
                    cost.attacked_trials,
                    cost.expected_points if n == 0 else cost.later_points,
                )
            )
    return costs
