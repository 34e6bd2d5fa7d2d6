"""Plugins as their authors use them: the user's own rules, attacks, datasets and models, named
by --plugin, a YAML's plugins: list or an installed package's entry point, on the driver and on
every Ray worker; bad plugins as one line; their knobs as run keys; `robusttune list`. Like a
plugin author, these tests import only the plugin API and the commands as functions
(tests/test_plugin_api.py holds them to it); test_plugin_shipping.py tests the machinery behind.

Registrations are process-wide, so every test that loads a plugin runs in a subprocess of its
own and the suite's processes keep the built-in registries only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
CLI = [sys.executable, "-m", "robusttune"]

RULE = textwrap.dedent('''
    """A test plugin: one rule with a knob of its own and a precondition, one without either."""
    from __future__ import annotations

    from robusttune.plugin import AGGREGATORS, Aggregator


    @AGGREGATORS.register("shrunk_median")
    class ShrunkMedian(Aggregator):
        """Coordinate-wise median shrunk toward zero by a factor."""

        def __init__(self, shrink: float = 0.5, f: int | None = None) -> None:
            super().__init__(f)
            self.shrink = shrink

        def precondition(self, n: int, f: int) -> bool:
            return 2 * f < n

        def aggregate(self, x, **context):
            return self.shrink * x.median(dim=0).values


    @AGGREGATORS.register("plain_average")
    class PlainAverage(Aggregator):
        """The mean, claiming no guarantee."""

        def aggregate(self, x, **context):
            return x.mean(dim=0)
''')


def environment(**extra: str) -> dict[str, str]:
    """This process's environment for a child that may start a Ray of its own: never the
    session's (no RAY_ADDRESS, which names it), in a temp dir of its own with short socket
    paths."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", **extra}
    env.pop("RAY_ADDRESS", None)
    env["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="rtp-", dir="/tmp")
    return env


def python(
    code: str, *, cwd: Path = ROOT, env: dict[str, str] | None = None, timeout: int = 240
) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter (its registrations die with it)."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        text=True,
        capture_output=True,
        timeout=timeout,
        env=environment(**(env or {})),
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def cli(*args: str, cwd: Path = ROOT, timeout: int = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, *args],
        cwd=cwd,
        text=True,
        capture_output=True,
        timeout=timeout,
        env=environment(),
        check=False,
    )


@pytest.fixture
def rule_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_rules.py"
    path.write_text(RULE)
    return path


def test_a_plugin_rule_is_a_method_with_its_own_knob_its_source_and_its_theory(rule_file, tmp_path):
    out = python(f"""
        import json
        import robusttune
        from robusttune.plugin import AGGREGATORS, SpecError

        robusttune.load_plugins([{str(rule_file)!r}])
        checks = {{}}
        checks["source"] = AGGREGATORS.source("shrunk_median")
        checks["builtin_source"] = AGGREGATORS.source("median")
        run = dict(method="shrunk_median", rounds=2, model="mlp", clients=10, eval_every=1,
                   attack="minmax", byzantine_fraction=0.2, train_samples=300)
        # a rule-aware attack chooses its message against the plugin rule, on the rule itself
        result = robusttune.run(run, out={str(tmp_path / "run")!r})
        spec = result.summary.spec
        checks["label"] = [spec["method"], spec["algorithm"], spec["aggregator"]]
        checks["default_knob"] = spec["shrink"]
        checks["ran"] = [result.summary.error, result.rounds["round"].tolist()]
        checks["set_knob"] = AGGREGATORS.make("shrunk_median", shrink=0.9).shrink
        for bad in ({{"shrink": "abc"}}, {{"shrnk": 1.0}}):
            try:
                robusttune.run({{**run, **bad}}, out={str(tmp_path / "bad")!r})
            except SpecError as error:
                checks.setdefault("errors", []).append(str(error))
        checks["theory"] = AGGREGATORS.make("shrunk_median").theoretical_breakdown(10)
        checks["no_theory"] = AGGREGATORS.make("plain_average").theoretical_breakdown(10)
        print(json.dumps(checks))
    """)
    checks = json.loads(out.stdout.strip().splitlines()[-1])
    assert checks["source"] == str(rule_file) and checks["builtin_source"] == "built-in"
    assert checks["label"] == ["shrunk_median", "fedavg", "shrunk_median"]
    assert checks["default_knob"] == 0.5 and checks["set_knob"] == 0.9
    typo, unknown = checks["errors"]
    assert typo == "shrink must be a finite number; got 'abc'"
    assert unknown.startswith("unknown RunSpec key 'shrnk'; allowed keys: ") and "shrink" in unknown
    assert not (tmp_path / "bad").exists()  # refused before anything ran
    assert checks["theory"] == pytest.approx(0.4)  # max{f : 2f < 10} / 10
    assert checks["no_theory"] is None  # no precondition claimed, no figure
    assert checks["ran"] == [None, [1, 2]]


