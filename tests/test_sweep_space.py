"""Search-space YAML: validation errors (one line naming the key and the allowed values), grid
expansion counts, constraints between keys, and the shipped spaces' dry runs (448 for the
SWB-DM paper grid). No Ray is started here."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml

from robusttune.core.registry import SpecError
from robusttune.experiments.sweep.space import load_sweep, parse_sweep

ROOT = Path(__file__).resolve().parents[1]
SPACES = ROOT / "search_spaces"
BASE = {"dataset": "synthetic", "clients": 10, "rounds": 2}


def space(**sections):
    mapping = {"run": dict(BASE)}
    mapping.update(sections)
    return mapping


def error_of(mapping) -> str:
    with pytest.raises(SpecError) as caught:
        parse_sweep(mapping, source="t.yaml")
    message = str(caught.value)
    assert "\n" not in message, "a SpecError is one line"
    return message


# -- errors -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("mapping", "key", "allowed"),
    [
        ({"run": BASE, "spaces": {}}, "spaces", "space"),
        ({"run": {**BASE, "learning_rate": 0.1}}, "learning_rate", "lr"),
        (
            space(space={"lr": {"gird": [0.1]}}),
            "space.lr",
            "grid, choice, uniform, loguniform, int",
        ),
        (space(space={"colour": {"grid": ["red"]}}), "colour", "dataset"),
        (space(search={"algorithm": "random"}), "search.algorithm", "grid, optuna"),
        (
            space(
                search={"algorithm": "optuna", "sampler": "anneal"},
                space={"lr": {"uniform": [0.01, 0.1]}},
            ),
            "search.sampler",
            "tpe, gp, nsga2, cmaes",
        ),
        (space(search={"algorithm": "grid", "sampler": "tpe"}), "search.sampler", "optuna"),
        (space(search={"num_samples": 0}), "search.num_samples", ">= 1"),
        (space(search={"metric": "f1"}), "search.metric", "accuracy"),
        (
            space(search={"metric": ["accuracy", "loss"], "mode": ["max"]}),
            "search.mode",
            "one mode per metric",
        ),
        (space(search={"mode": "maximise"}), "search.mode", "max, min"),
        (space(scheduler="hyperband"), "scheduler", "none, asha"),
        (space(scheduler={"type": "asha", "patience": 3}), "scheduler.patience", "grace_period"),
        (
            space(search={"metric": ["accuracy", "loss"]}, scheduler="asha"),
            "scheduler asha",
            "one metric",
        ),
        (space(resources={"cpu": 0}), "resources.cpu", "> 0"),
        (space(resources={"gpu": 1.5}), "resources.gpu", "whole number"),
        (space(resources={"tpu": 1}), "resources.tpu", "cpu, gpu"),
        (space(max_concurrent=-1), "max_concurrent", ">= 0"),
        (
            space(constraints={"attack_needs_byzantine": True}),
            "constraints.attack_needs_byzantine",
            "attack_matches_byzantine",
        ),
        (space(constraints={"invalid": "ignore"}), "constraints.invalid", "error, drop"),
        (space(space={"lr": {"uniform": [0.1, 0.01]}}), "space.lr", "low < high"),
        (space(space={"lr": {"loguniform": [0.0, 0.1]}}), "space.lr", "low > 0"),
        (
            space(space={"local_epochs": {"int": [1.5, 3]}}),
            "space.local_epochs.int[0]",
            "an integer",
        ),
        (space(space={"lr": {"grid": [0.1], "step": 2}}), "space.lr.step", "nothing else"),
        (
            space(space={"threat": {"grid": [{"attack": "alie", "beta": 0.2}]}}),
            "space.threat.grid[0].beta",
            "byzantine_fraction",
        ),
        (
            space(space={"attack": {"grid": ["alie"]}, "threat": {"grid": [{"attack": "ipm"}]}}),
            "sets attack",
            "one axis per RunSpec key",
        ),
        (
            space(run={**BASE, "device": "cuda"}, resources={"gpu": 0}),
            "run.device",
            "resources.gpu",
        ),
    ],
)
def test_bad_yaml_is_one_line_naming_key_and_allowed(mapping, key, allowed):
    message = error_of(mapping)
    assert message.startswith("t.yaml: ")
    assert key in message and allowed in message, message


def test_an_unknown_domain_kind_is_named_with_the_allowed_kinds():
    message = error_of(space(space={"lr": {"normal": [0.0, 1.0]}}))
    assert message == (
        "t.yaml: space.lr.normal is not a domain kind; allowed: grid, choice, uniform, "
        "loguniform, int; got [0.0, 1.0]"
    )


@pytest.mark.parametrize(
    ("mapping", "line"),
    [
        (
            space(name="my sweep"),
            "name must be a non-empty word without '/' or spaces; got 'my sweep'",
        ),
        (space(run=[1]), "run must be a mapping; got [1]"),
        ({"run": {**BASE, 5: 1}}, "run key 5 must be text"),
        (
            space(space={"lr": {"uniform": [0.1, "a"]}}),
            "space.lr.uniform[1] must be a finite number; got 'a'",
        ),
        (
            space(space={"lr": {"uniform": [0.1, 0.2, 0.3]}}),
            "space.lr.uniform must be [low, high]; got [0.1, 0.2, 0.3]",
        ),
        (
            space(space={"lr": {"grid": []}}),
            "space.lr.grid must be a list of at least 1 item; got []",
        ),
        (
            space(space={"local_epochs": {"int": [1, 3], "step": 0.5}}),
            "space.local_epochs.step must be an integer >= 1 beside int; got 0.5",
        ),
        (
            space(space={"threat": {"grid": [{"attack": ["alie"]}]}}),
            "space.threat.grid[0].attack must be a scalar; got ['alie']",
        ),
        (space(search={"seed": -1}), "search.seed must be an integer >= 0; got -1"),
        (space(search={"metric": 5}), "search.metric must be text; got 5"),
        (
            space(search={"mode": ["max", "top"], "metric": ["accuracy", "loss"]}),
            "search.mode[1] must be one of max, min; got 'top'",
        ),
        (
            space(scheduler={"type": "asha", "reduction_factor": 1}),
            "scheduler.reduction_factor must be a number > 1; got 1",
        ),
        (
            space(scheduler={"type": "asha", "max_t": 0}),
            "scheduler.max_t must be an integer >= 1; got 0",
        ),
        (
            space(scheduler={"grace_period": 2}),
            "scheduler.grace_period applies to scheduler type asha only; allowed "
            "with none: type; got 2",
        ),
        (
            space(resources={"cpu": True}),
            "resources.cpu must be a number, not true/false; got True",
        ),
        (
            space(resources={"gpu": -1}),
            "resources.gpu must be auto or a finite number >= 0; got -1",
        ),
        (space(max_concurrent=-1), "max_concurrent must be an integer >= 0; got -1"),
        (space(max_concurrent=1.5), "max_concurrent must be an integer; got 1.5"),
        (
            space(constraints={"attack_matches_byzantine": "yes"}),
            "constraints.attack_matches_byzantine must be true or false; got 'yes'",
        ),
        (
            space(constraints={"drop": [{}]}),
            "constraints.drop[0] must be a mapping of at least 1 key; got {}",
        ),
    ],
)
def test_a_bad_value_in_each_section_names_its_dotted_key(mapping, line):
    assert error_of(mapping) == f"t.yaml: {line}"


def test_unknown_runspec_keys_are_named_where_they_are():
    for mapping, key in [
        ({"run": {**BASE, "speed": 3}}, "run.speed"),
        (space(constraints={"drop": [{"speed": 1}]}), "constraints.drop[0].speed"),
    ]:
        message = error_of(mapping)
        assert (
            message.startswith(f"t.yaml: {key} is not a RunSpec key; allowed: ")
            and "byzantine_fraction" in message
        )


def test_a_bad_value_fails_before_ray_naming_the_runspec_key():
    message = error_of(space(space={"participation": {"grid": [0.5, 1.5]}}))
    assert "participation=1.5" in message and "participation must be a number in (0, 1]" in message
    message = error_of(space(space={"dataset": {"grid": ["synthetic", "imagenet"]}}))
    assert "dataset 'imagenet' is unknown; allowed:" in message


def test_file_errors(tmp_path):
    with pytest.raises(SpecError, match="does not exist"):
        load_sweep(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("run: [unclosed\n")
    with pytest.raises(SpecError, match=r"broken.yaml: not valid YAML"):
        load_sweep(broken)
    listed = tmp_path / "listed.yaml"
    listed.write_text("- a\n- b\n")
    with pytest.raises(SpecError, match=r"listed.yaml: a search space is a mapping"):
        load_sweep(listed)


# -- expansion --------------------------------------------------------------------------------
def test_grid_expansion_counts_and_order():
    spec = parse_sweep(space(space={"seed": {"grid": [1, 2, 3]}, "lr": {"grid": [0.1, 0.01]}}))
    points = spec.expand().points
    assert len(points) == 6 == spec.trial_count()
    assert points[:2] == [{"seed": 1, "lr": 0.1}, {"seed": 1, "lr": 0.01}]
    assert spec.name == "sweep" and spec.varied_keys == ("seed", "lr")


def test_num_samples_repeats_the_grid_and_drawn_axes_stay_for_tune():
    spec = parse_sweep(
        space(
            space={
                "seed": {"grid": [1, 2]},
                "lr": {"loguniform": [0.001, 0.1]},
                "local_epochs": {"int": [1, 3]},
            },
            search={"num_samples": 3},
        )
    )
    points = spec.expand().points
    assert len(points) == 6 and all(set(p) == {"seed"} for p in points)
    table = spec.configurations()
    assert len(table) == 6 and table["lr"].iloc[0] == "loguniform(0.001, 0.1)"


def test_joint_axis_sets_several_keys_and_keeps_its_labels():
    spec = parse_sweep(
        space(
            space={
                "threat": {
                    "grid": [
                        {"attack": "none", "byzantine_fraction": 0.0},
                        {"attack": "label_flip", "byzantine_fraction": 0.2, "attack_strength": 2.0},
                    ]
                }
            }
        )
    )
    points = spec.expand().points
    assert [p["threat"] for p in points] == [
        "attack=none,byzantine_fraction=0",
        "attack=label_flip,byzantine_fraction=0.2,attack_strength=2",
    ]
    resolved = spec.resolve(points[1])
    assert resolved["attack"] == "label_flip" and resolved["byzantine_fraction"] == 0.2
    assert spec.run_spec(points[1]).n_byzantine == 2
    assert spec.varied_keys == ("attack", "byzantine_fraction", "attack_strength")
    assert list(spec.configurations().columns) == [
        "attack",
        "byzantine_fraction",
        "attack_strength",
    ]


# -- constraints ------------------------------------------------------------------------------
def test_clean_attack_only_without_byzantine_clients():
    grid = {
        "attack": {"grid": ["none", "label_flip"]},
        "byzantine_fraction": {"grid": [0.0, 0.2, 0.3]},
    }
    expansion = parse_sweep(space(space=grid)).expand()
    kept = [(p["attack"], p["byzantine_fraction"]) for p in expansion.points]
    assert kept == [("none", 0.0), ("label_flip", 0.2), ("label_flip", 0.3)]
    assert expansion.combinations == 6 and expansion.dropped_total == 3
    assert expansion.dropped == {
        "attack none with Byzantine clients (attack_matches_byzantine)": 2,
        "an attack without Byzantine clients (attack_matches_byzantine)": 1,
    }


def test_constraints_can_be_turned_off_and_extended():
    grid = {"attack": {"grid": ["none", "label_flip"]}, "byzantine_fraction": {"grid": [0.0, 0.2]}}
    loose = parse_sweep(space(space=grid, constraints={"attack_matches_byzantine": False})).expand()
    assert len(loose.points) == 4
    grid["seed"] = {"grid": [1, 2]}
    dropped = parse_sweep(
        space(space=grid, constraints={"drop": [{"attack": "label_flip", "seed": [2]}]})
    ).expand()
    assert len(dropped.points) == 3  # none@0 x 2 seeds + label_flip@0.2 x seed 1
    assert dropped.dropped["constraints.drop attack=label_flip, seed=2"] == 1


def test_invalid_combinations_error_or_drop():
    grid = {"clients": {"grid": [2, 10]}, "sample_size": {"grid": [5]}}
    assert "sample_size must be in [1, clients=2]" in error_of(space(space=grid))
    expansion = parse_sweep(space(space=grid, constraints={"invalid": "drop"})).expand()
    assert [p["clients"] for p in expansion.points] == [10]
    assert expansion.dropped_total == 1


def test_duplicate_runs_are_dropped():
    # participation 0.5 is the default: both joint values give the same RunSpec.
    spec = parse_sweep(
        space(space={"threat": {"grid": [{"seed": 1}, {"seed": 1, "participation": 0.5}]}})
    )
    assert len(spec.expand().points) == 1
    assert spec.expand().dropped == {"same RunSpec as an earlier combination": 1}


def test_everything_dropped_is_an_error():
    message = error_of(space(space={"attack": {"grid": ["label_flip"]}}))
    assert "every combination of the grid was dropped" in message


def test_drawn_axis_must_stay_inside_the_constraints():
    message = error_of(
        space(
            run={**BASE, "attack": "label_flip"},
            space={"byzantine_fraction": {"uniform": [0.0, 0.3]}},
        )
    )
    assert "space.byzantine_fraction can draw 0" in message and "joint axis" in message


# -- optuna -----------------------------------------------------------------------------------
def test_optuna_space_is_checked_over_its_reach():
    ok = parse_sweep(
        space(
            run={**BASE, "attack": "label_flip", "byzantine_fraction": 0.2},
            space={
                "lr": {"loguniform": [0.001, 0.1]},
                "seed": {"grid": [1, 2]},
                "local_epochs": {"int": [1, 3]},
            },
            search={"algorithm": "optuna", "num_samples": 5},
        )
    )
    assert ok.trial_count() == 5 and ok.search.sampler == "tpe" and ok.search.seed == 0
    assert list(ok.configurations().index) == ["lr", "seed", "local_epochs"]

    reach = error_of(
        space(
            space={
                "attack": {"choice": ["none", "label_flip"]},
                "byzantine_fraction": {"uniform": [0.1, 0.3]},
            },
            search={"algorithm": "optuna"},
        )
    )
    assert "optuna space can propose attack=none" in reach and "joint axis" in reach
    invalid = error_of(
        space(space={"participation": {"uniform": [0.5, 1.5]}}, search={"algorithm": "optuna"})
    )
    assert "participation must be a number in (0, 1]" in invalid
    assert "constraints.drop needs search.algorithm grid" in error_of(
        space(
            space={"lr": {"uniform": [0.01, 0.1]}},
            search={"algorithm": "optuna"},
            constraints={"drop": [{"seed": 1}]},
        )
    )


def test_multi_objective_modes_default_by_metric():
    spec = parse_sweep(
        space(
            space={"lr": {"uniform": [0.01, 0.1]}},
            search={"algorithm": "optuna", "sampler": "nsga2", "metric": ["accuracy", "loss"]},
        )
    )
    assert spec.search.modes == ("max", "min") and spec.search.multi_objective


def test_overrides_are_validated_like_the_file():
    spec = parse_sweep(space(space={"seed": {"grid": [1, 2]}}), name="base")
    changed = spec.with_overrides(
        name="other", num_samples=2, max_concurrent=1, cpu=0.5, run={"rounds": 3}
    )
    assert (changed.name, changed.search.num_samples, changed.max_concurrent) == ("other", 2, 1)
    assert (
        changed.resources.cpu == 0.5 and changed.run["rounds"] == 3 and changed.trial_count() == 4
    )
    with pytest.raises(SpecError, match=r"resources.gpu"):
        spec.with_overrides(gpu=-1)


# -- the shipped spaces -----------------------------------------------------------------------
def test_paper_grid_is_448_trials():
    spec = load_sweep(SPACES / "paper_grid.yaml")
    expansion = spec.expand()
    assert len(expansion.points) == 448 and expansion.dropped_total == 0
    table = spec.configurations()
    assert len(table) == 448
    assert table.groupby("method").size().to_dict() == dict.fromkeys(
        ("fedavg", "median", "krum", "bulyan", "fltrust", "swb", "swb_dm"), 64
    )
    pairings = table[["attack", "byzantine_fraction"]].drop_duplicates()
    assert len(pairings) == 16 and set(pairings[pairings.attack == "none"].byzantine_fraction) == {
        0.0
    }
    # ALIE and IPM as the study's code ran them, over the round's sample
    assert set(table.attack) == {
        "none",
        "label_flip",
        "sign_flip",
        "gaussian",
        "alie_swbdm",
        "ipm_swbdm",
    }
    assert {spec.run_spec(p).attack_scope for p in expansion.points} == {"sample"}
    bulyan = table[(table.method == "bulyan") & (table.participation == 0.5)]
    assert set(bulyan.sample_size) == {11} and len(bulyan) == 32
    assert table[table.method != "bulyan"].sample_size.isna().all()
    assert set(table.participation) == {0.5, 0.1} and set(table.seed) == {42, 7}
    spec_for_one = spec.run_spec(expansion.points[0])
    assert (spec_for_one.dataset, spec_for_one.clients, spec_for_one.rounds) == ("cifar10", 20, 10)


# tune_defence.yaml is a robust-tuning study, not a sweep (tests/test_robust_tuning.py loads it)
@pytest.mark.parametrize(
    ("name", "trials"), [("quickstart", 60), ("demoa", 420), ("demoa_ablations", 204)]
)
def test_shipped_spaces_load(name, trials):
    spec = load_sweep(SPACES / f"{name}.yaml")
    assert spec.name == name and spec.trial_count() == trials
    lines = (SPACES / f"{name}.yaml").read_text().splitlines()
    header = " ".join(line for line in lines[: lines.index("#")] if line.startswith("#"))
    assert lines[0].startswith(f"# {name}.yaml: ") and header.endswith("?")  # the question asked


# A packaged space's comments say what it asks, what its keys mean and how to run it; what a run of
# it cost, on which machine and when, and what it found, belong to the docs and findings pages
# that are re-measured (issue 58), so no file keeps a figure nobody updates.
MEASUREMENT = re.compile(
    r"""
    \b\d+(?:\.\d+)?\ ?(?:ms|s|min|h)\b                      # a duration: 17 min, 2.0 s
  | \b(?:seconds?|minutes?|hours?)\b                        # or in words
  | \b20\d\d-\d\d\b                                         # a date
  | \b(?:wall|CPU\ time|run\ time|load\ average)\b          # how it was timed
  | \b(?:EPYC|Xeon|AVX\S*|laptop)\b|\b\d+-core\b|\bcores\b   # on what machine
  | (?<![=+]\ )\b\d{1,3}(?:,\d{3})*\ (?:runs|trials)\b      # what ran ("= N trials": a grid's size)
  | \b(?:[Mm]easured|took)\b                                # a measurement's own words
