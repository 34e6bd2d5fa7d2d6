"""Attacks that target a server's cache of stale messages (state_cache, demoa): cache-aware
ALIE and strategic skipping."""

from __future__ import annotations

from torch import Tensor

from robusttune.methods.attacks.base import ATTACKS, Attack, AttackRound
from robusttune.methods.attacks.statistical import ALIE, alie_z


@ATTACKS.register("cache_alie")
class CacheALIE(ALIE):
    """Cache-aware ALIE (adaptive; neither SWB-DM nor DeMoA evaluated it): ALIE computed over the
    aggregator's whole input, fresh and cached, which is what a delayed-cache rule actually sees:

        m = mu_c - s * z(N, B) * sigma_c,

    mu_c, sigma_c the coordinate-wise mean and unbiased std of the honest cache rows
    ``cache[~cache_byzantine]``, N = number of cache rows, B = number of Byzantine rows
    (``cache_byzantine.sum()``: the round loop marks the slots this round's Byzantine clients are
    about to overwrite as Byzantine too), z as in ``alie_z``, s = strength (default 1). Every
    Byzantine client sends the same vector. It reads the cache whatever ``attack_scope`` says, so
    under the default ``inputs`` scope it equals ``alie``; with ``attack_scope: sample`` it is the
    cache-aware attacker beside a sample-scope ALIE.

    Without ``cache`` this is plain ``alie`` with n = ``n_total`` and f = ``f`` or
    ``n_byzantine``. A cache with no honest row takes mu, sigma from ``honest`` (``own`` when
    h == 0), keeping z(N, B).
    """

    needs_cache = True

    def craft(self, rnd: AttackRound) -> Tensor:
        if rnd.cache is None or rnd.cache_byzantine is None:  # the two come together
            return super().craft(rnd)
        # the mask is bookkeeping on the host: its counts never wait for the device
        mask = rnd.cache_byzantine.detach().cpu().bool()
        rows = (~mask).nonzero().flatten().to(rnd.cache.device, non_blocking=True)
        honest_rows = rnd.cache.index_select(0, rows)
        source = honest_rows if len(rows) > 0 else rnd.reference(self.name)
        z = alie_z(rnd.cache.shape[0], int(mask.sum()))
        return self._message(rnd, source.to(rnd.honest.dtype), z)


@ATTACKS.register("strategic_skip")
class StrategicSkip(Attack):
    """Strategic skipping (adaptive; the threat the SWB-DM paper names in its introduction): the
    Byzantine clients behave honestly (send ``own``) unless they hold at least half of the sampled
    set,

        2 * n_byzantine >= n_sampled,   n_sampled = the number of clients SAMPLED this round

    (the round loop passes it even when the aggregator runs over a cache of N rows; without it,
    ``n_total``). In such a round every Byzantine client sends

        m = -s * mu,   s = strength (default 10), mu over the attacker's scope,

    the same vector from all of them, so that an order statistic (median, trimmed mean, Krum's
    neighbourhood) lands on it, and a large step against the honest direction (10x the honest mean,
    reversed) drives the model away in a single round. Data poisoning is off (``data_side`` False):
    the honest-looking rounds are genuinely honest, so the run is clean until the sample turns.

    Strength ladder (1, 10, 100, 1000): from a plain reversed mean to one that outweighs up to
    1000 honest messages in the round it strikes.
    """

    needs_own = True
    default_strength = 10.0
    min_strength = 0.0
    why_min_strength = "s < 0 sends +|s| mu in its striking rounds, an honest helper"
    strength_ladder = (1.0, 10.0, 100.0, 1000.0)

    def craft(self, rnd: AttackRound) -> Tensor:
        if 2 * rnd.n_byzantine < rnd.n_sampled:
            return rnd.require_own(self.name)
        return rnd.repeat(-self.strength * rnd.reference(self.name).mean(dim=0))
