"""Ray token authentication on a cluster (issue 57): a head started with ``RAY_AUTH_MODE=token``
refuses a process without its token, and `robusttune sweep --address` with it runs the sweep.
The head runs in a child process of its own (ray.cluster_utils, a private temp dir), so this
module never touches the session's local Ray (tests/conftest.py) nor kills other Rays
(`ray stop` would stop every Ray of the machine); each command is a fresh process, as on a
laptop that submits to a cluster."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ROBUSTTUNE = Path(sys.executable).parent / "robusttune"

HEAD = """
import sys, time
from pathlib import Path
from ray.cluster_utils import Cluster

cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
Path(sys.argv[1]).write_text(cluster.address)
stop = Path(sys.argv[2])
while not stop.exists():
    time.sleep(0.2)
cluster.shutdown()
"""

SPACE = """
name: authed
run: {dataset: synthetic, model: mlp, clients: 4, rounds: 1, local_epochs: 1,
      synthetic_samples: 160, trainer: sequential}
space:
  aggregator: {grid: [mean, median]}
resources: {cpu: 1}
"""


@pytest.fixture(scope="module")
def token_head(tmp_path_factory):
    """(address, token, environment without any token) of a running head with token auth."""
    folder = tmp_path_factory.mktemp("auth")
    token = secrets.token_hex(32)
    ray_tmp = tempfile.mkdtemp(prefix="rta-", dir="/tmp")  # short: unix socket paths
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
    }
    base.update(
        {
            "RAY_TMPDIR": ray_tmp,
            "HOME": str(folder),  # no ~/.ray/auth_token of ours
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
    )
    address_file, stop_file = folder / "address", folder / "stop"
    head = subprocess.Popen(
        [sys.executable, "-c", HEAD, str(address_file), str(stop_file)],
        env={**base, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 90
        while not address_file.exists():
            if head.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the token-auth head did not start:\n{head.stdout.read()[-3000:]}")
            time.sleep(0.2)
        yield address_file.read_text().strip(), token, base
    finally:
        stop_file.touch()
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
        shutil.rmtree(ray_tmp, ignore_errors=True)


def sweep(address: str, env: dict[str, str], storage: Path) -> subprocess.CompletedProcess:
    space = storage.parent / "authed.yaml"
    space.write_text(SPACE)
    # a refused connection is retried for 60 s by default; 3 s is enough for a running head
    return subprocess.run(
        [str(ROBUSTTUNE), "sweep", str(space), "--address", address, "--storage", str(storage)],
        env={**env, "RAY_gcs_server_port_wait_time_s": "3"},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def test_a_process_without_the_token_is_refused_in_one_line(token_head, tmp_path):
    address, _token, base = token_head
    for env in (
        {**base, "RAY_AUTH_MODE": "disabled"},
        {**base, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)},
    ):
        result = sweep(address, env, tmp_path / "refused")
        assert result.returncode == 2, result.stderr[-3000:]
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith(
            f"error: --address {address}: the cluster refused this process's token"
        ), result.stderr[-3000:]
        assert "RAY_AUTH_MODE=token" in last and "Traceback" not in result.stderr
        assert not (tmp_path / "refused" / "authed" / "trials.csv").exists()


def test_a_sweep_with_the_token_finishes_on_the_cluster(token_head, tmp_path):
    address, token, base = token_head
    result = sweep(
        address, {**base, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}, tmp_path / "store"
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    trials = (tmp_path / "store" / "authed" / "trials.csv").read_text().splitlines()
    assert len(trials) == 1 + 2
    summaries = list((tmp_path / "store" / "authed").rglob("summary.json"))
    assert len(summaries) == 2


def test_a_commands_own_ray_keeps_token_authentication_the_environment_asks_for(tmp_path):
    # on a machine whose ports others reach: RAY_AUTH_MODE=token before the command starts
    # (Ray reads it as it is imported) gives its own Ray a token, generated into ~/.ray
    home = tmp_path / "home"
    home.mkdir()
    ray_tmp = tempfile.mkdtemp(prefix="rtl-", dir="/tmp")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
    }
    env.update({"HOME": str(home), "RAY_TMPDIR": ray_tmp, "RAY_AUTH_MODE": "token"})
    space = tmp_path / "authed.yaml"
    space.write_text(SPACE)
    try:
        result = subprocess.run(
            [str(ROBUSTTUNE), "sweep", str(space), "--storage", str(tmp_path / "store")],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert len((tmp_path / "store" / "authed" / "trials.csv").read_text().splitlines()) == 3
    assert len((home / ".ray" / "auth_token").read_text().strip()) >= 32
