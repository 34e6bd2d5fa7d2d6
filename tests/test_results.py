"""Results folder -> tables -> report, on a fake results folder written by RunWriter with made-up
round records (whose numbers the test knows) plus one real tiny Simulation run."""

from __future__ import annotations

import json
import math
import re
import runpy
import sys
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from robusttune.core.records import RoundRecord, RunSummary
from robusttune.core.runspec import RunSpec
from robusttune.display.markdown import markdown_table
from robusttune.engine.recording import RunWriter
from robusttune.reports.paper_tables import accuracy_table, collapse_table, gain_table
from robusttune.reports.results import load_rounds, load_runs, report

METHODS = {
    "fedavg": {"method": "fedavg"},
    "fedcm": {"method": "fedcm"},
    "state_cache+mean": {"algorithm": "state_cache", "aggregator": "mean"},
}


def record(round_index: int, accuracy: float, norm: float) -> RoundRecord:
    return RoundRecord(
        round=round_index,
        accuracy=accuracy,
        loss=1.0,
        param_norm=norm,
        nonfinite_params=0,
        max_class_share=0.2,
        sampled=5,
        byzantine_sampled=1,
        nonfinite_messages=0,
        byzantine_input_share=0.2,
        byzantine_majority=False,
        f_assumed=1,
        precondition_held_assumed=True,
        precondition_held_actual=True,
        aggregated=True,
        collapsed=False,
        train_seconds=0.01,
        aggregate_seconds=0.001,
    )


def accuracy_of(method: str, beta: float, p: float, seed: int, attack: str) -> float:
    """The made-up final accuracy of one run (distinct per run, known to the test)."""
    base = {"fedavg": 0.80, "fedcm": 0.70, "state_cache+mean": 0.60}[method]
    value = base - beta * (1.0 if attack == "ipm" else 0.5) - 0.1 * (p == 0.1) + 0.01 * (seed == 7)
    if method == "fedavg" and attack == "ipm" and beta == 0.3:
        value = 0.104  # collapsed: <= chance (0.1) + 0.5 points
    return round(value, 6)


def write_fake_results(root: Path, rounds: int = 3, eval_every: int = 1) -> list[dict]:
    """A small grid like the paper's: clean at beta 0, two attacks at 0.1 and 0.3, p in {0.5, 0.1},
    seeds {42, 7}. Round r's accuracy is final x r / rounds; NaN between evaluations."""
    written = []
    conditions = [("none", 0.0)] + [(a, b) for a in ("alie", "ipm") for b in (0.1, 0.3)]
    for method, keys in METHODS.items():
        for attack, beta in conditions:
            for p in (0.5, 0.1):
                for seed in (42, 7):
                    spec = RunSpec(
                        dataset="synthetic",
                        clients=10,
                        rounds=rounds,
                        participation=p,
                        byzantine_fraction=beta,
                        attack=attack,
                        seed=seed,
                        **keys,
                    )
                    final = accuracy_of(method, beta, p, seed, attack)
                    folder = root / "sweep" / f"{method}-{attack}-b{beta}-p{p}-s{seed}"
                    writer = RunWriter(folder, spec, tensorboard=False)
                    for r in range(1, rounds + 1):
                        evaluated = r % eval_every == 0 or r == rounds
                        writer.write(
                            record(r, final * r / rounds if evaluated else math.nan, 10.0 + r)
                        )
                    writer.close(
                        RunSummary(
                            final_accuracy=final,
                            final_loss=1.0,
                            collapsed=final <= 0.105,
                            rounds_run=rounds,
                            byzantine_majority_rounds=0,
                            seconds=0.1,
                            num_classes=10,
                            spec=spec.to_dict(),
                        )
                    )
                    written.append(
                        {
                            "method": spec.method,
                            "attack": attack,
                            "beta": beta,
                            "p": p,
                            "seed": seed,
                            "final": final,
                        }
                    )
    return written


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    return root, write_fake_results(root)


def test_runs_table_matches_summaries(results):
    root, written = results
    runs = load_runs(root)
    assert len(runs) == len(written) == 3 * 5 * 2 * 2
    for path in root.rglob("summary.json"):
        summary = json.loads(path.read_text())
        row = runs[runs["run_id"] == path.parent.relative_to(root).as_posix()].iloc[0]
        assert row["final_accuracy"] == summary["final_accuracy"]
        assert row["method"] == summary["spec"]["method"]
        assert row["byzantine_fraction"] == summary["spec"]["byzantine_fraction"]
        assert bool(row["collapsed"]) == summary["collapsed"]


def test_runs_stopped_early_are_left_out_of_the_tables(results, tmp_path):
    import shutil

    root, written = results
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    stopped = next(copy.rglob("summary.json"))
    summary = json.loads(stopped.read_text())
    stopped.write_text(json.dumps({**summary, "stopped_early": True}))
    assert len(load_runs(copy)) == len(written) - 1
    assert len(load_runs(copy, include_partial=True)) == len(written)


