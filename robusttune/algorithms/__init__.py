"""Server algorithms (registry), one module per family:

- ``base``: the registry ``ALGORITHMS``, a round's types (RoundPlan, RoundState, AttackView,
  AggregatorInput), ``ServerAlgorithm`` and ``make_algorithm``
- ``state``: fedavg, state_cache (SWB-DM's delayed cache)
- ``momentum``: demoa, fedcm (as DeMoA runs it)
- ``baselines``: fedsgd, fedcm_xu, byz_vr_marina_pp (DeMoA's comparison)
"""

from __future__ import annotations

from robusttune.algorithms.base import (ALGORITHMS, AggregatorInput, AttackView, RoundPlan,
                                        RoundState, ServerAlgorithm, make_algorithm)
from robusttune.algorithms.baselines import ByzVRMarinaPP, FedCMXu, FedSGD, clip_rows, rand_k
from robusttune.algorithms.momentum import DeMoA, FedCM
from robusttune.algorithms.state import FedAvg, StateCacheAlgorithm

__all__ = [
    "ALGORITHMS", "AggregatorInput", "AttackView", "RoundPlan", "RoundState", "ServerAlgorithm",
    "make_algorithm", "FedAvg", "StateCacheAlgorithm", "DeMoA", "FedCM", "FedSGD", "FedCMXu",
    "ByzVRMarinaPP", "clip_rows", "rand_k",
]
