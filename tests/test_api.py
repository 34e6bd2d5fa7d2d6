"""The Python API (robusttune.commands.api): the commands as functions, with the CLI's inputs and
its code path, returning typed results and pandas tables; bad input raises the one-line
SpecError instead of exiting."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import robusttune
from robusttune.core.records import ROUND_COLUMNS, RunSummary
from robusttune.core.registries import AGGREGATORS, ATTACKS
from robusttune.core.registry import SpecError
from robusttune.experiments.breakdown.report import BREAKDOWN_COLUMNS, POINTS_COLUMNS, SEEDS_COLUMNS
from robusttune.reports.catalogue import CONCEPTS
from robusttune.reports.tuning import RESULT_COLUMN_DOCS

TINY = {
    "dataset": "digits",
    "model": "mlp",
    "clients": 10,
    "rounds": 2,
    "local_epochs": 1,
    "train_samples": 300,
    "eval_every": 2,
    "checkpoint_every": 0,
}


def test_importing_robusttune_stays_light_and_names_the_functions():
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, robusttune; "
            "print(sorted(m for m in ('torch', 'ray') if m in sys.modules)); "
            "print(callable(robusttune.breakdown))",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.stdout.split("\n")[:2] == ["[]", "True"], done.stderr


def test_run_returns_its_summary_and_rounds_and_raises_bad_input(tmp_path):
    result = robusttune.run(
        TINY, method="median", attack="sign_flip", byzantine_fraction=0.2, out=tmp_path / "run"
    )
    assert result.folder == tmp_path / "run" and (result.folder / "summary.json").exists()
    assert result.summary.spec["method"] == "median" and result.summary.rounds_run == 2
    assert list(result.rounds["round"]) == [1, 2]
    assert list(result.rounds.columns) == list(ROUND_COLUMNS)
    written = set(json.loads((result.folder / "summary.json").read_text()))
    assert written <= set(RunSummary.KEYS) == {f.name for f in dataclasses.fields(RunSummary)}
    assert math.isclose(result.rounds["accuracy"].iloc[-1], result.summary.final_accuracy)
    with pytest.raises(SpecError, match=r"^unknown RunSpec key 'roundz'; allowed keys: "):
        robusttune.run(TINY, roundz=3)
    with pytest.raises(SpecError, match=r"^option 'bogus' is unknown; allowed: "):
        robusttune.breakdown({"run": TINY}, bogus=1)


def test_breakdown_and_report_from_a_dict_in_process(tmp_path):
    space = {
        "name": "api_map",
        "run": TINY,
        "space": {"method": {"grid": ["median", "fedavg"]}, "participation": {"grid": [1.0]}},
        "breakdown": {
            "adversary": {"attack": ["sign_flip"], "attack_strength": [10.0]},
            "max_fraction": 0.3,
            "verify_radius": 0,
        },
    }
    result = robusttune.breakdown(space, storage=str(tmp_path), local=True)
    assert result.folder == tmp_path / "api_map" and result.report.exists()
    assert set(result.table["method"]) == {"median", "fedavg"}
    assert result.table.equals(pd.read_csv(tmp_path / "api_map" / "breakdown.csv"))
    assert set(result.points["method"]) == {"median", "fedavg"}
    assert set(result.table["breakdown_fraction"]) <= {0.0, 0.1, 0.2, 0.3}
    # the reference documents every column the files have (beside the cell's own axes)
    axes = ["method", "participation"]
    assert list(result.table.columns) == axes + list(BREAKDOWN_COLUMNS)
    assert list(result.points.columns) == axes + list(POINTS_COLUMNS)
    assert list(result.seeds.columns) == axes + list(SEEDS_COLUMNS)
    report = robusttune.report(result.folder)
    assert report.path.exists() and set(report.runs["method"]) == {"median", "fedavg"}


def test_calibrate_gives_what_the_command_prints(tmp_path):
    deployment = {"clients": 20, "participation": 0.5, "byzantine": 0.2, "rounds": 10}
    result = robusttune.calibrate(**deployment, analytic_only=True, trim=[0.25, 0.3])
    printed = subprocess.run(
        [
            sys.executable,
            "-m",
            "robusttune.commands.cli",
            "calibrate",
            "--clients",
            "20",
            "--participation",
            "0.5",
            "--byzantine",
            "0.2",
            "--rounds",
            "10",
            "--analytic-only",
            "--trim",
            "0.25",
            "--trim",
            "0.3",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert printed.returncode == 0, printed.stderr
    assert json.loads(printed.stdout) == json.loads(json.dumps(result.figures))
    assert result.recommended_trim_ratio is None and result.sweep.empty


def test_catalogue_lists_every_registered_entry_once():
    table = robusttune.catalogue()
    assert list(table.columns) == ["concept", "name", "source", "summary"]
    assert set(table["concept"]) == set(CONCEPTS)
    rules = table[table["concept"] == "aggregator"]
    assert list(rules["name"]) == AGGREGATORS.names() and (rules["source"] == "built-in").all()
    assert list(robusttune.catalogue("attack")["name"]) == ATTACKS.names()
    krum = rules.set_index("name").loc["krum", "summary"]
    assert krum == "Krum (Blanchard et al., NeurIPS 2017)"
    with pytest.raises(SpecError, match=r"^concept 'rules' is unknown; allowed: aggregator"):
        robusttune.catalogue("rules")


def test_tune_in_process_returns_its_proposals(tmp_path):
    study = {
        "name": "api_tune",
        "run": {**TINY, "method": "trimmed_mean", "byzantine_fraction": 0.2},
        "space": {"trim_ratio": {"uniform": [0.2, 0.45]}},
        "tuning": {
            "num_samples": 2,
            "batch": 1,
            "seed": 1,
            "adversary": {"attack": ["sign_flip"], "attack_strength": [10.0]},
        },
    }
    result = robusttune.tune(study, storage=str(tmp_path), local=True)
    assert result.folder == tmp_path / "api_tune" and result.report.exists()
    assert len(result.table) == 2 and result.table["trim_ratio"].between(0.2, 0.45).all()
    assert sorted(result.table.columns) == sorted([*RESULT_COLUMN_DOCS, "trim_ratio"])


def test_sweep_through_ray_returns_its_trials(tmp_path, ray_session):
    space = {"name": "api_sweep", "run": TINY, "space": {"method": {"grid": ["median", "fedavg"]}}}
    result = robusttune.sweep(space, storage=str(tmp_path))
    assert result.status == 0 and result.folder == tmp_path / "api_sweep"
    assert sorted(result.trials["method"]) == ["fedavg", "median"]
    assert Path(result.folder, "sweep.yaml").exists()
