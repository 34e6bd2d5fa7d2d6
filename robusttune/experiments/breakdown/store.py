"""A breakdown map's results folder, kept so that a killed map continues where it stopped.

    FOLDER/plan.yaml    the plan as run: the breakdown YAML with the command line's overrides
                        written into it (and the command line as a comment)
    FOLDER/runs.jsonl   one line per finished run: its RunSpec (the key) and its RunSummary

A map is a deterministic function of its plan and its runs' results: the bisection asks for the
same points in the same waves, `spec_evaluator` builds the same RunSpecs for them and a seeded
Optuna study asks the same knobs once it is told the same scores. So a resumed map replays the
whole bisection and `StoredRunner` answers every run it already has from runs.jsonl; only the
missing runs reach the real runner. The store is per run, not per point, so a point whose seeds
or adversary variants were cut half way loses only its unfinished runs.

Each line is appended with one ``write`` of the whole line and then fsync'ed, so a kill leaves at
most a torn last line, which a resume ignores (with a note) and runs again. A run that errored
(``RunSummary.error``) or was stopped before its last round is not kept: a resume runs it again.
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from robusttune.core.files import write_text_atomic
from robusttune.core.records import RunSummary
from robusttune.core.registry import SpecError
from robusttune.core.runspec import RunSpec
from robusttune.core.yaml_input import parse_yaml, read_yaml_text

if TYPE_CHECKING:
    from robusttune.engine.runners import Runner

__all__ = [
    "PLAN_FILE",
    "RUNS_FILE",
    "MapStore",
    "StoredRunner",
    "interrupted_lines",
    "open_stored_runner",
]

PLAN_FILE = "plan.yaml"
RUNS_FILE = "runs.jsonl"


class MapStore:
    """The plan and the finished runs of the map kept in ``folder`` (a local or shared folder)."""

    def __init__(
        self, folder: str | Path, kind: str = "breakdown map", result_file: str = "breakdown.csv"
    ) -> None:
        # kind / result_file: what the folder holds, for messages (robust tuning keeps its study
        # the same way, `robusttune.experiments.tuning`)
        self.kind, self.result_file = kind, result_file
        self.folder = Path(folder)
        self.plan_path = self.folder / PLAN_FILE
        self.runs_path = self.folder / RUNS_FILE
        self.notes: list[str] = []

    # -- the plan --------------------------------------------------------------------------
    def open(self, plan: Any, *, resume: bool, command: str) -> dict[str, RunSummary]:
        """Check the folder against ``plan`` and return the runs already finished in it.

        Without ``resume`` the folder must hold no runs (a map is never silently mixed with an
        earlier one); with it, the folder must hold this very plan. Either refusal is one
        SpecError line saying how to go on. ``command`` is the command line, for plan.yaml."""
        stored = self.stored_plan()
        if stored is not None and hasattr(plan, "identity_of"):
            # a plan that lets some keys change on a resume (a tuning study's num_samples)
            stored = plan.identity_of(stored)
        has_runs = self.runs_path.exists() and self.runs_path.stat().st_size > 0
        if not resume:
            if has_runs or (self.folder / self.result_file).exists():
                raise SpecError(
                    f"{self.folder} already holds a {self.kind}; allowed: --resume to "
                    f"continue it, a new --name for a new one, or removing the folder"
                )
        else:
            if stored is None:
                raise SpecError(
                    f"--resume: {self.folder} holds no {self.kind} ({PLAN_FILE}); "
                    f"run it without --resume"
                )
            difference = first_difference(_plain(stored), _plain(plan.identity()))
            if difference is not None:
                raise SpecError(
                    f"--resume: {self.folder} holds a different plan ({difference}); "
                    f"allowed: the same YAML and --set as before (see "
                    f"{self.plan_path}), or a new --name without --resume for the "
                    f"changed plan"
                )
        self.folder.mkdir(parents=True, exist_ok=True)
        # the command as a comment: the file is the plan to compare with, the comment is for people
        header = f"# {command}\n" if command else ""
        text = header + yaml.safe_dump({"name": plan.name, **plan.raw}, sort_keys=False)
        write_text_atomic(self.plan_path, text)
        return self.finished() if resume else {}

    def stored_plan(self) -> dict[str, Any] | None:
        """plan.yaml's identity (see `BreakdownPlan.identity`), or None when there is none."""
        if not self.plan_path.exists():
            return None
        mapping = parse_yaml(read_yaml_text(self.plan_path), str(self.plan_path)) or {}
        if not isinstance(mapping, dict):
            raise SpecError(
                f"{self.plan_path}: not a {self.kind}'s plan (a mapping); allowed: "
                f"the plan.yaml the command wrote, or a new --name"
            )
        return {
            k: v
            for k, v in mapping.items()
            if k not in ("name", "resources", "max_concurrent", "plugins")
        }

    # -- the runs --------------------------------------------------------------------------
    def finished(self) -> dict[str, RunSummary]:
        """Every kept run: RunSpec key -> RunSummary. A line that does not parse can only be the
        last one, torn by a kill; it is skipped with a note (its run is simply run again)."""
        runs: dict[str, RunSummary] = {}
        if not self.runs_path.exists():
            return runs
        lines = self.runs_path.read_bytes().split(b"\n")
        for number, raw in enumerate(lines, 1):
            if not raw.strip():
                continue
            try:
                # a line that is not UTF-8 is as unreadable as a torn one (UnicodeDecodeError
                # is a ValueError)
                entry = json.loads(raw.decode("utf-8"))
                # the key as this version spells it (a line kept before a key was added, or
                # one that spells an added key at its old value, is the same run)
                key = _identity(json.loads(entry["key"]))
                runs[key] = RunSummary.from_dict(_restore_floats(entry["summary"]))
            except (ValueError, KeyError, TypeError, AttributeError):
                self.notes.append(
                    f"note: {self.runs_path} line {number} is incomplete (a run cut "
                    f"off while it was written); that run is run again"
                )
        return runs

    def append(self, spec: RunSpec, summary: RunSummary) -> None:
        """Keep one finished run: one line, written whole and fsync'ed before the next run."""
        entry = {"key": run_key(spec), "summary": _json_safe(summary.to_dict())}
        line = json.dumps(entry, sort_keys=True, allow_nan=False) + "\n"
        if self.runs_path.exists() and self.runs_path.stat().st_size > 0:
            with self.runs_path.open("rb") as handle:
                handle.seek(-1, os.SEEK_END)
                if handle.read(1) != b"\n":
                    line = "\n" + line  # after a torn line: start a fresh one
        with self.runs_path.open("a") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())


