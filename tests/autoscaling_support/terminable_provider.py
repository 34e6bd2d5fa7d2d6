"""The node provider of tests/test_autoscaling.py's fake cluster: Ray 2.60's FakeMultiNodeProvider
(worker "nodes" are local raylets the real autoscaler starts and stops), which also

- logs every node it creates or terminates, with the time, as one JSON line in
  ``provider.event_log`` (the autoscaler's own actions: what scale-up and scale-down times are
  measured from), and
- terminates a node when a file ``terminate-NODE_ID`` appears in ``provider.requests``: the test
  takes a worker away as a cloud provider reclaims a spot instance, through the provider, so the
  autoscaler sees the node gone as it would on AWS.

The autoscaler (monitor.py on the head) imports this module by the ``provider.module`` path of the
autoscaling config (``type: external``); tests/test_autoscaling.py puts this folder on the
cluster's PYTHONPATH. Requests are served on ``non_terminated_nodes``, which the autoscaler calls
on every update (``AUTOSCALER_UPDATE_INTERVAL_S``)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ray.autoscaler._private.fake_multi_node.node_provider import FakeMultiNodeProvider
from ray.autoscaler.tags import TAG_RAY_USER_NODE_TYPE


class TerminableFakeProvider(FakeMultiNodeProvider):
    """FakeMultiNodeProvider with an event log and terminate-on-request (module docstring)."""

    def __init__(self, provider_config: dict[str, Any], cluster_name: str) -> None:
        super().__init__(provider_config, cluster_name)
        self._event_log = Path(provider_config["event_log"])
        self._requests = Path(provider_config["requests"])

    def _log(self, event: str, node_id: str, **extra: Any) -> None:
        with self._event_log.open("a") as handle:
            handle.write(
                json.dumps({"event": event, "node_id": node_id, "time": time.time(), **extra})
                + "\n"
            )

    def _create_node_with_resources_and_labels(self, node_config, tags, count, resources, labels):
        with self.lock:
            before = set(self._nodes)
            super()._create_node_with_resources_and_labels(
                node_config, tags, count, resources, labels
            )
            (created,) = set(self._nodes) - before
            self._log("create", created, node_type=tags[TAG_RAY_USER_NODE_TYPE])

    def terminate_node(self, node_id: str) -> None:
        self._terminate(node_id, by="autoscaler")

    def _terminate(self, node_id: str, by: str) -> None:
        with self.lock:
            super().terminate_node(node_id)
            self._log("terminate", node_id, by=by)

    def non_terminated_nodes(self, tag_filters):
        for request in sorted(self._requests.glob("terminate-*")):
            node_id = request.name.removeprefix("terminate-")
            request.unlink()
            with self.lock:
                if node_id in self._nodes:
                    self._terminate(node_id, by="request")
        return super().non_terminated_nodes(tag_filters)
