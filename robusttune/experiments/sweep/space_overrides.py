"""The command line's way into a search space: flags (``--name``, ``--num-samples``,
``--max-concurrent``, ``--cpus-per-trial``, ``--gpus-per-trial``) and ``--set key=value``
written into a copy of the file's mapping before it is validated, so the file and its flags are
validated together and a bad flag is named as typed
(`robusttune.experiments.sweep.space.load_sweep`, `SweepSpec.with_overrides`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from robusttune.core.plugins import declare_plugins
from robusttune.core.yaml_input import parse_assignments
from robusttune.experiments.sweep.domains import format_value

__all__ = ["deep_copy", "file_assignments", "override_sweep_mapping"]


def file_assignments(mapping: Any, source: str, assignments: Sequence[str]) -> dict[str, Any]:
    """``--set key=value`` texts as RunSpec values, read once the plugins the file names are
    loaded (their knobs are keys ``--set`` may name)."""
    if isinstance(mapping, Mapping):
        declare_plugins(deep_copy(dict(mapping)), source)
    return parse_assignments(assignments)


def override_sweep_mapping(mapping: Any, **changes: Any) -> tuple[Any, list[str]]:
    """(a copy of ``mapping`` with the command-line overrides written in, the flags as typed).
    ``changes``: name, num_samples, max_concurrent, cpu, gpu, and run keys as ``run={...}``;
    None is not given."""
    raw = deep_copy(dict(mapping)) if isinstance(mapping, Mapping) else mapping
    flags = {
        "name": "--name",
        "num_samples": "--num-samples",
        "max_concurrent": "--max-concurrent",
        "cpu": "--cpus-per-trial",
        "gpu": "--gpus-per-trial",
    }
    given: list[str] = []
    for key, value in changes.items():
        if value is None:
            continue
        if key not in (*flags, "run"):
            raise ValueError(f"unknown override {key!r}")
        if not isinstance(raw, dict):  # parse_sweep says what a search space is
            continue
        if key == "run":
            given += [f"--set {k}={format_value(v)}" for k, v in value.items()]
            raw["run"] = {**(raw.get("run") or {}), **value}
            continue
        given.append(f"{flags[key]} {format_value(value)}")
        if key == "name":
            raw["name"] = value
        elif key == "num_samples":
            raw["search"] = {**(raw.get("search") or {}), "num_samples": value}
        elif key == "max_concurrent":
            raw["max_concurrent"] = value
        else:
            raw["resources"] = {**(raw.get("resources") or {}), key: value}
    return raw, given


def deep_copy(value: Any) -> Any:
    """A copy of a parsed YAML value (mappings and lists copied, leaves shared): what an
    override writes into is never the caller's mapping."""
    if isinstance(value, Mapping):
        return {k: deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [deep_copy(v) for v in value]
    return value
