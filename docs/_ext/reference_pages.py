"""Writes the reference pages from the code at the start of every build, so they cannot drift:
every RunSpec key (type, allowed values, default, meaning: the schema's field descriptions),
every registered rule, attack, algorithm, method, dataset and model (their docstrings), and
every output file's columns, every command and option of the CLI (from the typer app: typer
0.29 vendors its own click, which sphinx-click does not read). It also writes the pages that
show a file kept elsewhere in the repository (the findings, CONTRACTS.md, the example's
walk-through), with their headings made consecutive under one title and their links to
repository files turned into file names."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parents[1]
ROOT = DOCS.parent
GENERATED = DOCS / "reference" / "generated"


def cell(text: Any) -> str:
    """A Markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def allowed(schema: dict[str, Any]) -> tuple[str, str]:
    """(type, allowed values) of one key from its JSON schema."""
    options = schema.get("anyOf") or [schema]
    kinds, ranges = [], []
    for option in options:
        kind = option.get("type", "")
        if kind == "null":
            kinds.append("none")
            continue
        if "enum" in option or "const" in option:
            values = option.get("enum") or [option["const"]]
            kinds.append("choice")
            ranges.append(", ".join(str(v) for v in values))
            continue
        kinds.append(
            {
                "integer": "integer",
                "number": "number",
                "string": "text",
                "boolean": "true/false",
            }.get(kind, kind)
        )
        low = (
            ("[" + format(option["minimum"], "g"))
            if "minimum" in option
            else ("(" + format(option["exclusiveMinimum"], "g"))
            if "exclusiveMinimum" in option
            else None
        )
        high = (
            (format(option["maximum"], "g") + "]")
            if "maximum" in option
            else (format(option["exclusiveMaximum"], "g") + ")")
            if "exclusiveMaximum" in option
            else None
        )
        if low or high:
            ranges.append(f"{low or '(-inf'}, {high or 'inf)'}")
    return " or ".join(kinds), "; ".join(ranges)


def runspec_page() -> str:
    from robusttune.core.schema import RunSchema

    schema = RunSchema.model_json_schema()["properties"]
    rows = []
    for key, field in RunSchema.model_fields.items():
        kind, values = allowed(schema[key])
        default = field.default
        rows.append(
            [
                f"`{key}`",
                kind,
                values,
                "none" if default is None else f"`{default}`",
                field.description or "",
            ]
        )
    return (
        "# RunSpec keys\n\nEvery knob of one run, with one spelling everywhere: YAML, "
        "`--set key=value`, Tune configs, result columns. Precedence: an explicit value, then "
        "the method preset, then the dataset's default, then the default below. A plugin "
        "entry's own constructor parameters are keys too (`robusttune list` names the "
        "plugins; {doc}`../../explanations/plugins`).\n\n"
        + table(["key", "type", "allowed", "default", "meaning"], rows)
    )


def docstring(entry: Any) -> str:
    text = (
        entry.__dict__.get("__doc__")
        if isinstance(entry, type)
        else getattr(entry, "__doc__", None)
    )
    return inspect.cleandoc(text or "(no docstring)")


def registry_page(concept: str, title: str, intro: str) -> str:
    from robusttune.core.registries import AGGREGATORS, ALGORITHMS, ATTACKS, DATASETS, MODELS

    registry = {
        "aggregator": AGGREGATORS,
        "attack": ATTACKS,
        "algorithm": ALGORITHMS,
        "dataset": DATASETS,
        "model": MODELS,
    }[concept]
    parts = [f"# {title}\n\n{intro}\n"]
    for name in registry.names():
        entry = registry[name]
        parts.append(f"## `{name}`\n\n```text\n{docstring(entry)}\n```\n")
    return "\n".join(parts)


def methods_page() -> str:
    from robusttune.core.runspec import method_presets

    rows = [[f"`{m}`", f"`{a}`", f"`{r}`"] for m, (a, r) in sorted(method_presets().items())]
    return (
        "# Methods\n\nA method is an algorithm with its rule (`method: NAME`); any "
        "combination no preset names is written `ALGORITHM+RULE` (`demoa+median`).\n\n"
        + table(["method", "algorithm", "rule"], rows)
    )


