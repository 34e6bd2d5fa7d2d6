"""A fake autoscaling Ray cluster on this machine for tests/test_autoscaling.py: ``ray start
--head --autoscaling-config=...`` with ``RAY_FAKE_CLUSTER=1``, the real autoscaler and
`terminable_provider.TerminableFakeProvider`, on its own ports and in its own temp dir.

Why not ``ray.cluster_utils.AutoscalingCluster``: in Ray 2.60 its constructor reads
``fake_multi_node/example.yaml``, which the wheel does not ship (FileNotFoundError), and its
``start()`` and ``shutdown()`` run ``ray stop --force``, which kills every Ray process on the
machine (other users' and the test session's own). Here every process of the cluster carries
a marker in its environment (``ROBUSTTUNE_FAKE_CLUSTER``, inherited by the raylets the provider
starts and by their workers), and `FakeCluster.stop` ends exactly the processes that carry it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

SUPPORT = Path(__file__).resolve().parent
ROOT = SUPPORT.parents[1]
HEAD_TYPE = "ray.head.default"  # the fake provider tags its head with this type name
MARKER = "ROBUSTTUNE_FAKE_CLUSTER"
OBJECT_STORE_BYTES = 100 * 1024 * 1024  # per node: the trials pass no large objects


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class FakeCluster:
    """One fake cluster: ``head_resources`` (e.g. cluster.yaml's head, ``{"CPU": 0}``) and
    ``worker_types`` (autoscaler node types: resources, min_workers, max_workers)."""

    def __init__(
        self,
        head_resources: dict[str, float],
        worker_types: dict[str, dict[str, Any]],
        *,
        idle_timeout_minutes: float,
        round_delay_s: float = 0.0,
    ) -> None:
        self.head_resources = head_resources
        self.worker_types = worker_types
        self.idle_timeout_minutes = idle_timeout_minutes
        self.marker = uuid.uuid4().hex
        # short: Ray's unix socket paths live under it (at most 107 characters)
        self.temp_dir = Path(tempfile.mkdtemp(prefix="rtas-", dir="/tmp"))
        self.events_path = self.temp_dir / "provider-events.jsonl"
        self.requests = self.temp_dir / "requests"
        self.requests.mkdir()
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.round_delay_s = round_delay_s

    # -- the config and the environment ---------------------------------------------------------
    def config(self) -> dict[str, Any]:
        """The autoscaling config (what fake_multi_node/example.yaml would have given, written
        out): no setup commands, the provider told where the GCS is (its default is port 6379)."""
        workers = {
            name: {
                "node_config": {},
                **body,
                "resources": {**body["resources"], "object_store_memory": OBJECT_STORE_BYTES},
            }
            for name, body in self.worker_types.items()
        }
        return {
            "cluster_name": f"robusttune-fake-{self.marker[:8]}",
            "max_workers": sum(t["max_workers"] for t in self.worker_types.values()),
            "upscaling_speed": 1.0,
            "idle_timeout_minutes": self.idle_timeout_minutes,
            "provider": {
                "type": "external",
                "module": "terminable_provider.TerminableFakeProvider",
                "gcs_address": self.address,
                "disable_node_updaters": True,
                "disable_launch_config_check": True,
                "use_node_id_as_ip": True,
                "event_log": str(self.events_path),
                "requests": str(self.requests),
            },
            "available_node_types": {
                HEAD_TYPE: {
                    "resources": dict(self.head_resources),
                    "node_config": {},
                    "max_workers": 0,
                },
                **workers,
            },
            "head_node_type": HEAD_TYPE,
            "auth": {},
            "docker": {},
            "file_mounts": {},
            "cluster_synced_files": [],
            "file_mounts_sync_continuously": False,
            "rsync_exclude": [],
            "rsync_filter": [],
            "initialization_commands": [],
            "setup_commands": [],
            "head_setup_commands": [],
            "worker_setup_commands": [],
            "head_start_ray_commands": [],
            "worker_start_ray_commands": [],
        }

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of the cluster's processes and of the drivers run against it:
        ``--address auto`` finds this cluster through RAY_ADDRESS, never another on the machine."""
        path = [str(SUPPORT), str(ROOT), os.environ.get("PYTHONPATH", "")]
        env = {
            **os.environ,
            MARKER: self.marker,
            "RAY_FAKE_CLUSTER": "1",
            "AUTOSCALER_UPDATE_INTERVAL_S": "1",
            "RAY_AUTH_MODE": "disabled",
            "RAY_ADDRESS": self.address,
            "RAY_TMPDIR": str(self.temp_dir),
            "RAY_USAGE_STATS_ENABLED": "0",
            "ROBUSTTUNE_TEST_ROUND_DELAY_S": str(self.round_delay_s),
            "PYTHONPATH": os.pathsep.join(filter(None, path)),
            **extra,
        }
        return env

    # -- start and stop -------------------------------------------------------------------------
    def start(self) -> None:
        config_path = self.temp_dir / "autoscaling.json"
        config_path.write_text(json.dumps(self.config()))
        head = dict(self.head_resources)
        command = [
            str(Path(sys.executable).with_name("ray")),
            "start",
            "--head",
            f"--port={self.port}",
            "--node-ip-address=127.0.0.1",
            f"--num-cpus={int(head.pop('CPU', 0))}",
            f"--num-gpus={int(head.pop('GPU', 0))}",
            f"--autoscaling-config={config_path}",
            f"--temp-dir={self.temp_dir}",
            "--include-dashboard=false",
            f"--dashboard-port={free_port()}",
            f"--ray-client-server-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--object-store-memory={OBJECT_STORE_BYTES}",
            "--disable-usage-stats",
        ]
        if head:
            command.append(f"--resources={json.dumps(head)}")
        env = self.env()
        env.pop("RAY_ADDRESS")  # a head starts a cluster, it joins none
        subprocess.run(command, env=env, check=True, capture_output=True, text=True, timeout=120)

    def processes(self) -> list[int]:
        """Ids of the live processes that carry this cluster's marker (procfs, own user's)."""
        mine = f"{MARKER}={self.marker}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if mine in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:  # gone, or another user's
                continue
        return found

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM to every process of this cluster, SIGKILL to those left after ``grace_s``;
        then the temp dir goes. No other process on the machine is touched."""
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
            pids = self.processes()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.time() + wait
            while pids and time.time() < deadline:
                time.sleep(0.2)
                pids = self.processes()
            if not pids:
                break
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    # -- what the provider did, and a node taken away -------------------------------------------
    def events(self) -> list[dict[str, Any]]:
        if not self.events_path.exists():
            return []
        return [json.loads(line) for line in self.events_path.read_text().splitlines() if line]

    def live_workers(self) -> set[str]:
        alive: set[str] = set()
        for event in self.events():
            (alive.add if event["event"] == "create" else alive.discard)(event["node_id"])
        return alive

    @staticmethod
    def node_of(pid: int) -> str | None:
        """The fake node a process runs on: the provider starts each node's raylet with its node
        id in RAY_OVERRIDE_NODE_ID_FOR_TESTING, and the raylet's workers inherit it."""
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            return None
        prefix = b"RAY_OVERRIDE_NODE_ID_FOR_TESTING="
        return next((v[len(prefix) :].decode() for v in environ if v.startswith(prefix)), None)

    def terminate(self, node_id: str) -> None:
        """Ask the provider to terminate ``node_id`` (served on the autoscaler's next update)."""
        (self.requests / f"terminate-{node_id}").touch()
