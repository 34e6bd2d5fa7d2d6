"""The round loop: determinism, checkpoints, divergence as a result, records, the run command."""

from __future__ import annotations

import json
import math
import pickle

import pytest
import torch
from typer.testing import CliRunner

from robusttune.commands.cli import app
from robusttune.core.runspec import RunSpec
from robusttune.engine.simulation import Simulation, load_checkpoint, simulate

FAST = {
    "dataset": "synthetic",
    "model": "mlp",
    "clients": 8,
    "rounds": 3,
    "participation": 0.5,
    "local_epochs": 1,
    "synthetic_samples": 400,
}


def _records(spec):
    return [r.to_dict() for r in simulate(spec)]


def _same(a, b):
    """Equal records, NaN == NaN, timings ignored."""
    for ra, rb in zip(a, b, strict=True):
        for key in ra:
            if key.endswith("_seconds"):
                continue
            va, vb = ra[key], rb[key]
            if isinstance(va, float) and math.isnan(va):
                assert math.isnan(vb), key
            else:
                assert va == vb, key


@pytest.mark.parametrize(
    ("method", "attack"),
    [("fedavg", "none"), ("swb_dm", "alie"), ("demoa", "ipm"), ("fedcm", "sign_flip")],
)
def test_same_seed_same_records(method, attack):
    spec = RunSpec(**FAST, method=method, attack=attack, byzantine_fraction=0.25)
    _same(_records(spec), _records(spec))


def test_different_seed_differs():
    a = _records(RunSpec(**FAST, seed=1))
    b = _records(RunSpec(**FAST, seed=2))
    assert [r["accuracy"] for r in a] != [r["accuracy"] for r in b]


@pytest.mark.parametrize(
    "method", ["fedavg", "swb_dm", "demoa", "fedsgd", "fedcm_xu", "byz_vr_marina_pp"]
)
def test_restored_simulation_continues_bit_for_bit(method, tmp_path):
    spec = RunSpec(
        **{**FAST, "rounds": 4}, method=method, attack="gaussian", byzantine_fraction=0.25
    )
    whole = Simulation(spec)
    reference = [whole.step() for _ in range(4)]

    first = Simulation(spec)
    first.step(), first.step()
    path = tmp_path / "simulation.pt"
    torch.save(first.state_dict(), path)
    resumed = Simulation(spec)
    resumed.load_state_dict(load_checkpoint(path))  # weights_only: no unpickling of code
    rest = [resumed.step(), resumed.step()]
    _same([r.to_dict() for r in reference[2:]], [r.to_dict() for r in rest])
    assert torch.equal(resumed.params, whole.params)


class _RunsCode:
    def __reduce__(self):
        return (print, ("a checkpoint ran code",))


def test_a_checkpoint_that_would_run_code_is_refused(tmp_path, capsys):
    path = tmp_path / "simulation.pt"
    torch.save({"rounds_done": 1, "payload": _RunsCode()}, path)
    with pytest.raises(pickle.UnpicklingError):
        load_checkpoint(path)
    assert "ran code" not in capsys.readouterr().out


def test_divergence_is_a_collapsed_result_not_a_crash():
    spec = RunSpec(
        **{**FAST, "rounds": 5}, attack="gaussian", attack_strength=1e38, byzantine_fraction=0.5
    )
    records = _records(spec)
    assert records[-1]["collapsed"]
    assert records[-1]["nonfinite_params"] > 0
    assert len(records) <= 5


def test_finite_parameters_past_float32s_norm_range_get_a_finite_norm():
    # Gaussian messages of std 1e25 move every parameter to ~1e24: each one finite in float32,
    # their sum of squares (~1e51 in all) far past float32's 3.4e38. The recorded norm is the
    # float64 one; a float32 norm would read inf beside 0 non-finite parameters (issue 27).
    spec = RunSpec(
        **{**FAST, "rounds": 1}, attack="gaussian", attack_strength=1e25, byzantine_fraction=0.5
    )
    record = _records(spec)[-1]
    assert record["nonfinite_params"] == 0
    assert math.isfinite(record["param_norm"]) and record["param_norm"] > 1e20