def outputs_page() -> str:
    from robusttune.core.records import ROUND_COLUMNS, RunSummary
    from robusttune.experiments.breakdown.report import (
        BREAKDOWN_COLUMNS,
        POINTS_COLUMNS,
        SEEDS_COLUMNS,
    )
    from robusttune.reports.tuning import RESULT_COLUMN_DOCS

    sections = [
        ("rounds.csv", "A run folder: one row per round.", ROUND_COLUMNS),
        ("summary.json", "A run folder: the run's end.", RunSummary.KEYS),
        (
            "breakdown.csv",
            "A map's folder: one row per cell, after the cell's own keys "
            "(method, participation ...).",
            BREAKDOWN_COLUMNS,
        ),
        (
            "breakdown_seeds.csv",
            "A map's folder: one row per cell and seed (each seed a "
            "replicate), after the cell's own keys.",
            SEEDS_COLUMNS,
        ),
        (
            "breakdown_points.csv",
            "A map's folder: one row per evaluated lattice point, after the cell's own keys.",
            POINTS_COLUMNS,
        ),
        (
            "tuning.csv",
            "A tuning study's folder: one row per proposal, beside one column per knob searched.",
            RESULT_COLUMN_DOCS,
        ),
    ]
    parts = ["# Output files\n"]
    for name, where, columns in sections:
        parts.append(
            f"## {name}\n\n{where}\n\n"
            + table(["column", "meaning"], [[f"`{k}`", v] for k, v in columns.items()])
        )
    return "\n".join(parts)


def cli_page() -> str:
    import typer

    from robusttune.commands.cli import app

    group = typer.main.get_command(app)
    parts = [
        "# Command line\n\nEvery command and option, read from the typer app. Bad input is "
        "one line and exit status 2. `robusttune COMMAND --help` shows the same.\n"
    ]
    for name, command in group.commands.items():
        help_text = (command.help or "").split("\n\nExamples:\n")
        parts.append(f"## `robusttune {name}`\n\n{help_text[0]}\n")
        if len(help_text) > 1:
            examples = [line.strip().removeprefix("$ ") for line in help_text[1].splitlines()]
            parts.append("```bash\n" + "\n".join(examples) + "\n```\n")
        rows = []
        for param in command.params:
            if param.name == "help":
                continue
            flags = (
                ", ".join(f"`{o}`" for o in param.opts)
                if param.opts != [param.name]
                else f"`{param.name.upper()}` (argument)"
            )
            default = param.default
            shown = "" if default in (None, [], ()) or callable(default) else f"`{default}`"
            rows.append([flags, getattr(param, "help", "") or "", shown])
        parts.append(table(["option", "meaning", "default"], rows))
    return "\n".join(parts)


LINK = re.compile(r"\[([^\]]+)\]\((?!https?:|#)([^)]+)\)")


def kept_elsewhere(source: Path, title: str | None = None) -> str:
    """A Markdown file of the repository as a page: its first heading the page's title (or
    ``title``), its other headings shifted so levels follow each other, its links to other
    repository files written as the files' names."""
    lines = source.read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("#"))
    level = len(lines[first]) - len(lines[first].lstrip("#"))
    out = [f"# {title or lines[first].lstrip('#').strip()}"]
    fence = False
    for line in lines[first + 1 :]:
        if line.startswith("```"):
            fence = not fence
        if not fence and line.startswith("#"):
            depth = len(line) - len(line.lstrip("#"))
            line = "#" * max(2, depth - level + 1) + line[depth:]
        if not fence:
            line = LINK.sub(lambda m: _named(m, source), line)
        out.append(line)
    return "\n".join(out) + "\n"


def _named(match: re.Match, source: Path) -> str:
    text, target = match.group(1), match.group(2)
    path = (source.parent / target.split("#")[0]).resolve()
    try:
        shown = path.relative_to(ROOT).as_posix()
    except ValueError:
        shown = target
    return f"`{shown}`" if text.strip("`") in (target, shown) else f"{text} (`{shown}`)"


