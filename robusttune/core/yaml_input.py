"""What the user writes, read into Python: YAML files (run files, search spaces, breakdown spaces,
stored sweeps) and ``--set key=value`` assignments, each failure one SpecError line. PyYAML is
only needed here and by the sweep layer, so the simulation imports without it (bench/gpu.sh
needs no YAML; tests/test_gpu_bench.py imports bench/gpu.py with PyYAML blocked).

YAML is read with PyYAML's safe loader (`BoundedSafeLoader`, a ``yaml.SafeLoader``): a file from a
shared folder cannot build Python objects, nor make the tool hang or exhaust memory. A file is
at most MAX_YAML_BYTES, UTF-8 (a bad byte is named with its offset), and its aliases may not
expand it past MAX_YAML_NODES values nor refer to themselves: nine aliases of nine aliases ...
eight deep load in milliseconds as shared objects, and every later walk or copy of them visits
the 43 million values they stand for.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from robusttune.core.plugins import absolute_references
from robusttune.core.registry import SpecError
from robusttune.core.runspec import run_keys

__all__ = [
    "MAX_YAML_BYTES",
    "MAX_YAML_NODES",
    "BoundedSafeLoader",
    "find_yaml",
    "packaged_spaces",
    "parse_assignment",
    "parse_assignments",
    "parse_yaml",
    "read_yaml",
    "read_yaml_text",
    "stored_plugins",
]

# A search space, plan or run file is a few kilobytes; these bounds are far above any real one.
MAX_YAML_BYTES = 4 * 1024 * 1024
MAX_YAML_NODES = 200_000


class YamlTooLarge(yaml.YAMLError):
    """A document whose aliases expand past MAX_YAML_NODES values, or refer to themselves."""


def expanded_size(root: yaml.Node, limit: int) -> int:
    """The number of values a composed YAML document stands for once every alias is expanded
    (each scalar, sequence and mapping counts 1, plus its items), counted without expanding
    anything: a node reached through several aliases is sized once and counted each time.
    Raises YamlTooLarge past ``limit`` or at an alias to one of its own ancestors (a recursive
    structure, which every later walk would follow for ever). Iterative: no recursion limit."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            open_nodes.discard(key)
            if isinstance(node, yaml.MappingNode):
                inner = sum(sizes[id(k)] + sizes[id(v)] for k, v in node.value)
            elif isinstance(node, yaml.SequenceNode):
                inner = sum(sizes[id(child)] for child in node.value)
            else:
                inner = 0
            sizes[key] = 1 + inner
            if sizes[key] > limit:
                raise YamlTooLarge(
                    f"its aliases expand it to more than {limit:,} values; "
                    f"allowed: YAML whose aliases stay under that"
                )
            continue
        if key in sizes:
            continue
        if key in open_nodes:
            raise YamlTooLarge(
                "an alias refers to a node that contains it (a recursive "
                "structure); allowed: aliases of complete values"
            )
        open_nodes.add(key)
        stack.append((node, True))
        if isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        else:
            children = []
        stack.extend((child, False) for child in reversed(children) if id(child) not in sizes)
    return sizes[id(root)]


class BoundedSafeLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that sizes a document before building it (`expanded_size`) and
    refuses one past MAX_YAML_NODES values."""

    def construct_document(self, node: yaml.Node) -> Any:
        expanded_size(node, MAX_YAML_NODES)
        return super().construct_document(node)


def read_yaml_text(path: str | Path, source: str | None = None) -> str:
    """A YAML file's text: a regular file of at most MAX_YAML_BYTES, decoded as UTF-8, or one
    SpecError line naming the file (and a bad byte's offset) before anything is parsed."""
    path = Path(path)
    where = source or str(path)
    if not path.is_file():
        raise SpecError(f"{where}: not a file; allowed: a YAML file")
    size = path.stat().st_size
    if size > MAX_YAML_BYTES:
        raise SpecError(
            f"{where}: {size:,} bytes; allowed: a YAML file of at most {MAX_YAML_BYTES:,} bytes"
        )
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise SpecError(
            f"{where}: not UTF-8 text (byte 0x{data[error.start]:02x} at offset "
            f"{error.start}); allowed: a UTF-8 YAML file"
        ) from None


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
        value = yaml.load(raw, Loader=BoundedSafeLoader) if raw.strip() else None
    except (yaml.YAMLError, RecursionError):
        value = raw
    return key, value


def parse_assignments(texts: Iterable[str]) -> dict[str, Any]:
    """Parse every ``--set key=value`` in order into RunSpec values; a later key overrides an
    earlier one."""
    return dict(parse_assignment(text) for text in texts)


def parse_yaml(text: str, source: str) -> Any:
    """YAML text -> Python (`BoundedSafeLoader`), or one SpecError line naming ``source`` and
    the parser's first line."""
    if len(text) > MAX_YAML_BYTES:
        raise SpecError(
            f"{source}: {len(text):,} characters; allowed: YAML of at most {MAX_YAML_BYTES:,}"
        )
    try:
        return yaml.load(text, Loader=BoundedSafeLoader)
    except YamlTooLarge as error:
        raise SpecError(f"{source}: {error}") from None
    except yaml.YAMLError as error:
        first = str(error).splitlines()[0] if str(error) else "parse error"
        raise SpecError(f"{source}: not valid YAML ({first})") from None
    except RecursionError:
        raise SpecError(
            f"{source}: YAML nested too deeply; allowed: a search space's few levels of nesting"
        ) from None


# the example spaces shipped inside the package (`robusttune sweep quickstart`)
PACKAGED_SPACES = Path(__file__).resolve().parents[1] / "search_spaces"


def packaged_spaces() -> dict[str, Path]:
    """The search spaces that ship with the package, by name: ``quickstart``,
    ``findings/claim3_bulyan`` ..."""
    return {
        p.relative_to(PACKAGED_SPACES).with_suffix("").as_posix(): p
        for p in sorted(PACKAGED_SPACES.rglob("*.yaml"))
    }


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
    raise SpecError(
        f"{what} {str(path)!r} does not exist; allowed: a YAML file, or a space "
        f"shipped with robusttune ({names}; robusttune list space)"
    )


def read_yaml(path: str | Path, what: str) -> Any:
    """Read a YAML file the user named (`find_yaml`: a path or a packaged space's name); ``what``
    names it in the one-line error if it is missing."""
    path = find_yaml(path, what)
    data = parse_yaml(read_yaml_text(path, path.name), path.name)
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
            data = parse_yaml(read_yaml_text(path), str(path))
            if isinstance(data, dict) and isinstance(data.get("plugins"), list):
                names += [p for p in data["plugins"] if isinstance(p, str) and p not in names]
    return names
