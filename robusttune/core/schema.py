"""The schema of one federated run: every RunSpec key with its type and range, validated by
pydantic, and the adapter that turns pydantic's errors into the tool's one-line `SpecError`
(``clients must be an integer >= 1; got 0``), which the sweep layer's file schema
(`robusttune.experiments.sweep.space_file`) shares. Pure: it knows no registry, so which names exist
(datasets, rules, attacks ...) and the name-keyed defaults are the resolver's business
(`robusttune.core.runspec.RunSpec`), one floor up.
"""

from __future__ import annotations

import functools
import math
import os
import re
from types import UnionType
from typing import (Annotated, Any, ClassVar, Literal, Optional, Sequence, Union, get_args,
                    get_origin)

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field,
                      TypeAdapter, ValidationError, model_validator)
from pydantic.fields import FieldInfo

from robusttune.core.registry import SpecError

__all__ = ["Checked", "RunSchema", "RUNSPEC_KEYS", "KeyedError", "spec_error", "check_model",
           "check_key", "check_value", "dotted", "optional_int", "optional_finite",
           "NUMERICS_ENV", "default_numerics"]


NUMERICS_ENV = "ROBUSTTUNE_NUMERICS"


def default_numerics() -> str:
    """The ``numerics`` of a RunSpec that does not set it: $ROBUSTTUNE_NUMERICS, else portable
    (written into the spec where it is made, so a trial trains in its driver's mode)."""
    value = os.environ.get(NUMERICS_ENV, "").strip() or "portable"
    if value not in ("native", "portable"):
        raise SpecError(f"{NUMERICS_ENV} must be one of native, portable; got {value!r}")
    return value


def _not_bool(value: Any) -> Any:
    # YAML's `yes` is True, and True is an int to Python: a number key given a boolean is a typo
    if isinstance(value, bool):
        raise ValueError("must be a number, not true/false")
    return value


def _device(value: str) -> str:
    if not re.fullmatch(r"auto|cpu|cuda|cuda:\d+", value):
        raise ValueError("must be one of auto, cpu, cuda, cuda:N")
    return value


def _shape(value: str) -> str:
    if not re.fullmatch(r"[1-9]\d*(x[1-9]\d*)*", value):
        raise ValueError("must look like 3x32x32 or 20")
    return value


def _none_word(value: Any) -> Any:
    # `--set sample_size=none` arrives as the string "none"
    if isinstance(value, str) and value.strip().lower() in ("none", "null", "~"):
        return None
    return value


Number = BeforeValidator(_not_bool)
NoneWord = BeforeValidator(_none_word)
Int = Annotated[int, Number]
Finite = Annotated[float, Number, Field(allow_inf_nan=False)]
OptionalStr = Annotated[Optional[str], NoneWord]


def optional_int(**bounds: Any) -> Any:
    """An integer within ``bounds`` (pydantic's ge/gt/le/lt), or None (also spelt none/null)."""
    return Annotated[Optional[Annotated[int, Number, Field(**bounds)]], NoneWord]


def optional_finite(**bounds: Any) -> Any:
    """A finite number within ``bounds``, or None (also spelt none/null)."""
    return Annotated[Optional[Annotated[float, Number, Field(allow_inf_nan=False, **bounds)]],
                     NoneWord]


