"""Portable numerics (robusttune.core.numerics, issue 21): the same RunSpec gives the same bits on every
AVX2 x86-64 CPU.

The golden values below were recorded on an AMD EPYC (Zen, AVX2 and FMA, no AVX-512; MKL 2024.2
inside torch 2.14.1), checked there under every float path a machine can impose on the process
(ATen's default and avx2 kernels, MKL's AUTO branch, oneDNN capped at AVX2, two threads), and
reproduced bit for bit by the same binaries under QEMU 7.2's emulated Intel Haswell
(GenuineIntel, other cache sizes; `qemu-x86_64 -cpu Haswell python tests/test_numerics.py`); the
values before the validation split and CCLIP's relative radius were reproduced under QEMU's
Skylake-Client too. A portable run pins all of those itself, so this file must pass unchanged on
any such CPU: a failure here on a new machine is a float path the mode does not pin yet.

Each run goes in a fresh process: a process trains in one mode, fixed before torch computes."""

from __future__ import annotations

import ast
import json
import math
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from robusttune.core import numerics
from robusttune.core.numerics import environment, float_path, pin, pinned_mode
from robusttune.core.registry import SpecError
from robusttune.core.schema import NUMERICS_ENV, default_numerics

# (label, RunSpec keys): FedAvg-style runs of both digits models, a robust rule under attack and
# DeMoA, each a few seconds.
GOLDEN_RUNS = {
    "fedavg mlp": {"model": "mlp", "rounds": 2, "local_epochs": 2},
    "fedavg cnn2": {"model": "cnn2", "rounds": 1, "local_epochs": 1},
    "median mlp, ipm": {
        "model": "mlp",
        "method": "median",
        "attack": "ipm",
        "byzantine_fraction": 0.2,
        "rounds": 2,
        "local_epochs": 1,
    },
    "demoa+cclip mlp, alie": {
        "model": "mlp",
        "method": "demoa",
        "attack": "alie",
        "byzantine_fraction": 0.2,
        "rounds": 25,
    },
    # ALIE with z != 0 (5 sampled of 10, 2 Byzantine): sigma's last bits reach the model (issue 44)
    "median mlp, alie": {
        "model": "mlp",
        "method": "median",
        "attack": "alie",
        "byzantine_fraction": 0.2,
        "rounds": 3,
        "local_epochs": 1,
    },
}
BASE = {
    "dataset": "digits",
    "clients": 10,
    "participation": 0.5,
    "seed": 42,
    "checkpoint_every": 0,
    "device": "cpu",
}

# final (loss, parameter norm) per run in portable numerics, written down once (see above); the
# norms re-recorded when the parameter norm began to accumulate in float64 (issue 27: a float32 norm
# read inf for finite parameters), on an AVX-512 Xeon, the losses unchanged to the last bit
GOLDEN = {
    "fedavg mlp": (0.8267917209201389, 12.70079478533782),
    "fedavg cnn2": (2.2598214043511287, 9.005170489729185),
    "median mlp, ipm": (2.0368916829427084, 11.887326238611118),
    # re-recorded when CCLIP's default tau went 1 -> 2 (issue 24: tau 1 starved DeMoA at p = 0.1)
    "demoa+cclip mlp, alie": (2.1363343980577256, 11.775122437727891),
    # recorded on an AVX-512 Intel Xeon, where MKL's sqrt had moved it (issue 44), and reproduced
    # under QEMU 7.2's emulated AMD EPYC-Rome
    "median mlp, alie": (1.4321840074327257, 12.185337404505162),
}

# What another machine's defaults, or a user's shell, may put in front of a run.
FOREIGN_PATHS = {
    "another capability": {"ATEN_CPU_CAPABILITY": "default"},
    "MKL's per-CPU branch, oneDNN at AVX2, two threads": {
        "MKL_CBWR": "AUTO",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "OMP_NUM_THREADS": "2",
        "MKL_NUM_THREADS": "2",
    },
}
PINNED_KEYS = (
    "MKL_CBWR",
    "ATEN_CPU_CAPABILITY",
    "ONEDNN_MAX_CPU_ISA",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    NUMERICS_ENV,
)


def golden_runs(mode: str) -> dict[str, list[float]]:
    """Run GOLDEN_RUNS in this process in ``mode``; (final loss, parameter norm) per label."""
    from robusttune.core.runspec import RunSpec
    from robusttune.engine.simulation import simulate

    out = {}
    for label, keys in GOLDEN_RUNS.items():
        for record in simulate(RunSpec.from_dict({**BASE, **keys, "numerics": mode})):
            last = record
        out[label] = [last.loss, last.param_norm]
    return out