BAD_PLUGINS = {
    "missing.py": None,
    "raises.py": "raise ValueError('the weights file is not there')\n",
    "clash_builtin.py": textwrap.dedent("""
        from robusttune.plugin import AGGREGATORS, Aggregator

        @AGGREGATORS.register("median")
        class Median(Aggregator):
            pass
    """),
    "first.py": textwrap.dedent("""
        from robusttune.plugin import ATTACKS, Attack

        @ATTACKS.register("mine")
        class Mine(Attack):
            pass
    """),
    "second.py": textwrap.dedent("""
        from robusttune.plugin import ATTACKS, Attack

        @ATTACKS.register("mine")
        class AlsoMine(Attack):
            pass
    """),
    "not_a_rule.py": textwrap.dedent("""
        from robusttune.plugin import AGGREGATORS

        @AGGREGATORS.register("not_a_rule")
        class NotARule:
            pass
    """),
}


def test_a_bad_plugin_is_one_line_and_exit_2_before_anything_starts(tmp_path):
    for name, text in BAD_PLUGINS.items():
        if text is not None:
            (tmp_path / name).write_text(text)
    space = tmp_path / "map.yaml"
    space.write_text(
        "run: {dataset: digits, model: mlp}\nspace: {method: {grid: [median]}}\n"
        "breakdown: {adversary: {attack: [sign_flip]}}\n"
    )
    cases = [
        ["missing.py"],
        ["raises.py"],
        ["clash_builtin.py"],
        ["first.py", "second.py"],
        ["not_a_rule.py"],
        ["no_such_module_anywhere"],
    ]
    # one interpreter for every case: each fails before registering anything it names
    out = python(
        f"""
        import json
        import robusttune
        from robusttune.plugin import SpecError
        results = []
        for plugins in {cases!r}:
            try:
                robusttune.breakdown({str(space)!r}, plugins=plugins,
                                     storage={str(tmp_path / "results")!r})
            except SpecError as error:
                results.append(str(error))
        print(json.dumps(results))
    """,
        cwd=tmp_path,
    )
    results = json.loads(out.stdout.strip().splitlines()[-1])
    expected = [
        "plugin 'missing.py': no such file or folder",
        "plugin 'raises.py' failed to import: ValueError: the weights file is not there",
        "plugin 'clash_builtin.py': aggregator 'median' from clash_builtin.py clashes with "
        "the built-in aggregator of that name",
        "plugin 'second.py': attack 'mine' from second.py clashes with the first.py attack",
        "plugin 'not_a_rule.py': aggregator 'not_a_rule' from not_a_rule.py: NotARule is "
        "not a subclass of Aggregator; allowed: a subclass of it (from robusttune.plugin import "
        "Aggregator)",
        "plugin 'no_such_module_anywhere': no module named 'no_such_module_anywhere'",
    ]
    assert len(results) == len(expected)
    for message, start in zip(results, expected):
        assert "\n" not in message and message.startswith(start), message
    # on the command line, the same line and exit status 2
    done = cli(
        "breakdown",
        str(space),
        "--storage",
        str(tmp_path / "results"),
        "--plugin",
        "raises.py",
        cwd=tmp_path,
    )
    assert done.returncode == 2 and done.stderr.startswith(f"error: {expected[1]}"), done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert not (tmp_path / "results").exists()  # nothing started, no folder


def test_an_installed_package_plugs_in_through_its_entry_point(tmp_path):
    # an installed distribution, as pip leaves it: a module and a .dist-info naming the group
    (tmp_path / "installed_rules.py").write_text(RULE)
    info = tmp_path / "installed_rules-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: installed-rules\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[robusttune.plugins]\nmy_rules = installed_rules\n")
    listed = subprocess.run(
        [*CLI, "list", "aggregator"],
        cwd=tmp_path,
        text=True,
        capture_output=True,
        timeout=120,
        env=environment(PYTHONPATH=str(tmp_path)),
        check=False,
    )
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if "shrunk_median" in line)
    assert "entry point my_rules" in row and "Coordinate-wise median shrunk" in row
    assert any("median" in line and "built-in" in line for line in listed.stdout.splitlines())


def test_a_notebook_rule_reaches_another_process_by_value(tmp_path):
    # a class defined in __main__ (a notebook cell) cannot be imported by a worker: its record
    # carries it pickled by value, and a fresh process registers it from that
    out = python('''
        import json, pickle
        import robusttune
        from robusttune.plugin import AGGREGATORS, Aggregator

        @AGGREGATORS.register("notebook_rule")
        class NotebookRule(Aggregator):
            """A rule typed into a notebook."""
            def __init__(self, scale: float = 1.0, f=None):
                super().__init__(f)
                self.scale = scale
            def aggregate(self, x, **context):
                return self.scale * x.median(dim=0).values

        (plugin,) = robusttune.load_plugins([NotebookRule])
        print(json.dumps([plugin.kind, pickle.dumps(plugin).hex()]))
    ''')
    kind, record = json.loads(out.stdout.strip().splitlines()[-1])
    assert kind == "object"
    worker = python(
        f"""
        import json, pickle
        import torch
        import robusttune
        from robusttune.plugin import AGGREGATORS
        robusttune.load_plugins([pickle.loads(bytes.fromhex({record!r}))])
        rule = AGGREGATORS.make("notebook_rule", scale=2.0)
        print(json.dumps(rule(torch.tensor([[1.0], [2.0], [9.0]])).tolist()))
    """,
        cwd=tmp_path,
    )
    assert json.loads(worker.stdout.strip().splitlines()[-1]) == [4.0]


