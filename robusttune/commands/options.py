"""The options several commands share, defined once so they read the same everywhere: where the
trials run (``--address``, ``--local``), what each takes (``--cpus-per-trial``,
``--gpus-per-trial``, ``--max-concurrent``), ``--set`` for a space's base run, and ``--plugin``,
which `takes_plugins` gives every command."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import typer

__all__ = [
    "ADDRESS",
    "CPUS_PER_TRIAL",
    "GPUS_PER_TRIAL",
    "LOCAL",
    "MAX_CONCURRENT",
    "PLUGIN_HELP",
    "SET_BASE",
    "takes_plugins",
]

ADDRESS = typer.Option(
    None,
    "--address",
    help="Join a running Ray cluster (e.g. auto) instead of starting a local Ray.",
)
CPUS_PER_TRIAL = typer.Option(
    None, "--cpus-per-trial", help="CPUs per trial (fractions allowed); torch threads follow."
)
GPUS_PER_TRIAL = typer.Option(
    None,
    "--gpus-per-trial",
    help="GPUs per trial: a number "
    "(fractions allowed, e.g. 0.25) or auto, the default: a share of a "
    "GPU from the run's size where the cluster has GPUs, else none.",
)
MAX_CONCURRENT = typer.Option(
    None, "--max-concurrent", help="At most K trials at once (0: as resources allow)."
)
LOCAL = typer.Option(False, "--local", help="Run trials in this process, without Ray.")
SET_BASE = typer.Option(
    [], "--set", help="key=value for the base run, repeatable; overrides run: in the YAML."
)

PLUGIN_HELP = (
    "A plugin to load first: a .py file, a package folder (name it with a /) or an "
    "importable module, registering rules, attacks, algorithms, datasets or models "
    "(repeatable)."
)


def takes_plugins(command: Callable[..., Any]) -> Callable[..., Any]:
    """Give a command the repeatable ``--plugin PATH_OR_MODULE`` option, loaded (relative to the
    working directory) before the command reads anything else."""
    signature = inspect.signature(command)
    option = inspect.Parameter(
        "plugin",
        inspect.Parameter.KEYWORD_ONLY,
        annotation=list[str],
        default=typer.Option([], "--plugin", help=PLUGIN_HELP),
    )

    @functools.wraps(command)
    def wrapper(*args: Any, plugin: list[str] = [], **kwargs: Any) -> Any:  # noqa: B006
        if plugin:
            from robusttune.core.plugins import load_plugins

            load_plugins(plugin)
        return command(*args, **kwargs)

    wrapper.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[*signature.parameters.values(), option]
    )
    wrapper.__annotations__ = {**command.__annotations__, "plugin": list[str]}
    return wrapper