def _clean_environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in PINNED_KEYS}
    return {**env, **extra}


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def _golden_in_fresh_process(mode: str, env: dict[str, str]) -> dict[str, tuple[float, float]]:
    code = (
        f"import json, sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); "
        f"import test_numerics as t; print(json.dumps(t.golden_runs({mode!r})))"
    )
    done = _python(code, env)
    assert done.returncode == 0, done.stderr[-2000:]
    return {k: tuple(v) for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}


@pytest.fixture(scope="module")
def portable_here():
    return _golden_in_fresh_process("portable", _clean_environment())


# The golden bits are an x86-64 claim; elsewhere (aarch64: another BLAS, docs/explanations/numerics.md)
# a portable run is held to giving its own machine's bits whatever the process's environment.
X86_64 = environment("portable")["ATEN_CPU_CAPABILITY"] == "avx2"


def test_portable_runs_give_the_golden_bits(portable_here):
    expected = GOLDEN if X86_64 else _golden_in_fresh_process("portable", _clean_environment())
    assert portable_here == expected


@pytest.mark.parametrize("foreign", list(FOREIGN_PATHS), ids=list(FOREIGN_PATHS))
def test_portable_runs_override_a_foreign_float_path(foreign, portable_here):
    # the environment a process starts with does not reach a portable run's bits
    foreign_run = _golden_in_fresh_process("portable", _clean_environment(**FOREIGN_PATHS[foreign]))
    assert foreign_run == (GOLDEN if X86_64 else portable_here)


def test_the_golden_runs_see_the_float_path(portable_here):
    # not a vacuous comparison: natively, ATen's default kernels instead of AVX2 ones move the
    # bits (on x86-64; elsewhere `default` is what the machine runs anyway)
    native = _golden_in_fresh_process("native", _clean_environment(ATEN_CPU_CAPABILITY="default"))
    assert native.keys() == GOLDEN.keys()
    assert (
        (native != GOLDEN)
        if X86_64
        else (
            native
            == _golden_in_fresh_process("native", _clean_environment(ATEN_CPU_CAPABILITY="default"))
        )
    )


def test_the_alie_golden_run_sees_sigmas_last_bit(monkeypatch):
    # one ulp more in every sigma moves the recorded bits: the golden pins sigma's rounding
    import robusttune.methods.attacks.base as attack_base

    keys = {**BASE, **GOLDEN_RUNS["median mlp, alie"], "numerics": pinned_mode()}
    monkeypatch.setattr(
        attack_base,
        "sqrt",
        lambda t: torch.nextafter(numerics.sqrt(t), torch.tensor(math.inf, dtype=t.dtype)),
    )
    from robusttune.core.runspec import RunSpec
    from robusttune.engine.simulation import simulate

    for record in simulate(RunSpec.from_dict(keys)):
        last = record
    assert [last.loss, last.param_norm] != list(GOLDEN["median mlp, alie"])


def _float32(value: float) -> float:
    return struct.unpack("f", struct.pack("f", value))[0]


