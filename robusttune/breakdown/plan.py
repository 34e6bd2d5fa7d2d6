"""The breakdown YAML: `load_plan` reads a breakdown space into a `BreakdownPlan` (the cells from
the sweep-layer space's grid axes, the defence knobs to tune from its drawn axes, and the
``breakdown:`` section, keys `PLAN_KEYS`). Parsing and validating the space is the sweep layer's
(`robusttune.sweep.space.parse_sweep`); this module only maps its axes onto cells and knobs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from robusttune.breakdown.bisection import Cell
from robusttune.registry import SpecError

__all__ = ["PLAN_KEYS", "BreakdownPlan", "load_plan"]

PLAN_KEYS = ("seeds", "threshold", "relative_threshold", "max_fraction", "budget",
             "verify_radius", "on_non_monotone", "adversary")


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


def load_plan(path: str | Path) -> BreakdownPlan:
    """Read a breakdown YAML. The cells come from the space's grid axes (every combination,
    expanded and validated by the sweep layer's parser); byzantine_fraction is the lattice's, so
    the space must not set it."""
    from robusttune.config import RunSpec
    from robusttune.yaml_input import read_yaml
    from robusttune.sweep.space import parse_sweep

    path = Path(path)
    raw = read_yaml(path, "breakdown space")
    if not isinstance(raw, dict):
        raise SpecError(f"{path.name}: a breakdown space is a mapping (run, space, breakdown ...)")
    section = raw.pop("breakdown", None) or {}
    if not isinstance(section, dict):
        raise SpecError(f"{path.name}: breakdown must be a mapping with keys {', '.join(PLAN_KEYS)}")
    unknown = sorted(set(section) - set(PLAN_KEYS))
    if unknown:
        raise SpecError(f"{path.name}: unknown key breakdown.{unknown[0]}; allowed: {', '.join(PLAN_KEYS)}")
    search = raw.pop("search", None) or {}
    if not isinstance(search, dict) or set(search) - {"sampler", "seed", "algorithm"}:
        raise SpecError(f"{path.name}: search in a breakdown space takes sampler (tpe) and seed only")
    if search.get("sampler", "tpe") != "tpe":
        raise SpecError(f"{path.name}: search.sampler {search['sampler']!r} is not allowed for "
                        f"breakdown; allowed: tpe")
    space = raw.get("space") or {}
    if "byzantine_fraction" in space or "byzantine_fraction" in (raw.get("run") or {}):
        raise SpecError(f"{path.name}: byzantine_fraction is the breakdown lattice's; remove it "
                        f"from run and space")
    # the lattice sets byzantine_fraction later; an attacked cell is legal at k = 0
    raw["constraints"] = {**(raw.get("constraints") or {}), "attack_matches_byzantine": False}
    raw["search"] = {"algorithm": "grid"}
    sweep = parse_sweep(raw, name=path.stem, source=path.name)

    cells = []
    for point in sweep.expand().points:
        values = {k: v for axis in sweep.grid_axes for k, v in axis.assign(point[axis.name]).items()}
        clients = RunSpec.from_dict(sweep.resolve(point)).clients
        cells.append(Cell.of(clients, **values))
    tune = {axis.name: axis.domain for axis in sweep.random_axes}
    if any(axis.groups is not None for axis in sweep.random_axes):
        raise SpecError(f"{path.name}: a drawn joint axis cannot be tuned per point; use grid")

    def number(key: str, default: Any, kind: type) -> Any:
        value = section.get(key, default)
        if value is None:
            return None
        try:
            return kind(value)
        except (TypeError, ValueError):
            raise SpecError(f"{path.name}: breakdown.{key} must be {kind.__name__}; got {value!r}") from None

    seeds = section.get("seeds", [sweep.run.get("seed", 42)])
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) for s in seeds):
        raise SpecError(f"{path.name}: breakdown.seeds must be a non-empty list of integers")
    adversary = section.get("adversary") or {}
    if not isinstance(adversary, dict) or not all(isinstance(v, list) and v for v in adversary.values()):
        raise SpecError(f"{path.name}: breakdown.adversary must map RunSpec keys to non-empty lists")
    plan = BreakdownPlan(
        name=sweep.name, base=dict(sweep.run), cells=cells, tune=tune, seeds=seeds,
        threshold=number("threshold", None, float),
        relative_threshold=number("relative_threshold", 0.5, float),
        max_fraction=number("max_fraction", 0.5, float), budget=number("budget", 4, int),
        verify_radius=number("verify_radius", 1, int),
        on_non_monotone=str(section.get("on_non_monotone", "flag")), adversary=adversary,
        sampler_seed=int(search.get("seed", 0)),
        resources={"cpu": sweep.resources.cpu, "gpu": sweep.resources.gpu},
    )
    from robusttune.config import RUNSPEC_KEYS

    cell_keys = {k for cell in cells for k in cell.as_dict()}
    for key in adversary:
        if key not in RUNSPEC_KEYS:
            raise SpecError(f"{path.name}: breakdown.adversary.{key} is not a RunSpec key")
        if key in cell_keys or key in tune or key == "byzantine_fraction":
            raise SpecError(f"{path.name}: breakdown.adversary.{key} is also set by space; "
                            f"allowed: one of them")
    return plan
