"""Plugins: the user's own rules, attacks, algorithms, datasets and models, registered with the
same ``@AGGREGATORS.register("name")`` decorators (and base classes) as the built-ins.

A plugin is named as pytest names its plugins:

- a Python file (``my_rule.py``) or a package folder (``./my_defence/``, ``my_defence/``): a
  name that ends in ``.py`` or holds a ``/``, relative to the YAML that names it (or to the
  working directory for ``--plugin``);
- an importable module (``my_package.rules``): any other name;
- an installed package's entry point in the group ``robusttune.plugins`` (loaded by every
  process at the registries' first lookup, with nothing to name);
- from Python, a module object or a registered class (`load_plugins`).

The driver and every Ray worker import the same plugins before they build a run: the driver's
list (`loaded`) travels with each trial, and a worker loads what it lacks (`load_plugins`);
on a cluster joined with ``--address`` the files travel with the job (`shipping_folder`, Ray's
``py_modules``). A bad plugin is one `SpecError` line naming it: a file that does not exist, an
import that raises (its exception's last line), a name that clashes with a built-in or another
plugin, an entry that is not a subclass of its registry's base class.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import shutil
import sys
import tempfile
import types
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from robusttune.core.plugin_records import (
    ENTRY_POINT_GROUP,
    Plugin,
    _last_line,
    _loaded,
    _lock,
    declared,
    load_entry_points,
    loaded,
)
from robusttune.core.registries import builtins_then_installed
from robusttune.core.registry import _REGISTRIES, SpecError, registering_from

# Plugin, ENTRY_POINT_GROUP, loaded, declared and load_entry_points live in
# robusttune.core.plugin_records (the registries load the entry points; this module imports them)
SHIPPED_PACKAGE = "robusttune_shipped_plugins"  # the package a job's plugin files travel in

__all__ = [
    "ENTRY_POINT_GROUP",
    "SHIPPED_PACKAGE",
    "Plugin",
    "absolute_references",
    "builtins_then_installed",
    "declare_plugins",
    "declared",
    "load_entry_points",
    "load_plugins",
    "loaded",
    "shipping_folder",
]


def is_path(text: str) -> bool:
    """Whether a plugin name is a file or folder (ends in .py or holds a /), not a module."""
    return text.endswith(".py") or "/" in text or "\\" in text


def absolute_references(texts: Any, base: Path | None) -> Any:
    """``plugins:`` as read from a YAML in folder ``base``: file and folder names made absolute
    (so a stored copy elsewhere names the same files), module names as given. Anything but a
    list of text is returned as is, for the file's schema to reject with its one line."""
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        return texts
    root = Path.cwd() if base is None else Path(base)
    return [str((root / t).resolve()) if is_path(t) else t for t in texts]


def load_plugins(plugins: Iterable[Any], base: Path | str | None = None) -> list[Plugin]:
    """Import ``plugins`` (names as the user writes them, `Plugin` records from another process,
    module objects or registered classes), each once per process; file names are relative to
    ``base`` (default: the working directory). Returns their records. Every failure is one
    SpecError line naming the plugin."""
    builtins_then_installed()
    root = Path.cwd() if base is None else Path(base)
    records = []
    for plugin in plugins:
        with _lock:
            if isinstance(plugin, Plugin):
                record = _load_record(plugin)
            elif isinstance(plugin, str):
                record = _load_name(plugin, root)
            elif isinstance(plugin, types.ModuleType):
                record = _load_module_object(plugin)
            else:
                record = _load_object(plugin)
        records.append(record)
    return records


def declare_plugins(
    mapping: dict[str, Any], source: str = "", base: Path | str | None = None
) -> list[Plugin]:
    """Load the plugins a YAML mapping's ``plugins:`` names (files relative to ``base``), then
    write into it every plugin loaded in this process that a stored copy can name again (files
    as absolute paths, modules), so the stored copy (sweep.yaml, plan.yaml) resumes, reports and
    reaches the workers with the same plugins, ``--plugin`` ones included."""
    texts = mapping.get("plugins")
    where = f"{source}: " if source else ""
    if texts is not None and (
        not isinstance(texts, list) or not all(isinstance(t, str) for t in texts)
    ):
        raise SpecError(
            f"{where}plugins must be a list of .py files, package folders or module "
            f"names; got {texts!r}"
        )
    try:
        records = load_plugins(texts or [], base)
    except SpecError as error:
        raise SpecError(f"{where}{error}") from None
    named = [p.reference for p in declared() if p.kind in ("file", "module")]
    if named:
        mapping["plugins"] = named
    else:
        mapping.pop("plugins", None)
    return records