class Checked(BaseModel):
    """A frozen pydantic model whose construction fails with one SpecError line, not a
    ValidationError: the base of the tool's small typed configurations (a deployment to
    calibrate, a breakdown plan's section)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    # the dotted prefix its keys are named under in messages (e.g. "breakdown" -> breakdown.budget)
    section: ClassVar[str] = ""

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as error:
            raise spec_error(error, model=type(self), section=self.section) from None


class RunSchema(BaseModel):
    """Every knob of one federated run, typed, with its allowed range. Defaults are the global
    ones (the SWB-DM cifar10 setup, with the embedded digits as the dataset); ``None`` marks the
    keys the resolver fills (method, assumed fraction, trim ratio, server step)."""

    # each key's docstring is its description (the reference and the JSON schema show it)
    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True,
                              use_attribute_docstrings=True)

    dataset: str = "digits"
    """The dataset (`robusttune list dataset`): `digits` ships with scikit-learn; others are
    read from disk, never downloaded."""
    data_root: str = "./data"
    """Folder of torchvision's dataset files (mnist, emnist, cifar10, cifar100,
    fashion_mnist)."""
    model: str = "cnn2"
    """The model (`robusttune list model`); a dataset may set its own default."""
    clients: Annotated[Int, Field(ge=1)] = 20
    """N, the number of clients."""
    rounds: Annotated[Int, Field(ge=1)] = 10
    """T, the number of rounds."""
    participation: Annotated[Finite, Field(gt=0, le=1)] = 0.5
    """p, the share of the N clients sampled per round."""
    participation_mode: Literal["fixed", "bernoulli"] = "fixed"
    """`fixed`: exactly n = round(p N) clients a round (SWB-DM's draw); `bernoulli`: each
    client independently with probability p."""
    sample_size: optional_int(ge=1) = None
    """n of a fixed draw (none: round(p N))."""
    byzantine_fraction: Annotated[Finite, Field(ge=0, lt=1)] = 0.0
    """beta, the share of the N clients that are Byzantine (B = floor(beta N))."""
    assumed_byzantine_fraction: optional_finite(ge=0, lt=1) = None
    """The corruption a rule is told to expect, f = floor(n_in x this); none: beta."""
    attack: str = "none"
    """What the Byzantine clients send (`robusttune list attack`)."""
    attack_strength: optional_finite() = None
    """The attack's one knob (none: the attack's documented default)."""
    attack_scope: Literal["inputs", "sample", "population"] = "inputs"
    """What the omniscient attacker computes its statistics over (mu, sigma, ALIE's n and
    f): `inputs`, every row the rule aggregates (all N cached rows under state_cache and
    demoa); `sample`, this round's sampled messages (how the SWB-DM grid ran ALIE and IPM);
    `population`, the rows of `inputs`, but ALIE's n and f are the run's N and B (DeMoA's
    comparison)."""
    attack_direction: Literal["std", "unit", "sign"] = "std"
    """MinMax and MinSum's perturbation p (m = mu + gamma p): minus the std, the unit mean
    or the sign of the mean."""
    method: OptionalStr = None
    """A method preset: an algorithm with its rule (`robusttune list method`), or
    ALGORITHM+RULE."""
    algorithm: str = "fedavg"
    """The server algorithm (`robusttune list algorithm`); set by `method` when given."""
    aggregator: str = "mean"
    """The robust aggregation rule (`robusttune list aggregator`); set by `method` when
    given."""
    trim_ratio: optional_finite(ge=0, lt=0.5) = None
    """The share trimmed from each side (trimmed mean, SWB); none: the rule's calibrated
    trim for the assumed fraction."""
    krum_m: optional_int(ge=1) = None
    """Multi-Krum's m, the messages averaged (none: n - f)."""
    cclip_scale: Literal["median_distance", "absolute"] = "median_distance"
    """CCLIP's radius r (Karimireddy et al., 2021): `median_distance`, cclip_tau times the
    lower median of the inputs' distances to the centre (the inputs' own scale); `absolute`,
    cclip_tau itself."""
    cclip_tau: Annotated[Finite, Field(gt=0)] = 2.0
    """CCLIP's tau (tau = 1 starved DeMoA at p = 0.1; measured in
    methods/aggregators/distance.py)."""
    cclip_iters: Annotated[Int, Field(ge=1)] = 1
    """CCLIP's clipping iterations L."""
    gm_iters: Annotated[Int, Field(ge=1)] = 10
    """Weiszfeld steps of the geometric median."""
    bucket_size: Annotated[Int, Field(ge=0)] = 0
    """Bucketing's s (Karimireddy, He and Jaggi, ICLR 2022) in front of the rule; 0 or 1:
    none."""
    pre_aggregator: Literal["none", "nnm", "arc"] = "none"
    """A pre-aggregation in front of the rule and its buckets: nearest-neighbour mixing
    (`nnm`, Allouah et al., AISTATS 2023) or adaptive robust clipping (`arc`, Allouah et
    al., ICLR 2025)."""
    swb_chunk: Annotated[Int, Field(ge=1)] = 512
    """SWB's chunk of C coordinates rotated together."""
    swb_views: Annotated[Int, Field(ge=1)] = 2
    """SWB's P random views per chunk."""
    swb_rotation: Literal["haar", "shared", "hadamard"] = "haar"
    """SWB's rotation: `haar`, an independent Haar rotation per chunk and view (exact);
    `shared`, one per view for all full chunks; `hadamard`, a randomized Hadamard transform
    (swb_chunk a power of 2)."""
    guarded: bool = False
    """Skip the aggregation (keep the model) in a round where the rule's precondition fails
    for the assumed corruption."""
    median_even: Literal["midpoint", "lower"] = "midpoint"
    """The median of an even count: `midpoint` averages the two middle values; `lower` takes
    the lower one."""
    local_epochs: Annotated[Int, Field(ge=1)] = 2
    """E, local epochs per round (algorithms that train locally)."""
    batch_size: Annotated[Int, Field(ge=1)] = 32
    """Client minibatch size."""
    lr: Annotated[Finite, Field(gt=0)] = 0.01
    """Client step size."""
    momentum: Annotated[Finite, Field(ge=0, lt=1)] = 0.9
    """Client SGD momentum (local training)."""
    trainer: Literal["auto", "sequential", "batched"] = "auto"
    """How clients train: `sequential`, one after another; `batched`, stacked with
    torch.func (vmap); `auto`, batched on CUDA, else sequential."""
    demoa_alpha: Annotated[Finite, Field(gt=0, le=1)] = 0.1
    """DeMoA's momentum coefficient alpha (and FedCM's)."""
    demoa_ablation: Literal["none", "coefficient_swap", "no_decay"] = "none"
    """A DeMoA ablation: `coefficient_swap` or `no_decay` (the paper's Section 5)."""
    server_lr: optional_finite(gt=0) = None
    """eta, the server step on the aggregate (none: the algorithm's default)."""
    aggregate_weights: Literal["auto", "samples", "uniform"] = "auto"
    """How the rule weighs its inputs: `samples`, by the clients' sample counts (FedAvg's
    n_i / n); `uniform`, one vote per client; `auto`, the algorithm's paper default (samples
    for fedavg and state_cache, uniform for the gradient-space algorithms)."""
    marina_variant: Literal["variance_reduction", "clipped_momentum"] = "variance_reduction"
    """Byz-VR-MARINA-PP (Malinovsky et al., 2024): `variance_reduction`, the paper's
    Algorithm 1; `clipped_momentum`, its heuristic eq. (10) on robust momentum SGD."""
    marina_p: optional_finite(gt=0, le=1) = None
    """Algorithm 1's probability of a full-participation round (none: the paper's p =
    min{C/n, b/m, zeta_Q/d})."""
    marina_clip_multiplier: optional_finite(gt=0) = None
    """alpha in the clipping level lambda = alpha ||x^{k+1} - x^k|| (Algorithm 1) or alpha
    ||g^{k-1}|| (eq. 10); none: 10 for Algorithm 1, 1 for eq. (10)."""
    marina_compressor: Literal["none", "rand_k"] = "none"
    """The unbiased compressor of the differences: `none` (Q = id) or `rand_k`."""
    marina_compress_ratio: Annotated[Finite, Field(gt=0, le=1)] = 0.1
    """rand_k's share of coordinates kept (scaled by d/k)."""
    dirichlet_alpha: Annotated[float, Number, Field(gt=0)] = 0.5
    """The Dirichlet concentration of the per-class split over clients (Hsu, Qi and Brown,
    2019); inf: IID."""
    partition_seed: Annotated[Int, Field(ge=0)] = 1234
    """Seeds the split, the root set and the validation part: every method and run seed
    trains on the same split."""
    seed: Annotated[Int, Field(ge=0)] = 42
    """Seeds the model's initialisation, the sampling and the attacks' noise."""
    device: Annotated[str, AfterValidator(_device)] = "auto"
    """`auto` (CUDA when there is one), `cpu`, `cuda` or `cuda:N`."""
    eval_every: Annotated[Int, Field(ge=1)] = 1
    """Evaluate every this many rounds (and at the last)."""
    validation_fraction: Annotated[Finite, Field(ge=0, lt=1)] = 0.5
    """The share of the held-out set, per class, that is validation (what every selection
    reads); the rest is the test part reports state. 0: no validation part."""
    train_samples: optional_int(ge=1) = None
    """A stratified subset of the training set of this size (none: all)."""
    cache_dtype: Literal["float32", "bfloat16"] = "float32"
    """The dtype of cached messages and momenta (bfloat16 halves their memory; reads are
    float32)."""
    fltrust_root_size: Annotated[Int, Field(ge=1)] = 100
    """FLTrust's clean root set, drawn from the training set."""
    synthetic_shape: Annotated[str, AfterValidator(_shape)] = "1x8x8"
    """The synthetic dataset's input shape (3x32x32 or 20)."""
    synthetic_classes: Annotated[Int, Field(ge=2)] = 10
    """The synthetic dataset's classes."""
    synthetic_samples: Annotated[Int, Field(ge=1)] = 2000
    """The synthetic dataset's training samples."""
    checkpoint_every: Annotated[Int, Field(ge=0)] = 5
    """A trial's checkpoint every this many rounds (0: none); a resumed trial continues from
    it."""
    numerics: Literal["native", "portable"] = "portable"
    """`portable`, the same bits on every AVX2 x86-64 CPU; `native`, ATen's fastest kernels
    (robusttune.core.numerics). Default: $ROBUSTTUNE_NUMERICS, else portable."""

    @model_validator(mode="after")
    def _across_keys(self) -> "RunSchema":
        if self.sample_size is not None and self.sample_size > self.clients:
            raise ValueError(f"sample_size must be in [1, clients={self.clients}]; got {self.sample_size}")
        if math.isnan(self.dirichlet_alpha):
            raise ValueError("dirichlet_alpha must be > 0 (inf: IID); got nan")
        if self.attack != "none" and self.byzantine_fraction > 0 and self.n_byzantine < 1:
            raise ValueError(
                f"byzantine_fraction {self.byzantine_fraction} gives no Byzantine client among "
                f"clients={self.clients}; use at least {1 / self.clients:.3g}")
        return self

    # -- derived quantities ------------------------------------------------------------------
    @property
    def n_byzantine(self) -> int:
        """B = floor(beta * N), with a tolerance so 0.3 * 10 counts as 3, not 2."""
        return int(math.floor(self.byzantine_fraction * self.clients + 1e-9))

    @property
    def beta_assumed(self) -> float:
        return (self.byzantine_fraction if self.assumed_byzantine_fraction is None
                else self.assumed_byzantine_fraction)

    def assumed_f(self, n_inputs: int) -> int:
        """f = floor(n_in * beta_assumed): the corruption a rule is told to expect."""
        return int(math.floor(n_inputs * self.beta_assumed + 1e-9))

    @property
    def expected_sample_size(self) -> int:
        """n = sample_size, or max(1, round(p * N)) (the fixed-size draw of SWB-DM)."""
        if self.sample_size is not None:
            return self.sample_size
        return max(1, int(round(self.participation * self.clients)))


