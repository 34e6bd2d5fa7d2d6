"""How plugins reach Ray's workers, the machinery behind tests/test_plugins.py: a file plugin
shipped in a package with the job (Ray's py_modules on --address), loaded by a worker where the
driver's path does not exist, and a joined cluster's trials running from that copy. These tests
reach into the package's internals (robusttune.core.plugins, the cluster session) on purpose;
test_plugins.py is what a plugin author does, and imports only the plugin API."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_plugins import RULE, python


@pytest.fixture
def rule_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_rules.py"
    path.write_text(RULE)
    return path


def test_a_node_without_the_plugin_file_loads_the_copy_shipped_with_the_job(tmp_path, rule_file):
    # the driver ships its file plugins in a package (Ray's py_modules on --address); a worker
    # where the driver's path does not exist imports that copy, and without one ends the trial
    # on one line
    out = python(f"""
        import json, pickle
        from robusttune.core.plugins import load_plugins, shipping_folder
        (plugin,) = load_plugins([{str(rule_file)!r}])
        folder = shipping_folder([plugin])
        print(json.dumps([str(folder), pickle.dumps(plugin).hex()]))
    """)
    folder, record = json.loads(out.stdout.strip().splitlines()[-1])
    rule_file.unlink()  # this "node" lacks the driver's file
    worker = f"""
        import json, pickle
        from robusttune.core.plugins import load_plugins
        from robusttune.core.registries import AGGREGATORS
        from robusttune.core.registry import SpecError
        try:
            load_plugins([pickle.loads(bytes.fromhex({record!r}))])
            print(json.dumps(["loaded", AGGREGATORS.source("shrunk_median")]))
        except SpecError as error:
            print(json.dumps(["error", str(error)]))
    """
    shipped = python(worker, cwd=tmp_path, env={"PYTHONPATH": str(Path(folder).parent)})
    assert json.loads(shipped.stdout.strip().splitlines()[-1]) == ["loaded", str(rule_file)]
    missing = python(worker, cwd=tmp_path)
    status, message = json.loads(missing.stdout.strip().splitlines()[-1])
    assert status == "error" and message.startswith(f"plugin {str(rule_file)!r}: no such file")


def test_a_joined_cluster_gets_the_plugin_files_with_the_job(tmp_path, rule_file):
    # --address: the driver's plugin files travel with the job (Ray's py_modules); here the
    # driver's file is gone once the job has started, so the workers can only use the copy
    (tmp_path / "pkg").mkdir()
    rule_file.replace(tmp_path / "pkg" / "joined_rule.py")
    out = python(
        """
        import contextlib, json, os
        from ray.cluster_utils import Cluster
        import robusttune
        from robusttune.experiments.sweep import cluster

        head = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
        joined = cluster.ray_session

        @contextlib.contextmanager
        def then_hide_the_file(address, num_cpus):
            with joined(address, num_cpus) as started:
                os.rename("pkg", "pkg_elsewhere")
                yield started

        cluster.ray_session = then_hide_the_file
        space = {"name": "joined", "plugins": ["pkg/joined_rule.py"],
                 "run": {"dataset": "digits", "model": "mlp", "clients": 10, "rounds": 2,
                         "train_samples": 300, "local_epochs": 1, "eval_every": 2,
                         "checkpoint_every": 0},
                 "space": {"method": {"grid": ["shrunk_median"]}},
                 "breakdown": {"adversary": {"attack": ["sign_flip"], "attack_strength": [10.0]},
                               "max_fraction": 0.1, "verify_radius": 0}}
        try:
            robusttune.breakdown(space, storage="results", address=head.address)
        finally:
            head.shutdown()
        runs = [json.loads(line) for line in open("results/joined/runs.jsonl")]
        print(json.dumps([[r["summary"]["spec"]["method"], r["summary"].get("error")]
                          for r in runs]))
    """,
        cwd=tmp_path,
        timeout=300,
    )
    runs = json.loads(out.stdout.strip().splitlines()[-1])
    assert runs and all(method == "shrunk_median" and not error for method, error in runs)
    assert not (tmp_path / "pkg").exists()
