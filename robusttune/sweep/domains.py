"""One axis of a search space: its set of values (`Domain`), the RunSpec keys it sets (`Axis`),
and its Ray Tune translation (`Domain.to_tune`, which imports ray.tune only when called).

A domain is ``grid`` (exhaustive), ``choice`` (drawn from a list), ``uniform`` / ``loguniform``
(drawn from [low, high)) or ``int`` (drawn from low..high, both ends included), the last two
with an optional ``step``. The YAML that describes them is validated in `space_file`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from robusttune.registry import SpecError

__all__ = ["Domain", "Axis", "format_value", "DOMAIN_KINDS", "RANDOM_KINDS"]

DOMAIN_KINDS = ("grid", "choice", "uniform", "loguniform", "int")
RANDOM_KINDS = ("choice", "uniform", "loguniform", "int")
# An ``int`` domain with at most this many values counts as discrete (enumerated when an
# Optuna space is checked, and a categorical to the dry run).
DISCRETE_INT_LIMIT = 64


def format_value(value: Any) -> str:
    """A compact, unambiguous text for a value (labels, tables, trial folder names)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


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
        """Whether the grid search enumerates this axis (the others are drawn)."""
        return self.kind == "grid"

    @property
    def is_discrete(self) -> bool:
        """Whether the values can be listed: grid, choice, or a small int range."""
        return self.kind in ("grid", "choice") or (self.kind == "int" and self.size <= DISCRETE_INT_LIMIT)

    @property
    def size(self) -> int:
        """Number of values: |values| for grid/choice, (high - low) // step + 1 for int, inf
        for the continuous ranges."""
        if self.kind in ("grid", "choice"):
            return len(self.values)
        if self.kind == "int":
            step = int(self.step or 1)
            return (int(self.high) - int(self.low)) // step + 1
        return math.inf  # type: ignore[return-value]

    def discrete_values(self) -> list[Any]:
        """Every value of a discrete domain, in order."""
        if self.kind in ("grid", "choice"):
            return list(self.values)
        if self.kind == "int":
            return list(range(int(self.low), int(self.high) + 1, int(self.step or 1)))
        raise ValueError(f"{self.kind} is not discrete")

    def probes(self) -> list[Any]:
        """Values that stand for the whole domain when validating: both ends and the middle
        (the geometric middle, sqrt(low * high), for loguniform)."""
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
        """``grid[a, b]`` or ``uniform(0, 0.4, step 0.1)``: the domain as the dry run shows it."""
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
