"""The GPU machine's bundle (bench/gpu_bundle.py), proved here so that a trim that breaks Tune
fails on this machine and not on the rare GPU one: the pins are this environment's versions and
cover what the GPU machine lacks, the trim leaves in every module the mission imports, a packed
wheel is a valid wheel, and the same trim of this Python's installed Ray (cp311, no network),
installed with ``--no-index`` into a fresh virtual environment the way bench/gpu.sh installs the
bundle there, runs a small sweep and a small breakdown map through Ray.

How the fresh environment sees the project's other dependencies without a second Ray: its
site-packages holds one ``.pth`` file naming this .venv's site-packages, so those come after the
fresh environment's own paths on ``sys.path``, and the trimmed Ray (``pip install --target``)
goes first through PYTHONPATH, as on the GPU machine. ``ray`` is a regular package (it has an
``__init__.py``), so once the first copy is imported every ``ray.*`` submodule resolves inside
that copy alone: a part the trim removed cannot be picked up from the .venv's full Ray, and
``import ray.rllib`` fails there (checked). Ray's worker processes inherit PYTHONPATH, so trials
run on the trimmed copy too."""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.metadata as metadata
import io
import json
import os
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import gpu_bundle  # noqa: E402  (bench/gpu_bundle.py)


def normal(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


# -- the pins ----------------------------------------------------------------------------------


def test_one_pin_per_package_at_the_tested_version():
    # the versions come from constraints.txt, which tests/test_dependencies.py holds this
    # environment to: the GPU machine gets what the tests ran
    names = [normal(pin.name) for pin in gpu_bundle.PINNED]
    assert len(names) == len(set(names))
    for pin in gpu_bundle.PINNED:
        assert pin.version == metadata.version(pin.name), pin.name
    assert gpu_bundle.constraint_versions()["ray"] == metadata.version("ray")


def requirement_closure(root: str, extras: tuple[str, ...] = ()) -> dict[str, set[str]]:
    """Every distribution the installed ``root`` needs at run time (with ``extras``), each with
    the distributions that asked for it; a GPU-machine distribution's own needs are not followed
    (it is installed there with them)."""
    needed: dict[str, set[str]] = {}
    stack = [(root, extras)]
    while stack:
        name, wanted = stack.pop()
        for text in metadata.requires(name) or []:
            requirement = Requirement(text)
            environments = [{"extra": extra} for extra in ("", *wanted)]
            if requirement.marker and not any(requirement.marker.evaluate(e) for e in environments):
                continue
            key = normal(requirement.name)
            first = key not in needed
            needed.setdefault(key, set()).add(normal(name))
            if first and key not in gpu_bundle.GPU_MACHINE_HAS | gpu_bundle.NOT_NEEDED_THERE:
                stack.append((requirement.name, tuple(requirement.extras)))
    return needed


def test_the_pins_are_what_the_gpu_machine_lacks_and_no_more():
    needed = requirement_closure("robusttune")
    pinned = {normal(pin.name) for pin in gpu_bundle.PINNED}
    covered = pinned | gpu_bundle.GPU_MACHINE_HAS | gpu_bundle.NOT_NEEDED_THERE
    missing = {name: sorted(by) for name, by in needed.items() if name not in covered}
    assert missing == {}  # a dependency neither pinned nor on the GPU machine
    assert pinned <= set(needed)  # every pin is needed by the project, directly or not
    assert {"ray", "optuna", "pydantic", "tensorboardx"} <= pinned


# -- the trim ----------------------------------------------------------------------------------


def test_trimmed_paths_and_kept_paths():
    assert gpu_bundle.trimmed_because("ray/rllib/__init__.py")
    assert gpu_bundle.trimmed_because("ray/jars/ray_dist.jar")
    assert gpu_bundle.trimmed_because("ray/dashboard/client/build/index.html")
    assert gpu_bundle.trimmed_because("ray/tune/tests/test_api.py")
    assert gpu_bundle.trimmed_because("ray/tune/__pycache__/") and gpu_bundle.trimmed_because(
        "ray/x.pyc"
    )
    for kept in (
        "ray/tune/__init__.py",
        "ray/data/__init__.py",
        "ray/dashboard/agent.py",
        "ray/dashboard/dashboard.py",
        "ray/_raylet.so",
        "ray/serve_like.py",
        "ray/_private/runtime_env/agent/main.py",
        "ray-2.60.0.dist-info/METADATA",
    ):
        assert gpu_bundle.trimmed_because(kept) is None, kept


# What the mission imports in its driver (every command's module, Tune with its searchers and
# schedulers, the cluster helpers); the processes Ray starts for itself (the dashboard head in its
# minimal mode, the agents, the workers) run in the end-to-end test below.
MISSION_IMPORTS = """
import json, sys
import importlib, pkgutil
import robusttune.commands
for module in pkgutil.iter_modules(robusttune.commands.__path__):
    importlib.import_module("robusttune.commands." + module.name)
import robusttune.experiments.sweep.runner, robusttune.experiments.sweep.stream
import robusttune.experiments.breakdown, robusttune.experiments.tuning
import ray, ray.tune, ray.tune.search.optuna, ray.tune.search.basic_variant, ray.tune.schedulers
import ray.tune.logger, ray.cluster_utils, ray._private.state, ray.train, ray.air
import ray.dashboard.agent, ray.dashboard.dashboard, ray._private.workers.default_worker
import pathlib
root = pathlib.Path(ray.__file__).parent.parent
files = sorted(str(pathlib.Path(m.__file__).relative_to(root)) for m in list(sys.modules.values())
               if getattr(m, "__name__", "").split(".")[0] == "ray" and getattr(m, "__file__", None))
print(json.dumps(files))
"""


def test_the_trim_keeps_every_module_the_mission_imports():
    out = subprocess.run(
        [sys.executable, "-c", MISSION_IMPORTS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=180,
        env={**os.environ, "RAY_AUTH_MODE": "disabled"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    files = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(files) > 500 and any(f.startswith("ray/data/") for f in files)  # Tune needs Data
    assert [f for f in files if gpu_bundle.trimmed_because(f)] == []


# -- a wheel packed from a folder ----------------------------------------------------------------


def record_rows(wheel: Path) -> dict[str, tuple[str, str]]:
    with zipfile.ZipFile(wheel) as archive:
        # the wheel's own dist-info, at its root (Ray vendors packages with dist-infos of theirs)
        name = next(
            n for n in archive.namelist() if n.count("/") == 1 and n.endswith(".dist-info/RECORD")
        )
        rows = csv.reader(io.StringIO(archive.read(name).decode()))
        return {row[0]: (row[1], row[2]) for row in rows}


def assert_valid_wheel(wheel: Path) -> None:
    """Every entry is in RECORD with its sha256 and size, and RECORD lists nothing else."""
    rows = record_rows(wheel)
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if not n.endswith("/")]
        assert sorted(names) == sorted(rows)
        for name in names:
            if name.count("/") == 1 and name.endswith(".dist-info/RECORD"):
                assert rows[name] == ("", "")  # RECORD does not hash itself
                continue
            data = archive.read(name)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert rows[name] == (f"sha256={digest}", str(len(data))), name
        assert names[-1].endswith(".dist-info/RECORD")


def test_pack_writes_a_valid_wheel_with_its_modes(tmp_path):
    tree = tmp_path / "tree"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "__init__.py").write_text("X = 1\n")
    tool = tree / "pkg" / "tool"
    tool.write_bytes(b"\x7fELF not really")
    tool.chmod(0o755)
    info = tree / "pkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\n")
    (info / "WHEEL").write_text(
        "Wheel-Version: 1.0\nRoot-Is-Purelib: false\n"
        "Tag: cp311-cp311-manylinux_2_17_x86_64\n"
        "Tag: cp311-cp311-manylinux2014_x86_64\n"
    )
    (info / "RECORD").write_text("stale,,\n")
    wheel = gpu_bundle.pack(tree, tmp_path / "out")
    assert wheel.name == "pkg-1.0-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.whl"
    assert_valid_wheel(wheel)
    again = gpu_bundle.pack(tree, tmp_path / "again")
    assert again.read_bytes() == wheel.read_bytes()  # the same tree packs to the same bytes
    unpacked = tmp_path / "unpacked"
    gpu_bundle.unpack_wheel(wheel, unpacked)
    assert stat.S_IMODE((unpacked / "pkg" / "tool").stat().st_mode) == 0o755
    assert stat.S_IMODE((unpacked / "pkg" / "__init__.py").stat().st_mode) & 0o111 == 0


def test_install_refuses_a_bundle_for_another_python(tmp_path):
    # a cp312 bundle built here must not break bench/gpu.sh run by this machine's Python 3.11
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    other = (3, 10) if sys.version_info[:2] != (3, 10) else (3, 12)
    (wheels / f"ray-2.60.0-{gpu_bundle.python_tag(other)}-x-manylinux2014_x86_64.whl").write_bytes(
        b""
    )
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "gpu_bundle.py"),
            "install",
            "--wheels",
            str(wheels),
            "--target",
            str(tmp_path / "site"),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert out.returncode == gpu_bundle.NOTHING_INSTALLED, out.stderr
    assert "not installed" in out.stdout and not (tmp_path / "site").exists()
    empty = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "gpu_bundle.py"),
            "install",
            "--wheels",
            str(tmp_path / "none"),
            "--target",
            str(tmp_path / "site"),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert empty.returncode == gpu_bundle.NOTHING_INSTALLED and "no bundle" in empty.stdout