def findings_pages() -> dict[str, str]:
    claims = sorted(
        (ROOT / "analysis" / "findings").glob("claim*.md"),
        key=lambda p: int(re.sub(r"\D", "", p.stem)),
    )
    pages = {f"findings/{p.stem}": kept_elsewhere(p) for p in claims}
    pages["findings/horizon"] = kept_elsewhere(ROOT / "analysis" / "findings" / "horizon.md")
    index = [
        "# Findings\n",
        "The papers' claims, each reproduced on digits (and Fashion-MNIST "
        "where named) by a script in `analysis/` whose figures are kept beside it; a test "
        "re-checks each claim's reduced form.\n",
        "```{toctree}",
        ":maxdepth: 1",
        "",
    ]
    index += [*list(pages), "```", ""]
    pages["findings"] = "\n".join(index)
    return pages


def python_page() -> str:
    from robusttune.commands import api

    parts = [
        "# Python API\n\n"
        + inspect.cleandoc(api.__doc__).split("\n\n", 1)[0].replace("\n", " ")
        + "\n"
    ]
    for name in ("run", "sweep", "breakdown", "calibrate", "tune", "report", "catalogue"):
        function = getattr(api, name)
        signature = str(inspect.signature(function)).replace("'", "")
        parts.append(
            f"## `robusttune.{name}`\n\n```python\n{name}{signature}\n```\n\n"
            f"```text\n{inspect.getdoc(function)}\n```\n"
        )
    results = [
        api.RunResult,
        api.SweepResult,
        api.BreakdownResult,
        api.CalibrationResult,
        api.TuningResult,
        api.ReportResult,
    ]
    parts.append(
        "## Results\n\n"
        + table(
            ["type", "fields", "meaning"],
            [
                [
                    f"`{r.__name__}`",
                    ", ".join(f"`{f}`" for f in r.__dataclass_fields__),
                    inspect.getdoc(r),
                ]
                for r in results
            ],
        )
    )
    return "\n".join(parts)


def plugin_page() -> str:
    """The plugin API: robusttune.plugin's docstring and where each of its names lives."""
    import robusttune.plugin as plugin

    text = inspect.cleandoc(plugin.__doc__)
    intro, rest = text.split("\n\n", 1)
    rows = []
    for name in plugin.__all__:
        value = getattr(plugin, name)
        doc = (inspect.getdoc(value) or "").split("\n\n")[0].replace("\n", " ")
        rows.append([f"`{name}`", f"`{type(value).__name__ if name.isupper() else 'class'}`", doc])
    return (
        "# Plugin API\n\n"
        + intro.replace("\n", " ")
        + "\n\n```text\n"
        + rest
        + "\n```\n\n## The names\n\n"
        + table(["name", "kind", "what it is"], rows)
    )


PAGES = {
    "plugin": plugin_page,
    "cli": cli_page,
    "python": python_page,
    "runspec": runspec_page,
    "methods": methods_page,
    "aggregators": lambda: registry_page(
        "aggregator",
        "Aggregation rules",
        "Every rule, with its docstring: the formula it "
        "implements and the paper it follows (`aggregator: NAME`).",
    ),
    "attacks": lambda: registry_page(
        "attack", "Attacks", "Every attack (`attack: NAME`, strength `attack_strength`)."
    ),
    "algorithms": lambda: registry_page(
        "algorithm", "Server algorithms", "Every server algorithm (`algorithm: NAME`)."
    ),
    "datasets": lambda: registry_page(
        "dataset", "Datasets", "Every dataset (`dataset: NAME`); nothing is downloaded."
    ),
    "models": lambda: registry_page("model", "Models", "Every model (`model: NAME`)."),
    "outputs": outputs_page,
}


def write_pages(app: Any = None) -> None:
    pages = {name: page() for name, page in PAGES.items()}
    pages.update(findings_pages())
    pages["contracts"] = kept_elsewhere(ROOT / "CONTRACTS.md", "Contracts between the modules")
    pages["own-rule"] = kept_elsewhere(ROOT / "examples" / "README.md")
    for name, text in pages.items():
        path = GENERATED / f"{name}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != text:  # unchanged pages stay unrebuilt
            path.write_text(text)


def setup(app: Any) -> dict[str, Any]:
    app.connect("builder-inited", write_pages)
    return {"parallel_read_safe": True}