def test_record_fields_describe_the_round():
    spec = RunSpec(**FAST, byzantine_fraction=0.25, attack="ipm", eval_every=2)
    records = _records(spec)
    first, second, last = records
    assert math.isnan(first["accuracy"]) and not math.isnan(second["accuracy"])
    assert not math.isnan(last["accuracy"])  # the last round is always evaluated
    assert all(r["sampled"] == 4 for r in records)
    for r in records:
        assert r["byzantine_input_share"] == pytest.approx(r["byzantine_sampled"] / r["sampled"])
        assert r["byzantine_majority"] == (
            r["byzantine_sampled"] * 2 >= r["sampled"] and r["byzantine_sampled"] > 0
        )
        assert r["f_assumed"] == math.floor(r["sampled"] * 0.25)


def test_bernoulli_sampling_varies_the_sample_size():
    spec = RunSpec(
        **{**FAST, "rounds": 6, "clients": 20, "participation": 0.3},
        participation_mode="bernoulli",
        method="demoa",
    )
    sizes = {r["sampled"] for r in _records(spec)}
    assert len(sizes) > 1


def test_guarded_refuses_a_round_whose_precondition_fails():
    # krum needs n > 2f + 2: n = 4 sampled, f = floor(4 * 0.5) = 2 fails.
    base = dict(FAST, method="krum", byzantine_fraction=0.5, attack="sign_flip")
    guarded = _records(RunSpec(**base, guarded=True))
    assert all(not r["precondition_held_assumed"] and not r["aggregated"] for r in guarded)
    unguarded = _records(RunSpec(**base, guarded=False))
    assert all(r["aggregated"] for r in unguarded)


def test_run_command_writes_the_run_folder(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(
        app,
        [
            "run",
            "--set",
            "dataset=synthetic",
            "--set",
            "model=mlp",
            "--set",
            "rounds=2",
            "--set",
            "clients=4",
            "--set",
            "synthetic_samples=200",
            "--out",
            str(out),
            "--quiet",
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds_run"] == 2 and summary["spec"]["dataset"] == "synthetic"
    assert {
        "final_accuracy",
        "final_loss",
        "collapsed",
        "byzantine_majority_rounds",
        "seconds",
    } <= set(summary)
    rows = (out / "rounds.csv").read_text().splitlines()
    assert len(rows) == 3 and rows[0].startswith("round,accuracy")
    assert any(p.name.startswith("events.out.tfevents") for p in out.iterdir())


@pytest.mark.parametrize(
    "assignment", ["participation=1.5", "aggregator=krumm", "colour=red", "rounds=ten", "clients"]
)
def test_run_command_bad_set_exits_2_with_one_line(tmp_path, assignment):
    out = tmp_path / "bad"
    result = CliRunner().invoke(app, ["run", "--set", assignment, "--out", str(out)])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:")
    assert not out.exists()  # no half-written run folder


def test_missing_dataset_is_one_line_and_no_folder(tmp_path):
    out = tmp_path / "cifar"
    result = CliRunner().invoke(
        app,
        [
            "run",
            "--set",
            "dataset=cifar10",
            "--set",
            f"data_root={tmp_path / 'nothing'}",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 2 and "cifar-10-batches-py" in result.output
    assert not out.exists()


def test_first_fixed_sample_is_not_the_byzantine_set():
    # The Byzantine permutation has its own stream: seeded like the sampler, round 1 used to
    # sample exactly the B Byzantine clients first (here 5 of 5 in every seed).
    counts = []
    for seed in range(6):
        spec = RunSpec(
            **{**FAST, "clients": 20, "participation": 0.25, "rounds": 1, "seed": seed},
            byzantine_fraction=0.3,
            attack="sign_flip",
        )
        counts.append(Simulation(spec).step().byzantine_sampled)
    assert counts != [5] * 6


@pytest.mark.parametrize(
    ("method", "participation", "seed"), [("demoa", 0.5, 9), ("fedsgd", 0.5, 13), ("demoa", 0.1, 1)]
)
def test_replayed_majority_rounds_are_the_rounds_a_run_records(method, participation, seed):
    """`byzantine_majority_rounds` replays the sampling stream without training; the run's own
    records (2 b_t >= |S_t|, b_t >= 1) must flag exactly those rounds, whatever the method."""
    from robusttune.problem.sampling import byzantine_majority_rounds

    spec = RunSpec(
        **{
            **FAST,
            "clients": 25,
            "byzantine_fraction": 0.2,
            "rounds": 12,
            "participation_mode": "bernoulli",
            "participation": participation,
            "method": method,
            "attack": "ipm",
            "seed": seed,
        }
    )
    recorded = [r.round for r in simulate(spec) if r.byzantine_majority]
    assert recorded, "no Byzantine-majority round in 12: pick another seed"
    assert byzantine_majority_rounds(spec) == recorded
