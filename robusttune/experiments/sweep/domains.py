"""One axis of a search space: its set of values (`Domain`), the RunSpec keys it sets (`Axis`),
and its Ray Tune translation (`Domain.to_tune`, which imports ray.tune only when called).

A domain is ``grid`` (exhaustive), ``choice`` (drawn from a list), ``uniform`` / ``loguniform``
(drawn from [low, high)) or ``int`` (drawn from low..high, both ends included), the last two
with an optional ``step``. `DomainBody` is one ``space:`` entry as the YAML writes it (a pydantic
model, validated with the rest of the file by `space_file.SweepFile`); `build_axis` makes it an
Axis.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from robusttune.core.registry import SpecError
from robusttune.core.runspec import run_keys
from robusttune.core.validation import Finite, Int, KeyedError

__all__ = [
    "DOMAIN_KINDS",
    "RANDOM_KINDS",
    "Axis",
    "Domain",
    "DomainBody",
    "build_axis",
    "describe_values",
    "format_value",
    "key_values",
]

DOMAIN_KINDS = ("grid", "choice", "uniform", "loguniform", "int")
RANDOM_KINDS = ("choice", "uniform", "loguniform", "int")
# Domains that take a ``step`` beside their bounds.
STEPPED_KINDS = ("int", "uniform")
# An ``int`` domain with at most this many values counts as discrete (enumerated when an
# Optuna space is checked, and a categorical to the dry run).
DISCRETE_INT_LIMIT = 64


def describe_values(values: Mapping[str, Any]) -> str:
    """``key=value, ...`` of RunSpec values as a space writes them (`format_value`), or
    ``(base run)`` when there are none."""
    return ", ".join(f"{k}={format_value(v)}" for k, v in values.items()) or "(base run)"


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
    def bounds(self) -> tuple[float, float]:
        """(low, high) of a range domain (uniform, loguniform, int): always set for those."""
        assert self.low is not None and self.high is not None, f"{self.kind} has no bounds"
        return self.low, self.high

    @property
    def is_discrete(self) -> bool:
        """Whether the values can be listed: grid, choice, or a small int range."""
        return self.kind in ("grid", "choice") or (
            self.kind == "int" and self.size <= DISCRETE_INT_LIMIT
        )

    @property
    def size(self) -> int:
        """Number of values: |values| for grid/choice, (high - low) // step + 1 for int, inf
        for the continuous ranges."""
        if self.kind in ("grid", "choice"):
            return len(self.values)
        if self.kind == "int":
            step = int(self.step or 1)
            low, high = self.bounds
            return (int(high) - int(low)) // step + 1
        return math.inf  # type: ignore[return-value]

    def discrete_values(self) -> list[Any]:
        """Every value of a discrete domain, in order."""
        if self.kind in ("grid", "choice"):
            return list(self.values)
        if self.kind == "int":
            low, high = self.bounds
            return list(range(int(low), int(high) + 1, int(self.step or 1)))
        raise ValueError(f"{self.kind} is not discrete")

    def probes(self) -> list[Any]:
        """Values that stand for the whole domain when validating: both ends and the middle
        (the geometric middle, sqrt(low * high), for loguniform)."""
        if self.is_discrete:
            return self.discrete_values()
        low, high = (float(b) for b in self.bounds)
        if self.kind == "int":
            return [int(low), int((low + high) // 2), int(high)]
        middle = math.sqrt(low * high) if self.kind == "loguniform" else (low + high) / 2
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
        low, high = self.bounds
        if self.kind == "uniform":
            return tune.quniform(low, high, self.step) if self.step else tune.uniform(low, high)
        if self.kind == "loguniform":
            return tune.loguniform(low, high)
        # int: tune.randint excludes its upper end, tune.qrandint includes it.
        if self.step and int(self.step) > 1:
            return tune.qrandint(int(low), int(high), int(self.step))
        return tune.randint(int(low), int(high) + 1)


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
            raise SpecError(
                f"space.{self.name}: {value!r} is not one of its labels; allowed: "
                f"{', '.join(self.groups)}"
            ) from None


def key_values(
    key: str, run: Mapping[str, Any], axes: Iterable[Axis], default: Any
) -> list[tuple[str, Any]]:
    """(where, value) for each value RunSpec key ``key`` takes in a sweep's trials, where being
    ``space.<axis>`` for the values of the axis that sets it (a range domain: its probes; a joint
    axis: the groups that set it) and ``run.<key>`` for its value there (else ``default``) where
    no axis sets it or a group leaves it out. One axis at most sets a key (the file's
    validation)."""
    fixed = (f"run.{key}", run.get(key, default))
    for axis in axes:
        if key not in axis.keys:
            continue
        if axis.groups is None:
            domain = axis.domain
            values = domain.discrete_values() if domain.is_discrete else domain.probes()
            return [(f"space.{axis.name}", v) for v in dict.fromkeys(values)]
        setting = [group[key] for group in axis.groups.values() if key in group]
        leaving = any(key not in group for group in axis.groups.values())
        found = [(f"space.{axis.name}", v) for v in dict.fromkeys(setting)]
        return [*found, fixed] if leaving else found
    return [fixed]


def _pair(value: Any) -> Any:
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise ValueError("must be [low, high]")
    return value


Values = Annotated[list[Any], Field(min_length=1)]
Bounds = Annotated[tuple[Finite, Finite], BeforeValidator(_pair)]
IntBounds = Annotated[tuple[Int, Int], BeforeValidator(_pair)]


# ---------------------------------------------------------------------------------------------
# one ``space:`` entry as written
# ---------------------------------------------------------------------------------------------
class DomainBody(BaseModel):
    """One ``space:`` entry as written: exactly one domain kind, and ``step`` beside int or
    uniform. Whether its values are scalars or joint mappings depends on the entry's name, so
    `SweepFile` builds the `Axis`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    grid: Values | None = None
    choice: Values | None = None
    uniform: Bounds | None = None
    loguniform: Bounds | None = None
    int_: IntBounds | None = Field(default=None, alias="int")
    step: Annotated[Finite, Field(gt=0)] | None = None

    @model_validator(mode="before")
    @classmethod
    def _one_kind(cls, body: Any) -> Any:
        allowed = ", ".join(DOMAIN_KINDS)
        if not isinstance(body, Mapping):
            raise ValueError(f"must be one domain, e.g. {{grid: [...]}}; allowed: {allowed}")
        kinds = [k for k in body if k in DOMAIN_KINDS]
        others = [k for k in body if k not in DOMAIN_KINDS and k != "step"]
        if not kinds and others:  # `normal: [0, 1]`: name the kind that does not exist
            raise KeyedError(
                f"is not a domain kind; allowed: {allowed}",
                key=(str(others[0]),),
                value=body[others[0]],
            )
        if len(kinds) != 1:
            raise ValueError(f"must be one domain, e.g. {{grid: [...]}}; allowed: {allowed}")
        kind = kinds[0]
        besides = others + (["step"] if "step" in body and kind not in STEPPED_KINDS else [])
        if besides:
            raise KeyedError(
                f"is not allowed beside {kind}; allowed: "
                f"{'step' if kind in STEPPED_KINDS else 'nothing else'}",
                key=(str(besides[0]),),
                value=body[besides[0]],
            )
        return body

    @model_validator(mode="after")
    def _ordered_bounds(self) -> DomainBody:
        kind = self.kind
        if kind == "int":
            assert self.int_ is not None  # kind "int": int_ is the bound that is set
            low, high = self.int_
            if low > high:
                raise KeyedError("needs low <= high", key=("int",), value=[low, high])
            if self.step is not None and (not float(self.step).is_integer() or self.step < 1):
                raise KeyedError(
                    "must be an integer >= 1 beside int", key=("step",), value=self.step
                )
        elif kind in ("uniform", "loguniform"):
            low, high = getattr(self, kind)
            if not low < high:
                raise KeyedError("needs low < high", key=(kind,), value=[low, high])
            if kind == "loguniform" and low <= 0:
                raise KeyedError("needs low > 0", key=(kind,), value=[low, high])
        return self

    @property
    def kind(self) -> str:
        """The one domain kind set."""
        return next(
            k for k in DOMAIN_KINDS if getattr(self, "int_" if k == "int" else k) is not None
        )

    @property
    def values(self) -> list[Any]:
        """The listed values of a grid or choice."""
        return list(self.grid if self.grid is not None else self.choice or ())

    def range_domain(self) -> Domain:
        """The Domain of uniform, loguniform or int (both ends of int included)."""
        kind = self.kind
        if kind == "int":
            assert self.int_ is not None  # kind "int": int_ is the bound that is set
            low, high = self.int_
            return Domain(
                "int", low=low, high=high, step=None if self.step is None else int(self.step)
            )
        low, high = getattr(self, kind)
        return Domain(kind, low=low, high=high, step=self.step)


