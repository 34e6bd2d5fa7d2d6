"""Server algorithms (registry), one module per family:

- ``base``: the registry ``ALGORITHMS``, a round's types (RoundPlan, RoundState, AttackView,
  AggregatorInput), ``ServerAlgorithm`` and ``make_algorithm``
- ``state``: fedavg, state_cache (SWB-DM's delayed cache)
- ``momentum``: demoa, fedcm (client momenta over the sample)
- ``baselines``: fedsgd, fedavgm, fedcm_xu (DeMoA's comparison)
- ``marina``: byz_vr_marina_pp, Algorithm 1 and its eq. (10) clipped-momentum variant
"""

from __future__ import annotations

from robusttune.methods.algorithms.base import (
    ALGORITHMS,
    AggregatorInput,
    AttackView,
    RoundPlan,
    RoundState,
    ServerAlgorithm,
    make_algorithm,
)
from robusttune.methods.algorithms.baselines import FedAvgM, FedCMXu, FedSGD
from robusttune.methods.algorithms.marina import (
    ByzVRMarinaPP,
    ClippedMomentumMarina,
    clip_rows,
    marina_probability,
    rand_k,
)
from robusttune.methods.algorithms.momentum import DeMoA, FedCM
from robusttune.methods.algorithms.state import FedAvg, StateCacheAlgorithm

__all__ = [
    "ALGORITHMS",
    "AggregatorInput",
    "AttackView",
    "ByzVRMarinaPP",
    "ClippedMomentumMarina",
    "DeMoA",
    "FedAvg",
    "FedAvgM",
    "FedCM",
    "FedCMXu",
    "FedSGD",
    "RoundPlan",
    "RoundState",
    "ServerAlgorithm",
    "StateCacheAlgorithm",
    "clip_rows",
    "make_algorithm",
    "marina_probability",
    "rand_k",
]