# -- names ----------------------------------------------------------------------------------
def _load_name(text: str, root: Path) -> Plugin:
    if not text.strip():
        raise SpecError(
            "plugin '' is empty; allowed: a .py file, a package folder or a module name"
        )
    if is_path(text):
        path = (root / text).resolve()
        reference = str(path)
        if reference in _loaded:
            return _loaded[reference]
        if not path.exists():
            raise SpecError(
                f"plugin {text!r}: no such file or folder ({path}); allowed: a .py "
                f"file or a package folder, relative to {root}, or a module name"
            )
        return _import_path(reference, path, label=text)
    if text in _loaded:
        return _loaded[text]
    _import(text, text, lambda: importlib.import_module(text))
    _loaded[text] = plugin = Plugin(text, "module", text)
    return plugin


def _load_record(plugin: Plugin) -> Plugin:
    if plugin.reference in _loaded:
        return _loaded[plugin.reference]
    if plugin.kind == "file":
        path = Path(plugin.reference)
        if not path.exists():
            shipped = _shipped_copy(plugin.module)
            if shipped is None:
                raise SpecError(
                    f"plugin {plugin.reference!r}: no such file or folder on this "
                    f"node; allowed: the same path on every node, or a cluster joined "
                    f"with --address (the files travel with the job)"
                )
            path = shipped
        return _import_path(plugin.reference, path, label=plugin.reference, module=plugin.module)
    if plugin.kind == "object":
        return _load_shipped_object(plugin)
    if plugin.kind == "entry_point":
        load_entry_points()
        if plugin.reference not in _loaded:
            raise SpecError(
                f"plugin {plugin.reference}: not installed on this node; allowed: the "
                f"same packages on every node"
            )
        return _loaded[plugin.reference]
    return _load_name(plugin.reference, Path.cwd())


def module_name(path: Path) -> str:
    """The module a plugin file is imported as: a package folder keeps its name (its relative
    imports work); a file gets one of its own, unique per path, so two files called rules.py
    in two folders do not meet, and a file never hides a real module."""
    if path.is_dir():
        return path.name
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:8]
    stem = "".join(c if c.isalnum() else "_" for c in path.stem)
    return f"robusttune_plugin_{stem}_{digest}"


def _import_path(reference: str, path: Path, *, label: str, module: str | None = None) -> Plugin:
    name = module or module_name(Path(reference))
    if path.is_dir():
        init = path / "__init__.py"
        if not init.exists():
            raise SpecError(
                f"plugin {label!r}: the folder has no __init__.py; allowed: a package "
                f"folder, or one of its .py files"
            )
        present = sys.modules.get(name)
        if present is not None and Path(getattr(present, "__file__", "") or "").parent != path:
            raise SpecError(
                f"plugin {label!r}: a module named {name!r} is already imported (from "
                f"{getattr(present, '__file__', None)}); allowed: a folder with "
                f"another name"
            )
        spec = importlib.util.spec_from_file_location(
            name, init, submodule_search_locations=[str(path)]
        )
    else:
        if path.suffix != ".py":
            raise SpecError(
                f"plugin {label!r}: not a .py file; allowed: a .py file, a package "
                f"folder or a module name"
            )
        spec = importlib.util.spec_from_file_location(name, path)

    def run() -> None:
        if name in sys.modules:
            return
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)  # type: ignore[union-attr]
        except BaseException:
            sys.modules.pop(name, None)
            raise

    _import(label, reference, run)
    _loaded[reference] = plugin = Plugin(reference, "file", name)
    return plugin


def _import(label: str, source: str, run: Any) -> None:
    """Run one plugin import with its registrations attributed to it; any failure, one line."""
    with registering_from(label):
        try:
            run()
        except SpecError as error:
            raise SpecError(f"plugin {label!r}: {error}") from None
        except ModuleNotFoundError as error:
            if error.name == source:
                raise SpecError(
                    f"plugin {label!r}: no module named {source!r}; allowed: an "
                    f"importable module, or a .py file or folder (a name with / or "
                    f".py)"
                ) from None
            raise SpecError(f"plugin {label!r} failed to import: {_last_line(error)}") from None
        except Exception as error:
            raise SpecError(f"plugin {label!r} failed to import: {_last_line(error)}") from None