RUNSPEC_KEYS: frozenset[str] = frozenset(RunSchema.model_fields)


class KeyedError(ValueError):
    """A check inside a model that names the key at fault, relative to the model it runs in
    (``("step",)``, ``("grid", 0, "beta")``; empty: the model itself), and the value found there.
    `spec_error` prints ``KEY MESSAGE; got VALUE`` (without ``; got`` when no value is given)."""

    def __init__(self, message: str, *, key: str | tuple[str | int, ...] = (), value: Any = ...):
        super().__init__(message)
        self.key: tuple[str | int, ...] = (key,) if isinstance(key, str) else tuple(key)
        self.value = value


def dotted(loc: Sequence[str | int]) -> str:
    """A location as the user spells it: ``space.threat.grid[0].beta``."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def check_model(model: type[BaseModel], values: Any, *, where: str = "") -> Any:
    """``model.model_validate(values)``, its first error as one SpecError line."""
    try:
        return model.model_validate(values)
    except ValidationError as error:
        raise spec_error(error, where, model) from None


def spec_error(error: ValidationError, where: str = "", model: type[BaseModel] | None = None,
               section: str = "") -> SpecError:
    """One line from pydantic's first error: the key (dotted path, under ``section`` when the
    model is one section of a file), what is allowed, the value. ``where`` (a file name)
    prefixes the line; ``model`` (the one validated) names the allowed keys of an unknown one
    and tells an integer key from a real one, also in nested models."""
    first = error.errors(include_url=False)[0]
    loc = tuple(first["loc"])
    head: tuple[str, ...] = (section,) if section else ()

    def shown(parts: tuple[Any, ...]) -> str:
        return dotted(head + tuple(parts))

    prefix = f"{where}: " if where else ""
    if first["type"] == "extra_forbidden":
        owner = _model_at(model, loc[:-1])
        fields = _keys_of(owner) if owner is not None else []
        listed = f"; allowed keys: {', '.join(sorted(fields))}" if fields else ""
        return SpecError(f"{prefix}unknown key {shown(loc)!r}{listed}")
    if first["type"] == "value_error":
        cause = first.get("ctx", {}).get("error")
        message = str(cause if cause is not None else first["msg"]).removeprefix("Value error, ")
        value = first.get("input")
        if isinstance(cause, KeyedError):
            loc += cause.key
            if cause.value is ...:
                return SpecError(f"{prefix}{shown(loc)} {message}")
            value = cause.value
        if not loc:  # a check across keys words its own line
            return SpecError(prefix + message)
        return SpecError(f"{prefix}{shown(loc)} {message}; got {value!r}")
    if first["type"] == "invalid_key" or loc[-1:] == ("[key]",):  # a mapping's key, not a value
        parent = loc[:-1] if first["type"] == "invalid_key" else loc[:-2]
        owner = f"{shown(parent)} key" if parent else "key"
        return SpecError(f"{prefix}{owner} {first.get('input')!r} must be text")
    field = _field_at(model, loc)
    return SpecError(f"{prefix}{shown(loc) or 'value'} must be {_allowed(first, field)}; "
                     f"got {first.get('input')!r}")


def _walk(model: type[BaseModel] | None, loc: Sequence[str | int]) -> tuple[Any, Any]:
    """(annotation, field) found at ``loc`` below ``model``: through nested models (by field
    name or alias), the values of dicts and the items of lists and tuples. Inside a container
    the field is the item's (its bounds), built from the item's annotation."""
    annotation: Any = model
    field: Any = None
    for part in loc:
        annotation = _unwrap(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            field = next((f for name, f in annotation.model_fields.items()
                          if part in (name, f.alias)), None)
            if field is None:
                return None, None
            annotation = field.annotation
            continue
        origin, arguments = get_origin(annotation), get_args(annotation)
        if origin is dict and len(arguments) == 2:
            annotation = arguments[1]
        elif origin in (list, tuple, set, frozenset) and arguments:
            fixed = origin is tuple and Ellipsis not in arguments and isinstance(part, int)
            annotation = arguments[part] if fixed and part < len(arguments) else arguments[0]
        else:
            return None, None
        field = FieldInfo.from_annotation(annotation)
        annotation = field.annotation
    return annotation, field


def _unwrap(annotation: Any) -> Any:
    """The type inside Annotated[...] and Optional[...]."""
    while True:
        if get_origin(annotation) is Annotated:
            annotation = get_args(annotation)[0]
            continue
        arguments = [a for a in get_args(annotation) if a is not type(None)]
        if get_origin(annotation) in (Union, UnionType) and len(arguments) == 1:
            annotation = arguments[0]
            continue
        return annotation


def _model_at(model: type[BaseModel] | None, loc: Sequence[str | int]) -> type[BaseModel] | None:
    annotation = _unwrap(_walk(model, loc)[0])
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _field_at(model: type[BaseModel] | None, loc: Sequence[str | int]) -> Any:
    return _walk(model, loc)[1] if loc else None


def _keys_of(model: type[BaseModel]) -> list[str]:
    """The keys a model takes, as the user writes them (aliases where set)."""
    return [f.alias or name for name, f in model.model_fields.items()]


def _constraints(field: Any) -> tuple[str, dict[str, float]]:
    """(number kind, bounds) of a field, looking inside Optional[Annotated[...]]."""
    bounds: dict[str, float] = {}
    kind = "number"

    def visit(annotation: Any, metadata: list[Any]) -> None:
        nonlocal kind
        for item in metadata:
            for name in ("ge", "gt", "le", "lt"):
                if getattr(item, name, None) is not None:
                    bounds[name] = getattr(item, name)
            if hasattr(item, "metadata") and isinstance(item.metadata, list):
                visit(None, item.metadata)
        if annotation is int:
            kind = "integer"
        for argument in get_args(annotation):
            if get_origin(argument) is Annotated:
                inner, *extra = get_args(argument)
                visit(inner, extra)
            elif argument is int:
                kind = "integer"

    if field is not None:
        visit(field.annotation, list(field.metadata))
    return kind, bounds


def _allowed(first: dict[str, Any], field: Any) -> str:
    kind, ctx = first["type"], first.get("ctx", {})
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        number, bounds = _constraints(field)
        low = f"[{bounds['ge']:g}" if "ge" in bounds else f"({bounds['gt']:g}" if "gt" in bounds else None
        high = f"{bounds['le']:g}]" if "le" in bounds else f"{bounds['lt']:g})" if "lt" in bounds else None
        if low and high:
            return f"{'an integer' if number == 'integer' else 'a number'} in {low}, {high}"
        sign = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=",
                "less_than": "<"}[kind]
        limit = next(iter(ctx.values()))
        return f"{'an integer' if number == 'integer' else 'a number'} {sign} {limit:g}"
    if kind == "literal_error":
        return "one of " + ", ".join(re.findall(r"'([^']*)'", ctx.get("expected", "")))
    if kind.startswith("int"):
        return "an integer"
    if kind.startswith("float") or kind == "finite_number":
        return "a finite number"
    if kind.startswith("bool"):
        return "true or false"
    if kind.startswith("string"):
        return "text"
    if kind == "missing":
        return "set"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return "a mapping"
    if kind in ("list_type", "tuple_type"):
        return "a list"
    if kind in ("too_short", "too_long"):
        count = ctx.get("min_length" if kind == "too_short" else "max_length", 0)
        what = ("a mapping", "key") if ctx.get("field_type") == "Dictionary" else ("a list", "item")
        return f"{what[0]} of at {'least' if kind == 'too_short' else 'most'} {count} " \
               f"{what[1]}{'' if count == 1 else 's'}"
    return first["msg"].lower()


@functools.lru_cache(maxsize=None)
def _adapter(annotation: Any) -> TypeAdapter:
    return TypeAdapter(annotation)


def check_value(key: str, value: Any, annotation: Any) -> Any:
    """``value`` validated (and coerced) as ``annotation`` (a type with pydantic metadata), or
    one SpecError line naming ``key``: for the parameters of a rule built on its own."""
    try:
        return _adapter(annotation).validate_python(value)
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        if first["type"] == "value_error":
            message = str(first.get("ctx", {}).get("error", first["msg"])).removeprefix("Value error, ")
            raise SpecError(f"{key} {message}; got {value!r}") from None
        field = FieldInfo.from_annotation(annotation)
        raise SpecError(f"{key} must be {_allowed(first, field)}; got {value!r}") from None


def check_key(key: str, value: Any) -> Any:
    """``value`` validated as RunSpec key ``key`` is (the schema's type and range): a rule's
    constructor checks its RunSpec-named parameters with the one rule the RunSpec uses."""
    field = RunSchema.model_fields[key]
    annotation = Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation
    return check_value(key, value, annotation)