# RunSpec keys added after maps were first kept, each with the value that reproduces the runs
# made before it existed. At that value a key is left out of a run's identity, so a map (or a
# tuning study) kept before the key existed still resumes: its runs answer the specs that leave
# the key there. A new RunSpec key belongs here (tests/test_breakdown_cli.py checks).
KEYS_ADDED_LATER: dict[str, Any] = {"train_samples": None}


def run_key(spec: RunSpec) -> str:
    """A run's identity in runs.jsonl: its fully resolved RunSpec (sorted JSON; non-finite
    values as strings so the line stays strict JSON), less the `KEYS_ADDED_LATER` at the value
    that reproduces the runs made before them."""
    return _identity(spec.to_dict())


def _identity(values: dict[str, Any]) -> str:
    kept = {
        k: v for k, v in values.items() if not (k in KEYS_ADDED_LATER and v == KEYS_ADDED_LATER[k])
    }
    return json.dumps(_json_safe(kept), sort_keys=True)


class StoredRunner:
    """A `robusttune.engine.runners.Runner` that answers runs kept in ``store`` without running them,
    hands the others to ``inner`` and keeps each as it finishes.

    ``one_at_a_time``: give ``inner`` one run per call, so each run is kept the moment it ends
    (the in-process runner runs one after another anyway); off, the missing runs of a call go to
    ``inner`` together (a Ray Tune wave, whose trials run side by side) and are kept when it
    returns. ``on_runs(ran, reused, seconds)`` is told after every inner call (progress)."""

    def __init__(
        self,
        inner: Runner,
        store: MapStore,
        finished: dict[str, RunSummary] | None = None,
        *,
        one_at_a_time: bool = False,
        on_runs: Callable[[int, int], None] | None = None,
    ) -> None:
        self.inner = inner
        self.store = store
        self.finished = dict(finished or {})
        self.one_at_a_time = one_at_a_time
        self.on_runs = on_runs
        self.ran = 0
        self.reused = 0
        self._lock = threading.Lock()

    def __call__(self, specs: Sequence[RunSpec]) -> list[RunSummary]:
        keys = [run_key(s) for s in specs]
        with self._lock:  # a map's cells call from threads of their own (a streaming runner)
            missing = list(dict.fromkeys(k for k in keys if k not in self.finished))
            reused = len(keys) - sum(1 for k in keys if k in missing)
            self.reused += reused
        if self.on_runs is not None and reused:
            self.on_runs(0, reused)
        by_key = dict(zip(keys, specs))
        chunks = [[k] for k in missing] if self.one_at_a_time else ([missing] if missing else [])
        fresh: dict[str, RunSummary] = {}
        for chunk in chunks:
            summaries = self.inner([by_key[k] for k in chunk])
            with self._lock:
                for key, summary in zip(chunk, summaries):
                    fresh[key] = summary
                    if summary.error is None and not summary.stopped_early:
                        self.store.append(by_key[key], summary)
                        self.finished[key] = summary
                self.ran += len(chunk)
            if self.on_runs is not None:
                self.on_runs(len(chunk), 0)
        with self._lock:
            return [fresh[k] if k in fresh else self.finished[k] for k in keys]

    def drive(self, body: Callable[[], Any]) -> Any:
        """The inner runner's way of running a command's logic (`robusttune.engine.runners.drive`)."""
        from robusttune.engine.runners import drive

        return drive(self.inner, body)


