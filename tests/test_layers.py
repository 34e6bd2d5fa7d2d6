"""The package's layers, read from its own imports (docs/explanations/architecture.md): every import points to
the importing module's own layer or one below it, and no module reaches itself again through
its imports (no import circle). Every import counts: at the top of a module, inside a function
(a lazy import is still a dependency), under TYPE_CHECKING and by name
(``importlib.import_module("robusttune...")``)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "robusttune"

# bottom to top: a module may import from its own layer and the layers before it
LAYERS = (
    "core",  # registry, the RunSpec schema, records, numerics, file and YAML input
    "display",  # terminal, markdown tables, matplotlib figures: formats, no content
    "problem",  # the learning problem: datasets and their split, models, local training,
    # who takes part in a round, the law of the Byzantine share of a sample
    "methods",  # aggregation rules, attacks, server algorithms, the adversary made of them
    "engine",  # one federated run: the round loop, its run folder, the runners
    "experiments",  # many runs: sweeps on Ray Tune, breakdown maps, calibration, tuning
    "reports",  # robusttune report: the tables and figures of a results folder
    "commands",  # the command line: the typer app and one module per command
)


# above every layer: the package's public faces, which may import from any layer (the commands
# as functions, the plugin API robusttune.plugin, and `python -m robusttune`)
TOP = ("robusttune", "robusttune.plugin", "robusttune.__main__")


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports (``from a.b import c`` counts as a.b.c when
    c is a module, else as a.b)."""

    def known_prefix(dotted: str) -> str | None:
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    found: set[str | None] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {known_prefix(a.name) for a in node.names if a.name.startswith("robusttune")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
            if base.startswith("robusttune"):
                found |= {
                    f"{base}.{a.name}" if f"{base}.{a.name}" in known else known_prefix(base)
                    for a in node.names
                }
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", None) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and str(node.args[0].value).startswith("robusttune")
        ):
            # an import by name is a dependency all the same
            found.add(known_prefix(str(node.args[0].value)))
    return {m for m in found if m and m != name}


def layer_of(name: str) -> int | None:
    parts = name.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_every_module_belongs_to_a_layer_and_few_stand_at_the_top():
    names = modules()
    loose = sorted(n for n in names if n not in TOP and layer_of(n) is None)
    assert loose == [], f"modules outside every layer: {loose}; LAYERS lists {LAYERS}"
    assert sorted(p.name for p in PACKAGE.glob("*.py")) == [
        "__init__.py",
        "__main__.py",
        "plugin.py",
    ]


def test_imports_point_down_the_layers():
    upward = [
        f"{a} -> {b}"
        for a, targets in sorted(graph().items())
        for b in sorted(targets)
        if a not in TOP and (b in TOP or (layer_of(b) is not None and layer_of(b) > layer_of(a)))
    ]
    assert upward == [], "imports from a lower layer into a higher one:\n" + "\n".join(upward)


def test_no_import_circle():
    found = circles(graph())
    assert found == [], f"import circles: {found}"


def test_the_checks_see_an_upward_arrow_and_a_circle():
    # the checker itself: an arrow up and a two-module circle, on a made-up graph
    assert layer_of("robusttune.core.registry") < layer_of("robusttune.methods.attacks.base")
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    edges = graph()
    assert "robusttune.core.registry" in edges["robusttune.core.schema"]
    assert "robusttune.engine.simulation" in edges["robusttune.engine.recording"]


def test_an_import_by_name_is_seen(tmp_path):
    # an import by name is a dependency (the registries <-> plugins circle hid behind one)
    module = tmp_path / "by_name.py"
    module.write_text(
        "import importlib\n\ndef late():\n"
        "    return importlib.import_module('robusttune.core.registries')\n"
    )
    assert imports("robusttune.core.by_name", module, modules()) == {"robusttune.core.registries"}


def test_a_registry_fills_itself_from_its_builtins_at_the_first_lookup(tmp_path, monkeypatch):
    # the registries live in core; the entries' module is imported at the first lookup, once
    import sys

    from robusttune.core.registry import Registry

    (tmp_path / "made_up_rules.py").write_text(
        "from test_layers_registry import RULES\n@RULES.register('mine')\nclass Mine: pass\n"
    )
    registry = Registry("rule", builtins="made_up_rules")
    module = type(sys)("test_layers_registry")
    module.RULES = registry
    monkeypatch.setitem(sys.modules, "test_layers_registry", module)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "made_up_rules", raising=False)
    assert "made_up_rules" not in sys.modules
    assert registry.names() == ["mine"] and "made_up_rules" in sys.modules
    assert registry["mine"].name == "mine"
    broken = Registry("rule", builtins="no_such_module_here")
    for _ in range(2):  # a failed import is not remembered as done
        try:
            broken.names()
        except ModuleNotFoundError:
            pass
        else:
            raise AssertionError("the missing builtins module went unnoticed")
