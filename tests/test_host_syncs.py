"""No rule reads a device value back to the host while it aggregates (issue 16).

A read-back (``bool(t)``, ``t.item()``, ``int(t)``, ``.tolist()``, ``nonzero``, a boolean-mask
index, an index by a 0-dim integer tensor, which ATen resolves with ``item()``) stalls the CUDA
pipeline until every queued kernel has run. The rules branch on such values only on the host,
where it is free: :func:`robusttune.methods.aggregators.base.on_host` decides, from the device types in
``base.HOST_DEVICE_TYPES``.

Design: this machine has no GPU, so the test empties ``HOST_DEVICE_TYPES`` and runs every rule on
CPU tensors. The rules then take exactly the code they take on CUDA (no numpy, no host-only
branch), and a ``TorchFunctionMode`` counts every Python-visible read-back. Emptying one set of
device types is the whole switch: no rule has a test-only parameter, and the CPU fast paths stay
as they are. What the mode cannot see are syncs inside one ATen kernel's C++ (none of the ops used
here has one, except 0-dim integer indexing, which is counted at the ``__getitem__`` call).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

from robusttune.methods.aggregators import AGGREGATORS, base, make_aggregator

# Rules that still read back on the device path, with the reason. Empty: every rule is sync-free.
ALLOWED_READBACKS: dict[str, str] = {}

READBACK_METHODS: set[Callable[..., Any]] = {
    torch.Tensor.__bool__,
    torch.Tensor.item,
    torch.Tensor.tolist,
    torch.Tensor.__int__,
    torch.Tensor.__float__,
    torch.Tensor.__index__,
    torch.Tensor.nonzero,
    torch.nonzero,
    torch.argwhere,
    torch.Tensor.argwhere,
    torch.masked_select,
    torch.Tensor.masked_select,
    torch.Tensor.numpy,
    torch.Tensor.cpu,
    torch.unique,
    torch.Tensor.unique,
    torch.Tensor.__complex__,
}
INDEXING = {torch.Tensor.__getitem__, torch.Tensor.__setitem__}


def _syncing_index(index: Any) -> bool:
    """A boolean-mask index (output size depends on the data) or a 0-dim integer tensor (ATen
    reads it back with item() to select)."""
    parts = index if isinstance(index, tuple) else (index,)
    for part in parts:
        if isinstance(part, torch.Tensor) and (
            part.dtype == torch.bool or (part.dim() == 0 and not part.dtype.is_floating_point)
        ):
            return True
    return False


class CountReadbacks(TorchFunctionMode):
    """Counts the calls that read a tensor's value back to the host, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in READBACK_METHODS:
            self.calls[getattr(func, "__name__", str(func))] += 1
        elif func in INDEXING and len(args) > 1 and _syncing_index(args[1]):
            self.calls[f"{func.__name__} with a bool or 0-dim index"] += 1
        return func(*args, **kwargs)


@pytest.fixture
def device_paths(monkeypatch):
    """Rules take their device (non-host) path on CPU tensors."""
    monkeypatch.setattr(base, "HOST_DEVICE_TYPES", frozenset())


RULE_PARAMS: dict[str, dict[str, Any]] = {
    "swb": {"swb_chunk": 8, "trim_ratio": 0.25},
    "bucketing": {"bucket_size": 2},
    "nnm": {"inner": "median"},
    "arc": {"inner": "krum"},
}
INNER_OF_BUCKETING = ("mean", "krum", "bulyan", "geometric_median", "cclip", "fltrust", "swb")
N, F = 11, 2


def cases() -> list[tuple[str, dict[str, Any]]]:
    out = [(name, RULE_PARAMS.get(name, {})) for name in AGGREGATORS.names() if name != "bucketing"]
    for inner in INNER_OF_BUCKETING:
        out.append(
            (
                "bucketing",
                {**RULE_PARAMS["bucketing"], "inner": inner, **RULE_PARAMS.get(inner, {})},
            )
        )
    return out


def messages(d: int, corrupt: str | None, weighted: bool) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(N, d, generator=gen, dtype=torch.float64) + 3.0
    if corrupt == "nan":
        x[4] = math.nan
    elif corrupt == "inf":
        x[4, :3] = math.inf
        x[7] = 1e300
    context: dict[str, Any] = {
        "previous": torch.full((d,), 2.5, dtype=torch.float64),
        "reference": x[5:].mean(0) + 0.1,
    }
    if weighted:
        context["weights"] = torch.arange(1.0, N + 1, dtype=torch.float64)
    return {"updates": x, **context}


# d = 37: explicit distances; d = 40,000: the blocked Gram path of pairwise_sq_distances.
@pytest.mark.parametrize(
    ("name", "params"),
    cases(),
    ids=lambda v: v if isinstance(v, str) else "-".join(f"{k}={v}" for k, v in v.items()),
)
@pytest.mark.parametrize("corrupt", [None, "nan", "inf"])
@pytest.mark.parametrize(("d", "weighted"), [(37, False), (37, True), (40_000, False)])
def test_rules_do_not_read_back_on_the_device_path(
    device_paths, name, params, corrupt, d, weighted
):
    agg = make_aggregator(name, f=F, **params)
    context = messages(d, corrupt, weighted)
    updates = context.pop("updates")
    generator = torch.Generator().manual_seed(0)
    mode = CountReadbacks()
    with mode:
        out = agg(updates, f=F, generator=generator, **context)
    label = name if name != "bucketing" else f"bucketing({params['inner']})"
    if label in ALLOWED_READBACKS:  # the list stays true: a listed rule does read back
        assert mode.calls, f"{label} no longer reads back: drop it from ALLOWED_READBACKS"
        return
    assert not mode.calls, f"{label} read back on the device path: {dict(mode.calls)}"
    if "mean" not in (name, params.get("inner")):  # the robust rules stay finite
        assert torch.isfinite(out).all(), label


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("krum", {}),
        ("multi_krum", {}),
        ("bulyan", {}),
        ("geometric_median", {}),
        ("cclip", {}),
        ("fltrust", {}),
        ("swb", RULE_PARAMS["swb"]),
        ("bucketing", {"bucket_size": 3, "inner": "mean"}),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
@pytest.mark.parametrize("corrupt", [None, "nan", "inf"])
def test_device_path_equals_the_host_path(monkeypatch, name, params, corrupt):
    """The branch-free path computes the same aggregate as the host one (up to rounding)."""
    context = messages(40_000, corrupt, False)
    updates = context.pop("updates")
    host = make_aggregator(name, f=F, **params)(
        updates, f=F, **context, generator=torch.Generator().manual_seed(0)
    )
    monkeypatch.setattr(base, "HOST_DEVICE_TYPES", frozenset())
    device = make_aggregator(name, f=F, **params)(
        updates, f=F, **context, generator=torch.Generator().manual_seed(0)
    )
    torch.testing.assert_close(device, host, rtol=1e-9, atol=1e-9, equal_nan=True)


def test_the_counter_sees_each_kind_of_read_back():
    x = torch.arange(4.0)
    mode = CountReadbacks()
    with mode:
        bool(x.sum() > 0), x[0].item(), int(x[1]), float(x[2]), x.tolist(), x.nonzero()
        x[x > 1], x[torch.tensor(2)], range(10)[torch.tensor(1)]
    assert sum(mode.calls.values()) == 9, mode.calls
