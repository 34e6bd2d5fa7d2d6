"""Ranges for users, pins for us (issue 58): pyproject.toml states the versions robusttune
supports as ranges, never one exact version (a pin would replace a researcher's torch or fail
beside a GPU image's); constraints.txt pins the exact versions `make install` and CI test with,
each inside its range, and this environment is the one it pins."""

from __future__ import annotations

import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def requirements() -> list[Requirement]:
    """pyproject.toml's dependencies and every extra's, as parsed requirements."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    listed = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        listed += extra
    return [Requirement(line) for line in listed]


def pins() -> dict[str, Version]:
    """constraints.txt: canonical name -> the exact version."""
    found: dict[str, Version] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, pinned = line.partition("==")
        assert pinned, f"constraints.txt: {line!r} is not an exact pin (name==version)"
        found[canonicalize_name(name)] = Version(pinned)
    return found


def exact(requirement: Requirement) -> bool:
    return any(spec.operator in ("==", "===") for spec in requirement.specifier)


def test_the_package_states_ranges_not_pins():
    pinned = [str(r) for r in requirements() if exact(r) and r.name != "byzfl"]
    # byzfl, a test-only cross-check, is pinned: its rules are the reference values compared
    assert pinned == [], f"exact requirements in pyproject.toml (state a range): {pinned}"
    unbounded = [r.name for r in requirements() if not r.specifier]
    assert unbounded == [], f"requirements with no lower bound: {unbounded}"


def test_every_requirement_is_pinned_inside_its_range():
    pinned = pins()
    outside = {}
    for requirement in requirements():
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{requirement.name} is not pinned in constraints.txt"
        if not requirement.specifier.contains(pinned[name], prereleases=True):
            outside[requirement.name] = f"{pinned[name]} not in {requirement.specifier}"
    assert outside == {}, f"constraints.txt pins outside pyproject.toml's ranges: {outside}"


def test_this_environment_is_the_pinned_one():
    # make install builds .venv with -c constraints.txt: a stale environment tests other code
    differ = {}
    for name, pinned in pins().items():
        try:
            installed = Version(version(name))
        except PackageNotFoundError:
            differ[name] = "not installed"
            continue
        if installed.public != pinned.public:
            differ[name] = f"{installed} installed, {pinned} pinned"
    assert differ == {}, f"the environment differs from constraints.txt (make install): {differ}"


def test_the_checks_catch_a_pin_and_a_pin_outside_the_range():
    assert exact(Requirement("torch==2.14.1")) and not exact(Requirement("torch>=2.11,<3"))
    assert not Requirement("torch>=2.11,<3").specifier.contains(Version("3.0.0"))
