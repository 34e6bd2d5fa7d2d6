"""The commands as Python functions, for notebooks and scripts: ``robusttune.run``, ``.sweep``,
``.breakdown``, ``.calibrate``, ``.tune``, ``.report`` and ``.catalogue``.

Each takes what its command takes (a YAML path, or the same content as a dict; the options under
their long names, ``set`` as a mapping of RunSpec keys) and runs the command's own code, so a
function and its command give the same results and the same one-line `SpecError` for bad input
(raised here, not printed). ``plugins``: files, package folders or module names as for
``--plugin``, module objects, or registered classes (a notebook's own: they reach the Ray
workers by value). Each returns a typed result with pandas tables read from what the command
wrote::

    import robusttune
    result = robusttune.breakdown("examples/meamed_map.yaml", plugins=["examples/my_defence/"])
    result.table[["method", "breakdown", "broken_by"]]
"""

from __future__ import annotations

import copy
import inspect
import json
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import typer

from robusttune.commands import cli
from robusttune.commands.breakdown_command import breakdown as breakdown_command
from robusttune.commands.tune import tune as tune_command
from robusttune.core.plugins import absolute_references, load_plugins
from robusttune.core.records import RunSummary
from robusttune.core.registry import SpecError

__all__ = [
    "BreakdownResult",
    "CalibrationResult",
    "ReportResult",
    "RunResult",
    "SweepResult",
    "TuningResult",
    "breakdown",
    "calibrate",
    "catalogue",
    "report",
    "run",
    "sweep",
    "tune",
]


@dataclass(frozen=True)
class RunResult:
    """One run: its summary, its folder and its per-round table (rounds.csv)."""

    summary: RunSummary
    folder: Path
    rounds: pd.DataFrame = field(repr=False)


@dataclass(frozen=True)
class SweepResult:
    """A sweep: its folder, its trials (trials.csv: one row per trial, best first) and the
    command's exit status (0: every trial finished; 1: some errored; 130: interrupted)."""

    folder: Path
    trials: pd.DataFrame = field(repr=False)
    status: int


@dataclass(frozen=True)
class BreakdownResult:
    """A breakdown map: ``table`` (breakdown.csv, one row per cell: the median over seeds and
    its range), ``points`` (breakdown_points.csv, the runs behind each number), the report
    breakdown.md and ``seeds`` (breakdown_seeds.csv, one row per cell and seed)."""

    folder: Path
    table: pd.DataFrame = field(repr=False)
    points: pd.DataFrame = field(repr=False)
    report: Path
    seeds: pd.DataFrame = field(repr=False, default_factory=pd.DataFrame)


@dataclass(frozen=True)
class CalibrationResult:
    """``calibrate``'s figures (what ``--json`` prints), its recommended trim ratio (None when
    the sweep was skipped or nothing survived) and the trim sweep's rows as a table."""

    figures: dict[str, Any] = field(repr=False)
    recommended_trim_ratio: float | None
    sweep: pd.DataFrame = field(repr=False)


@dataclass(frozen=True)
class TuningResult:
    """A tuning study: ``table`` (tuning.csv, one row per proposal) and its report tuning.md."""

    folder: Path
    table: pd.DataFrame = field(repr=False)
    report: Path


@dataclass(frozen=True)
class ReportResult:
    """A report: report.md and the runs it read (one row per run: summary figures and keys)."""

    path: Path
    runs: pd.DataFrame = field(repr=False)


def run(
    spec: str | Path | Mapping[str, Any] | None = None,
    *,
    plugins: Iterable[Any] = (),
    out: str | Path | None = None,
    quiet: bool = True,
    **values: Any,
) -> RunResult:
    """``robusttune run``: one federated run from a YAML of RunSpec keys or a dict, with
    ``values`` as ``--set``::

        result = robusttune.run(method="median", attack="ipm", byzantine_fraction=0.2, rounds=5)
        result.summary.final_accuracy, result.rounds[["round", "accuracy"]]
    """
    load_plugins(plugins)
    if isinstance(spec, Mapping):
        values = {**spec, **values}
        spec = None
    folder, summary = _invoke(
        cli.run, spec_file=_path(spec), set_=_assignments(values), out=_path(out), quiet=quiet
    )
    return RunResult(summary, Path(folder), _csv(Path(folder) / "rounds.csv"))