""",
    re.X,
)


@pytest.mark.parametrize(
    "line",
    [
        "# 17 min 51 s wall, 34.4 min of run time",
        "# (about 1 minute here)",
        "# today (2026-12-06)",
        "# measured on the 2-core machine",
        "# on the AVX-512 Xeon",
        "# 2,937 runs in 477 points",
        "# 36 of them took 19 min 51 s",
        "# 238 runs, 76 min in process",
    ],
)
def test_the_measurement_pattern_finds_a_measurement(line):
    assert MEASUREMENT.search(line)


@pytest.mark.parametrize(
    "line",
    [
        "# 7 methods x 5 attacks x 2 rates x 2 splits x 3 seeds = 420 runs",
        "# 5 rounds of 1 local epoch",
        "# rounds >= ceil(2.5 / p): 25 at p = 0.1",
        "# alpha = min{1, c L eta / p}",
        "#   python analysis/findings/grid_in_process.py SPACE DIR --shard 0/2   # a shard per core",
    ],
)
def test_the_measurement_pattern_leaves_what_a_file_asks(line):
    assert not MEASUREMENT.search(line)


@pytest.mark.parametrize(
    "path", sorted(SPACES.rglob("*.yaml")), ids=lambda p: p.relative_to(SPACES).as_posix()
)
def test_packaged_spaces_state_no_measurement(path):
    stated = [
        f"{path.name}:{number}: {line.strip()}"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "#" in line and MEASUREMENT.search(line[line.index("#") :])
    ]
    assert not stated, "a measurement belongs in the docs, not in a space:\n" + "\n".join(stated)


def test_demoa_space_matches_the_paper_setting():
    spec = load_sweep(SPACES / "demoa.yaml")
    runs = [spec.run_spec(p) for p in spec.expand().points]
    assert len(runs) == 7 * 5 * 2 * 2 * 3
    assert {(r.clients, r.byzantine_fraction, r.participation_mode, r.model) for r in runs} == {
        (25, 0.2, "bernoulli", "mlp")
    }
    # methods labelled by what ran: (label, algorithm, rule), CCLIP for every baseline
    assert {(r.method, r.algorithm, r.aggregator) for r in runs} == {
        ("fedsgd+cclip", "fedsgd", "cclip"),
        ("fedavgm+cclip", "fedavgm", "cclip"),
        ("byz_vr_marina_pp", "byz_vr_marina_pp", "cclip"),
        ("demoa+median", "demoa", "median"),
        ("demoa+krum", "demoa", "krum"),
        ("demoa+geometric_median", "demoa", "geometric_median"),
        ("demoa", "demoa", "cclip"),
    }
    assert {r.aggregate_weights for r in runs} == {"uniform"}
    # as DeMoA's comparison ran: MARINA's eq. (10) on momentum, CCLIP at its inputs' scale, one
    # attacker for every method (ALIE's n and f the population's)
    assert {r.marina_variant for r in runs if r.algorithm == "byz_vr_marina_pp"} == {
        "clipped_momentum"
    }
    assert {(r.cclip_scale, r.cclip_tau) for r in runs} == {("median_distance", 2.0)}
    assert {r.attack_scope for r in runs} == {"population"}
    assert {r.attack for r in runs} == {"alie", "bit_flip", "ipm", "label_flip", "mimic"}
    assert {r.participation for r in runs} == {0.1, 0.5}
    # Theorem 3.1's coupling: alpha p is the same at both rates
    assert {round(r.demoa_alpha * r.participation, 12) for r in runs} == {0.05}
    assert {r.dirichlet_alpha for r in runs} == {math.inf, 0.5}  # IID and non-IID
    assert {r.seed for r in runs} == {1, 2, 3}
    # every cell once per seed
    cells = Counter((r.method, r.attack, r.participation, r.dirichlet_alpha) for r in runs)
    assert len(cells) == 140 and set(cells.values()) == {3}


def test_demoa_ablations_are_the_papers_three_arms():
    spec = load_sweep(SPACES / "demoa_ablations.yaml")
    runs = [spec.run_spec(p) for p in spec.expand().points]
    clean = [r for r in runs if r.byzantine_fraction == 0]
    # delta = 0 with plain averaging, at p = 0.5, every method, the baselines as demoa.yaml runs
    # them: FedAvgM (not the client-momentum fedcm) and MARINA's eq. (10), all at eta 0.2
    assert {(r.method, r.aggregator, r.attack, r.participation) for r in clean} == {
        (m, "mean", "none", 0.5)
        for m in ("fedsgd", "fedavgm", "byz_vr_marina_pp+mean", "demoa+mean")
    }
    assert len(clean) == 4 * 2 * 3
    assert {r.marina_variant for r in clean if r.algorithm == "byz_vr_marina_pp"} == {
        "clipped_momentum"
    }
    assert {r.server_lr for r in runs} == {0.2}
    assert {r.attack_scope for r in runs} == {"population"}
    attacked = [r for r in runs if r.byzantine_fraction > 0]
    assert {(r.method, r.aggregator) for r in attacked} == {("demoa", "cclip")}
    assert Counter(r.demoa_ablation for r in attacked) == {
        "none": 60,
        "coefficient_swap": 60,
        "no_decay": 60,
    }
    assert {r.attack for r in attacked} == {"alie", "bit_flip", "ipm", "label_flip", "mimic"}
    assert {round(r.demoa_alpha * r.participation, 12) for r in runs} == {0.05}


def test_dry_run_prints_count_and_table_without_importing_ray():
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from robusttune.commands.sweep import sweep_command\n"
        "status = sweep_command(Path('search_spaces/paper_grid.yaml'), dry_run=True)\n"
        "assert status == 0\n"
        "assert 'ray' not in sys.modules, 'dry run imported ray'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("paper_grid: 448 trials (grid of 448 combinations, 0 dropped)")
    assert "(dry run: Ray not started)" in lines[-1]
    assert sum(1 for line in lines if line.split()[:1] and line.split()[0].isdigit()) == 448


def test_stored_sweep_round_trips():
    spec = parse_sweep(
        space(
            space={
                "threat": {"grid": [{"attack": "none", "byzantine_fraction": 0.0}]},
                "seed": {"grid": [1, 2]},
            }
        ),
        name="rt",
    )
    again = parse_sweep(yaml.safe_load(yaml.safe_dump(spec.raw, sort_keys=False)), name="rt")
    assert again == spec and again.expand().points == spec.expand().points


# -- the command line -------------------------------------------------------------------------
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path):
    from typer.testing import CliRunner

    from robusttune.commands.cli import app

    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump({"run": BASE, "search": {"algorithm": "optuna", "sampler": "anneal"}})
    )
    result = CliRunner().invoke(app, ["sweep", str(bad), "--dry-run"])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines == [
        "error: bad.yaml: search.sampler must be one of tpe, gp, nsga2, cmaes; got 'anneal'"
    ]
    result = CliRunner().invoke(app, ["sweep", str(tmp_path / "none.yaml")])
    assert result.exit_code == 2 and "does not exist" in result.output
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump({"run": BASE}))
    result = CliRunner().invoke(app, ["sweep", str(good), "--set", "speed=3"])
    assert result.exit_code == 2 and "unknown RunSpec key 'speed'" in result.output


def test_cli_dry_run_with_overrides(tmp_path):
    from typer.testing import CliRunner

    from robusttune.commands.cli import app

    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump({"run": BASE, "space": {"seed": {"grid": [1, 2, 3]}}}))
    result = CliRunner().invoke(
        app,
        [
            "sweep",
            str(good),
            "--dry-run",
            "--num-samples",
            "2",
            "--name",
            "renamed",
            "--set",
            "rounds=3",
        ],
    )
    assert result.exit_code == 0, result.output
    assert result.output.startswith("renamed: 6 trials (grid of 6 combinations, 0 dropped)")
    assert "(dry run: Ray not started)" in result.output


def test_command_line_flags_are_validated_with_the_file_not_after_it(tmp_path):
    # a file that is wrong alone (cuda with gpu 0) is settled by a flag; a bad flag is named as
    # typed; a file error is still one line naming the file
    from typer.testing import CliRunner

    from robusttune.commands.cli import app

    path = tmp_path / "cuda.yaml"
    path.write_text(yaml.safe_dump({"run": {**BASE, "device": "cuda"}, "resources": {"gpu": 0}}))

    def dry(*flags: str):
        return CliRunner().invoke(app, ["sweep", str(path), "--dry-run", *flags])

    alone = dry()
    assert alone.exit_code == 2 and alone.output.strip() == (
        "error: cuda.yaml: run.device cuda needs resources.gpu > 0; allowed: gpu auto or above 0, "
        "or device auto or cpu without a GPU"
    )
    for flags, shown in (
        (["--gpus-per-trial", "auto"], "gpu auto"),
        (["--gpus-per-trial", "0.5"], "gpu 0.5"),
        (["--set", "device=cpu"], "gpu 0"),
    ):
        settled = dry(*flags)
        assert settled.exit_code == 0, (flags, settled.output)
        assert f"resources per trial: cpu 1, {shown};" in settled.output
    bad = dry("--gpus-per-trial", "half", "--set", "rounds=2")
    assert bad.exit_code == 2 and bad.output.strip().startswith(
        "error: cuda.yaml with --gpus-per-trial half --set rounds=2: resources.gpu must be auto or"
    )


def test_nothing_outside_the_sweep_package_imports_ray():
    package = ROOT / "robusttune"
    offenders = [
        str(p.relative_to(package))
        for p in package.rglob("*.py")
        if "sweep" not in p.relative_to(package).parts
        and any(
            line.strip().startswith(("import ray", "from ray"))
            for line in p.read_text().splitlines()
        )
    ]
    assert offenders == []
