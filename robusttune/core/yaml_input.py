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

from robusttune.core.runspec import RUNSPEC_KEYS
from robusttune.core.registry import SpecError

__all__ = ["parse_assignment", "parse_assignments", "parse_yaml", "read_yaml"]


def parse_assignment(text: str) -> tuple[str, Any]:
    """Parse one ``key=value`` from ``--set``; the value is read as a YAML scalar."""
    if "=" not in text:
        raise SpecError(f"--set expects key=value, got {text!r}")
    key, raw = text.split("=", 1)
    key = key.strip()
    if key not in RUNSPEC_KEYS:
        raise SpecError(f"unknown RunSpec key {key!r}; allowed keys: {', '.join(sorted(RUNSPEC_KEYS))}")
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


def read_yaml(path: str | Path, what: str) -> Any:
    """Read a YAML file the user named; ``what`` names it in the one-line error if it is missing."""
    path = Path(path)
    if not path.exists():
        raise SpecError(f"{what} {str(path)!r} does not exist")
    return parse_yaml(path.read_text(), path.name)