def _correctly_rounded_sqrt(x: torch.Tensor) -> torch.Tensor:
    """Python's math.sqrt (IEEE double, correctly rounded); for float32 rounded once more, which is
    exact for sqrt (53 >= 2 * 24 + 2 bits: double rounding is innocuous, Figueroa 1995)."""

    def root(v: float) -> float:
        if math.isnan(v) or v < 0:
            return math.nan
        return math.sqrt(v)

    values = [root(v) for v in x.tolist()]
    if x.dtype == torch.float32:
        values = [_float32(v) for v in values]
    return torch.tensor(values, dtype=x.dtype)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    nan = torch.isnan(a)
    return bool(torch.equal(nan, torch.isnan(b)) and torch.equal(a[~nan], b[~nan]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_portable_sqrt_is_correctly_rounded_on_random_and_tie_heavy_inputs(dtype):
    assert pinned_mode() == "portable"  # the suite's mode (tests/conftest.py)
    g = torch.Generator().manual_seed(44)
    wide = torch.rand(20_000, generator=g, dtype=dtype) * torch.pow(
        10.0, torch.randint(-30, 30, (20_000,), generator=g)
    ).to(dtype)
    exact_squares = torch.arange(1, 2_000, dtype=dtype).square()
    info = torch.finfo(dtype)
    specials = torch.tensor(
        [0.0, -0.0, info.tiny, info.tiny / 4, info.max, math.inf, -1.0, math.nan, 2.0, 0.5],
        dtype=dtype,
    )
    for x in (wide, exact_squares, specials, wide.view(100, 200).t()):  # the last non-contiguous
        assert _same_bits(numerics.sqrt(x).flatten(), _correctly_rounded_sqrt(x.flatten()))
    # ALIE's statistics over rows many of which are identical (sign-flipped or cached copies):
    # sums of equal terms, near-zero variances and exact zeros
    from robusttune.methods.attacks.base import mean_std

    row = torch.randn(5_000, generator=g, dtype=dtype)
    rows = torch.cat([row.repeat(7, 1), (row + 1e-3).repeat(2, 1), -row[None]])
    mu, sigma = mean_std(rows)
    variance = (rows - mu).square().sum(dim=0) / (rows.shape[0] - 1)
    assert _same_bits(sigma, _correctly_rounded_sqrt(variance))
    assert torch.equal(mean_std(row.repeat(4, 1))[1], torch.zeros_like(row))


def test_portable_sqrt_keeps_gradients_shapes_and_cuda():
    x = torch.tensor([[4.0, 2.0], [9.0, 0.25]], requires_grad=True)
    root = numerics.sqrt(x)
    assert root.shape == x.shape and root.dtype == x.dtype
    root.sum().backward()
    assert torch.allclose(x.grad, 0.5 / root.detach())
    assert torch.equal(
        numerics.sqrt(torch.tensor([4.0], dtype=torch.float16)),
        torch.tensor([2.0], dtype=torch.float16),
    )


# Calls that would reach an approximate MKL kernel (numerics.MKL_APPROXIMATE_OPERATIONS); `log`
# is approximate for float64 only, but no package code may guess a tensor's dtype.
_APPROXIMATE_CALLS = {
    "sqrt",
    "sqrt_",
    "acos",
    "acos_",
    "arccos",
    "asin",
    "asin_",
    "arcsin",
    "atan",
    "atan_",
    "arctan",
    "tan",
    "tan_",
    "log",
    "log_",
    "log10",
    "log10_",
    "log2",
    "log2_",
    "logsumexp",
    "cdist",
}
_SCALAR_MODULES = {"math", "np", "numpy", "cmath"}


def test_the_package_calls_no_approximate_mkl_operation_but_through_numerics():
    package = Path(numerics.__file__).parent
    offenders = []
    for path in sorted(package.rglob("*.py")):
        if path.name == "numerics.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            base = node.func.value
            if isinstance(base, ast.Name) and base.id in _SCALAR_MODULES:
                continue
            power_half = (
                node.func.attr in ("pow", "pow_")
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and node.args[0].value == 0.5
            )
            if node.func.attr in _APPROXIMATE_CALLS or power_half:
                offenders.append(f"{path.relative_to(package)}:{node.lineno} .{node.func.attr}(")
    assert offenders == [], (
        "use robusttune.core.numerics.sqrt (MKL's kernel is CPU-dependent): " + ", ".join(offenders)
    )


def test_the_vml_audit_finds_what_numerics_states(tmp_path):
    # analysis/vml_audit.py under gdb and objdump (make tools): which operations reach VML, which
    # kernels are approximate, and that a portable ALIE run reaches none of those
    findings = tmp_path / "audit.json"
    done = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).parents[1] / "analysis" / "vml_audit.py"),
            "--quick",
            "--json",
            str(findings),
        ],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "approximate_vml_kernels_reached_by_runs: 0"
    audit = json.loads(findings.read_text())
    reached = {op for op, entry in audit["operations"].items() if entry["reached"]}
    assert reached == set(numerics.MKL_VML_OPERATIONS)
    for dtype, ops in numerics.MKL_APPROXIMATE_OPERATIONS.items():
        found = {op for op, entry in audit["operations"].items() if dtype in entry["approximate"]}
        assert found == set(ops), dtype
    assert audit["runs"] == {"median under alie": []}


def test_portable_environment_pins_mkl_aten_onednn_and_threads():
    env = environment("portable")
    assert env["MKL_CBWR"] == "COMPATIBLE,STRICT"
    assert env["ATEN_CPU_CAPABILITY"] in ("avx2", "default")
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "1"
    assert environment("native") == {}
    with pytest.raises(SpecError, match="numerics must be one of native, portable; got 'fast'"):
        environment("fast")


def test_this_process_runs_the_float_path_it_was_pinned_to():
    path = float_path()
    assert path.mode == pinned_mode() == default_numerics()
    if path.mode == "portable":
        assert path.aten_capability.lower() == environment("portable")["ATEN_CPU_CAPABILITY"]
        assert path.threads == 1 and not path.mkldnn and not path.nnpack
        # the MKL adapter reaches torch's MKL wherever torch has one
        assert (path.mkl_branch == "compatible") == torch.backends.mkl.is_available()
    assert path.label().startswith(f"{path.mode}: aten ")


