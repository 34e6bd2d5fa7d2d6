"""What the user writes, read into Python: YAML files (run files, search spaces, breakdown spaces,
stored sweeps) and ``--set key=value`` assignments, each failure one SpecError line. PyYAML is
only needed here and by the sweep layer, so the simulation imports without it (bench/gpu.sh
needs no YAML; tests/test_gpu_bench.py imports bench/gpu.py with PyYAML blocked).

YAML is read with ``yaml.safe_load``: a file from a shared folder cannot build Python objects.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import yaml

from robusttune.core.plugins import absolute_references
from robusttune.core.runspec import run_keys
from robusttune.core.registry import SpecError

__all__ = ["parse_assignment", "parse_assignments", "parse_yaml", "read_yaml", "find_yaml",
           "packaged_spaces", "stored_plugins"]

# the inputs a results folder keeps (a sweep's, a map's or a study's), which name its plugins
STORED_INPUTS = ("sweep.yaml", "plan.yaml")


def parse_assignment(text: str) -> tuple[str, Any]:
    """Parse one ``key=value`` from ``--set``; the value is read as a YAML scalar."""
    if "=" not in text:
        raise SpecError(f"--set expects key=value, got {text!r}")
    key, raw = text.split("=", 1)
    key = key.strip()
    keys = run_keys()
    if key not in keys:
        raise SpecError(f"unknown RunSpec key {key!r}; allowed keys: {', '.join(sorted(keys))}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return key, value


def parse_assignments(texts: Iterable[str]) -> dict[str, Any]:
    """Parse every ``--set key=value`` in order into RunSpec values; a later key overrides an
    earlier one."""
    return dict(parse_assignment(text) for text in texts)


def parse_yaml(text: str, source: str) -> Any:
    """YAML text -> Python, or one SpecError line naming ``source`` and the parser's first line."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        first = str(error).splitlines()[0] if str(error) else "parse error"
        raise SpecError(f"{source}: not valid YAML ({first})") from None


# the example spaces shipped inside the package (`robusttune sweep quickstart`)
PACKAGED_SPACES = Path(__file__).resolve().parents[1] / "search_spaces"


def packaged_spaces() -> dict[str, Path]:
    """The search spaces that ship with the package, by name: ``quickstart``,
    ``findings/claim3_bulyan`` ..."""
    return {p.relative_to(PACKAGED_SPACES).with_suffix("").as_posix(): p
            for p in sorted(PACKAGED_SPACES.rglob("*.yaml"))}


def find_yaml(path: str | Path, what: str) -> Path:
    """The YAML file the user named: a path, or the name of a space shipped with the package
    (``quickstart``, ``breakdown``; `packaged_spaces`) where no such file exists."""
    path = Path(path)
    if path.exists():
        return path
    packaged = packaged_spaces().get(path.as_posix().removesuffix(".yaml"))
    if packaged is not None:
        return packaged
    names = ", ".join(n for n in packaged_spaces() if "/" not in n)
    raise SpecError(f"{what} {str(path)!r} does not exist; allowed: a YAML file, or a space "
                    f"shipped with robusttune ({names}; robusttune list space)")


def read_yaml(path: str | Path, what: str) -> Any:
    """Read a YAML file the user named (`find_yaml`: a path or a packaged space's name); ``what``
    names it in the one-line error if it is missing."""
    path = find_yaml(path, what)
    data = parse_yaml(path.read_text(), path.name)
    if isinstance(data, dict) and "plugins" in data:
        # a plugin file is named relative to the YAML that names it
        data["plugins"] = absolute_references(data["plugins"], path.resolve().parent)
    return data


def stored_plugins(folder: str | Path) -> list[str]:
    """The plugins a results folder's stored input names (``plugins:`` of its sweep.yaml or
    plan.yaml; absolute paths and module names), for ``report`` and a resume to load."""
    names: list[str] = []
    for stored in STORED_INPUTS:
        path = Path(folder) / stored
        if path.exists():
            data = parse_yaml(path.read_text(), str(path))
            if isinstance(data, dict) and isinstance(data.get("plugins"), list):
                names += [p for p in data["plugins"] if isinstance(p, str) and p not in names]
    return names
