"""robusttune.plugin is the plugin API (issue 58): every name it gives is the object the package
uses, importing it costs no torch, and the examples and the documentation's code import nothing
of robusttune but it and the commands as functions (``import robusttune``), so a plugin written
from them survives the next reorganisation of the internals."""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import robusttune.plugin as plugin

ROOT = Path(__file__).resolve().parents[1]
ALLOWED = {"robusttune", "robusttune.plugin"}


def test_every_name_is_the_packages_own_object():
    homes = {
        "AGGREGATORS": "robusttune.core.registries",
        "ATTACKS": "robusttune.core.registries",
        "ALGORITHMS": "robusttune.core.registries",
        "DATASETS": "robusttune.core.registries",
        "MODELS": "robusttune.core.registries",
        "SpecError": "robusttune.core.registry",
        "Aggregator": "robusttune.methods.aggregators.base",
        "Attack": "robusttune.methods.attacks.base",
        "AttackRound": "robusttune.methods.attacks.base",
        "ServerAlgorithm": "robusttune.methods.algorithms.base",
        "RawDataset": "robusttune.problem.data.base",
        "DataShape": "robusttune.problem.data.base",
    }
    assert sorted(plugin.__all__) == sorted(homes)
    for name, home in homes.items():
        assert getattr(plugin, name) is getattr(importlib.import_module(home), name), name
    assert set(plugin.__all__) <= set(dir(plugin))
    with pytest.raises(AttributeError, match="the plugin API is AGGREGATORS"):
        plugin.Registry  # noqa: B018 - an internal name is not part of the API


def test_importing_the_plugin_api_costs_no_torch():
    code = (
        "import sys; import robusttune.plugin as p; assert 'torch' not in sys.modules; "
        "from robusttune.plugin import AGGREGATORS, MODELS, SpecError; "
        "assert 'torch' not in sys.modules, 'the registries pulled torch'; print('light')"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0 and result.stdout.strip() == "light", result.stderr[-2000:]


def imported(source: str) -> set[str]:
    """The robusttune modules a piece of Python imports: import statements and
    importlib.import_module("...") calls with a literal name."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", None) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            names.add(str(node.args[0].value))
    return {n for n in names if n == "robusttune" or n.startswith("robusttune.")}


def code_blocks(markdown: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", markdown, flags=re.S)


def plugin_sources() -> dict[str, str]:
    """What plugin authors read and copy: the example plugin's code, and every Python block of
    the README, the examples' walk-through and the documentation pages."""
    sources = {str(p.relative_to(ROOT)): p.read_text() for p in (ROOT / "examples").rglob("*.py")}
    pages = [
        ROOT / "README.md",
        ROOT / "examples" / "README.md",
        *(
            p
            for p in (ROOT / "docs").rglob("*.md")
            if "_build" not in p.parts and "generated" not in p.parts
        ),
    ]
    for page in pages:
        for number, block in enumerate(code_blocks(page.read_text())):
            sources[f"{page.relative_to(ROOT)} block {number}"] = block
    return sources


def test_examples_and_documentation_import_only_the_plugin_api():
    sources = plugin_sources()
    assert any("robusttune.plugin" in text for text in sources.values())
    strays = {}
    for where, text in sources.items():
        try:
            names = imported(text)
        except SyntaxError:  # a block of shell or an elided sketch, not code to run
            continue
        if names - ALLOWED:
            strays[where] = sorted(names - ALLOWED)
    assert not strays, f"plugin code importing internals (use robusttune.plugin): {strays}"


def test_the_contract_check_sees_imports_by_name_too():
    # the check must be able to fail: internals imported by statement or by name are caught
    assert imported("from robusttune.core.registries import AGGREGATORS") == {
        "robusttune.core.registries"
    }
    assert imported(
        "import importlib\nimportlib.import_module('robusttune.methods.aggregators')"
    ) == {"robusttune.methods.aggregators"}
    assert imported("from robusttune.plugin import Aggregator\nimport robusttune") == ALLOWED


# an import anywhere in a file, the plugin code the tests write out as strings included
IMPORT_IN_TEXT = re.compile(
    r"^\s*(?:from\s+(robusttune[\w.]*)\s+import\b|import\s+(robusttune[\w.]*))"
    r"|import_module\(\s*['\"](robusttune[\w.]*)['\"]|['\"]-m['\"],\s*['\"](robusttune[\w.]*)['\"]",
    flags=re.M,
)


def imported_anywhere(text: str) -> set[str]:
    """The robusttune modules a file imports or runs (``-m``), in its code or in code it holds as
    strings (a plugin file a test writes, a snippet it runs in a child interpreter)."""
    return {name for groups in IMPORT_IN_TEXT.findall(text) for name in groups if name}


def test_the_plugin_tests_import_only_the_plugin_api():
    # what tests/test_plugins.py does is what a plugin author does; the machinery behind it
    # (shipping plugins to workers) is tested with the internals in test_plugin_shipping.py
    text = (ROOT / "tests" / "test_plugins.py").read_text()
    names = imported_anywhere(text) | imported(text)
    assert "robusttune.plugin" in names
    assert names <= ALLOWED, f"tests/test_plugins.py reaches internals: {sorted(names - ALLOWED)}"


def test_the_text_check_sees_imports_inside_strings():
    snippet = (
        'code = """\n    from robusttune.core.registries import AGGREGATORS\n'
        '    import robusttune.methods\n"""\n'
        'CLI = [sys.executable, "-m", "robusttune.commands.cli"]\n'
        'importlib.import_module("robusttune.engine")\n'
    )
    assert imported_anywhere(snippet) == {
        "robusttune.core.registries",
        "robusttune.methods",
        "robusttune.commands.cli",
        "robusttune.engine",
    }


def test_a_registry_base_class_is_named_as_the_plugin_api_gives_it():
    # a plugin entry of the wrong kind is told to subclass robusttune.plugin's class
    from robusttune.core.registries import REGISTRIES

    bases = [registry.base.partition(":")[2] for registry in REGISTRIES if registry.base]
    assert bases and set(bases) <= set(plugin.__all__)