# -- this Python's Ray, trimmed, in a fresh environment ------------------------------------------


@pytest.fixture(scope="module")
def trimmed_environment(tmp_path_factory):
    """(the fresh environment's python, the PYTHONPATH that puts the trimmed Ray first, the
    trimmed wheel, the trim's report output)."""
    work = tmp_path_factory.mktemp("bundle")
    wheels = work / "wheels"
    made = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "gpu_bundle.py"),
            "trim-installed",
            "--dest",
            str(wheels),
            "--compresslevel",
            "1",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert made.returncode == 0, made.stderr[-3000:]
    base = Path(sys.base_prefix) / "bin" / "python3"
    subprocess.run([str(base), "-m", "venv", str(work / "venv")], check=True, timeout=120)
    python = work / "venv" / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    venv_site = Path(metadata.distribution("ray").locate_file(""))
    (Path(purelib) / "zz_robusttune_venv.pth").write_text(f"{venv_site}\n")
    site = work / "site"
    installed = subprocess.run(
        [
            str(python),
            str(ROOT / "bench" / "gpu_bundle.py"),
            "install",
            "--wheels",
            str(wheels),
            "--target",
            str(site),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr[-3000:]
    (wheel,) = wheels.glob("ray-*.whl")
    return python, f"{site}{os.pathsep}{ROOT}", wheel, made.stdout


def test_the_trimmed_wheel_is_valid_and_small(trimmed_environment):
    _, _, wheel, report = trimmed_environment
    assert_valid_wheel(wheel)
    for trim in gpu_bundle.TRIMMED:
        assert trim.why in report
    assert all(f"stripped {name}" in report for name in gpu_bundle.STRIPPED)
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = archive.read(
            next(
                n for n in names if n.count("/") == 1 and n.endswith(".dist-info/entry_points.txt")
            )
        ).decode()
        modes = {n: (archive.getinfo(n).external_attr >> 16) & 0o777 for n in gpu_bundle.STRIPPED}
    assert not any(gpu_bundle.trimmed_because(n) for n in names)
    assert "serve =" not in entry_points and "tune =" in entry_points
    assert all(mode & 0o111 for mode in modes.values())  # the binaries stay executable
    # the cp312 bundle's Ray must fit with the other wheels under the limit; this cp311 build is
    # the same trim of the same release
    assert wheel.stat().st_size < 42 * 2**20


MISSION = """
import json, os, sys
import ray
try:
    import ray.rllib
    rllib = True
except ImportError:
    rllib = False
ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
import robusttune
storage = sys.argv[1]
tiny = {"dataset": "synthetic", "model": "mlp", "clients": 4, "participation": 1.0,
        "synthetic_samples": 240, "synthetic_shape": "16", "local_epochs": 1, "rounds": 2}
swept = robusttune.sweep({"name": "tiny", "run": tiny,
                          "space": {"seed": {"grid": [1, 2]}, "method": {"grid": ["fedavg", "median"]}},
                          "search": {"algorithm": "grid"}, "resources": {"cpu": 1}},
                         storage=storage)
mapped = robusttune.breakdown(
    {"name": "tinymap",
     "run": {"dataset": "synthetic", "model": "mlp", "clients": 4, "rounds": 1, "local_epochs": 1,
             "synthetic_samples": 200, "trainer": "sequential"},
     "space": {"aggregator": {"grid": ["mean"]}, "attack": {"grid": ["sign_flip"]}},
     "breakdown": {"seeds": [1], "adversary": {"attack_strength": [3.0]}, "verify_radius": 0}},
    storage=storage)
workers = ray.get(ray.remote(lambda: __import__("ray").__file__).remote())
print(json.dumps({"ray": ray.__file__, "worker_ray": workers, "rllib": rllib,
                  "statuses": swept.trials["status"].tolist(),
                  "map": mapped.table[["breakdown", "trials"]].to_dict("records")}))
"""


def test_the_trimmed_ray_runs_a_sweep_and_a_map(trimmed_environment, tmp_path):
    python, pythonpath, _, _ = trimmed_environment
    env = {**os.environ, "PYTHONPATH": pythonpath, "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run(
        [str(python), "-c", MISSION, str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=400,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    site = pythonpath.split(os.pathsep)[0]
    assert seen["ray"].startswith(site) and seen["worker_ray"].startswith(site)
    assert seen["rllib"] is False  # the .venv's full Ray is not reachable behind the trimmed one
    assert seen["statuses"] == ["TERMINATED"] * 4
    assert len(seen["map"]) == 1 and seen["map"][0]["trials"] >= 2
    assert 0 <= seen["map"][0]["breakdown"] <= 0.5
