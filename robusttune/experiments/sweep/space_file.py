"""The search-space YAML's schema: one pydantic model per section, validated through
`robusttune.core.validation.check_model`, so every error is the tool's one-line `SpecError` naming the
dotted key (``search.sampler``), what is allowed and the value found.

    name        a word (default: the file name without .yaml)
    run         RunSpec keys (values checked when each configuration is built as a RunSpec)
    space       key -> one domain (`domains.DomainBody`): {grid | choice: [...]},
                {uniform | loguniform | int: [low, high]}, step beside int and uniform
    search      `SearchSpec`      (or the shorthand ``search: optuna``)
    scheduler   `SchedulerSpec`   (or the shorthand ``scheduler: asha``)
    resources   `ResourceSpec`
    max_concurrent  an integer >= 0
    constraints `ConstraintSpec`

`SweepFile` checks what spans sections (optuna and constraints.drop, asha and several metrics,
run.device and resources.gpu, one axis per RunSpec key) and turns ``space`` into `Axis` objects.
The section models are the validated configuration the runner reads (``spec.search.metrics``).
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    PrivateAttr,
    StrictBool,
    TypeAdapter,
    model_validator,
)

from robusttune.core.registry import SpecError
from robusttune.core.runspec import run_keys
from robusttune.core.validation import Finite, Int, KeyedError
from robusttune.experiments.sweep.domains import (
    Axis,
    DomainBody,
    build_axis,
    format_value,
    key_values,
)
from robusttune.experiments.sweep.gpu_share import AUTO, device_phrase
from robusttune.experiments.sweep.metrics import (
    DEFAULT_METRIC,
    EVALUATED_METRICS,
    default_mode,
    report_metrics,
)

__all__ = [
    "INVALID_POLICIES",
    "MAPPING_SECTIONS",
    "SAMPLERS",
    "SCHEDULERS",
    "SEARCH_ALGORITHMS",
    "ConstraintSpec",
    "ResourceSpec",
    "SchedulerSpec",
    "SearchSpec",
    "SweepFile",
    "check_sections",
]

SearchAlgorithm = Literal["grid", "optuna"]
Sampler = Literal["tpe", "gp", "nsga2", "cmaes"]
Mode = Literal["max", "min"]
SchedulerKind = Literal["none", "asha"]
InvalidPolicy = Literal["error", "drop"]
SEARCH_ALGORITHMS: tuple[str, ...] = get_args(SearchAlgorithm)
SAMPLERS: tuple[str, ...] = get_args(Sampler)
SCHEDULERS: tuple[str, ...] = get_args(SchedulerKind)
INVALID_POLICIES: tuple[str, ...] = get_args(InvalidPolicy)


# ---------------------------------------------------------------------------------------------
# small types
# ---------------------------------------------------------------------------------------------
def _empty_if_none(value: Any) -> Any:
    # ``run:`` with nothing under it is YAML null: the same as no section
    return {} if value is None else value


def _empty_list_if_none(value: Any) -> Any:
    return [] if value is None else value


def _one_or_many(item: Any) -> BeforeValidator:
    """A scalar stands for a one-item list. A bad scalar is reported at the key itself
    (``search.mode``), not at an index the user never wrote."""
    adapter = TypeAdapter(item)

    def listed(value: Any) -> Any:
        if isinstance(value, (list, tuple)):
            return value
        return [adapter.validate_python(value)]

    return BeforeValidator(listed)


def _listed(value: Any) -> Any:
    return value if isinstance(value, (list, tuple)) else [value]


def _runspec_keys(values: dict[str, Any]) -> dict[str, Any]:
    """Every key of a mapping of RunSpec values is a RunSpec key."""
    keys = run_keys()
    for key in values:
        if key not in keys:
            raise KeyedError(
                f"is not a RunSpec key; allowed: {', '.join(sorted(keys))}", key=(str(key),)
            )
    return values


def _word(value: str) -> str:
    if not value or any(c in value for c in "/\\ "):
        raise ValueError("must be a non-empty word without '/' or spaces")
    return value


RunValues = Annotated[
    dict[str, Any], BeforeValidator(_empty_if_none), AfterValidator(_runspec_keys)
]
# constraints.drop: RunSpec key -> the values (one or a list) that, all matched, drop a run
DropRule = Annotated[
    dict[str, Annotated[tuple[Any, ...], BeforeValidator(_listed)]],
    Field(min_length=1),
    AfterValidator(_runspec_keys),
]


# ---------------------------------------------------------------------------------------------
# search, scheduler, resources, constraints
# ---------------------------------------------------------------------------------------------
class SearchSpec(BaseModel):
    """How trials are chosen. ``metric`` and ``mode`` take one name or a list (several metrics:
    multi-objective, optuna only); a single mode applies to every metric, no mode means min for
    losses and seconds and max otherwise. ``num_samples``: repeats of the grid (default 1) or
    Optuna trials (default 10); ``seed`` seeds Optuna's sampler and Tune's random draws."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    algorithm: SearchAlgorithm = "grid"
    sampler: Sampler = "tpe"
    seed: Annotated[Int, Field(ge=0)] = 0
    num_samples: Annotated[Int, Field(ge=1)] = 1
    metrics: Annotated[tuple[str, ...], _one_or_many(str), Field(min_length=1, alias="metric")] = (
        DEFAULT_METRIC,
    )
    given_modes: Annotated[tuple[Mode, ...], _one_or_many(Mode)] | None = Field(
        default=None, alias="mode"
    )

    @model_validator(mode="before")
    @classmethod
    def _shorthand_and_defaults(cls, data: Any) -> Any:
        data = {} if data is None else {"algorithm": data} if isinstance(data, str) else data
        if not isinstance(data, Mapping):
            return data
        data = dict(data)
        data.setdefault("num_samples", 10 if data.get("algorithm") == "optuna" else 1)
        metric, mode = data.get("metric", DEFAULT_METRIC), data.get("mode")
        if isinstance(mode, str) and mode in get_args(Mode) and isinstance(metric, list):
            data["mode"] = [mode] * len(metric)  # one mode for every metric
        return data

    @model_validator(mode="after")
    def _consistent(self) -> SearchSpec:
        if self.algorithm == "grid" and "sampler" in self.model_fields_set:
            raise KeyedError(
                "applies to search.algorithm optuna only; allowed with grid: "
                "algorithm, seed, num_samples, metric, mode",
                key="sampler",
                value=self.sampler,
            )
        cmaes = self.algorithm == "optuna" and self.sampler == "cmaes"
        if cmaes and importlib.util.find_spec("cmaes") is None:
            raise KeyedError(
                "needs the 'cmaes' package (pip install cmaes); allowed without it: tpe, gp, nsga2",
                key="sampler",
                value=self.sampler,
            )
        if len(set(self.metrics)) != len(self.metrics):
            raise KeyedError("lists a metric twice", key="metric", value=list(self.metrics))
        allowed = report_metrics()
        for metric in self.metrics:
            if metric not in allowed:
                raise KeyedError(
                    f"is not reported; allowed: {', '.join(allowed)}", key="metric", value=metric
                )
        if self.given_modes is not None and len(self.given_modes) != len(self.metrics):
            raise KeyedError(
                f"needs one mode per metric ({len(self.metrics)})",
                key="mode",
                value=list(self.given_modes),
            )
        if self.multi_objective and cmaes:
            raise KeyedError(
                "is single-objective; allowed with several metrics: tpe, gp, nsga2",
                key="sampler",
                value=self.sampler,
            )
        return self

    @property
    def modes(self) -> tuple[str, ...]:
        """One mode per metric: as given, else by `default_mode`."""
        return self.given_modes or tuple(default_mode(m) for m in self.metrics)

    @property
    def metric(self) -> str:
        return self.metrics[0]

    @property
    def mode(self) -> str:
        return self.modes[0]

    @property
    def multi_objective(self) -> bool:
        return len(self.metrics) > 1


