"""Loading a script of analysis/ (not a package: they run as `python analysis/....py`) as a module
a test can call into."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


@contextmanager
def loaded_script(path: Path, name: str) -> Iterator[ModuleType]:
    """The script at ``path`` imported as module ``name`` as `python path` would run it: its folder
    first on ``sys.path`` (where it finds its sibling modules), itself registered in
    ``sys.modules`` while the block runs (a dataclass resolves its annotations through its
    module's name); both undone after, so two tests may load the same script under different
    names without seeing each other's."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    folder = str(path.parent)
    sys.path.insert(0, folder)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(name, None)
        sys.path.remove(folder)
