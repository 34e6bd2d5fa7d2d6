"""The GPU machine's bundle: the wheels its Python lacks for the mission (sweeps and maps as Ray Tune
trials), Ray among them trimmed to what Tune needs, in one git-ignored folder that travels with the
project tree (64 MiB in all; the bundle at most ``LIMIT_MIB``).

The GPU machine (docs/how-to/gpu.md) has CPython 3.12 on x86-64, torch, no network and no Ray,
Optuna or pydantic. Ray's wheel for it is 79 MB; of it Tune needs neither the Java jars (31 MiB
compressed), the dashboard's web client, RLlib, Serve nor Ray LLM, and its three large binaries
(``_raylet.so``, ``gcs_server``, ``raylet``) carry their symbol tables. `trim` removes those
(`TRIMMED`, each with why) and strips the binaries (`STRIPPED`), then `pack` makes a valid wheel
again: a new RECORD with each file's sha256 and size. Ray Data stays: ``ray.air`` imports it, and
``ray.tune`` imports ``ray.air``. The dashboard's Python package stays too: every node runs its
agent (``ray/dashboard/agent.py``, in its minimal mode without the dashboard's optional
dependencies), which the raylet lives and dies with.

    python bench/gpu_bundle.py build     # make gpu-bundle: download for cp312, trim Ray, into
                                         # bench/wheels/; prints the size, fails over LIMIT_MIB
    python bench/gpu_bundle.py list      # the pinned wheels and why each is there
    python bench/gpu_bundle.py install --target /tmp/site   # what bench/gpu.sh runs there
    python bench/gpu_bundle.py trim-installed --dest DIR    # this Python's installed Ray, trimmed
                                         # the same way into a wheel (tests/test_gpu_bundle.py)

Standard library only (``pip`` as a command, binutils' ``strip``, which ``make tools`` installs),
so that the GPU machine's bare ``python3`` runs ``install``. Versions are those of the project's
.venv (tests/test_gpu_bundle.py holds them equal), one version of each package; the binary ones
(Ray, pydantic-core, rpds-py, SQLAlchemy) are downloaded as their cp312 builds of that version.
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parent.parent
BUNDLE_DIR = ROOT / "bench" / "wheels"  # git-ignored (/bench/wheels/ in .gitignore)
LIMIT_MIB = 50.0
TARGET_PYTHON = "3.12"  # the GPU machine's python3 (/opt/torch/.venv)
# pip matches manylinux_2_N tags exactly: every tag a wheel for glibc 2.17 .. 2.35 may carry
PLATFORMS = (
    "manylinux_2_35_x86_64",
    "manylinux_2_34_x86_64",
    "manylinux_2_31_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)
MANIFEST = "BUNDLE.txt"  # what the folder holds, written beside the wheels
NOTHING_INSTALLED = 3  # install's exit status with no bundle for this Python


def constraint_versions(path: Path = ROOT / "constraints.txt") -> dict[str, str]:
    """The exact versions the repository tests with (constraints.txt, `make lock`), by the
    distribution's normalised name: the bundle carries the same, so the GPU machine runs what
    the tests ran."""
    versions: dict[str, str] = {}
    for line in path.read_text().splitlines():
        name, _, version = line.split("#", 1)[0].strip().partition("==")
        if version:
            versions[name.lower().replace("_", "-").replace(".", "-")] = version
    return versions


_VERSIONS = constraint_versions()


@dataclass(frozen=True)
class Pin:
    """One wheel of the bundle: a distribution at constraints.txt's version, and why the GPU
    machine needs it."""

    name: str
    why: str

    @property
    def version(self) -> str:
        return _VERSIONS[self.name.lower().replace("_", "-").replace(".", "-")]

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"


# What the GPU machine lacks, at constraints.txt's versions. Its Python has numpy, pandas, pyarrow,
# scipy, scikit-learn, matplotlib, grpcio, msgpack, protobuf, pyyaml, requests, click, rich,
# typer, tensorboard, tqdm, jinja2 (so MarkupSafe), attrs, filelock, fsspec (GPU_MACHINE_HAS).
PINNED: tuple[Pin, ...] = (
    Pin(
        "ray",
        "Ray Core and Tune: every sweep, map, calibration and tuning study "
        "(trimmed: TRIMMED, STRIPPED)",
    ),
    Pin("jsonschema", "Ray's runtime environments validate against JSON schemas"),
    Pin("jsonschema-specifications", "jsonschema's meta-schemas"),
    Pin("referencing", "jsonschema's $ref resolution"),
    Pin("rpds-py", "referencing's persistent maps (binary: the cp312 build)"),
    Pin("tensorboardX", "ray[tune]'s TensorBoard logger"),
    Pin("packaging", "Ray asks for packaging>=24.2; the machine's version is not known"),
    Pin("pydantic", "RunSpec's schema (robusttune.core.runspec), and ray[tune]'s"),
    Pin("pydantic-core", "pydantic's validator (binary: the cp312 build)"),
    Pin("annotated-types", "pydantic's constraints"),
    Pin("typing-inspection", "pydantic's reading of annotations"),
    Pin("typing-extensions", "pydantic 2.14 asks for >=4.16, newer than the machine's"),
    Pin("optuna", "the Optuna searches of sweep, breakdown --budget and tune"),
    Pin("alembic", "Optuna's storage migrations (imported with optuna)"),
    Pin("SQLAlchemy", "Optuna's storage (binary: the cp312 build)"),
    Pin("Mako", "alembic's templates"),
    Pin("colorlog", "Optuna's log format"),
    Pin("cmaes", "Optuna's CMA-ES sampler (search.sampler: cmaes)"),
)

# The GPU machine's own distributions that the project or a pinned wheel needs (docs/how-to/gpu.md,
# the 2026-12-04 session): with one of these there, its own dependencies are there too. torch is
# the machine's (2.11); torchvision is not needed there (resnet18 and the CIFAR files only).
GPU_MACHINE_HAS = frozenset(
    {
        "absl-py",
        "aiohttp",
        "attrs",
        "click",
        "cloudpickle",
        "filelock",
        "fsspec",
        "grpcio",
        "jinja2",
        "markdown",
        "markupsafe",
        "matplotlib",
        "msgpack",
        "numpy",
        "pandas",
        "pillow",
        "protobuf",
        "psutil",
        "pyarrow",
        "pyyaml",
        "requests",
        "rich",
        "scikit-learn",
        "scipy",
        "tensorboard",
        "torch",
        "tqdm",
        "typer",
    }
)
NOT_NEEDED_THERE = frozenset({"torchvision"})


@dataclass(frozen=True)
class Trim:
    """One part of Ray's wheel left out: a path under the wheel's root, and why Tune does not
    need it."""

    path: str
    why: str


TRIMMED: tuple[Trim, ...] = (
    Trim("ray/jars", "Java workers' jar (31 MiB compressed): no Java actor here"),
    Trim(
        "ray/dashboard/client",
        "the dashboard's built web client, served only by the dashboard "
        "head, which the project never starts (include_dashboard=False)",
    ),
    Trim("ray/rllib", "RLlib, reinforcement learning: Tune reaches it only by name, lazily"),
    Trim("ray/serve", "Ray Serve, model serving"),
    Trim("ray/llm", "Ray LLM, built on Serve and Data"),
)
# Any folder of these names anywhere in the wheel: tests, and compiled files of another Python
TRIMMED_FOLDER_NAMES = {"tests": "Ray's own tests", "__pycache__": "another Python's bytecode"}
STRIPPED = ("ray/_raylet.so", "ray/core/src/ray/gcs/gcs_server", "ray/core/src/ray/raylet/raylet")
# console scripts of the trimmed parts: pip would make a `serve` command that cannot start
TRIMMED_SCRIPTS = {"serve"}


def trimmed_because(relative: str) -> str | None:
    """Why the file or folder at ``relative`` (a path under the wheel's root, with /) is left out
    of the trimmed Ray, or None when it stays."""
    path = PurePosixPath(relative)
    for trim in TRIMMED:
        if path == PurePosixPath(trim.path) or PurePosixPath(trim.path) in path.parents:
            return trim.why
    for part in path.parts[:-1] if not relative.endswith("/") else path.parts:
        if part in TRIMMED_FOLDER_NAMES:
            return TRIMMED_FOLDER_NAMES[part]
    if path.suffix == ".pyc":
        return TRIMMED_FOLDER_NAMES["__pycache__"]
    return None


@dataclass
class TrimReport:
    """What `trim` did: bytes removed by reason, and each stripped binary's size before/after."""

    removed: dict[str, int] = field(default_factory=dict)
    stripped: dict[str, tuple[int, int]] = field(default_factory=dict)

    def lines(self) -> list[str]:
        out = [f"removed {size / 2**20:6.1f} MiB: {why}" for why, size in self.removed.items()]
        out += [
            f"stripped {name}: {before / 2**20:.1f} -> {after / 2**20:.1f} MiB"
            for name, (before, after) in self.stripped.items()
        ]
        return out


# -- a wheel as a folder, and back --------------------------------------------------------------


def unpack_wheel(wheel: Path, tree: Path) -> None:
    """Unpack ``wheel`` into the folder ``tree``, keeping each file's permission bits (zipfile
    drops them; the raylet and GCS binaries must stay executable)."""
    with zipfile.ZipFile(wheel) as archive:
        for info in archive.infolist():
            target = tree / info.filename
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(info) as source, target.open("wb") as sink:
                shutil.copyfileobj(source, sink, 2**20)
            mode = (info.external_attr >> 16) & 0o777
            if mode:
                target.chmod(mode)


def copy_installed(site_packages: Path, distribution: str, tree: Path) -> Path:
    """Copy an installed distribution (the files its dist-info RECORD lists inside
    ``site_packages``, less bytecode and the installer's own files) into ``tree``, as its wheel
    held them; returns the dist-info folder in ``tree``."""
    matches = [
        p
        for p in site_packages.glob("*.dist-info")
        if p.name.split("-")[0].lower().replace("_", "-") == distribution.lower()
    ]
    if len(matches) != 1:
        raise SystemExit(
            f"gpu_bundle: {distribution}: {len(matches)} dist-info folders in "
            f"{site_packages}; expected one"
        )
    info = matches[0]
    installer_files = {"INSTALLER", "REQUESTED", "RECORD", "direct_url.json"}
    with (info / "RECORD").open(newline="") as handle:
        for row in csv.reader(handle):
            relative = row[0]
            if relative.startswith("..") or relative.endswith(".pyc") or "__pycache__/" in relative:
                continue  # console scripts (pip makes them again), bytecode
            if (
                relative.startswith(info.name + "/")
                and relative.split("/", 1)[1] in installer_files
            ):
                continue
            target = tree / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(site_packages / relative, target)
    return tree / info.name


def trim(tree: Path, strip: str = "strip") -> TrimReport:
    """Leave out of the unpacked Ray in ``tree`` what `trimmed_because` names, strip the symbols
    of the `STRIPPED` binaries with binutils' ``strip``, and drop the console scripts of the
    trimmed parts from entry_points.txt. The dist-info's RECORD is rewritten by `pack`."""
    report = TrimReport()
    for path in sorted(tree.rglob("*"), key=lambda p: len(p.parts)):
        if not path.exists():
            continue  # inside a folder already removed
        why = trimmed_because(path.relative_to(tree).as_posix() + ("/" if path.is_dir() else ""))
        if why is None:
            continue
        if path.is_dir():
            report.removed[why] = report.removed.get(why, 0) + sum(
                f.stat().st_size for f in path.rglob("*") if f.is_file()
            )
            shutil.rmtree(path)
        else:
            report.removed[why] = report.removed.get(why, 0) + path.stat().st_size
            path.unlink()
    if shutil.which(strip) is None:
        raise SystemExit(f"gpu_bundle: {strip!r} not found: binutils' strip (make tools)")
    for relative in STRIPPED:
        binary = tree / relative
        before = binary.stat().st_size
        subprocess.run([strip, "--strip-all", str(binary)], check=True)
        report.stripped[relative] = (before, binary.stat().st_size)
    for entry_points in tree.glob("*.dist-info/entry_points.txt"):
        lines = entry_points.read_text().splitlines()
        kept = [line for line in lines if line.split("=", 1)[0].strip() not in TRIMMED_SCRIPTS]
        entry_points.write_text("\n".join(kept) + "\n")
    return report


def wheel_name(dist_info: Path) -> str:
    """The file name of the wheel whose dist-info folder is ``dist_info``: name and version from
    the folder, the tags from its WHEEL file (several tags compressed as pip writes them)."""
    name, version = dist_info.name[: -len(".dist-info")].split("-", 1)
    tags = [
        line.split(":", 1)[1].strip()
        for line in (dist_info / "WHEEL").read_text().splitlines()
        if line.startswith("Tag:")
    ]
    parts = [sorted({tag.split("-")[i] for tag in tags}) for i in range(3)]
    return f"{name}-{version}-" + "-".join(".".join(part) for part in parts) + ".whl"


def record_hash(data: bytes) -> str:
    """A RECORD hash: sha256, urlsafe base64 without padding (the wheel spec's form)."""
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def pack(tree: Path, out_dir: Path, compresslevel: int = 9, name: str | None = None) -> Path:
    """Zip the unpacked wheel in ``tree`` into ``out_dir`` as a valid wheel: a new RECORD (every
    file's sha256 and size, RECORD itself without), the dist-info last, permission bits kept, and
    a fixed date on every entry so that the same tree packs to the same bytes. ``name``: the file
    name (a released wheel's own: Ray's name says manylinux2014 where its WHEEL file says
    linux_x86_64), by default `wheel_name`'s."""
    dist_infos = list(tree.glob("*.dist-info"))
    if len(dist_infos) != 1:
        raise SystemExit(f"gpu_bundle: {tree} holds {len(dist_infos)} dist-info folders")
    dist_info = dist_infos[0]
    record = f"{dist_info.name}/RECORD"
    files = sorted(
        (p for p in tree.rglob("*") if p.is_file() and p.relative_to(tree).as_posix() != record),
        key=lambda p: (p.is_relative_to(dist_info), p.relative_to(tree).as_posix()),
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    wheel = out_dir / (name or wheel_name(dist_info))
    rows = io.StringIO()
    writer = csv.writer(rows, lineterminator="\n")
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED, compresslevel=compresslevel) as archive:
        for path in files:
            relative = path.relative_to(tree).as_posix()
            data = path.read_bytes()
            writer.writerow([relative, record_hash(data), len(data)])
            archive.writestr(
                _entry(relative, path.stat().st_mode), data, compresslevel=compresslevel
            )
        writer.writerow([record, "", ""])
        archive.writestr(_entry(record, 0o644), rows.getvalue(), compresslevel=compresslevel)
    return wheel


def _entry(name: str, mode: int) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.external_attr = ((mode & 0o777) | 0o100000) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    return info


def trimmed_wheel(
    tree: Path, out_dir: Path, compresslevel: int = 9, name: str | None = None
) -> tuple[Path, TrimReport]:
    """`trim` the unpacked Ray in ``tree`` and `pack` it into ``out_dir`` (as ``name``)."""
    report = trim(tree)
    return pack(tree, out_dir, compresslevel, name), report


# -- the bundle ---------------------------------------------------------------------------------


def download(pins: tuple[Pin, ...], dest: Path, python_version: str = TARGET_PYTHON) -> list[Path]:
    """pip download of ``pins``' wheels for CPython ``python_version`` on manylinux x86-64 (no
    dependencies: the pins are the whole list) into ``dest``; their paths, in ``pins``' order."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        python_version,
        "--implementation",
        "cp",
        "-d",
        str(dest),
    ]
    for platform in PLATFORMS:
        command += ["--platform", platform]
    subprocess.run(command + [pin.requirement for pin in pins], check=True)
    found = []
    for pin in pins:
        wheels = [
            w for w in dest.glob("*.whl") if wheel_project(w) == (_normal(pin.name), pin.version)
        ]
        if len(wheels) != 1:
            raise SystemExit(f"gpu_bundle: {pin.requirement}: {len(wheels)} wheels downloaded")
        found.append(wheels[0])
    return found


def _normal(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def wheel_project(wheel: Path) -> tuple[str, str]:
    """(normalised name, version) of a wheel file: ``SQLAlchemy-2.1.9-cp312-...whl`` gives
    ``("sqlalchemy", "2.1.9")``."""
    name, version = wheel.name.split("-")[:2]
    return _normal(name), version


def build(
    dest: Path = BUNDLE_DIR, python_version: str = TARGET_PYTHON, limit_mib: float = LIMIT_MIB
) -> int:
    """Download `PINNED` for ``python_version``, trim Ray, and leave exactly those wheels in
    ``dest`` (any other ``*.whl`` there removed: one version of each package), with MANIFEST;
    print each wheel's size and the total. Returns 1 when the total exceeds ``limit_mib``."""
    with tempfile.TemporaryDirectory(prefix="gpu-bundle-") as tmp:
        downloaded = download(PINNED, Path(tmp) / "download", python_version)
        staged = Path(tmp) / "bundle"
        staged.mkdir()
        notes: list[str] = []
        for pin, wheel in zip(PINNED, downloaded):
            if pin.name != "ray":
                shutil.copy2(wheel, staged / wheel.name)
                continue
            tree = Path(tmp) / "ray"
            unpack_wheel(wheel, tree)
            trimmed, report = trimmed_wheel(tree, staged, name=wheel.name)
            notes = [
                f"{wheel.name}: {wheel.stat().st_size / 2**20:.1f} MiB as released, "
                f"{trimmed.stat().st_size / 2**20:.1f} MiB trimmed",
                *report.lines(),
            ]
        dest.mkdir(parents=True, exist_ok=True)
        for old in dest.glob("*.whl"):
            old.unlink()
        for wheel in staged.glob("*.whl"):
            shutil.move(str(wheel), dest / wheel.name)
    wheels = sorted(dest.glob("*.whl"))
    total = sum(w.stat().st_size for w in wheels)
    lines = [
        f"# bench/gpu_bundle.py build for CPython {python_version} (bench/gpu.sh installs it)",
        *(f"# {note}" for note in notes),
        *(f"{w.name} {w.stat().st_size}" for w in wheels),
        f"# total {total / 2**20:.1f} MiB of at most {limit_mib:g}",
    ]
    (dest / MANIFEST).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if total > limit_mib * 2**20:
        print(
            f"gpu_bundle: {total / 2**20:.1f} MiB is over the {limit_mib:g} MiB limit",
            file=sys.stderr,
        )
        return 1
    return 0


def python_tag(version: tuple[int, int] | None = None) -> str:
    """``cp312`` for CPython 3.12: the tag a binary wheel for that Python carries."""
    major, minor = version or sys.version_info[:2]
    return f"cp{major}{minor}"


def install(wheels: Path, target: Path, python: str = sys.executable) -> bool:
    """pip install (no index, no dependencies, no bytecode) every wheel in ``wheels`` into
    ``target``, which then goes first on PYTHONPATH (bench/gpu.sh). Installs nothing and says why
    when the folder has no wheels or its Ray is for another Python; returns whether it installed."""
    found = sorted(wheels.glob("*.whl"))
    rays = [w for w in found if w.name.startswith("ray-")]
    if not found:
        print(f"# no bundle in {wheels}: using this Python's own packages", flush=True)
        return False
    if not any(f"-{python_tag()}-" in w.name for w in rays):
        print(
            f"# the bundle in {wheels} is for {', '.join(w.name.split('-')[2] for w in rays)}, "
            f"this Python is {python_tag()}: not installed",
            flush=True,
        )
        return False
    subprocess.run(
        [
            python,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--no-compile",
            "--no-cache-dir",
            "--upgrade",
            "--target",
            str(target),
            *map(str, found),
        ],
        check=True,
    )
    print(f"# bundle installed: {len(found)} wheels from {wheels} into {target}", flush=True)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    made = commands.add_parser("build", help="download for the GPU machine's Python, trim Ray")
    made.add_argument("--dest", type=Path, default=BUNDLE_DIR)
    made.add_argument("--python-version", default=TARGET_PYTHON)
    made.add_argument("--limit-mib", type=float, default=LIMIT_MIB)
    commands.add_parser("list", help="the pinned wheels and why each is there")
    put = commands.add_parser("install", help="pip install --target the bundle (bench/gpu.sh)")
    put.add_argument("--wheels", type=Path, default=BUNDLE_DIR)
    put.add_argument("--target", type=Path, required=True)
    local = commands.add_parser("trim-installed", help="this Python's installed Ray, trimmed")
    local.add_argument("--dest", type=Path, required=True)
    local.add_argument("--compresslevel", type=int, default=9)
    args = parser.parse_args(argv)

    if args.command == "build":
        return build(args.dest, args.python_version, args.limit_mib)
    if args.command == "list":
        for pin in PINNED:
            print(f"{pin.requirement:32s} {pin.why}")
        return 0
    if args.command == "install":  # bench/gpu.sh puts the target on PYTHONPATH on status 0
        return 0 if install(args.wheels, args.target) else NOTHING_INSTALLED
    import ray  # trim-installed: the Ray of the Python running this

    site_packages = Path(ray.__file__).parent.parent
    with tempfile.TemporaryDirectory(prefix="gpu-bundle-") as tmp:
        copy_installed(site_packages, "ray", Path(tmp))
        wheel, report = trimmed_wheel(Path(tmp), args.dest, args.compresslevel)
    print("\n".join([f"{wheel} {wheel.stat().st_size / 2**20:.1f} MiB", *report.lines()]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
