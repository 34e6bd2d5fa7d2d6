"""RunSpec: defaults, precedence, presets and one-line validation errors."""

from __future__ import annotations

import json

import pytest

from robusttune.core.registry import SpecError
from robusttune.core.runspec import RUNSPEC_KEYS, RunSpec
from robusttune.core.yaml_input import parse_assignment

DESIGN_KEYS = [
    "dataset",
    "data_root",
    "model",
    "clients",
    "rounds",
    "participation",
    "participation_mode",
    "sample_size",
    "byzantine_fraction",
    "assumed_byzantine_fraction",
    "attack",
    "attack_strength",
    "method",
    "algorithm",
    "aggregator",
    "trim_ratio",
    "krum_m",
    "cclip_tau",
    "cclip_iters",
    "gm_iters",
    "bucket_size",
    "swb_chunk",
    "swb_views",
    "swb_rotation",
    "guarded",
    "median_even",
    "local_epochs",
    "batch_size",
    "lr",
    "momentum",
    "trainer",
    "demoa_alpha",
    "server_lr",
    "dirichlet_alpha",
    "partition_seed",
    "seed",
    "device",
    "eval_every",
    "cache_dtype",
]


def test_every_design_key_exists():
    assert set(DESIGN_KEYS) <= RUNSPEC_KEYS


def test_global_defaults_are_the_swb_dm_cifar10_setup():
    spec = RunSpec(dataset="cifar10")
    assert (spec.clients, spec.rounds, spec.dirichlet_alpha) == (20, 10, 0.5)
    assert (spec.lr, spec.momentum, spec.local_epochs, spec.batch_size) == (0.01, 0.9, 2, 32)


def test_the_default_dataset_is_the_embedded_digits_with_its_defaults():
    spec = RunSpec()
    assert (spec.dataset, spec.lr, spec.batch_size, spec.local_epochs) == ("digits", 0.05, 16, 5)


def test_dataset_defaults_apply_unless_given():
    digits = RunSpec(dataset="digits")
    assert (digits.lr, digits.batch_size, digits.local_epochs) == (0.05, 16, 5)
    # explicit beats the dataset default even when it equals the global default
    explicit = RunSpec(dataset="digits", lr=0.01)
    assert explicit.lr == 0.01 and explicit.batch_size == 16


def test_updated_re_resolves_dataset_defaults():
    spec = RunSpec(dataset="digits", seed=3)
    moved = spec.updated(dataset="cifar10")
    assert moved.lr == 0.01 and moved.seed == 3


def test_method_presets_set_algorithm_and_aggregator():
    assert (RunSpec(method="swb_dm").algorithm, RunSpec(method="swb_dm").aggregator) == (
        "state_cache",
        "swb",
    )
    assert RunSpec(method="delayed_momentum").aggregator == "median"
    assert (RunSpec(method="demoa").algorithm, RunSpec(method="demoa").aggregator) == (
        "demoa",
        "cclip",
    )
    assert RunSpec(method="demoa", aggregator="krum").aggregator == "krum"
    assert RunSpec(method="krum").algorithm == "fedavg"
    assert RunSpec(algorithm="state_cache", aggregator="median").method == "delayed_momentum"
    # DeMoA's comparison (its experiments): FedAvg as one gradient, FedCM two ways, Byz-VR-MARINA-PP
    assert (RunSpec(method="fedsgd").algorithm, RunSpec(method="fedsgd").aggregator) == (
        "fedsgd",
        "mean",
    )
    assert RunSpec(method="fedcm_xu").algorithm == "fedcm_xu"
    assert (
        RunSpec(method="byz_vr_marina_pp").algorithm,
        RunSpec(method="byz_vr_marina_pp").aggregator,
    ) == ("byz_vr_marina_pp", "cclip")
    assert RunSpec(method="byz_vr_marina_pp", aggregator="krum").method == "byz_vr_marina_pp+krum"


