"""The plugins a process has loaded (`Plugin` records, `loaded`, `declared`) and the installed
packages' ``robusttune.plugins`` entry points (`load_entry_points`), which every process loads by
itself at the registries' first lookup (`robusttune.core.registries.builtins_then_installed`).
Below both the registries and `robusttune.core.plugins` (files, modules and objects named by the
user), so that neither imports the other back."""

from __future__ import annotations

import importlib.metadata
import threading
import traceback
import types
from dataclasses import dataclass

from robusttune.core.registry import SpecError, registering_from

__all__ = ["ENTRY_POINT_GROUP", "Plugin", "declared", "load_entry_points", "loaded"]

ENTRY_POINT_GROUP = "robusttune.plugins"


@dataclass(frozen=True)
class Plugin:
    """One loaded plugin. ``reference``: how any process names it (an absolute file or folder
    path, a module name, ``entry point NAME``, or ``object MODULE.QUALNAME``); ``kind``: file,
    module, entry_point or object; ``module``: the module it was imported as; ``payload``: an
    object plugin defined in a notebook (``__main__``), pickled by value for the workers."""

    reference: str
    kind: str
    module: str
    payload: bytes | None = None
    concept: str | None = None
    entry: str | None = None


_loaded: dict[str, Plugin] = {}
_lock = threading.RLock()


def loaded() -> tuple[Plugin, ...]:
    """Every plugin this process has loaded, in load order."""
    return tuple(_loaded.values())


def declared() -> tuple[Plugin, ...]:
    """The plugins a run's workers must load: all but the installed entry points (which every
    process loads by itself)."""
    return tuple(p for p in _loaded.values() if p.kind != "entry_point")


def load_entry_points() -> list[Plugin]:
    """Load the ``robusttune.plugins`` entry points of every installed package."""
    found = []
    for point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        reference = f"entry point {point.name}"
        with _lock:
            if reference in _loaded:
                continue
            with registering_from(reference):
                try:
                    target = point.load()
                except SpecError as error:
                    raise SpecError(f"plugin {reference} ({point.value}): {error}") from None
                except Exception as error:
                    raise SpecError(
                        f"plugin {reference} ({point.value}) failed to import: {_last_line(error)}"
                    ) from None
            module = target.__name__ if isinstance(target, types.ModuleType) else point.module
            _loaded[reference] = plugin = Plugin(reference, "entry_point", module)
        found.append(plugin)
    return found


def _last_line(error: BaseException) -> str:
    return traceback.format_exception_only(type(error), error)[-1].strip()
