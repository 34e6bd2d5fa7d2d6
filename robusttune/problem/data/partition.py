"""The federated split: a per-class Dirichlet partition of the training set over the clients
(Hsu, Qi and Brown, 2019) and FLTrust's class-balanced root set, both seeded by the partition seed."""

from __future__ import annotations

import math

import numpy as np

from robusttune.core.registry import SpecError
from robusttune.problem.data.base import STREAM_PARTITION, STREAM_ROOT, seeded_rng

# A Dirichlet draw that leaves a client empty is redrawn at most this many times. The redraw only
# touches the K x N proportion matrix (emptiness depends on the counts alone), so it is cheap even
# for EMNIST; the NIID-Bench code redraws without a bound, which never ends when N exceeds what a
# tiny alpha can fill (alpha = 0.01 puts each class on about one client).
_MAX_REDRAWS = 50


def dirichlet_partition(
    labels: np.ndarray, n_clients: int, alpha: float, seed: int
) -> list[np.ndarray]:
    """Split sample indices over ``n_clients`` clients, non-IID per class (Hsu et al., 2019).

    For every class k with index set I_k (|I_k| = n_k): draw q_k ~ Dirichlet(alpha * 1_N), shuffle
    I_k, and give client j the slice between floor(n_k * sum_{l<j} q_kl) and
    floor(n_k * sum_{l<=j} q_kl). Small alpha concentrates a class on few clients; as alpha grows,
    every client's label mix tends to the global one. ``alpha = inf`` is the IID split: a random
    permutation of all indices cut into N parts whose sizes differ by at most one.

    Every client gets at least one sample: a draw with an empty client is redrawn (its proportions
    only) up to ``_MAX_REDRAWS`` times, which conditions the Dirichlet draw on "no empty client";
    if that still fails (e.g. many clients and a tiny alpha), each empty client in turn receives
    one random sample from the client that is then the largest.

    Args:
        labels: class label of each training sample, shape [n].
        n_clients: N >= 1, at most n.
        alpha: Dirichlet concentration > 0, or ``math.inf`` for IID.
        seed: the partition seed (not the run seed), the only source of randomness.

    Returns:
        N sorted, disjoint index arrays (int64) whose union is range(n).
    """
    labels = np.asarray(labels).reshape(-1)
    n = labels.size
    if n_clients < 1:
        raise SpecError(f"clients must be >= 1; got {n_clients}")
    if n < n_clients:
        raise SpecError(
            f"clients={n_clients} exceeds the {n} training samples; every client needs at least one"
        )
    if not alpha > 0:
        raise SpecError(f"dirichlet_alpha must be > 0 (inf: IID); got {alpha}")
    rng = seeded_rng(seed, STREAM_PARTITION)

    if math.isinf(alpha):
        return [np.sort(part) for part in np.array_split(rng.permutation(n), n_clients)]

    _, inverse = np.unique(labels, return_inverse=True)
    class_sizes = np.bincount(inverse)  # n_k
    counts = _dirichlet_counts(class_sizes, n_clients, alpha, rng)  # [K, N]

    # Samples grouped by class, shuffled within each class; then class k's block is cut into the
    # N consecutive runs counts[k, 0], counts[k, 1], ... (the np.split on cumulative proportions,
    # done for all classes at once with one np.repeat).
    grouped = np.lexsort((rng.random(n), inverse))
    owner = np.empty(n, dtype=np.int64)
    owner[grouped] = np.repeat(np.tile(np.arange(n_clients), class_sizes.size), counts.reshape(-1))

    sizes = counts.sum(axis=0)
    if sizes.min() == 0:
        owner, sizes = _fill_empty_clients(owner, sizes, rng)
    by_client = np.argsort(owner, kind="stable")  # stable: indices ascending within a client
    return np.split(by_client, np.cumsum(sizes)[:-1])


def _dirichlet_counts(
    class_sizes: np.ndarray, n_clients: int, alpha: float, rng: np.random.Generator
) -> np.ndarray:
    """counts[k, j] = floor(n_k * cumsum(q_k)_j) - floor(n_k * cumsum(q_k)_{j-1}), q_k ~ Dir(alpha).

    Redrawn while a client would be empty, at most ``_MAX_REDRAWS`` times; the last draw is
    returned either way (the caller repairs empty clients)."""
    n_k = class_sizes[:, None]
    counts = None
    for _ in range(_MAX_REDRAWS):
        q = rng.dirichlet(np.full(n_clients, alpha), size=class_sizes.size)  # [K, N]
        if not np.isfinite(q).all():  # a tiny alpha can underflow: count it as a failed draw
            continue
        cut = np.minimum(np.floor(np.cumsum(q, axis=1) * n_k).astype(np.int64), n_k)
        cut[:, -1] = class_sizes  # the cumulative sum may end at 1 - 1e-16
        counts = np.diff(cut, axis=1, prepend=0)
        if counts.sum(axis=0).min() > 0:
            break
    if counts is None:  # every draw underflowed: all on client 0, the repair spreads it
        counts = np.zeros((class_sizes.size, n_clients), dtype=np.int64)
        counts[:, 0] = class_sizes
    return counts