def test_swb_trim_ratio_is_calibrated_to_assumed_corruption():
    assert RunSpec(method="swb", byzantine_fraction=0.2, attack="ipm").trim_ratio == pytest.approx(
        0.25
    )
    assert RunSpec(method="swb", byzantine_fraction=0.45, attack="ipm").trim_ratio == pytest.approx(
        0.45
    )
    spec = RunSpec(
        method="swb", byzantine_fraction=0.2, assumed_byzantine_fraction=0.3, attack="ipm"
    )
    assert spec.trim_ratio == pytest.approx(0.35)
    assert RunSpec(method="swb", trim_ratio=0.1).trim_ratio == 0.1


def test_derived_counts():
    spec = RunSpec(clients=10, byzantine_fraction=0.3, participation=0.5)
    assert spec.n_byzantine == 3 and spec.expected_sample_size == 5 and spec.assumed_f(10) == 3
    assert RunSpec(clients=20, participation=0.01).expected_sample_size == 1
    assert RunSpec(clients=20, sample_size=11).expected_sample_size == 11


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"participation": 0}, "participation"),
        ({"participation": 1.5}, "participation"),
        ({"byzantine_fraction": 1.0}, "byzantine_fraction"),
        ({"trim_ratio": 0.5}, "trim_ratio"),
        ({"clients": 0}, "clients"),
        ({"aggregator": "krumm"}, "aggregator"),
        ({"attack": "nope"}, "attack"),
        ({"method": "swbdm"}, "method"),
        ({"dataset": "imagenet"}, "dataset"),
        ({"participation_mode": "poisson"}, "participation_mode"),
        ({"rounds": "ten"}, "rounds"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_bad_values_are_one_line_naming_the_key(values, key):
    with pytest.raises(SpecError) as error:
        RunSpec.from_dict(values)
    message = str(error.value)
    assert key in message and "\n" not in message


def test_unknown_registry_name_lists_the_allowed_ones():
    with pytest.raises(SpecError, match="median"):
        RunSpec(aggregator="medain")


def test_parse_assignment_reads_yaml_scalars():
    assert parse_assignment("clients=50") == ("clients", 50)
    assert parse_assignment("guarded=true") == ("guarded", True)
    assert parse_assignment("dataset=digits") == ("dataset", "digits")
    with pytest.raises(SpecError):
        parse_assignment("clients50")
    with pytest.raises(SpecError):
        parse_assignment("colour=red")


def test_to_dict_round_trips_through_json():
    spec = RunSpec(dataset="digits", method="swb_dm", byzantine_fraction=0.2, attack="alie")
    again = RunSpec.from_dict(json.loads(spec.to_json()))
    assert again == spec


def test_a_combination_no_preset_names_round_trips():
    # method resolves to the label "state_cache+mean"; summary.json's spec must read back
    spec = RunSpec(dataset="digits", algorithm="state_cache", aggregator="mean")
    assert spec.method == "state_cache+mean"
    assert RunSpec.from_dict(json.loads(spec.to_json())) == spec
    assert RunSpec(dataset="digits", method="demoa+median").aggregator == "median"
    with pytest.raises(SpecError, match="algorithm 'nope'"):
        RunSpec(dataset="digits", method="nope+mean")


def test_a_method_with_a_conflicting_rule_or_algorithm_is_one_line():
    """method krum with aggregator median would run the median and record it as krum."""
    for values, words in (
        ({"method": "krum", "aggregator": "median"}, "method 'krum' runs aggregator"),
        ({"method": "swb_dm", "aggregator": "median"}, "runs aggregator 'swb'"),
        ({"method": "demoa", "algorithm": "fedcm"}, "runs algorithm 'demoa'"),
    ):
        with pytest.raises(SpecError, match=words) as error:
            RunSpec(**values)
        assert "\n" not in str(error.value)


def test_a_method_that_takes_any_rule_is_labelled_by_what_ran():
    spec = RunSpec(method="demoa", aggregator="median")
    assert (spec.method, spec.algorithm, spec.aggregator) == ("demoa+median", "demoa", "median")
    assert RunSpec(method="demoa", aggregator="cclip").method == "demoa"
    assert RunSpec(method="fedcm", aggregator="krum").method == "fedcm+krum"
    assert RunSpec.from_dict(spec.to_dict()) == spec


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ({"device": "cuda:x"}, "device must be one of auto, cpu, cuda, cuda:N; got 'cuda:x'"),
        ({"clients": True}, "clients must be a number, not true/false; got True"),
        ({"rounds": 2.7}, "rounds must be an integer; got 2.7"),
        ({"seed": -1}, "seed must be an integer >= 0; got -1"),
        ({"momentum": 1}, "momentum must be a number in [0, 1); got 1"),
        ({"synthetic_shape": "3x"}, "synthetic_shape must look like 3x32x32 or 20; got '3x'"),
        ({"sample_size": 30}, "sample_size must be in [1, clients=20]; got 30"),
    ],
)
def test_schema_errors_name_the_key_the_rule_and_the_value(values, words):
    with pytest.raises(SpecError) as error:
        RunSpec(**values)
    assert str(error.value) == words