class SchedulerSpec(BaseModel):
    """``none``, or ASHA (Li et al., 2020) stopping trials at rungs grace_period * factor^k up
    to ``max_t`` rounds (default: the largest number of rounds in the space)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: SchedulerKind = Field(default="none", alias="type")
    grace_period: Annotated[Int, Field(ge=1)] = 1
    reduction_factor: Annotated[Finite, Field(gt=1)] = 4.0
    max_t: Annotated[Int, Field(ge=1)] | None = None

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        return (
            {"type": "none"} if data is None else {"type": data} if isinstance(data, str) else data
        )

    @model_validator(mode="after")
    def _asha_keys_need_asha(self) -> SchedulerSpec:
        if self.kind == "none":
            for name in sorted(self.model_fields_set - {"kind"}):
                raise KeyedError(
                    "applies to scheduler type asha only; allowed with none: type",
                    key=name,
                    value=getattr(self, name),
                )
        return self


def _gpu_amount(value: Any) -> float | Literal["auto"]:
    """``auto``, or a finite number of GPUs >= 0 (above 1 only whole: Ray shares only fractions
    of one GPU); a string of a number counts (``--gpus-per-trial 0.25`` arrives as one)."""
    if isinstance(value, str) and value.strip().lower() == AUTO:
        return AUTO
    if isinstance(value, bool):
        raise ValueError("must be auto or a number >= 0, not true/false")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError("must be auto or a number >= 0") from None
    if not math.isfinite(number) or number < 0:
        raise ValueError("must be auto or a finite number >= 0")
    if number > 1 and not number.is_integer():
        raise ValueError("above 1 must be a whole number (Ray shares only fractions of one GPU)")
    return number


class ResourceSpec(BaseModel):
    """What one trial reserves; fractions allowed (a GPU above 1 only whole). ``gpu: auto`` (the
    default): a share of a GPU chosen per run from its size where the cluster has GPUs, none
    where it has none (`robusttune.experiments.sweep.gpu_share`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpu: Annotated[Finite, Field(gt=0)] = 1.0
    gpu: Annotated[
        float | Literal["auto"],
        PlainValidator(_gpu_amount, json_schema_input_type=float | Literal["auto"]),
    ] = AUTO

    @model_validator(mode="before")
    @classmethod
    def _none(cls, data: Any) -> Any:
        return _empty_if_none(data)

    def as_tune(self) -> dict[str, float | str]:
        return {"cpu": self.cpu, "gpu": self.gpu}


class ConstraintSpec(BaseModel):
    """Combinations left out. ``attack_matches_byzantine``: attack none <=> no Byzantine client;
    ``drop``: rules of RunSpec key -> value(s), a run matching every key of one is left out
    (grid only); ``invalid``: a combination RunSpec rejects is an ``error`` or dropped."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    attack_matches_byzantine: StrictBool = True
    drop: Annotated[tuple[DropRule, ...], BeforeValidator(_empty_list_if_none)] = ()
    invalid: InvalidPolicy = "error"

    @model_validator(mode="before")
    @classmethod
    def _none(cls, data: Any) -> Any:
        return _empty_if_none(data)


# ---------------------------------------------------------------------------------------------
# the file
# ---------------------------------------------------------------------------------------------
class SweepFile(BaseModel):
    """A whole search-space file, validated; ``axes`` are its ``space:`` entries as Axis
    objects. Building every configuration as a RunSpec is the SweepSpec's job."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, AfterValidator(_word)]
    # loaded before the file is checked (parse_sweep), so the names they register are known
    plugins: list[str] = Field(default_factory=list)
    run: RunValues = Field(default_factory=dict)
    space: Annotated[dict[str, DomainBody], BeforeValidator(_empty_if_none)] = Field(
        default_factory=dict
    )
    search: SearchSpec = Field(default_factory=SearchSpec)
    scheduler: SchedulerSpec = Field(default_factory=SchedulerSpec)
    resources: ResourceSpec = Field(default_factory=ResourceSpec)
    max_concurrent: Annotated[Int, Field(ge=0)] = 0
    constraints: ConstraintSpec = Field(default_factory=ConstraintSpec)

    _axes: tuple[Axis, ...] = PrivateAttr(default=())

    @property
    def axes(self) -> tuple[Axis, ...]:
        return self._axes

    @model_validator(mode="after")
    def _across_sections(self) -> SweepFile:
        axes = []
        owner: dict[str, str] = {}
        for name, body in self.space.items():
            try:
                axis = build_axis(name, body)
            except KeyedError as error:
                raise KeyedError(str(error), key=("space", *error.key), value=error.value) from None
            for key in axis.keys:
                if key == "numerics":
                    raise KeyedError(
                        "is an axis over numerics, which takes one value per sweep (a "
                        "process trains in one float path); allowed: numerics in run:",
                        key=("space", name),
                    )
                if key in owner:
                    raise KeyedError(
                        f"sets {key}, which {owner[key]} sets too; allowed: one axis "
                        f"per RunSpec key",
                        key=("space", name),
                    )
                owner[key] = f"space.{name}"
            axes.append(axis)
        self._axes = tuple(axes)

        search, constraints = self.search, self.constraints
        if search.algorithm == "optuna":
            if constraints.drop:
                raise ValueError(
                    "constraints.drop needs search.algorithm grid (optuna cannot skip a "
                    "proposal); allowed under optuna: attack_matches_byzantine, invalid: error"
                )
            if constraints.invalid == "drop":
                raise ValueError(
                    "constraints.invalid drop needs search.algorithm grid; allowed "
                    "under optuna: error"
                )
            if not axes:
                raise ValueError("search.algorithm optuna needs at least one space: axis")
        if self.scheduler.kind == "asha":
            if search.multi_objective:
                raise ValueError(
                    f"scheduler asha stops trials on one metric; search.metric lists "
                    f"{len(search.metrics)}; allowed: one metric, or scheduler none"
                )
            every = self.run.get("eval_every", 1)
            varied = any("eval_every" in axis.keys for axis in axes)  # may skip rounds
            skips = varied or (isinstance(every, (int, float)) and every > 1)
            if search.metric in EVALUATED_METRICS and skips:
                raise ValueError(
                    f"scheduler asha compares {search.metric} every round, but "
                    f"eval_every > 1 leaves it NaN between evaluations; allowed "
                    f"metrics: last_validation_accuracy, last_accuracy, last_loss"
                )
        # every device a trial can have: run.device, or the values of an axis that sets it
        devices = [
            (where, device)
            for where, device in key_values("device", self.run, axes, "auto")
            if isinstance(device, str)
        ]
        gpu = self.resources.gpu
        for where, device in devices:
            if device.startswith("cuda") and gpu == 0:
                raise ValueError(
                    f"{device_phrase(where, device)} needs resources.gpu > 0; allowed: "
                    f"gpu auto or above 0, or device auto or cpu without a GPU"
                )
        if devices and all(device == "cpu" for _, device in devices) and gpu != AUTO and gpu > 0:
            where = devices[0][0]
            raise ValueError(
                f"{device_phrase(where, 'cpu')} with resources.gpu {format_value(gpu)} "
                f"reserves a GPU no trial uses; allowed: device auto or cuda, or gpu: 0"
            )
        return self


MAPPING_SECTIONS = ("run", "space", "constraints", "resources", "search", "scheduler")


def check_sections(
    mapping: Mapping[str, Any], where: str, sections: Sequence[str] = MAPPING_SECTIONS
) -> None:
    """One SpecError line for a section of ``sections`` that is set to something other than a
    mapping (``run: true``), before anything reads into it (a breakdown or tuning space reads
    run and space before the sweep layer validates them)."""
    for section in sections:
        value = mapping.get(section)
        if value is not None and not isinstance(value, Mapping):
            raise SpecError(f"{where}: {section} must be a mapping; got {format_value(value)}")