def build_axis(name: str, body: DomainBody) -> Axis:
    """The Axis of one ``space:`` entry. A RunSpec key takes scalar values; any other name is
    a joint axis whose grid or choice lists mappings of RunSpec keys set together. Errors are
    KeyedError located below ``space``."""
    kind = body.kind
    keys = run_keys()
    if name in keys:
        if kind not in ("grid", "choice"):
            return Axis(name, body.range_domain())
        values = body.values
        if any(isinstance(v, (Mapping, list)) for v in values):
            raise KeyedError(
                "values must be scalars; a list of mappings needs a joint axis whose "
                "name is not a RunSpec key",
                key=(name, kind),
                value=values,
            )
        if len({format_value(v) for v in values}) != len(values):
            raise KeyedError("lists a value twice", key=(name, kind), value=values)
        return Axis(name, Domain(kind, values=tuple(values)))
    allowed = ", ".join(sorted(keys))
    if kind not in ("grid", "choice"):
        raise KeyedError(f"is not a RunSpec key; allowed: {allowed}", key=(name,))
    if not all(isinstance(v, Mapping) and v for v in body.values):
        raise KeyedError(
            f"is not a RunSpec key; allowed: {allowed} (a joint axis with a free "
            f"name lists mappings of RunSpec keys)",
            key=(name,),
        )
    groups: dict[str, dict[str, Any]] = {}
    for index, value in enumerate(body.values):
        for inner, setting in value.items():
            where = (name, kind, index, str(inner))
            if inner not in keys:
                raise KeyedError(f"is not a RunSpec key; allowed: {allowed}", key=where)
            if isinstance(setting, (Mapping, list)):
                raise KeyedError("must be a scalar", key=where, value=setting)
        label = ",".join(f"{k}={format_value(v)}" for k, v in value.items())
        if label in groups:
            raise KeyedError(f"lists {label} twice", key=(name, kind))
        groups[label] = dict(value)
    return Axis(name, Domain(kind, values=tuple(groups)), groups=groups)