# -- objects (the Python API) ---------------------------------------------------------------
def _load_module_object(module: types.ModuleType) -> Plugin:
    for plugin in _loaded.values():
        if plugin.module == module.__name__:
            return plugin
    if module.__name__ == "__main__":
        raise SpecError(
            "plugin __main__: a notebook or script cannot be named as a plugin; "
            "allowed: its registered classes, a .py file, or a module"
        )
    # imported already (its entries registered); workers import it by name
    _loaded[module.__name__] = plugin = Plugin(module.__name__, "module", module.__name__)
    return plugin


def _load_object(entry: Any) -> Plugin:
    """A registered class or factory: workers import its module, or, for one defined in a
    notebook or script (``__main__``), unpickle it by value and register it again."""
    where = _registered_as(entry)
    label = getattr(entry, "__qualname__", repr(entry))
    if where is None:
        raise SpecError(
            f"plugin {label}: not registered; allowed: an entry decorated with a "
            f"registry's register, e.g. @AGGREGATORS.register('name')"
        )
    registry, name = where
    module = getattr(entry, "__module__", "") or ""
    if module != "__main__":
        imported = sys.modules.get(module)
        for plugin in _loaded.values():
            if plugin.module == module:
                return plugin
        if imported is not None and getattr(imported, "__file__", None) and not is_path(module):
            _loaded[module] = plugin = Plugin(module, "module", module)
            return plugin
    import cloudpickle

    reference = f"object {module}.{label}"
    payload = cloudpickle.dumps(entry)
    _loaded[reference] = plugin = Plugin(
        reference, "object", module, payload, registry.concept, name
    )
    return plugin


def _registered_as(entry: Any) -> tuple[Any, str] | None:
    for registry in _REGISTRIES:
        for name in registry.names():
            if registry._entries[name] is entry:
                return registry, name
    return None


def _load_shipped_object(plugin: Plugin) -> Plugin:
    import cloudpickle

    registry = next((r for r in _REGISTRIES if r.concept == plugin.concept), None)
    if registry is None or plugin.payload is None or plugin.entry is None:
        raise SpecError(f"plugin {plugin.reference}: no {plugin.concept} registry here")
    with registering_from(plugin.reference):
        try:
            entry = cloudpickle.loads(plugin.payload)
            if plugin.entry not in registry._entries:
                registry.register(plugin.entry)(entry)
        except SpecError as error:
            raise SpecError(f"plugin {plugin.reference}: {error}") from None
        except Exception as error:
            raise SpecError(
                f"plugin {plugin.reference} failed to load: {_last_line(error)}"
            ) from None
    _loaded[plugin.reference] = plugin
    return plugin


# -- a cluster's workers --------------------------------------------------------------------
def shipping_folder(plugins: Sequence[Plugin]) -> Path | None:
    """A package folder holding a copy of every file plugin under its module name, for Ray's
    ``runtime_env={"py_modules": [folder]}`` on a cluster joined with ``--address``: a node
    without the driver's files loads the copies (`load_plugins`). None when there are none."""
    files = [p for p in plugins if p.kind == "file"]
    if not files:
        return None
    folder = Path(tempfile.mkdtemp(prefix="robusttune-plugins-")) / SHIPPED_PACKAGE
    folder.mkdir()
    (folder / "__init__.py").write_text('"""Plugin files a robusttune job brought along."""\n')
    for plugin in files:
        source = Path(plugin.reference)
        if source.is_dir():
            shutil.copytree(
                source,
                folder / plugin.module,
                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
            )
        else:
            shutil.copy2(source, folder / f"{plugin.module}.py")
    return folder


def _shipped_copy(module: str) -> Path | None:
    """The copy of a plugin file (or folder) in the job's shipped package, if there is one."""
    try:
        spec = importlib.util.find_spec(SHIPPED_PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        for candidate in (Path(location) / module, Path(location) / f"{module}.py"):
            if candidate.exists():
                return candidate
    return None