def test_a_plugin_knob_is_tuned_by_optuna_like_any_knob(tmp_path):
    # robust tuning proposes the plugin rule's own knob with Optuna, as it proposes trim_ratio
    space = tmp_path / "tune_knob.yaml"
    space.write_text(
        textwrap.dedent(f"""
        name: tune_knob
        plugins: [{EXAMPLES / "my_defence"}/]
        run: {{dataset: digits, model: mlp, method: meamed, rounds: 2, clients: 10,
               byzantine_fraction: 0.2, train_samples: 300, local_epochs: 1, eval_every: 2}}
        space:
          keep_fraction: {{uniform: [0.3, 1.0]}}
        tuning: {{num_samples: 3, batch: 1, seed: 3, adversary: {{attack: [sign_flip]}}}}
    """)
    )
    done = cli("tune", str(space), "--storage", str(tmp_path), "--local", cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    table = pd.read_csv(tmp_path / "tune_knob" / "tuning.csv")
    proposed = table["keep_fraction"]
    assert len(proposed) == 3 and proposed.between(0.3, 1.0).all() and proposed.nunique() == 3
    bad = cli(
        "tune",
        str(space),
        "--storage",
        str(tmp_path / "bad"),
        "--local",
        "--set",
        "keep_fraction=abc",
        cwd=tmp_path,
    )
    assert bad.returncode == 2 and not (tmp_path / "bad").exists()
    assert bad.stderr.strip().endswith("keep_fraction must be a finite number; got 'abc'")


def test_the_examples_map_runs_through_ray_with_the_plugin_on_every_worker(tmp_path):
    # examples/README.md's walk-through: the plugin package's rule beside the median, on its own
    # arrays and model, against a ladder, its attack and MinMax (rule-aware), through a local Ray
    # of two workers that import the plugin themselves; then report and --resume load it again
    arrays = tmp_path / "arrays.npz"
    subprocess.run(
        [sys.executable, str(EXAMPLES / "make_arrays.py"), str(arrays)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    command = [
        "breakdown",
        str(EXAMPLES / "meamed_map.yaml"),
        "--storage",
        str(tmp_path),
        "--set",
        f"arrays_path={arrays}",
        "--set",
        "rounds=2",
    ]
    done = cli(*command, timeout=400)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    folder = tmp_path / "meamed_map"
    table = pd.read_csv(folder / "breakdown.csv")
    mine = table[table["method"] == "meamed"].iloc[0]
    assert mine["keep_fraction"] == 0.6 and mine["status"] in ("ok", "survives_all")
    assert mine["breakdown_fraction"] in {k / 10 for k in range(6)}
    assert mine["theory_fraction"] == pytest.approx(0.4)  # 2f < n at n = 5 sampled
    runs = [json.loads(line) for line in (folder / "runs.jsonl").read_text().splitlines()]
    attacks = {(json.loads(r["key"])["method"], json.loads(r["key"])["attack"]) for r in runs}
    assert ("meamed", "minmax") in attacks and ("meamed", "sparse_spike") in attacks
    assert not any(r["summary"].get("error") for r in runs)
    # the trials ran on Ray's workers, which imported the plugin package from the manifest
    assert any((folder / "trials").rglob("summary.json"))
    reported = cli("report", str(folder), cwd=tmp_path)  # a fresh process
    assert reported.returncode == 0, reported.stderr[-2000:]
    assert "keep_fraction" in (folder / "report" / "report.md").read_text()
    resumed = cli(*command, "--resume", "--local", timeout=400)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"{len(runs)} runs kept from before" in resumed.stdout and ", 0 new" in resumed.stdout


def test_a_sweep_through_ray_runs_a_plugin_rule_and_stores_its_plugins(tmp_path):
    # the sweep's trainable (not the streaming one) loads the driver's plugins too, and the
    # stored sweep.yaml names them for --resume
    space = tmp_path / "plugin_sweep.yaml"
    space.write_text(
        textwrap.dedent(f"""
        name: plugin_sweep
        plugins: [{EXAMPLES / "my_defence"}/]
        run: {{dataset: digits, model: tiny_mlp, method: meamed, rounds: 2, clients: 10,
               train_samples: 300, local_epochs: 1, checkpoint_every: 0}}
        space:
          keep_fraction: {{grid: [0.5, 0.9]}}
    """)
    )
    done = cli("sweep", str(space), "--storage", str(tmp_path), cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    trials = pd.read_csv(tmp_path / "plugin_sweep" / "trials.csv")
    assert (
        sorted(trials["keep_fraction"]) == [0.5, 0.9] and (trials["status"] == "TERMINATED").all()
    )
    stored = (tmp_path / "plugin_sweep" / "sweep.yaml").read_text()
    assert str(EXAMPLES / "my_defence") in stored