def test_name_keyed_defaults_live_on_the_registry_entries():
    from robusttune.methods.aggregators import AGGREGATORS
    from robusttune.methods.algorithms import ALGORITHMS
    from robusttune.problem.data import DATASETS

    assert DATASETS["digits"].defaults == {"lr": 0.05, "batch_size": 16, "local_epochs": 5}
    assert RunSpec(method="demoa").server_lr == ALGORITHMS["demoa"].default_server_lr == 0.1
    assert (
        RunSpec(method="swb", byzantine_fraction=0.3, attack="ipm").trim_ratio
        == AGGREGATORS["swb"].calibrated_trim_ratio(0.3)
        == pytest.approx(0.35)
    )
    assert (
        RunSpec(method="swb_dm").aggregates_cache and not RunSpec(method="fedcm").aggregates_cache
    )


def _imported_modules(tree) -> set[str]:
    """Every module a file imports, anywhere in it: module level, functions and
    ``if TYPE_CHECKING:`` blocks alike (a type-only import is still an arrow)."""
    import ast

    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            # `from robusttune import config` names the module as an alias
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_no_module_imports_the_resolver_from_below():
    """config (the resolver) imports the registries; none of them imports config, not even
    for types: every arrow runs one way (the registries type a spec as ``schema.RunSchema``)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "robusttune"
    below = [
        "core/registry.py",
        "core/registries.py",
        "core/schema.py",
        "core/validation.py",
        "core/records.py",
        "problem/sampling.py",
        "methods/algorithms/caches.py",
        "problem/models.py",
        "problem/training.py",
        "problem/evaluation.py",
    ] + [
        str(p.relative_to(root))
        for folder in (
            "methods/aggregators",
            "methods/algorithms",
            "methods/attacks",
            "problem/data",
        )
        for p in (root / folder).glob("*.py")
    ]
    assert len(below) > 30
    for name in below:
        imported = _imported_modules(ast.parse((root / name).read_text()))
        if "robusttune.core.runspec" in imported:
            raise AssertionError(f"{name} imports robusttune.core.runspec")


def test_the_registries_type_a_spec_against_the_schema_that_the_resolver_extends():
    """What the registries annotate ``spec`` with is the schema, and a RunSpec is one, so the
    algorithms and loaders take a resolved RunSpec without knowing the resolver."""
    import inspect

    from robusttune.core.schema import RunSchema
    from robusttune.methods.algorithms import make_algorithm
    from robusttune.problem.data import load_federated

    for function in (make_algorithm, load_federated):
        assert inspect.signature(function).parameters["spec"].annotation == "RunSchema"
    assert isinstance(RunSpec(method="demoa"), RunSchema)
