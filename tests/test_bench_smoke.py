"""Every script under bench/ runs end to end at toy sizes, so none rots between the rare times its
numbers are measured: each runs in its tiny mode (``--tiny``, or ``--quick`` where that is
already a few seconds) as a fresh process, exits 0 and ends with its headline line
``<figure>: <number>``. A bench script without an entry here fails `test_every_bench_script_is_run`.

The Ray benches (cluster.py, sweep.py, map_throughput.py, tune_floor.py) start Ray clusters of
their own in their subprocesses, each with a private Ray temp dir and no RAY_ADDRESS, so they
never join the session's Ray (tests/conftest.py) or each other's."""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# script -> the flags of its smoke run (measured on the 2-core shared machine, under load:
# about 2-30 s each)
SMOKE = {
    "aggregators.py": ["--tiny"],
    "breakdown.py": ["--tiny"],
    "cluster.py": ["--tiny"],
    "map_throughput.py": ["--tiny"],
    "numerics.py": ["--tiny"],
    "rule_aware_attacks.py": ["--quick"],
    "seeds.py": ["--tiny"],
    "swb_rotation_accuracy.py": ["--tiny"],
    "sweep.py": ["--tiny"],
    "training.py": ["--tiny"],
    "tune_floor.py": ["--tiny"],
}
RAY_SCRIPTS = {"cluster.py", "sweep.py", "map_throughput.py", "tune_floor.py"}
# covered elsewhere: gpu.py and gpu_tune.py, bench/gpu.sh's two phases, by tests/test_gpu_bench.py;
# gpu_bundle.py (the GPU machine's wheels, not a bench) by tests/test_gpu_bundle.py;
# figure_lines.py (the output class those two share, not a bench) through them
NOT_HERE = {"gpu.py", "gpu_tune.py", "gpu_bundle.py", "figure_lines.py"}

# ``figure_name: 0.104``; numerics.py's headline, quoted in docs/explanations/numerics.md, is
# ``portable/native time: 1.16``, hence the optional "/part" and " part" of the name
HEADLINE = re.compile(r"^[a-z0-9_]+(/[a-z0-9_]+)?( [a-z0-9_]+)?: -?[0-9.]+(e[-+]?[0-9]+)?$")
TIMEOUT = 240  # seconds a smoke run may take before it counts as hung


def test_every_bench_script_is_run():
    scripts = {path.name for path in (ROOT / "bench").glob("*.py")}
    assert scripts - NOT_HERE == set(SMOKE), "a bench script needs a smoke entry in SMOKE"


@pytest.mark.parametrize("script", sorted(SMOKE))
def test_bench_runs_in_tiny_mode(script):
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    ray_tmp = None
    if script in RAY_SCRIPTS:
        # short path: Ray's socket paths under it must stay under the OS's 107 characters
        ray_tmp = tempfile.mkdtemp(prefix="rtb-", dir="/tmp")
        env["RAY_TMPDIR"] = ray_tmp
    try:
        out = subprocess.run(
            [sys.executable, f"bench/{script}", *SMOKE[script]],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
    finally:
        if ray_tmp is not None:
            shutil.rmtree(ray_tmp, ignore_errors=True)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    lines = out.stdout.strip().splitlines()
    assert lines, out.stderr[-4000:]
    assert HEADLINE.match(lines[-1]), lines[-5:]
    assert math.isfinite(float(lines[-1].rpartition(": ")[2])), lines[-1]