def test_table_one_is_mean_accuracy_by_beta_and_p(results):
    root, written = results
    table = accuracy_table(load_runs(root))
    assert list(table.index) == ["fedavg", "fedcm", "state_cache+mean"]  # the paper's order first
    frame = pd.DataFrame(written)
    for (method, p, beta), group in frame.groupby(["method", "p", "beta"]):
        assert table.loc[method, (p, beta)] == pytest.approx(100 * group["final"].mean())
    # p = 0.5 first and beta ascending, as in the paper
    assert list(table.columns[:3]) == [(0.5, 0.0), (0.5, 0.1), (0.5, 0.3)]


def test_table_two_counts_collapses(results):
    root, _written = results
    table = collapse_table(load_runs(root))
    assert table.loc["fedavg", "collapsed"] == 4  # ipm, beta 0.3, two p, two seeds
    assert table.loc["fedcm", "collapsed"] == 0
    assert (table["runs"] == 20).all()


def test_table_four_gain_from_rounds(tmp_path):
    write_fake_results(tmp_path, rounds=25, eval_every=4)  # rounds 10 and 25: 8 and 25 evaluated
    runs = load_runs(tmp_path)
    rounds = load_rounds(tmp_path, runs)
    table = gain_table(runs, rounds, 10, 25)
    frame = pd.DataFrame(write_fake_results(tmp_path / "again", rounds=1))
    for method, group in frame.groupby("method"):
        # accuracy at round 10 is the last evaluated one, round 8: final x 8/25
        expected = (100 * group["final"] * (1 - 8 / 25)).mean()
        assert table.loc[method, "synthetic gain"] == pytest.approx(expected)
    assert gain_table(runs, rounds, 10, 30).empty


def test_report_writes_tables_and_figures(results, tmp_path):
    root, _written = results
    path = report(root, out=tmp_path / "report")
    text = path.read_text()
    assert "Table I" in text and "Table II" in text and "Table IV" in text
    assert "| fedavg |" in text
    for name in (
        "runs.csv",
        "table1_accuracy.csv",
        "table2_collapses.csv",
        "curves_00.png",
        "test_error_vs_corruption.png",
        "report.html",
    ):
        assert (tmp_path / "report" / name).stat().st_size > 0, name
    table = pd.read_csv(tmp_path / "report" / "table2_collapses.csv", index_col=0)
    assert table.loc["fedavg", "collapsed"] == 4
    # one like-for-like figure per attack present (and the clean runs), every method in each
    for attack in ("alie", "ipm"):
        assert f"### {attack} at β=0.3" in text
    assert "### clean, p=0.1" in text
    assert "no panel for" not in text  # both attacks have a panel


def test_like_for_like_curve_groups_and_short_runs_gain(results):
    from robusttune.reports.results import curve_groups, gain_rounds_for

    root, _ = results
    runs, rounds = load_runs(root), load_rounds(root, load_runs(root))
    groups = dict(curve_groups(runs))
    assert set(groups) == {"clean, p=0.1", "alie at β=0.3, p=0.1", "ipm at β=0.3, p=0.1"}
    for ids in groups.values():
        chosen = runs.set_index("run_id").loc[ids]
        assert sorted(chosen["method"]) == sorted(runs["method"].unique())  # one run per method
        assert chosen["attack"].nunique() == 1 and chosen["byzantine_fraction"].nunique() == 1
        assert chosen["seed"].nunique() == 1
    # these runs have 3 rounds: the gain runs from round 1 to 3; runs of 30 keep the paper's 10 -> 25
    assert gain_rounds_for(rounds, runs, 10, 25) == (1, 3)
    long = pd.DataFrame({"run_id": ["a"] * 30 + ["b"] * 30, "round": list(range(1, 31)) * 2})
    assert gain_rounds_for(long, runs, 10, 25) == (10, 25)
    assert gain_rounds_for(long[long["round"] <= 12], runs, 10, 25) == (6, 12)


def test_fits_need_three_points_and_every_attack_gets_a_panel_or_a_reason(tmp_path):
    from robusttune.display import plots

    runs = pd.DataFrame(
        {
            "method": ["swb"] * 3,
            "attack": ["none", "ipm", "sign_flip"],
            "attack_strength": [None, 10.0, None],
            "byzantine_fraction": [0.0, 0.2, 0.2],
            "final_accuracy": [0.9, 0.5, 0.7],
        }
    )
    figure, skipped = plots.classification_error_vs_corruption(runs, tmp_path / "e.png")
    assert figure is not None and skipped == {}
    only_attacked = runs[runs["attack"] != "none"]
    figure, skipped = plots.classification_error_vs_corruption(only_attacked, tmp_path / "f.png")
    assert figure is None and set(skipped) == {"ipm x10", "sign_flip"}