def test_a_process_that_computed_first_is_refused_portable_in_one_line():
    code = (
        "import torch; torch.ones(64, 64) @ torch.ones(64, 64); "
        "from robusttune.core.numerics import pin; pin('portable')"
    )
    done = _python(code, _clean_environment())
    if torch.backends.mkl.is_available():  # MKL's branch was fixed at the matmul: detectable
        assert done.returncode != 0
        last = done.stderr.strip().splitlines()[-1]
        assert "numerics portable:" in last and "computed in this process before" in last
    else:
        assert done.returncode == 0, done.stderr


def _summary_via_in_process_runner(first: str) -> list:
    code = (
        f"import json, sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); {first}; "
        "import test_numerics as t; from robusttune.core.runspec import RunSpec; "
        "from robusttune.core.numerics import pinned_mode; "
        "from robusttune.engine.runners import InProcessRunner; "
        "spec = RunSpec.from_dict({**t.BASE, **t.GOLDEN_RUNS['median mlp, alie'], "
        "'numerics': 'portable'}); s = InProcessRunner()([spec])[0]; "
        "print(json.dumps([s.final_loss, s.final_accuracy, s.error, pinned_mode()]))"
    )
    done = _python(code, _clean_environment())
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_process_that_computed_first_still_gets_portable_runs_from_the_runner():
    # a notebook or script that used torch before its first run (issue 44: bench/breakdown.py on
    # an AVX-512 Xeon): the in-process runner trains in a fresh worker process, same bits
    fresh = _summary_via_in_process_runner("pass")
    computed_first = _summary_via_in_process_runner(
        "import torch; torch.ones(64, 64) @ torch.ones(64, 64)"
    )
    assert fresh[-1] == "portable" and fresh[2] is None
    if torch.backends.mkl.is_available():  # the matmul fixed MKL's branch: the run went elsewhere
        assert computed_first[-1] is None
    assert computed_first[:3] == fresh[:3]


def test_a_process_keeps_its_mode():
    code = (
        "from robusttune.core.numerics import pin; pin('portable'); pin('portable'); pin('native')"
    )
    done = _python(code, _clean_environment())
    assert done.returncode != 0
    assert (
        "numerics native: this process already trains in portable numerics"
        in done.stderr.strip().splitlines()[-1]
    )
    with pytest.raises(SpecError, match="numerics must be one of"):
        pin("fast")


def test_the_default_mode_comes_from_the_environment_and_is_checked(monkeypatch):
    from robusttune.core.runspec import RunSpec

    monkeypatch.setenv(NUMERICS_ENV, "native")
    spec = RunSpec(dataset="digits")
    assert spec.numerics == "native" and "numerics" in spec.explicit  # carried to every worker
    monkeypatch.setenv(NUMERICS_ENV, "fast")
    with pytest.raises(
        SpecError, match=f"{NUMERICS_ENV} must be one of native, portable; got 'fast'"
    ):
        RunSpec(dataset="digits")
    monkeypatch.delenv(NUMERICS_ENV)
    assert RunSpec(dataset="digits").numerics == "portable"
    with pytest.raises(SpecError, match="numerics"):
        RunSpec(dataset="digits", numerics="fast")


def test_a_sweep_stores_its_mode_and_takes_one(monkeypatch):
    from robusttune.experiments.sweep.space import parse_sweep

    monkeypatch.setenv(NUMERICS_ENV, "native")
    space = {"run": {"dataset": "digits", "rounds": 1}, "space": {"seed": {"grid": [1, 2]}}}
    spec = parse_sweep(space)
    # written into the stored sweep: a resume, or a node with another default, keeps it
    assert spec.run["numerics"] == "native" and spec.raw["run"]["numerics"] == "native"
    assert (
        parse_sweep({**space, "run": {"dataset": "digits", "numerics": "portable"}}).run["numerics"]
        == "portable"
    )
    with pytest.raises(
        SpecError, match=r"space.numerics is an axis over numerics, which takes one value per sweep"
    ):
        parse_sweep({**space, "space": {"numerics": {"grid": ["native", "portable"]}}})


def test_summary_records_the_mode_and_the_float_path(tmp_path):
    from typer.testing import CliRunner

    from robusttune.commands.cli import app

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
            "rounds=1",
            "--set",
            "clients=4",
            "--set",
            "synthetic_samples=100",
            "--out",
            str(out),
            "--quiet",
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["spec"]["numerics"] == default_numerics()
    assert summary["float_path"] == float_path().label()


if __name__ == "__main__":  # print the golden values of this machine (to record them once)
    print(json.dumps(golden_runs(sys.argv[1] if len(sys.argv) > 1 else "portable"), indent=1))
