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


def test_the_seeds_bench_floor_counts_the_clean_point_the_survivor_and_one_failure():
    # bench/seeds.py's least_runs, on hand-made later seeds of a lattice of 10 (chance 0.1, clean
    # 0.9: the bar is 0.5): what a search that guessed b at once must still have run
    from scripts import loaded_script

    from robusttune.experiments.breakdown import Cell, Outcome
    from robusttune.experiments.breakdown.cell_search import CellResult

    def seed_with(outcomes: dict[int, tuple[float, int]], status: str, b: int) -> CellResult:
        result = CellResult(Cell.of(20, method="median"), 10, status=status, lo=b)
        result.outcomes = {k: Outcome(a, trials=t, chance=0.1) for k, (a, t) in outcomes.items()}
        return result

    with loaded_script(ROOT / "bench" / "seeds.py", "bench_seeds") as bench:
        edge = seed_with({0: (0.9, 1), 2: (0.8, 9), 3: (0.7, 9), 4: (0.2, 2)}, "ok", 3)
        assert bench.least_runs(edge) == 1 + 9 + 1  # the climb through 2 was the search's excess
        at_zero = seed_with({0: (0.9, 1), 1: (0.1, 1)}, "ok", 0)
        assert bench.least_runs(at_zero) == 1 + 1  # the clean point is the survivor
        on_top = seed_with({0: (0.9, 1), 9: (0.1, 1), 10: (0.8, 9)}, "survives_all", 10)
        assert bench.least_runs(on_top) == 1 + 9  # no failure above the lattice to find
        at_chance = seed_with({0: (0.15, 1), 1: (0.6, 9)}, "clean_at_chance", 0)
        assert bench.least_runs(at_chance) == 1