def _fill_empty_clients(
    owner: np.ndarray, sizes: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Give each empty client one random sample of the client that is largest at that moment."""
    original = sizes
    sizes = sizes.copy()
    receivers: dict[int, list[int]] = {}
    # A loop over empty clients (at most N) that only decides who gives to whom.
    for empty in np.flatnonzero(sizes == 0):
        donor = int(np.argmax(sizes))
        sizes[donor] -= 1
        sizes[empty] += 1
        receivers.setdefault(donor, []).append(int(empty))
    # Each donor's samples are one contiguous block of the owner-sorted order.
    by_client = np.argsort(owner, kind="stable")
    starts = np.cumsum(original) - original
    owner = owner.copy()
    for donor, takers in receivers.items():
        picks = rng.choice(int(original[donor]), size=len(takers), replace=False)
        owner[by_client[starts[donor] + picks]] = takers
    return owner, sizes


def root_set(labels: np.ndarray, size: int, seed: int) -> np.ndarray:
    """Indices of a class-balanced server root set of ``min(size, n)`` training samples (FLTrust).

    FLTrust (Cao et al., NDSS 2021) samples its small clean root set from the learning task's
    training data, so it overlaps the clients' pool. Balanced: every sample gets its rank r within
    its class in a random order, and samples are taken by increasing r * K + pi(class) for a random
    class permutation pi, i.e. one per class, then a second per class, ... . Class counts in the
    root set therefore differ by at most one, unless a class has run out of samples (the others
    then fill in). Seeded by the partition seed on its own stream.

    Returns:
        sorted int64 indices into the training set.
    """
    labels = np.asarray(labels).reshape(-1)
    n = labels.size
    size = min(int(size), n)
    rng = seeded_rng(seed, STREAM_ROOT)
    inverse, class_sizes, rank = _ranks_within_class(labels, rng)
    priority = rank * class_sizes.size + rng.permutation(class_sizes.size)[inverse]
    return np.sort(np.argsort(priority, kind="stable")[:size])


def _ranks_within_class(
    labels: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(class index per sample, class sizes, rank of each sample within its class in a random
    order drawn from ``rng``): the stratification both the root set and the validation split
    draw from (one ``rng.random(n)`` draw)."""
    _, inverse = np.unique(labels, return_inverse=True)
    class_sizes = np.bincount(inverse)
    grouped = np.lexsort((rng.random(labels.size), inverse))  # by class, random order within
    rank = np.empty(labels.size, dtype=np.int64)
    rank[grouped] = np.arange(labels.size) - np.repeat(
        np.cumsum(class_sizes) - class_sizes, class_sizes
    )
    return inverse, class_sizes, rank


def validation_split(
    labels: np.ndarray, fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Split the held-out set into (validation, test) indices, stratified by class.

    Every sample gets the key (r + 1/2) / n_k, r its rank within its class k (n_k samples) in a
    random order drawn from the partition seed on its own stream; the v = floor(fraction n + 1/2)
    samples with the smallest keys (ties in a random order) are validation, the rest test. Class
    k then gives validation floor(fraction n_k) or ceil(fraction n_k) samples: disjoint parts,
    every class in both in the held-out set's proportions up to one sample, the same split for
    every run seed and method. The validation part comes from the test set, not from the
    training set, so every client's data and every training trajectory stay as they are without
    it; what selection reads (validation accuracy) and what a report states (test accuracy) are
    then two disjoint samples of the same distribution that no client trains on.
    ``fraction = 0``: no validation part, every index is test.

    Returns:
        (validation, test): sorted int64 index arrays into the held-out set.
    """
    from robusttune.problem.data.base import STREAM_VALIDATION

    labels = np.asarray(labels).reshape(-1)
    n = labels.size
    if fraction <= 0:
        return np.empty(0, dtype=np.int64), np.arange(n, dtype=np.int64)
    taken = math.floor(fraction * n + 0.5)
    if not 0 < taken < n:
        part = "validation" if taken == 0 else "test"
        raise SpecError(
            f"validation_fraction {fraction:g} leaves no {part} sample of the {n} "
            f"held-out samples; allowed: a fraction that leaves both parts non-empty"
        )
    mask = _stratified_mask(labels, taken, seeded_rng(seed, STREAM_VALIDATION))
    return np.flatnonzero(mask).astype(np.int64), np.flatnonzero(~mask).astype(np.int64)


def training_subset(
    labels: np.ndarray, size: int, seed: int, dataset: str = "the dataset"
) -> np.ndarray:
    """Indices of ``size`` training samples, stratified by class: the training set a run with
    ``train_samples`` learns from (the partition, the root set and every client's data are drawn
    from it, so a CPU can run a real dataset's map on a tenth of it).

    The same keys as `validation_split`: every sample gets (r + 1/2) / n_k, r its rank within its
    class k (n_k samples) in a random order drawn from the partition seed on its own stream, and
    the ``size`` smallest keys are taken (ties in a random order): class k gives floor or ceil of
    size * n_k / n samples, the training set's class proportions up to one sample, and a larger
    size takes a superset of a smaller one's samples. ``size`` above n is one SpecError line.

    Returns:
        sorted int64 indices into the training set.
    """
    from robusttune.problem.data.base import STREAM_TRAIN_SUBSET

    labels = np.asarray(labels).reshape(-1)
    n = labels.size
    if not 1 <= size <= n:
        raise SpecError(
            f"train_samples must be in [1, {n}] ({dataset} has {n} training samples); got {size}"
        )
    return np.flatnonzero(
        _stratified_mask(labels, size, seeded_rng(seed, STREAM_TRAIN_SUBSET))
    ).astype(np.int64)


def _stratified_mask(labels: np.ndarray, taken: int, rng: np.random.Generator) -> np.ndarray:
    """A mask of the ``taken`` samples with the smallest keys (r + 1/2) / n_k (see
    `validation_split`), ties broken in a random order from ``rng``."""
    inverse, class_sizes, rank = _ranks_within_class(labels, rng)
    key = (rank + 0.5) / class_sizes[inverse]
    chosen = np.lexsort((rng.random(labels.size), key))[:taken]
    mask = np.zeros(labels.size, dtype=bool)
    mask[chosen] = True
    return mask
