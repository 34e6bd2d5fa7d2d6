"""The breakdown YAML: `load_plan` reads a breakdown space into a `BreakdownPlan` (the cells from
the sweep-layer space's grid axes, the defence knobs to tune from its drawn axes, and the
``breakdown:`` section, keys `PLAN_KEYS`). Parsing and validating the space is the sweep layer's
(`robusttune.sweep.space.parse_sweep`); this module only maps its axes onto cells and knobs."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Optional

from pydantic import Field

from robusttune.breakdown.bisection import Cell
from robusttune.config import RunSpec
from robusttune.registry import SpecError
from robusttune.schema import RUNSPEC_KEYS, Checked, Number, optional_finite
from robusttune.sweep.space import parse_sweep
from robusttune.yaml_input import read_yaml

__all__ = ["PLAN_KEYS", "BreakdownPlan", "load_plan"]



class BreakdownSection(Checked):
    """The ``breakdown:`` section of a breakdown space (and the command line's overrides of it).
    Accuracies are fractions in [0, 1]."""

    section: ClassVar[str] = "breakdown"

    seeds: Annotated[list[Annotated[int, Number, Field(ge=0)]], Field(min_length=1)] = [42]
    threshold: optional_finite(ge=0, le=1) = None
    relative_threshold: Annotated[float, Number, Field(gt=0, le=1)] = 0.5
    max_fraction: Annotated[float, Number, Field(gt=0, lt=1)] = 0.5
    budget: Annotated[int, Number, Field(ge=1)] = 4
    verify_radius: Annotated[int, Number, Field(ge=0)] = 1
    on_non_monotone: Literal["flag", "scan"] = "flag"
    adversary: dict[str, Annotated[list[Any], Field(min_length=1)]] = {}


PLAN_KEYS = tuple(BreakdownSection.model_fields)


class BreakdownSearch(Checked):
    """A breakdown space's ``search:`` (the Optuna study that tunes the defence knobs)."""

    section: ClassVar[str] = "search"

    algorithm: Optional[str] = None  # the map always bisects; a grid/optuna word is accepted
    sampler: Literal["tpe"] = "tpe"
    seed: Annotated[int, Number, Field(ge=0)] = 0


@dataclass
class BreakdownPlan:
    """A breakdown search space: a sweep-layer search space (``run``, ``space``, ``resources``
    ...) whose grid axes are the cells and whose drawn axes are the defence knobs tuned at each
    point, plus a ``breakdown:`` section (keys PLAN_KEYS)."""

    name: str
    base: dict[str, Any]
    cells: list[Cell]
    tune: dict[str, Any]
    seeds: list[int] = field(default_factory=lambda: [42])
    threshold: float | None = None
    relative_threshold: float = 0.5
    max_fraction: float = 0.5
    budget: int = 4
    verify_radius: int = 1
    on_non_monotone: str = "flag"
    adversary: dict[str, list[Any]] = field(default_factory=dict)
    sampler_seed: int = 0
    resources: dict[str, float] = field(default_factory=dict)

    def with_overrides(self, **changes: Any) -> "BreakdownPlan":
        """The plan with command-line values (None: not given) for its ``breakdown:`` keys,
        validated as the YAML's are."""
        given = {k: v for k, v in changes.items() if v is not None}
        keys = {f: getattr(self, f) for f in BreakdownSection.model_fields}
        section = BreakdownSection(**{**keys, **given})
        return replace(self, **section.model_dump())


def load_plan(path: str | Path) -> BreakdownPlan:
    """Read a breakdown YAML. The cells come from the space's grid axes (every combination,
    expanded and validated by the sweep layer's parser); byzantine_fraction is the lattice's, so
    the space must not set it."""
    path = Path(path)
    raw = read_yaml(path, "breakdown space")
    if not isinstance(raw, dict):
        raise SpecError(f"{path.name}: a breakdown space is a mapping (run, space, breakdown ...)")
    section_values = raw.pop("breakdown", None) or {}
    if not isinstance(section_values, dict):
        raise SpecError(f"{path.name}: breakdown must be a mapping with keys {', '.join(PLAN_KEYS)}")
    search_values = raw.pop("search", None) or {}
    if not isinstance(search_values, dict):
        raise SpecError(f"{path.name}: search in a breakdown space is a mapping of sampler (tpe) "
                        f"and seed")
    try:
        search = BreakdownSearch(**search_values)
        seeds = section_values.get("seeds", [(raw.get("run") or {}).get("seed", 42)])
        section = BreakdownSection(**{**section_values, "seeds": seeds})
    except SpecError as error:
        raise SpecError(f"{path.name}: {error}") from None
    space = raw.get("space") or {}
    if "byzantine_fraction" in space or "byzantine_fraction" in (raw.get("run") or {}):
        raise SpecError(f"{path.name}: byzantine_fraction is the breakdown lattice's; remove it "
                        f"from run and space")
    # the lattice sets byzantine_fraction later; an attacked cell is legal at k = 0
    raw["constraints"] = {**(raw.get("constraints") or {}), "attack_matches_byzantine": False}
    raw["search"] = {"algorithm": "grid"}
    sweep = parse_sweep(raw, name=path.stem, source=path.name)

    cells = []
    attacks_listed = section.adversary.get("attack")
    for point in sweep.expand().points:
        values = {k: v for axis in sweep.grid_axes for k, v in axis.assign(point[axis.name]).items()}
        spec = RunSpec.from_dict(sweep.resolve(point))
        cell = Cell.of(spec.clients, **values)
        if spec.attack == "none" and not attacks_listed:
            # it would report "survives all" for a map nobody attacked
            raise SpecError(f"{path.name}: cell {cell.label} has no attack (attack: none), so "
                            f"nothing can break it; allowed: any other attack, in run, space or "
                            f"breakdown.adversary.attack")
        cells.append(cell)
    tune = {axis.name: axis.domain for axis in sweep.random_axes}
    if any(axis.groups is not None for axis in sweep.random_axes):
        raise SpecError(f"{path.name}: a drawn joint axis cannot be tuned per point; use grid")

    plan = BreakdownPlan(
        name=sweep.name, base=dict(sweep.run), cells=cells, tune=tune,
        **section.model_dump(), sampler_seed=search.seed,
        resources={"cpu": sweep.resources.cpu, "gpu": sweep.resources.gpu},
    )
    adversary = section.adversary
    cell_keys = {k for cell in cells for k in cell.as_dict()}
    for key in adversary:
        if key not in RUNSPEC_KEYS:
            raise SpecError(f"{path.name}: breakdown.adversary.{key} is not a RunSpec key")
        if key in cell_keys or key in tune or key == "byzantine_fraction":
            raise SpecError(f"{path.name}: breakdown.adversary.{key} is also set by space; "
                            f"allowed: one of them")
    return plan
