"""Robust aggregation rules (registry), one module per family:

- ``coordinate``: mean (FedAvg), median, trimmed_mean
- ``distance``: krum, multi_krum, bulyan, geometric_median (RFA), cclip
- ``reference``: fltrust
- ``swb``: swb (SWB-DM, Section IV) and its rotations
- ``wrappers``: bucketing

``make_aggregator(name, **runspec_keys)`` builds one; ``AGGREGATORS`` maps names to classes.
"""

from __future__ import annotations

from robusttune.aggregators.base import AGGREGATORS, Aggregator, make_aggregator
from robusttune.aggregators.coordinate import Mean, Median, TrimmedMean
from robusttune.aggregators.distance import Bulyan, CenteredClipping, GeometricMedian, Krum, MultiKrum
from robusttune.aggregators.reference import FLTrust
from robusttune.aggregators.swb import SWB
from robusttune.aggregators.wrappers import Bucketing

__all__ = [
    "AGGREGATORS", "Aggregator", "make_aggregator", "Mean", "Median", "TrimmedMean", "Krum",
    "MultiKrum", "Bulyan", "GeometricMedian", "CenteredClipping", "FLTrust", "SWB", "Bucketing",
]
