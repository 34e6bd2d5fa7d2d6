"""Robust aggregation rules (registry), one module per family:

- ``coordinate``: mean (FedAvg), median, trimmed_mean
- ``distance``: krum, multi_krum, bulyan, geometric_median (RFA), cclip
- ``reference``: fltrust
- ``swb``: swb (SWB-DM, Section IV) and its rotations
- ``wrappers``: bucketing
- ``preaggregation``: nnm (nearest-neighbour mixing), arc (adaptive robust clipping)

Shared by them: ``base`` (the interface, the registry, sorting, medians and blocks) and
``geometry`` (distances, directions and centred sums, safe against any message).

``make_aggregator(name, **runspec_keys)`` builds one; ``AGGREGATORS`` maps names to classes;
``make_rule`` builds what a RunSpec names (its rule, in buckets when ``bucket_size`` > 1,
behind NNM or ARC when ``pre_aggregator`` names one).
"""

from __future__ import annotations

from typing import Any

from robusttune.core.registry import SpecError
from robusttune.methods.aggregators.base import AGGREGATORS, Aggregator, make_aggregator
from robusttune.methods.aggregators.coordinate import Mean, Median, TrimmedMean
from robusttune.methods.aggregators.distance import (
    Bulyan,
    CenteredClipping,
    GeometricMedian,
    Krum,
    MultiKrum,
)
from robusttune.methods.aggregators.preaggregation import (
    AdaptiveRobustClipping,
    NearestNeighbourMixing,
)
from robusttune.methods.aggregators.reference import FLTrust
from robusttune.methods.aggregators.swb import SWB
from robusttune.methods.aggregators.wrappers import Bucketing

__all__ = [
    "AGGREGATORS",
    "SWB",
    "AdaptiveRobustClipping",
    "Aggregator",
    "Bucketing",
    "Bulyan",
    "CenteredClipping",
    "FLTrust",
    "GeometricMedian",
    "Krum",
    "Mean",
    "Median",
    "MultiKrum",
    "NearestNeighbourMixing",
    "TrimmedMean",
    "make_aggregator",
    "make_rule",
]


def make_rule(
    aggregator: str, bucket_size: int = 0, pre_aggregator: str = "none", **params: Any
) -> Aggregator:
    """The rule a run aggregates with: ``aggregator`` built from RunSpec-named ``params``, inside
    bucketing (Karimireddy, He and Jaggi, ICLR 2022) when ``bucket_size`` > 1, the whole behind
    ``pre_aggregator`` (``nnm`` or ``arc``, Allouah et al.) unless it is ``none``:
    out = Rule(Bucket(Pre(x))), the order of ByzFL's pre-aggregation lists."""
    if bucket_size > 1:
        rule = make_aggregator("bucketing", inner=aggregator, bucket_size=bucket_size, **params)
    else:
        rule = make_aggregator(aggregator, **params)
    if pre_aggregator == "none":
        return rule
    if pre_aggregator not in ("nnm", "arc"):
        raise SpecError(f"pre_aggregator must be one of none, nnm, arc; got {pre_aggregator!r}")
    return make_aggregator(pre_aggregator, inner=rule, **params)