def test_the_html_report_loads_every_figure_in_a_real_browser(results, tmp_path):
    """report.html is self-contained: headless Chromium (Debian's package; the Makefile installs
    it) opens it from a folder of its own and every embedded figure loads."""
    import shutil
    import subprocess

    root, _ = results
    report(root, out=tmp_path / "report")
    page = tmp_path / "elsewhere" / "report.html"
    page.parent.mkdir()
    shutil.copy(tmp_path / "report" / "report.html", page)  # no PNG beside it
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    assert browser, "chromium is missing: `make test` installs it (apt-get install chromium)"
    out = subprocess.run(
        [
            browser,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--virtual-time-budget=5000",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    loaded = re.search(r'data-figures-loaded="(\d+)/(\d+)"', out.stdout)
    assert loaded, out.stdout[-500:] + out.stderr[-500:]
    assert int(loaded.group(2)) >= 3 and loaded.group(1) == loaded.group(2)


def test_real_run_folder_and_cli(tmp_path):
    from robusttune.commands.cli import app
    from robusttune.engine.runners import InProcessRunner

    spec = RunSpec(
        dataset="synthetic",
        model="mlp",
        clients=4,
        rounds=2,
        participation=0.5,
        synthetic_samples=200,
        local_epochs=1,
    )
    (summary,) = InProcessRunner(tmp_path / "real")([spec])
    runs = load_runs(tmp_path / "real")
    assert len(runs) == 1 and runs.loc[0, "final_accuracy"] == pytest.approx(summary.final_accuracy)
    assert len(load_rounds(tmp_path / "real", runs)) == 2

    cli = CliRunner()
    result = cli.invoke(app, ["report", str(tmp_path / "real"), "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "r" / "report.md").exists()
    result = cli.invoke(app, ["report", str(tmp_path / "missing")])
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1


def test_analysis_script(results, tmp_path, monkeypatch, capsys):
    root, _ = results
    script = Path(__file__).resolve().parents[1] / "analysis" / "tables.py"
    monkeypatch.setattr(sys, "argv", [str(script), str(root), "--out", str(tmp_path / "a")])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(script), run_name="__main__")
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "Table I" in out and "fedavg" in out
    for name in ("table1_accuracy.csv", "table2_collapses.csv", "test_error.png"):
        assert (tmp_path / "a" / name).exists(), name
    # these made-up records carry no aggregation error: no Figure 2, and the script says so
    assert not (tmp_path / "a" / "figure2.png").exists()
    assert "figure 2 (aggregation error): (no attacked runs with that figure)" in out


def test_markdown_table():
    frame = pd.DataFrame(
        {"a": [1.234, float("nan")], "b": ["x|y", None]}, index=pd.Index(["m", "n"], name="method")
    )
    text = markdown_table(frame)
    assert text.splitlines()[0] == "| method | a | b |"
    assert "| m | 1.23 | x\\|y |" in text and "| n |  |  |" in text


def test_accuracy_by_attack_shows_where_each_rule_breaks():
    runs = pd.DataFrame(
        {
            "run_id": list("abcdef"),
            "dataset": "digits",
            "participation": 0.5,
            "seed": 1,
            "method": ["fedavg", "fedavg", "fedavg", "median", "median", "median"],
            "attack": ["none", "ipm", "alie", "none", "ipm", "alie"],
            "attack_strength": [None, 10.0, None, None, 10.0, None],
            "byzantine_fraction": [0.0, 0.2, 0.2, 0.0, 0.2, 0.2],
            "final_accuracy": [0.97, 0.13, 0.92, 0.95, 0.75, 0.46],
            "collapsed": False,
        }
    )
    from robusttune.reports.paper_tables import attack_table

    table = attack_table(runs)
    assert list(table.columns) == ["none", "alie", "ipm x10", "worst"]
    assert list(table.index) == ["fedavg", "median"]
    assert table.loc["fedavg", "ipm x10"] == pytest.approx(13.0)
    assert table.loc["fedavg", "worst"] == pytest.approx(13.0)
    assert table.loc["median", "worst"] == pytest.approx(46.0)


def test_accuracy_by_attack_text_shows_each_cells_spread_over_seeds():
    # two seeds per cell: mean ± sample sd, the worst column the worst attack's own cell
    runs = pd.DataFrame(
        {
            "run_id": list("abcdefgh"),
            "dataset": "digits",
            "participation": 0.5,
            "seed": [1, 2] * 4,
            "method": ["fedavg"] * 4 + ["median"] * 4,
            "attack": ["none", "none", "ipm", "ipm"] * 2,
            "attack_strength": [None, None, 10.0, 10.0] * 2,
            "byzantine_fraction": [0.0, 0.0, 0.2, 0.2] * 2,
            "final_accuracy": [0.9, 0.9, 0.5, 0.7, 0.8, 0.6, 0.75, 0.75],
            "collapsed": False,
        }
    )
    from robusttune.reports.paper_tables import attack_spread_table

    text = attack_spread_table(runs)
    assert list(text.columns) == ["none", "ipm x10", "worst"]
    # sd of 50 and 70: sqrt(((50 - 60)^2 + (70 - 60)^2) / 1) = 14.14
    assert text.loc["fedavg"].tolist() == ["90.0 ± 0.0", "60.0 ± 14.1", "60.0 ± 14.1"]
    assert text.loc["median"].tolist() == ["70.0 ± 14.1", "75.0 ± 0.0", "75.0 ± 0.0"]
    one_seed = attack_spread_table(runs[runs["seed"] == 1])
    assert one_seed.loc["fedavg"].tolist() == ["90.0", "50.0", "50.0"]


def test_a_resumed_folder_from_before_a_column_keeps_its_rows_aligned(tmp_path):
    # rounds.csv written before `honest_input_spread` existed: the resumed run appends rows with
    # today's columns, so the old header must not stay (pandas would shift every new value)
    spec = RunSpec(dataset="synthetic", clients=10, rounds=3)
    writer = RunWriter(tmp_path, spec, tensorboard=False)
    for r in (1, 2):
        writer.write(record(r, 0.1 * r, 10.0 + r))
    writer.abort()
    old = pd.read_csv(tmp_path / "rounds.csv").drop(columns=["honest_input_spread"])
    old.to_csv(tmp_path / "rounds.csv", index=False)

    resumed = RunWriter(tmp_path, spec, tensorboard=False, resume_at=1)
    resumed.write(RoundRecord(**{**record(2, 0.7, 12.5).to_dict(), "honest_input_spread": 3.25}))
    resumed.abort()
    table = pd.read_csv(tmp_path / "rounds.csv")
    assert list(table.columns) == list(record(1, 0.1, 11.0).to_dict())
    assert table["round"].tolist() == [1, 2]
    assert table["accuracy"].tolist() == [0.1, 0.7] and table["param_norm"].tolist() == [11.0, 12.5]
    assert math.isnan(table["honest_input_spread"][0]) and table["honest_input_spread"][1] == 3.25


def test_a_run_started_over_in_a_folder_a_killed_attempt_left_has_each_round_once(tmp_path):
    # a sweep trial restarted without a checkpoint, or `robusttune run` after a kill: the first
    # attempt's rows must not stay in front of the second attempt's
    from robusttune.engine.recording import run_to_folder

    spec = RunSpec(dataset="synthetic", clients=4, rounds=2, local_epochs=1)
    killed = RunWriter(tmp_path, spec)
    for r in (1, 2):
        killed.write(record(r, 0.5, 10.0 + r))
    killed.abort()
    summary = run_to_folder(spec, tmp_path)
    table = pd.read_csv(tmp_path / "rounds.csv")
    assert table["round"].tolist() == [1, 2]
    assert table["param_norm"].iloc[-1] != 12.0 and summary.rounds_run == 2

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert [e.step for e in events.Scalars("round/param_norm")] == [1, 2]


# -- README's quickstart table (issue 44: a mean over seeds with its spread) ---------------------
REPO = Path(__file__).resolve().parents[1]


def _readme_quickstart_table() -> list[list[str]]:
    lines = (REPO / "README.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| method | none | alie |"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return [rows[0], *rows[2:]]  # without the |---| line


def test_readme_quickstart_table_is_what_the_sweep_report_prints_for_its_kept_runs():
    from robusttune.experiments.sweep.space import load_sweep
    from robusttune.reports.paper_tables import attack_spread_table

    runs = pd.read_csv(REPO / "analysis" / "findings" / "quickstart" / "runs.csv")
    # the kept runs are the quickstart sweep's, every configuration once, in portable numerics
    space = load_sweep(REPO / "search_spaces" / "quickstart.yaml")
    asked = sorted(
        (s.method, s.attack, s.attack_strength or 0.0, s.byzantine_fraction, s.seed)
        for s in (space.run_spec(p) for p in space.expand().points)
    )
    kept = sorted(
        zip(
            runs["method"],
            runs["attack"],
            runs["attack_strength"].fillna(0.0),
            runs["byzantine_fraction"],
            runs["seed"],
        )
    )
    assert kept == asked and len(asked) == 60 and set(runs["numerics"]) == {"portable"}
    printed = attack_spread_table(runs).reset_index()
    expected = [list(printed.columns), *printed.astype(str).values.tolist()]
    assert _readme_quickstart_table() == expected
    assert all("±" in cell for row in expected[1:] for cell in row[1:])  # every cell over seeds
