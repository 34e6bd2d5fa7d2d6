"""`pip install .` gives a package like any other: a wheel with the licence, the console
script and the example search spaces inside, which runs outside the repository
(`robusttune sweep quickstart` by name)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The suite's environment has robusttune installed in editable mode (a finder that maps the
# name to this checkout); the installed copy under test must win, so the finder is removed.
SITE_CUSTOMIZE = """
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__.lower()
                    and "editable" not in getattr(f, "__module__", "").lower()]
"""


def tracked_copy(to: Path) -> Path:
    """The repository's tracked files (what a clone has), so the build writes nothing here."""
    files = (
        subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, files):
        source, target = ROOT / name, to / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(source.readlink())
        elif source.is_file():
            shutil.copy2(source, target)
    return to


def test_the_wheel_holds_the_spaces_and_runs_them_outside_the_repository(tmp_path):
    wheels = tmp_path / "wheels"
    source = tracked_copy(tmp_path / "source")
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheels),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = wheels.glob("robusttune-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    packaged = {
        Path(n).relative_to("robusttune/search_spaces").as_posix()
        for n in names
        if n.startswith("robusttune/search_spaces/")
    }
    shipped = {
        p.relative_to(ROOT / "robusttune" / "search_spaces").as_posix()
        for p in (ROOT / "robusttune" / "search_spaces").rglob("*.yaml")
    }
    assert packaged == shipped and "quickstart.yaml" in packaged
    assert "robusttune/problem/data/digits_split.npy" in names  # the digits split, not recomputed
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert (
        "robusttune = robusttune.commands.cli:main"
        in zipfile.ZipFile(wheel).read(entry_points).decode()
    )

    site = tmp_path / "site"
    installed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--target",
            str(site),
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        check=False,
    )
    assert installed.returncode == 0, installed.stderr[-2000:]
    (tmp_path / "customize").mkdir()
    (tmp_path / "customize" / "sitecustomize.py").write_text(SITE_CUSTOMIZE)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {
        "PYTHONPATH": f"{tmp_path / 'customize'}:{site}",
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
    }
    where = subprocess.run(
        [sys.executable, "-c", "import robusttune; print(robusttune.__file__)"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=elsewhere,
        env=env,
        check=False,
    )
    assert where.stdout.strip() == str(site / "robusttune" / "__init__.py"), where.stderr
    dry = subprocess.run(
        [sys.executable, "-m", "robusttune.commands.cli", "sweep", "quickstart", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=elsewhere,
        env=env,
        check=False,
    )
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert dry.stdout.startswith("quickstart: 60 trials")
    assert not (elsewhere / "results").exists()