def open_stored_runner(
    folder: str | Path,
    plan: Any,
    runner: Runner,
    *,
    resume: bool,
    local: bool,
    command: str,
    say: Callable[[str], None],
    kind: str = "breakdown map",
    result_file: str = "breakdown.csv",
    on_runs: Callable[[int, int], None] | None = None,
) -> StoredRunner:
    """``runner`` behind ``folder``'s store, as the breakdown map, the horizon measurement and the
    tuning study each open it: the folder checked against ``plan`` (`MapStore.open`), its notes
    and, on ``resume``, the count of kept runs told through ``say``; in process (``local``) each
    run is kept the moment it ends."""
    store = MapStore(folder, kind=kind, result_file=result_file)
    finished = store.open(plan, resume=resume, command=command)
    for note in store.notes:
        say(note)
    if resume:
        say(f"resuming {store.folder}: {len(finished)} finished runs kept in {RUNS_FILE}")
    return StoredRunner(runner, store, finished, one_at_a_time=local, on_runs=on_runs)


def interrupted_lines(folder: str | Path, command: str) -> list[str]:
    """What a Ctrl-C'd map, measurement or study prints: where its runs are and how to go on."""
    return [
        f"interrupted: the finished runs are kept in {Path(folder) / RUNS_FILE}",
        f"continue with: {command} --resume",
    ]


def first_difference(stored: Any, current: Any, path: str = "") -> str | None:
    """The first dotted key where two plan mappings differ, as ``key: A there, B now``."""
    if isinstance(stored, dict) and isinstance(current, dict):
        for key in list(dict.fromkeys([*stored, *current])):
            where = f"{path}.{key}" if path else str(key)
            if key not in stored:
                return f"{where}: not set there, {_show(current[key])} now"
            if key not in current:
                return f"{where}: {_show(stored[key])} there, not set now"
            found = first_difference(stored[key], current[key], where)
            if found is not None:
                return found
        return None
    if stored != current:
        return f"{path or 'plan'}: {_show(stored)} there, {_show(current)} now"
    return None


def _show(value: Any) -> str:
    return json.dumps(value, default=str) if not isinstance(value, str) else value


def _plain(mapping: Any) -> Any:
    """The mapping as YAML gives it back, so a stored plan and a fresh one compare alike."""
    return yaml.safe_load(yaml.safe_dump(mapping, sort_keys=False))


def _json_safe(value: Any) -> Any:
    # strict JSON has no NaN or inf; a diverged run's accuracy is NaN and is kept as text
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _restore_floats(value: Any) -> Any:
    if value in ("nan", "inf", "-inf"):
        return float(value)
    if isinstance(value, dict):
        return {k: _restore_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_restore_floats(v) for v in value]
    return value
