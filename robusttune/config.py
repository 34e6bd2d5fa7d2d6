"""RunSpec: every knob of one federated run, validated at the edge, with defaults.

Precedence of a value is explicit > method preset (algorithm, aggregator) > dataset default >
global default. The dataset defaults to the embedded `digits`; the global defaults reproduce the
SWB-DM setup on cifar10 (N=20, 10 rounds,
Dirichlet 0.5, lr 0.01, momentum 0.9, 2 local epochs, batch 32). Dataset defaults exist where that
setup cannot learn: on digits (1,437 training images, ~70 per client) it reached only ~20% after 10
rounds, while lr 0.05, batch 16, 5 local epochs reached 93%.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from robusttune.registry import SpecError

__all__ = ["RunSpec", "SpecError", "RUNSPEC_KEYS", "METHOD_PRESETS"]

# method preset -> (algorithm, aggregator). Every aggregator name is also a preset of plain FedAvg
# with that rule (filled in lazily in `_method_presets`), as in the SWB-DM study.
METHOD_PRESETS: dict[str, tuple[str, str]] = {
    "fedavg": ("fedavg", "mean"),
    "swb_dm": ("state_cache", "swb"),
    "delayed_momentum": ("state_cache", "median"),
    "demoa": ("demoa", "cclip"),
    "fedcm": ("fedcm", "mean"),
}

DATASET_DEFAULTS: dict[str, dict[str, Any]] = {
    "digits": {"lr": 0.05, "batch_size": 16, "local_epochs": 5},
    "synthetic": {"model": "mlp", "lr": 0.05, "batch_size": 16, "local_epochs": 2},
}

# DeMoA's server step x <- x - eta * m is a gradient step, so eta is a learning rate; FedAvg-style
# algorithms replace the model by the aggregate (eta = 1 is plain FedAvg).
ALGORITHM_SERVER_LR = {"fedavg": 1.0, "state_cache": 1.0, "demoa": 0.1, "fedcm": 0.1}

CHOICES: dict[str, tuple[str, ...]] = {
    "participation_mode": ("fixed", "bernoulli"),
    "median_even": ("midpoint", "lower"),
    "trainer": ("auto", "sequential", "batched"),
    "swb_rotation": ("haar", "shared", "hadamard"),
    "cache_dtype": ("float32", "bfloat16"),
    "demoa_ablation": ("none", "coefficient_swap", "no_decay"),
    "attack_scope": ("inputs", "sample"),
}


@dataclass(frozen=True, init=False)
class RunSpec:
    """Every knob of one federated run. Build it with ``RunSpec(...)`` or ``RunSpec.from_dict``;
    both validate and resolve defaults, so the engine never sees a bad value."""

    # digits ships inside scikit-learn, so a laptop with no network runs out of the box; the other
    # defaults are the SWB-DM cifar10 setup, which `dataset: cifar10` gets unchanged.
    dataset: str = "digits"
    data_root: str = "./data"
    model: str = "cnn2"
    clients: int = 20
    rounds: int = 10
    participation: float = 0.5
    participation_mode: str = "fixed"
    sample_size: int | None = None
    byzantine_fraction: float = 0.0
    assumed_byzantine_fraction: float | None = None
    attack: str = "none"
    attack_strength: float | None = None
    # What the omniscient attacker computes its statistics over (mu, sigma, ALIE's n and f):
    # `inputs` = every row the rule aggregates (all N cached rows under state_cache and demoa),
    # `sample` = this round's sampled messages (how the SWB-DM grid ran ALIE and IPM).
    attack_scope: str = "inputs"
    method: str | None = None
    algorithm: str = "fedavg"
    aggregator: str = "mean"
    trim_ratio: float | None = None
    krum_m: int | None = None
    cclip_tau: float = 10.0
    cclip_iters: int = 1
    gm_iters: int = 10
    bucket_size: int = 0
    swb_chunk: int = 512
    swb_views: int = 2
    swb_rotation: str = "haar"
    guarded: bool = False
    median_even: str = "midpoint"
    local_epochs: int = 2
    batch_size: int = 32
    lr: float = 0.01
    momentum: float = 0.9
    trainer: str = "auto"
    demoa_alpha: float = 0.1
    demoa_ablation: str = "none"
    server_lr: float | None = None
    dirichlet_alpha: float = 0.5
    partition_seed: int = 1234
    seed: int = 42
    device: str = "auto"
    eval_every: int = 1
    cache_dtype: str = "float32"
    fltrust_root_size: int = 100
    synthetic_shape: str = "1x8x8"
    synthetic_classes: int = 10
    synthetic_samples: int = 2000
    checkpoint_every: int = 5
    explicit: frozenset[str] = field(default=frozenset(), repr=False, compare=False)

    def __init__(self, **values: Any) -> None:
        # A hand-written __init__ so that "given" means passed, not "different from the default":
        # RunSpec(dataset="digits", lr=0.01) must keep lr=0.01 over the digits default.
        explicit = frozenset(values.pop("explicit", ())) | frozenset(values)
        unknown = sorted(set(values) - RUNSPEC_KEYS)
        if unknown:
            raise SpecError(
                f"unknown RunSpec key {unknown[0]!r}; allowed keys: {', '.join(sorted(RUNSPEC_KEYS))}"
            )
        for f in fields(self):
            if f.name != "explicit":
                object.__setattr__(self, f.name, values.get(f.name, f.default))
        object.__setattr__(self, "explicit", explicit)
        _coerce_all(self)
        _resolve(self)
        _validate(self)

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "RunSpec":
        """Build from a mapping (YAML, ``--set``, a Tune config); unknown keys are errors."""
        return cls(**dict(values))

    def updated(self, **changes: Any) -> "RunSpec":
        """A new spec from this one's explicit values plus ``changes``, re-resolving defaults (so
        changing the dataset brings that dataset's defaults for keys that were not given)."""
        values = {k: getattr(self, k) for k in self.explicit}
        values.update(changes)
        return RunSpec.from_dict(values)

    def to_dict(self) -> dict[str, Any]:
        """The resolved values of every key, JSON-ready."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "explicit"}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    # -- derived quantities ------------------------------------------------------------------
    @property
    def n_byzantine(self) -> int:
        """B = floor(beta * N), with a tolerance so 0.3 * 10 counts as 3, not 2."""
        return int(math.floor(self.byzantine_fraction * self.clients + 1e-9))

    @property
    def beta_assumed(self) -> float:
        assert self.assumed_byzantine_fraction is not None  # resolved in __init__
        return self.assumed_byzantine_fraction

    def assumed_f(self, n_inputs: int) -> int:
        """f = floor(n_in * beta_assumed): the corruption a rule is told to expect."""
        return int(math.floor(n_inputs * self.beta_assumed + 1e-9))

    @property
    def expected_sample_size(self) -> int:
        """n = sample_size, or max(1, round(p * N)) (the fixed-size draw of SWB-DM)."""
        if self.sample_size is not None:
            return self.sample_size
        return max(1, int(round(self.participation * self.clients)))

    def aggregator_params(self) -> dict[str, Any]:
        """The knobs a rule may take, spelled as RunSpec keys."""
        keys = ("trim_ratio", "krum_m", "cclip_tau", "cclip_iters", "gm_iters", "bucket_size",
                "swb_chunk", "swb_views", "swb_rotation", "median_even", "seed")
        return {k: getattr(self, k) for k in keys}


RUNSPEC_KEYS: frozenset[str] = frozenset(f.name for f in fields(RunSpec) if f.name != "explicit")

_FIELD_TYPES = {f.name: f.type for f in fields(RunSpec)}


def _coerce(name: str, value: Any) -> Any:
    kind = str(_FIELD_TYPES[name])
    optional = "None" in kind
    if optional and (value is None or (isinstance(value, str) and value.lower() in ("none", "null"))):
        return None
    if value is None:
        raise SpecError(f"{name} must be set; got none")
    try:
        if kind.startswith("int"):
            if isinstance(value, bool):
                raise ValueError
            number = float(value)
            if not number.is_integer():
                raise ValueError
            return int(number)
        if kind.startswith("float"):
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if kind.startswith("bool"):
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "yes", "1", "on"):
                return True
            if isinstance(value, str) and value.lower() in ("false", "no", "0", "off"):
                return False
            if isinstance(value, int) and value in (0, 1):
                return bool(value)
            raise ValueError
        if kind.startswith("str"):
            if not isinstance(value, str):
                raise ValueError
            return value
    except (TypeError, ValueError):
        expected = kind.split(" ")[0].replace("|", "")
        raise SpecError(f"{name} must be {expected}; got {value!r}") from None
    return value


def _coerce_all(spec: RunSpec) -> None:
    for name in RUNSPEC_KEYS:
        object.__setattr__(spec, name, _coerce(name, getattr(spec, name)))


def _set(spec: RunSpec, name: str, value: Any) -> None:
    object.__setattr__(spec, name, value)


def _method_presets() -> dict[str, tuple[str, str]]:
    from robusttune.aggregators import AGGREGATORS

    presets = {name: ("fedavg", name) for name in AGGREGATORS.names() if name != "bucketing"}
    presets.update(METHOD_PRESETS)
    return presets


def _resolve(spec: RunSpec) -> None:
    """Fill what was not given: dataset defaults, method preset, calibrated values."""
    explicit = spec.explicit
    defaults = DATASET_DEFAULTS.get(spec.dataset, {})
    for key, value in defaults.items():
        if key not in explicit:
            _set(spec, key, value)

    presets = _method_presets()
    if spec.method is not None:
        if spec.method in presets:
            algorithm, aggregator = presets[spec.method]
        elif spec.method.count("+") == 1:
            # the label given to a combination no preset names ("state_cache+mean"): a resolved
            # spec written to summary.json must read back (RunSpec.from_dict(spec.to_dict()))
            algorithm, aggregator = spec.method.split("+")
        else:
            raise SpecError(f"unknown method {spec.method!r}; allowed: {', '.join(sorted(presets))}"
                            f", or ALGORITHM+AGGREGATOR")
        if "algorithm" not in explicit:
            _set(spec, "algorithm", algorithm)
        if "aggregator" not in explicit:
            _set(spec, "aggregator", aggregator)
    else:
        match = [m for m, pair in presets.items() if pair == (spec.algorithm, spec.aggregator)]
        preferred = [m for m in match if m in METHOD_PRESETS] or match
        _set(spec, "method", preferred[0] if preferred else f"{spec.algorithm}+{spec.aggregator}")

    if spec.assumed_byzantine_fraction is None:
        _set(spec, "assumed_byzantine_fraction", spec.byzantine_fraction)
    if spec.server_lr is None:
        _set(spec, "server_lr", ALGORITHM_SERVER_LR.get(spec.algorithm, 1.0))
    if spec.trim_ratio is None and spec.aggregator == "swb":
        # SWB-DM, Section IV: r = min(0.45, beta + 0.05), tied to the assumed corruption.
        assumed = spec.assumed_byzantine_fraction
        if isinstance(assumed, float) and 0 <= assumed < 1:
            _set(spec, "trim_ratio", round(min(0.45, assumed + 0.05), 10))


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise SpecError(message)


def _validate(spec: RunSpec) -> None:
    from robusttune.aggregators import AGGREGATORS
    from robusttune.algorithms import ALGORITHMS
    from robusttune.attacks import ATTACKS
    from robusttune.data import DATASETS
    from robusttune.models import MODELS

    for key, registry in (("dataset", DATASETS), ("model", MODELS), ("attack", ATTACKS),
                          ("algorithm", ALGORITHMS), ("aggregator", AGGREGATORS)):
        value = getattr(spec, key)
        _check(value in registry, f"{key} {value!r} is unknown; allowed: {', '.join(registry.names())}")
    for key, allowed in CHOICES.items():
        value = getattr(spec, key)
        _check(value in allowed, f"{key} {value!r} is not allowed; allowed: {', '.join(allowed)}")

    _check(spec.clients >= 1, f"clients must be >= 1; got {spec.clients}")
    _check(spec.rounds >= 1, f"rounds must be >= 1; got {spec.rounds}")
    _check(0 < spec.participation <= 1, f"participation must be in (0, 1]; got {spec.participation}")
    if spec.sample_size is not None:
        _check(1 <= spec.sample_size <= spec.clients,
               f"sample_size must be in [1, clients={spec.clients}]; got {spec.sample_size}")
    _check(0 <= spec.byzantine_fraction < 1,
           f"byzantine_fraction must be in [0, 1); got {spec.byzantine_fraction}")
    _check(0 <= spec.beta_assumed < 1,
           f"assumed_byzantine_fraction must be in [0, 1); got {spec.beta_assumed}")
    if spec.attack_strength is not None:
        _check(math.isfinite(spec.attack_strength),
               f"attack_strength must be a finite number; got {spec.attack_strength}")
    if spec.trim_ratio is not None:
        _check(0 <= spec.trim_ratio < 0.5, f"trim_ratio must be in [0, 0.5); got {spec.trim_ratio}")
    if spec.krum_m is not None:
        _check(spec.krum_m >= 1, f"krum_m must be >= 1; got {spec.krum_m}")
    _check(spec.cclip_tau > 0, f"cclip_tau must be > 0; got {spec.cclip_tau}")
    for key in ("cclip_iters", "gm_iters", "swb_chunk", "swb_views", "local_epochs", "batch_size",
                "eval_every", "fltrust_root_size", "synthetic_samples"):
        _check(getattr(spec, key) >= 1, f"{key} must be >= 1; got {getattr(spec, key)}")
    _check(spec.synthetic_classes >= 2, f"synthetic_classes must be >= 2; got {spec.synthetic_classes}")
    _check(all(part.isdigit() and int(part) > 0 for part in spec.synthetic_shape.split("x")),
           f"synthetic_shape must look like 3x32x32 or 20; got {spec.synthetic_shape!r}")
    _check(spec.bucket_size >= 0, f"bucket_size must be >= 0 (0 or 1: no bucketing); got {spec.bucket_size}")
    _check(spec.checkpoint_every >= 0, f"checkpoint_every must be >= 0; got {spec.checkpoint_every}")
    _check(spec.lr > 0, f"lr must be > 0; got {spec.lr}")
    _check(0 <= spec.momentum < 1, f"momentum must be in [0, 1); got {spec.momentum}")
    _check(0 < spec.demoa_alpha <= 1, f"demoa_alpha must be in (0, 1]; got {spec.demoa_alpha}")
    _check(spec.server_lr is not None and spec.server_lr > 0, f"server_lr must be > 0; got {spec.server_lr}")
    _check(spec.dirichlet_alpha > 0, f"dirichlet_alpha must be > 0 (inf: IID); got {spec.dirichlet_alpha}")
    _check(spec.device in ("auto", "cpu", "cuda") or spec.device.startswith("cuda:"),
           f"device {spec.device!r} is not allowed; allowed: auto, cpu, cuda, cuda:N")
    if spec.attack != "none":
        _check(spec.n_byzantine >= 1 or spec.byzantine_fraction == 0,
               f"byzantine_fraction {spec.byzantine_fraction} gives no Byzantine client among "
               f"clients={spec.clients}; use at least {1 / spec.clients:.3g}")
