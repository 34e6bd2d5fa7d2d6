"""The schema of one federated run: every RunSpec key with its type, range and meaning,
validated by pydantic; its errors are one `SpecError` line (`robusttune.core.validation`). Pure:
it knows no registry, so which names exist (datasets, rules, attacks ...) and the name-keyed
defaults are the resolver's business (`robusttune.core.runspec.RunSpec`), one floor up.
"""

from __future__ import annotations

import math
import os
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from robusttune.core.registry import SpecError
from robusttune.core.validation import (
    Finite,
    Int,
    Number,
    OptionalStr,
    check_value,
    optional_finite,
    optional_int,
)

__all__ = ["NUMERICS_ENV", "RUNSPEC_KEYS", "RunSchema", "check_key", "default_numerics"]


NUMERICS_ENV = "ROBUSTTUNE_NUMERICS"


def default_numerics() -> str:
    """The ``numerics`` of a RunSpec that does not set it: $ROBUSTTUNE_NUMERICS, else portable
    (written into the spec where it is made, so a trial trains in its driver's mode)."""
    value = os.environ.get(NUMERICS_ENV, "").strip() or "portable"
    if value not in ("native", "portable"):
        raise SpecError(f"{NUMERICS_ENV} must be one of native, portable; got {value!r}")
    return value


def _device(value: str) -> str:
    if not re.fullmatch(r"auto|cpu|cuda|cuda:\d+", value):
        raise ValueError("must be one of auto, cpu, cuda, cuda:N")
    return value


def _shape(value: str) -> str:
    if not re.fullmatch(r"[1-9]\d*(x[1-9]\d*)*", value):
        raise ValueError("must look like 3x32x32 or 20")
    return value


class RunSchema(BaseModel):
    """Every knob of one federated run, typed, with its allowed range. Defaults are the global
    ones (the SWB-DM cifar10 setup, with the embedded digits as the dataset); ``None`` marks the
    keys the resolver fills (method, assumed fraction, trim ratio, server step)."""

    # each key's docstring is its description (the reference and the JSON schema show it)
    model_config = ConfigDict(
        frozen=True, extra="forbid", validate_default=True, use_attribute_docstrings=True
    )

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
    def _across_keys(self) -> RunSchema:
        if self.sample_size is not None and self.sample_size > self.clients:
            raise ValueError(
                f"sample_size must be in [1, clients={self.clients}]; got {self.sample_size}"
            )
        if math.isnan(self.dirichlet_alpha):
            raise ValueError("dirichlet_alpha must be > 0 (inf: IID); got nan")
        if self.attack != "none" and self.byzantine_fraction > 0 and self.n_byzantine < 1:
            raise ValueError(
                f"byzantine_fraction {self.byzantine_fraction} gives no Byzantine client among "
                f"clients={self.clients}; use at least {1 / self.clients:.3g}"
            )
        return self

    # -- derived quantities ------------------------------------------------------------------
    @property
    def n_byzantine(self) -> int:
        """B = floor(beta * N), with a tolerance so 0.3 * 10 counts as 3, not 2."""
        return math.floor(self.byzantine_fraction * self.clients + 1e-9)

    @property
    def beta_assumed(self) -> float:
        return (
            self.byzantine_fraction
            if self.assumed_byzantine_fraction is None
            else self.assumed_byzantine_fraction
        )

    def assumed_f(self, n_inputs: int) -> int:
        """f = floor(n_in * beta_assumed): the corruption a rule is told to expect."""
        return math.floor(n_inputs * self.beta_assumed + 1e-9)

    @property
    def expected_sample_size(self) -> int:
        """n = sample_size, or max(1, round(p * N)) (the fixed-size draw of SWB-DM)."""
        if self.sample_size is not None:
            return self.sample_size
        return max(1, round(self.participation * self.clients))


RUNSPEC_KEYS: frozenset[str] = frozenset(RunSchema.model_fields)


def check_key(key: str, value: Any) -> Any:
    """``value`` validated as RunSpec key ``key`` is (the schema's type and range): a rule's
    constructor checks its RunSpec-named parameters with the one rule the RunSpec uses."""
    field = RunSchema.model_fields[key]
    arguments = (field.annotation, *field.metadata)
    annotation = Annotated[arguments] if field.metadata else field.annotation
    return check_value(key, value, annotation)
