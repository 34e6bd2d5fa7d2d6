"""Local training of the sampled clients, in two strategies with equal results.

Each client i starts from the global vector ``start`` (theta_0 = start), makes a fresh SGD
optimiser with momentum mu, and runs E epochs over its n_i samples in minibatches of size B (the
last batch of an epoch may be short), following PyTorch's SGD (dampening 0, no Nesterov, no weight
decay):

    g_t   = grad_theta  (1/|b_t|) sum_{j in b_t} CE(f(x_j; theta_t), y_j)
    buf_t = mu * buf_{t-1} + g_t        (buf_0 = g_0 on the first step)
    theta_{t+1} = theta_t - lr * buf_t

Client i's batch order is drawn from ``torch.Generator().manual_seed(seeds[i])`` on the CPU: one
``randperm(n_i)`` per epoch, cut into consecutive batches of B. Both strategies use the same
batches, so they agree up to floating-point summation order.

- ``sequential``: one client after another, one autograd step at a time, the parameters being
  leaf views into the client's output row and the update ``torch._foreach_*`` ops (what
  ``torch.optim.SGD(foreach=True)`` does), so no step concatenates d values. On CPU a small CNN
  already fills the cores (under vmap a convolution with per-client weights becomes a grouped
  convolution, which was slower here), so CPU speed comes from trials side by side with one
  thread each.
- ``batched``: ``torch.func.vmap`` of ``torch.func.grad`` over the stacked parameters of the
  clients still training at each step, each with its own momentum buffer. Clients are sorted by
  their number of steps, so the ones still training are always a prefix of the stack (a view,
  no gather or scatter of parameters). Short last batches are padded to B with copies of a real
  sample of the same batch and weight 0, the loss being sum_j w_j CE_j / sum_j w_j: one vmap call
  per step, and the padded samples are real data, so they are finite whenever the batch is.

Devices. Batch orders are drawn on the CPU on purpose (the same batches on every device and
strategy); each round moves them to the run's device once, with ``non_blocking=True`` (a copy
from pageable host memory returns once staged and waits for no queued GPU work, where a plain
``.to(device)`` ends in a stream synchronisation). Every other tensor is made on ``start``'s
device, and no step reads a value back to the host: ``bench/gpu.py`` counts the synchronising
CUDA calls of a training call (``torch.cuda.set_sync_debug_mode``) so a regression shows there.

Determinism. On the CPU both strategies are bit for bit repeatable. On CUDA, with PyTorch's
defaults, a repeated run may differ in the last bits:

- convolution backward (cuDNN): the heuristics may pick algorithms that accumulate with float
  atomics, for the ordinary convolutions of ``sequential`` and for the grouped convolutions that
  per-client weights become under ``vmap`` in ``batched``; ``torch.backends.cudnn.deterministic
  = True`` restricts cuDNN to deterministic algorithms;
- cuBLAS (the linear layers, and the batched matmuls they become under ``vmap``) is
  deterministic on one stream only with a fixed workspace: ``CUBLAS_WORKSPACE_CONFIG=:4096:8``
  set before CUDA starts;
- outside this module: ``index_add_`` (bucketing) and any ``scatter_add_``/``index_put_(...,
  accumulate=True)`` add floats with atomics in an unspecified order.

Precision, not determinism: cuDNN convolutions default to TF32 on Ampere and later GPUs
(``torch.backends.cudnn.allow_tf32``), so there the two strategies agree less closely than the
CPU's 1e-5; ``batched_vs_sequential_max_abs_diff_cnn2_10_clients`` in ``bench/gpu.py`` says how
closely.

Not on PyTorch's list of non-deterministic CUDA operations: the gathers ``x[idx]`` (no gradient
flows to the data), 2-D max-pool backward, cross-entropy on [B, K] logits (PyTorch flags only the
spatial ``nll_loss2d``), the foreach SGD updates, and ``robusttune.problem.evaluation.evaluate`` (an integer
``bincount``).

``torch.use_deterministic_algorithms(True)``, with the cuDNN and cuBLAS settings above, makes
the listed operations repeatable, at a cost ``bench/gpu.py`` measures
(``deterministic_vs_default_batched_cnn2_10_clients``, in a child process because the cuBLAS
setting must precede CUDA's start). It is a per-process switch, not a per-call one, and with it
an operation that has no deterministic CUDA kernel raises (``bench/gpu.py`` lists any it meets).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from robusttune.core.registry import SpecError
from robusttune.problem.models import bound_copy, param_layout

__all__ = [
    "STRATEGIES",
    "batch_orders",
    "client_gradients",
    "resolve_trainer",
    "train_clients",
]

STRATEGIES = ("sequential", "batched")

ClientData = Sequence[tuple[Tensor, Tensor]]


def resolve_trainer(trainer: str, device: torch.device | str) -> str:
    """``auto`` -> ``batched`` on CUDA, ``sequential`` elsewhere; explicit names pass through.

    The rule follows what was measured, by device type:

    - CPU (``bench/training.py``, cnn2, 10 clients of 300-900 CIFAR-shaped images, 2 epochs, on
      the 2-core development machine; docs/explanations/performance.md): sequential is the faster strategy,
      1.00 against 0.73 for batched at 2 threads and 0.59 against 0.45 at 1 thread (under vmap a
      convolution with per-client weights becomes a grouped convolution, slower on the CPU).
    - CUDA (``bench/gpu.sh`` on one H200, torch 2.11, 2026-12-04; docs/how-to/gpu.md): batched,
      which stacks the clients into a GPU that one client's batch of 32 leaves mostly idle:
      1.95-2.07x sequential at 10 clients and 9.4-11.0x at 50 (two runs).
    - Anything else (e.g. ``mps``): sequential, since nothing was measured there.
    """
    if trainer == "auto":
        return "batched" if torch.device(device).type == "cuda" else "sequential"
    if trainer not in STRATEGIES:
        raise SpecError(
            f"trainer {trainer!r} is not allowed; allowed: auto, {', '.join(STRATEGIES)}"
        )
    return trainer


def batch_orders(n: int, *, epochs: int, batch_size: int, seed: int) -> list[Tensor]:
    """The minibatches of one client: for each epoch ``randperm(n)`` from
    ``torch.Generator().manual_seed(seed)``, cut into consecutive pieces of ``batch_size`` (the
    last one of each epoch may be shorter). CPU int64 index tensors, in training order."""
    if n == 0:
        return []
    generator = torch.Generator().manual_seed(int(seed))
    batches: list[Tensor] = []
    for _ in range(epochs):
        batches.extend(torch.randperm(n, generator=generator).split(batch_size))
    return batches


def _check_args(start: Tensor, data: ClientData, seeds: Sequence[int], batch_size: int) -> None:
    if start.dim() not in (1, 2) or (start.dim() == 2 and len(start) != len(data)):
        raise ValueError(
            f"start must be a flat parameter vector Tensor[d] or one per client, "
            f"Tensor[{len(data)}, d]; got shape {tuple(start.shape)}"
        )
    if len(seeds) != len(data):
        raise ValueError(f"need one seed per client: {len(data)} clients, {len(seeds)} seeds")
    if batch_size < 1:
        raise SpecError(f"batch_size must be >= 1; got {batch_size}")


# --------------------------------------------------------------------------------------------
# Local training


def train_clients(
    model: nn.Module,
    start: Tensor,
    data: ClientData,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    momentum: float,
    seeds: Sequence[int],
    strategy: str = "sequential",
    drift: Tensor | None = None,
) -> Tensor:
    """Train every client of ``data`` (a list of ``(x_i, y_i)``) from ``start`` as described in
    the module docstring; return the trained vectors, ``Tensor[k, d]`` in the order of ``data``.
    ``model`` is only the architecture (it is never modified: the sequential trainer calls a copy
    bound to the client's vector, the batched one ``functional_call``). A client without data
    returns its start. ``start`` is ``Tensor[d]``, shared by every client (a round of one run), or
    ``Tensor[k, d]``, client i starting from ``start[i]`` (the clients of several runs of one
    architecture in one computation: bench/gpu.py's stacked runs).

    ``drift`` (Tensor[d], shared by every client): each step's gradient becomes g_t + drift, the
    gradient of CE + <drift, theta>. FedCM (Xu et al., 2021) runs SGD on
    v = alpha g + (1 - alpha) Delta, which is lr' = lr alpha on g + ((1 - alpha) / alpha) Delta."""
    _check_args(start, data, seeds, batch_size)
    if epochs < 0:
        raise SpecError(f"local_epochs must be >= 0; got {epochs}")
    start = start.detach()
    if len(data) == 0:
        return start.new_empty((0, start.shape[-1]))
    orders = [
        batch_orders(len(y), epochs=epochs, batch_size=batch_size, seed=s)
        for (_, y), s in zip(data, seeds)
    ]
    if drift is not None:
        drift = drift.detach().to(start.device, start.dtype)
    starts = start.expand(len(data), -1)  # one row per client: a view of a shared start
    if resolve_trainer(strategy, start.device) == "batched":
        return _train_batched(model, starts, data, orders, batch_size, lr, momentum, drift)
    return _train_sequential(model, starts, data, orders, batch_size, lr, momentum, drift)


def _train_sequential(
    model: nn.Module,
    starts: Tensor,
    data: ClientData,
    orders: list[list[Tensor]],
    batch_size: int,
    lr: float,
    momentum: float,
    drift: Tensor | None = None,
) -> Tensor:
    layout = param_layout(model)
    drifts = None if drift is None else list(layout.views(drift).values())
    out = starts.clone(memory_format=torch.contiguous_format)
    # The parameters are leaf views into one flat vector, and so is the momentum buffer: the
    # foreach updates below write it in place, so no step pays a concatenation of d values (38
    # ms of 110 per resnet18 step on this CPU with a flat leaf). The module is bound to that
    # vector once, not swapped through functional_call at every step (`bound_copy`).
    theta = torch.empty_like(out[0])
    net, params = bound_copy(model, theta)
    buf = torch.empty_like(theta) if momentum != 0 else None
    bufs = None if buf is None else list(layout.views(buf).values())
    for i, ((x, y), batches) in enumerate(zip(data, orders)):
        with torch.no_grad():
            theta.copy_(out[i])
        if buf is not None:
            buf.zero_()  # mu * 0 + g_0 = g_0: the first step of torch.optim.SGD exactly
        # one gather per epoch, then the batches are views: no indexing inside the step loop
        for xb, yb in _epoch_batches(x, y, batches, batch_size):
            loss = F.cross_entropy(net(xb), yb)
            grads = torch.autograd.grad(loss, params)
            with torch.no_grad():
                if drifts is not None:
                    grads = torch._foreach_add(grads, drifts)
                if bufs is None:
                    torch._foreach_add_(params, grads, alpha=-lr)
                else:
                    torch._foreach_mul_(bufs, momentum)
                    torch._foreach_add_(bufs, grads)
                    torch._foreach_add_(params, bufs, alpha=-lr)
        with torch.no_grad():
            out[i].copy_(theta)
    return out


def _epoch_batches(
    x: Tensor, y: Tensor, batches: list[Tensor], batch_size: int
) -> Iterator[tuple[Tensor, Tensor]]:
    """Yield (x_b, y_b) in order, gathering each epoch's permutation once (batches within an
    epoch are consecutive slices of one permutation)."""
    n = len(y)
    if n == 0:
        return
    per_epoch = math.ceil(n / batch_size)
    for e in range(0, len(batches), per_epoch):
        perm = torch.cat(batches[e : e + per_epoch]).to(x.device, non_blocking=True)
        xs, ys = x[perm], y[perm]
        yield from zip(xs.split(batch_size), ys.split(batch_size))


def _padded_index(
    orders: list[list[Tensor]], offsets: list[int], batch_size: int, steps: int
) -> tuple[Tensor, Tensor]:
    """Index table ``Tensor[k, steps, B]`` into the concatenated data and the weights
    ``Tensor[k, steps, B]`` (1 for a real sample, 0 for padding). A short batch is padded with its
    own first index; steps past a client's end point at row 0 with weight 0 (never used)."""
    k = len(orders)
    index = torch.zeros((k, steps, batch_size), dtype=torch.int64)
    weight = torch.zeros((k, steps, batch_size))
    slot = torch.arange(batch_size)
    for i, batches in enumerate(orders):
        if not batches:
            continue
        flat = torch.cat(batches)
        # where each step starts in `flat` and how many real samples it has: one gather per client
        sizes = torch.tensor([len(b) for b in batches])
        first = torch.cumsum(sizes, 0) - sizes
        real = slot < sizes[:, None]  # [T_i, B]
        pos = torch.where(real, first[:, None] + slot, first[:, None])  # pad = the batch's first
        index[i, : len(batches)] = flat[pos] + offsets[i]
        weight[i, : len(batches)] = real.float()
    return index, weight


def _weighted_loss(model: nn.Module) -> Callable[..., Tensor]:
    """L(theta; x, y, w) = sum_j w_j CE(f(x_j; theta), y_j) / sum_j w_j for one client, theta a
    ``{name: tensor}`` dict (gradients come back as a dict of the same views, no concatenation)."""

    def loss(theta: dict[str, Tensor], x: Tensor, y: Tensor, w: Tensor) -> Tensor:
        ce = F.cross_entropy(functional_call(model, theta, (x,)), y, reduction="none")
        return (ce * w).sum() / w.sum()

    return loss


def _train_batched(
    model: nn.Module,
    starts: Tensor,
    data: ClientData,
    orders: list[list[Tensor]],
    batch_size: int,
    lr: float,
    momentum: float,
    drift: Tensor | None = None,
) -> Tensor:
    k, device = len(data), starts.device
    steps = [len(b) for b in orders]
    # clients in decreasing number of steps: those still training at step t are a prefix
    rank = sorted(range(k), key=lambda i: -steps[i])
    active = (
        (torch.tensor(steps)[None, :] > torch.arange(max(steps))[:, None]).sum(1).tolist()
        if max(steps) > 0
        else []
    )
    if not active:
        return starts.clone(memory_format=torch.contiguous_format)
    # the stack is in `rank` order (clients by decreasing steps); indexing copies the starts
    order = torch.tensor(rank).to(device, non_blocking=True)
    theta = starts[order]
    xs = [data[i][0] for i in rank]
    ys = [data[i][1] for i in rank]
    offsets = [0]
    for y in ys[:-1]:
        offsets.append(offsets[-1] + len(y))
    # non_blocking: host-to-device copies from pageable memory then wait for no queued GPU work
    # (no-ops when the data already lives on the device, as in the simulation)
    x_all = torch.cat(xs).to(device, non_blocking=True)
    y_all = torch.cat(ys).to(device, non_blocking=True)
    index, weight = _padded_index([orders[i] for i in rank], offsets, batch_size, len(active))
    index = index.to(device, non_blocking=True)
    weight = weight.to(dtype=starts.dtype).to(device, non_blocking=True)
    buf = torch.zeros_like(theta) if momentum != 0 else None
    layout = param_layout(model)
    step = vmap(grad(_weighted_loss(model)))
    with torch.no_grad():
        for t, a in enumerate(active):
            idx = index[:a, t]  # [a, B]
            # theta[:a] is a prefix of a contiguous stack: its per-parameter views are views too
            params = layout.views(theta[:a])
            grads = list(step(params, x_all[idx], y_all[idx], weight[:a, t]).values())
            if drift is not None:  # one add per parameter tensor, broadcast over the clients
                for g, b in zip(grads, layout.views(drift).values()):
                    g.add_(b)
            tensors = list(params.values())
            if buf is None:
                torch._foreach_add_(tensors, grads, alpha=-lr)
            else:
                bufs = list(layout.views(buf[:a]).values())
                torch._foreach_mul_(bufs, momentum)
                torch._foreach_add_(bufs, grads)
                torch._foreach_add_(tensors, bufs, alpha=-lr)
    out = torch.empty_like(theta)
    # torch.tensor(..., device=cuda) would copy and then synchronise the stream
    out[order] = theta
    return out


# --------------------------------------------------------------------------------------------
# One minibatch gradient per client (DeMoA's g_i)


def client_gradients(
    model: nn.Module,
    start: Tensor,
    data: ClientData,
    *,
    batch_size: int,
    seeds: Sequence[int],
    strategy: str = "sequential",
) -> Tensor:
    """g_i = grad_theta (1/|b_i|) sum_{j in b_i} CE(f(x_j; start), y_j) for each client, with b_i
    the first minibatch of ``batch_orders(n_i, epochs=1, batch_size, seeds[i])`` (the batch the
    first local step would use). Returns ``Tensor[k, d]``; a client without data gives zeros.
    ``batched`` computes all clients in one vmap over the data with ``start`` shared (an ordinary
    batched convolution, not a grouped one)."""
    _check_args(start, data, seeds, batch_size)
    start = start.detach()
    k = len(data)
    out = start.new_zeros((k, start.numel()))
    if k == 0:
        return out
    batches = [_first_batch(len(y), batch_size, s) for (_, y), s in zip(data, seeds)]
    layout = param_layout(model)
    if resolve_trainer(strategy, start.device) == "sequential":
        net, params = bound_copy(model, start)  # views of start, never written
        # one host-to-device copy of every client's batch per round, not one per client (a
        # DeMoA round is milliseconds, so per-client transfers show)
        on_device = _to_data_device(torch.cat(batches), data).split([len(b) for b in batches])
        for i, ((x, y), b) in enumerate(zip(data, on_device)):
            if len(b) == 0:
                continue
            loss = F.cross_entropy(net(x[b]), y[b])
            grads = torch.autograd.grad(loss, params)
            torch._foreach_copy_(list(layout.views(out[i]).values()), grads)
        return out
    live = [i for i in range(k) if len(batches[i]) > 0]
    if not live:
        return out
    # one gather per client of just its batch, padded to B with its first sample at weight 0;
    # the index table and the weights are built on the host and copied once
    sizes = torch.tensor([len(batches[i]) for i in live])
    table = torch.stack(
        [torch.cat([batches[i], batches[i][:1].expand(batch_size - len(batches[i]))]) for i in live]
    )
    table = _to_data_device(table, [data[i] for i in live])
    xs = [data[i][0][table[j]] for j, i in enumerate(live)]
    ys = [data[i][1][table[j]] for j, i in enumerate(live)]
    x = torch.stack(xs).to(start.device, non_blocking=True)
    y = torch.stack(ys).to(start.device, non_blocking=True)
    w = (torch.arange(batch_size)[None, :] < sizes[:, None]).to(start.dtype)
    w = w.to(start.device, non_blocking=True)
    # in_dims None for the parameters: every client shares `start`, so the convolutions stay
    # ordinary batched ones (per-sample-gradient style), not grouped ones
    per_client = vmap(grad(_weighted_loss(model)), in_dims=(None, 0, 0, 0))
    with torch.no_grad():
        grads = per_client(layout.views(start), x, y, w)
    g = torch.cat([v.reshape(len(live), -1) for v in grads.values()], dim=1)
    if len(live) == k:
        return g
    out[torch.tensor(live).to(start.device, non_blocking=True)] = g
    return out


def _to_data_device(index: Tensor, data: ClientData) -> Tensor:
    """``index`` (CPU) on the device of the clients' data, copied without a stream sync. All
    clients of one call hold their data on one device (the run's)."""
    devices = {x.device for x, _ in data}
    if len(devices) > 1:
        raise ValueError(f"client data must share one device; got {sorted(map(str, devices))}")
    return index.to(devices.pop(), non_blocking=True) if devices else index


def _first_batch(n: int, batch_size: int, seed: int) -> Tensor:
    """The first minibatch of ``batch_orders(n, epochs=1, ...)`` (empty when n == 0)."""
    batches = batch_orders(n, epochs=1, batch_size=batch_size, seed=seed)
    return batches[0] if batches else torch.empty(0, dtype=torch.int64)
