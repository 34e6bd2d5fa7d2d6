"""Test-only: every round of a federated run made ROBUSTTUNE_TEST_ROUND_DELAY_S seconds slower,
in every Python process of tests/test_autoscaling.py's fake cluster (this folder is on its
PYTHONPATH; Python imports ``sitecustomize`` at start-up). Tiny test rounds take milliseconds, and
a worker must be lost while trials run. ``robusttune.engine.simulation`` is patched when it is first
imported (a meta-path hook), so processes that never run a round pay nothing for it."""

from __future__ import annotations

import os
import sys

_DELAY_S = float(os.environ.get("ROBUSTTUNE_TEST_ROUND_DELAY_S") or 0)


class _SlowRounds:
    """Finds robusttune.engine.simulation once, then slows Simulation.step after the module loads."""

    name = "robusttune.engine.simulation"

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        import importlib.util

        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        load = spec.loader.exec_module

        def exec_module(module):
            import time

            load(module)
            step = module.Simulation.step

            def slowed(simulation):
                time.sleep(_DELAY_S)
                return step(simulation)

            module.Simulation.step = slowed

        spec.loader.exec_module = exec_module
        return spec


if _DELAY_S > 0:
    sys.meta_path.insert(0, _SlowRounds())