def sweep(
    space: str | Path | Mapping[str, Any],
    *,
    plugins: Iterable[Any] = (),
    set: Mapping[str, Any] | None = None,
    **options: Any,
) -> SweepResult:
    """``robusttune sweep``: ``options`` are its long options (name, storage, address,
    num_samples, max_concurrent, cpus_per_trial, gpus_per_trial, resume, dry_run, verbose)::

        result = robusttune.sweep("search_spaces/quickstart.yaml", set={"rounds": 5})
        result.trials.head()
    """
    from robusttune.commands.sweep import prepare_spec, sweep_command
    from robusttune.experiments.sweep.storage import DEFAULT_STORAGE, TRIALS_FILE, experiment_path

    load_plugins(plugins)
    path = _yaml_file(space, "sweep")
    assignments = _assignments(set or {})
    status = sweep_command(path, assignments=assignments, echo=typer.echo, **options)
    named = prepare_spec(
        path,
        name=options.get("name"),
        num_samples=None,
        max_concurrent=None,
        cpus_per_trial=None,
        gpus_per_trial=None,
        assignments=[],
    )
    folder = Path(experiment_path(options.get("storage") or DEFAULT_STORAGE, named.name))
    return SweepResult(folder, _csv(folder / TRIALS_FILE), status)


def breakdown(
    space: str | Path | Mapping[str, Any],
    *,
    plugins: Iterable[Any] = (),
    set: Mapping[str, Any] | None = None,
    **options: Any,
) -> BreakdownResult:
    """``robusttune breakdown``: ``options`` are its long options (name, storage, resume,
    local, address, cpus_per_trial, max_concurrent, threshold, relative_threshold, budget,
    max_fraction, verify_radius, start_from ...)::

        result = robusttune.breakdown("examples/meamed_map.yaml", local=True)
        result.table[["method", "breakdown", "broken_by", "theory_fraction"]]
    """
    load_plugins(plugins)
    folder = Path(
        _invoke(
            breakdown_command,
            wrapped=False,
            space=_yaml_file(space, "breakdown"),
            set_=_assignments(set or {}),
            **options,
        )
    )
    return BreakdownResult(
        folder,
        _csv(folder / "breakdown.csv"),
        _csv(folder / "breakdown_points.csv"),
        folder / "breakdown.md",
        _csv(folder / "breakdown_seeds.csv"),
    )


def calibrate(
    *,
    clients: int,
    participation: float,
    byzantine: float,
    rounds: int,
    plugins: Iterable[Any] = (),
    set: Mapping[str, Any] | None = None,
    **options: Any,
) -> CalibrationResult:
    """``robusttune calibrate``: the deployment (N, p, beta, T) and its long options (method,
    dataset, attack, trim, seeds, margin, sweep_rounds, local, out, analytic_only ...)::

        result = robusttune.calibrate(clients=100, participation=0.1, byzantine=0.1,
                                      rounds=200, analytic_only=True)
        result.figures["analytic_safe_trim"]
    """
    load_plugins(plugins)
    figures = _invoke(
        cli.calibrate,
        clients=clients,
        participation=participation,
        byzantine=byzantine,
        rounds=rounds,
        set_=_assignments(set or {}),
        as_json=options.pop("as_json", False),
        **_listed(options, "trim", "attack", "seeds"),
    )
    rows = (figures.get("sweep") or {}).get("rows") or []
    return CalibrationResult(figures, figures.get("recommended_trim_ratio"), pd.DataFrame(rows))


def tune(
    space: str | Path | Mapping[str, Any],
    *,
    plugins: Iterable[Any] = (),
    set: Mapping[str, Any] | None = None,
    **options: Any,
) -> TuningResult:
    """``robusttune tune``: ``options`` are its long options (name, storage, num_samples,
    resume, local, address, cpus_per_trial, max_concurrent ...)::

        result = robusttune.tune("search_spaces/tune_defence.yaml", num_samples=8)
        result.table.sort_values("worst_validation", ascending=False).head()
    """
    load_plugins(plugins)
    folder = Path(
        _invoke(
            tune_command,
            wrapped=False,
            space=_yaml_file(space, "tuning"),
            set_=_assignments(set or {}),
            **options,
        )
    )
    return TuningResult(folder, _csv(folder / "tuning.csv"), folder / "tuning.md")


