"""The documentation site builds offline with no warning, and its reference, generated from the
code, names every registered entry, every RunSpec key, every command and option, and every
column of the output files."""

from __future__ import annotations

import html
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from robusttune.commands.cli import app
from robusttune.core.records import ROUND_COLUMNS, RunSummary
from robusttune.core.registries import AGGREGATORS, ALGORITHMS, ATTACKS, DATASETS, MODELS
from robusttune.core.runspec import method_presets
from robusttune.core.schema import RUNSPEC_KEYS
from robusttune.experiments.breakdown.report import BREAKDOWN_COLUMNS, POINTS_COLUMNS, SEEDS_COLUMNS
from robusttune.reports.tuning import RESULT_COLUMN_DOCS

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-W",
            "--keep-going",
            "-b",
            "html",
            "-d",
            str(out / "doctrees"),
            str(ROOT / "docs"),
            str(out / "html"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out / "html"


def text_of(page: Path) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", page.read_text()))


def test_the_reference_names_every_registered_entry(site):
    generated = site / "reference" / "generated"
    for registry, page in (
        (AGGREGATORS, "aggregators"),
        (ATTACKS, "attacks"),
        (ALGORITHMS, "algorithms"),
        (DATASETS, "datasets"),
        (MODELS, "models"),
    ):
        shown = set(
            re.findall(
                r'<h2>.*?<code[^>]*><span class="pre">([^<]+)</span>',
                (generated / f"{page}.html").read_text(),
            )
        )
        assert shown == set(registry.names()), page
    methods = text_of(generated / "methods.html")
    assert all(f" {m} " in methods for m in method_presets())


def test_the_reference_names_every_runspec_key_with_its_meaning(site):
    from robusttune.core.schema import RunSchema

    page = text_of(site / "reference" / "generated" / "runspec.html")
    words = " ".join(re.findall(r"\w+", page))
    for key in RUNSPEC_KEYS:
        assert f" {key} " in page, key
        meaning = " ".join(re.findall(r"\w+", RunSchema.model_fields[key].description)[:6])
        assert meaning in words, key


def test_the_reference_names_every_command_option_and_output_column(site):
    page = " ".join(text_of(site / "reference" / "generated" / "cli.html").split())
    group = typer.main.get_command(app)
    for name, command in group.commands.items():
        assert f"robusttune {name}" in page
        for param in command.params:
            for flag in param.opts:
                assert flag in page or param.name.upper() in page, (name, flag)
    outputs = text_of(site / "reference" / "generated" / "outputs.html")
    for columns in (
        ROUND_COLUMNS,
        RunSummary.KEYS,
        BREAKDOWN_COLUMNS,
        SEEDS_COLUMNS,
        POINTS_COLUMNS,
        RESULT_COLUMN_DOCS,
    ):
        assert all(f" {column} " in outputs for column in columns)


def test_the_reference_shows_every_function_of_the_python_api(site):
    import robusttune

    page = text_of(site / "reference" / "generated" / "python.html")
    for name in robusttune.__all__:
        if name not in ("__version__", "load_plugins"):
            assert f"robusttune.{name}" in page, name


def test_every_page_is_reachable_from_the_index(site):
    pages = {
        p.relative_to(ROOT / "docs").with_suffix("").as_posix()
        for p in (ROOT / "docs").rglob("*.md")
        if "_build" not in p.parts
    }
    built = {p.relative_to(site).with_suffix("").as_posix() for p in site.rglob("*.html")}
    assert pages <= built
    index = (site / "index.html").read_text()
    for section in (
        "tutorials/first-run",
        "how-to/cluster",
        "explanations/concepts",
        "reference/index",
    ):
        assert f'href="{section}.html"' in index
