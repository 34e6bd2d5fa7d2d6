"""Robust aggregation rules (registry), one module per family:

- ``coordinate``: mean (FedAvg), median, trimmed_mean
- ``distance``: krum, multi_krum, bulyan, geometric_median (RFA), cclip
- ``reference``: fltrust
- ``swb``: swb (SWB-DM, Section IV) and its rotations
- ``wrappers``: bucketing

``make_aggregator(name, **runspec_keys)`` builds one; ``AGGREGATORS`` maps names to classes;
``make_rule`` builds what a RunSpec names (its rule, in buckets when ``bucket_size`` > 1).
"""

from __future__ import annotations

from typing import Any

from robusttune.aggregators.base import AGGREGATORS, Aggregator, make_aggregator
from robusttune.aggregators.coordinate import Mean, Median, TrimmedMean
from robusttune.aggregators.distance import Bulyan, CenteredClipping, GeometricMedian, Krum, MultiKrum
from robusttune.aggregators.reference import FLTrust
from robusttune.aggregators.swb import SWB
from robusttune.aggregators.wrappers import Bucketing

__all__ = [
    "AGGREGATORS", "Aggregator", "make_aggregator", "make_rule", "Mean", "Median", "TrimmedMean", "Krum",
    "MultiKrum", "Bulyan", "GeometricMedian", "CenteredClipping", "FLTrust", "SWB", "Bucketing",
]


def make_rule(aggregator: str, bucket_size: int = 0, **params: Any) -> Aggregator:
    """The rule a run aggregates with: ``aggregator`` built from RunSpec-named ``params``, inside
    bucketing (Karimireddy, He and Jaggi, ICLR 2022) when ``bucket_size`` > 1."""
    if bucket_size > 1:
        return make_aggregator("bucketing", inner=aggregator, bucket_size=bucket_size, **params)
    return make_aggregator(aggregator, **params)