def report(results_dir: str | Path, *, plugins: Iterable[Any] = (), **options: Any) -> ReportResult:
    """``robusttune report``: report.md of a results folder (out, runs, gain_from, gain_to)::

    result = robusttune.report("results/quickstart")
    result.runs.groupby("method")["final_accuracy"].mean()
    """
    from robusttune.reports.results import load_runs

    load_plugins(plugins)
    path = _invoke(cli.report, results_dir=Path(results_dir), **_listed(options, "runs"))
    return ReportResult(Path(path), load_runs(results_dir))


def catalogue(concept: str | None = None, *, plugins: Iterable[Any] = ()) -> pd.DataFrame:
    """``robusttune list``: every registered entry (concept, name, source, summary)::

    robusttune.catalogue("aggregator", plugins=["examples/my_defence/"])
    """
    from robusttune.reports.catalogue import catalogue as rows

    load_plugins(plugins)
    return pd.DataFrame(rows(concept), columns=["concept", "name", "source", "summary"])


# -- plumbing --------------------------------------------------------------------------------
def _invoke(command: Callable[..., Any], wrapped: bool = True, **given: Any) -> Any:
    """Call a command's body (under its one-line-error wrapper: a SpecError is raised here)
    with ``given`` and, for every other parameter, the default its typer option declares."""
    body = command.__wrapped__ if wrapped else command  # type: ignore[attr-defined]
    parameters = inspect.signature(body).parameters
    unknown = sorted(set(given) - set(parameters))
    if unknown:
        allowed = ", ".join(p.rstrip("_") for p in parameters if p not in ("plugin",))
        raise SpecError(f"option {unknown[0]!r} is unknown; allowed: {allowed}")
    values = {}
    for name, parameter in parameters.items():
        if name in given:
            values[name] = given[name]
            continue
        default = parameter.default
        default = getattr(default, "default", default)  # typer's OptionInfo / ArgumentInfo
        if default is ... or default is inspect.Parameter.empty:
            raise SpecError(f"{name} is required")
        values[name] = copy.copy(default)
    try:
        return body(**values)
    except typer.Exit as stop:
        if stop.exit_code == cli.EXIT_INTERRUPTED:
            raise KeyboardInterrupt(
                "interrupted: call again with resume=True to continue"
            ) from None
        raise


def _assignments(values: Mapping[str, Any]) -> list[str]:
    # JSON is YAML: each value reads back as the Python value it was
    return [f"{key}={json.dumps(value)}" for key, value in values.items()]


def _listed(options: dict[str, Any], *keys: str) -> dict[str, Any]:
    """Repeatable options given as one value become a list (``attack="ipm"``)."""
    out = dict(options)
    for key in keys:
        if key in out and not isinstance(out[key], (list, tuple)):
            out[key] = [out[key]]
        elif key in out:
            out[key] = list(out[key])
    return out


def _path(value: str | Path | None) -> Path | None:
    return None if value is None else Path(value)


def _yaml_file(space: str | Path | Mapping[str, Any], default_name: str) -> Path:
    """A YAML path as given, or a dict written to a temporary YAML named after the dict's
    ``name`` (the command's default name otherwise), its plugin files made absolute first (they
    are relative to the working directory, as ``--plugin`` is)."""
    if not isinstance(space, Mapping):
        return Path(space)
    import yaml

    content = dict(space)
    if "plugins" in content:
        content["plugins"] = absolute_references(content["plugins"], None)
    name = content.get("name") if isinstance(content.get("name"), str) else default_name
    folder = Path(tempfile.mkdtemp(prefix="robusttune-api-"))
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(content, sort_keys=False))
    return path


def _csv(path: Path) -> pd.DataFrame:
    return pd.read_csv(path) if path.exists() else pd.DataFrame()
