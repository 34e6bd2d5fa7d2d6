"""robusttune: map where Byzantine-robust federated learning breaks.

The commands are functions too (`robusttune.commands.api`, imported at first use, so ``import
robusttune`` stays light): ``robusttune.run``, ``sweep``, ``breakdown``, ``calibrate``,
``tune``, ``report`` and ``catalogue``; ``load_plugins`` loads your own rules, attacks,
algorithms, datasets and models (`robusttune.core.plugins`)."""

from typing import Any

__version__ = "0.2.0"

_API = ("run", "sweep", "breakdown", "calibrate", "tune", "report", "catalogue")
__all__ = [
    "__version__",
    "breakdown",
    "calibrate",
    "catalogue",
    "load_plugins",
    "report",
    "run",
    "sweep",
    "tune",
]


def __getattr__(name: str) -> Any:
    if name in _API:
        from robusttune.commands import api

        return getattr(api, name)
    if name == "load_plugins":
        from robusttune.core.plugins import load_plugins

        return load_plugins
    raise AttributeError(f"module 'robusttune' has no attribute {name!r}")
