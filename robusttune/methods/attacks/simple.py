"""Attacks that need no honest statistics beyond a mean: none, label flip, sign flip, bit flip
and Gaussian noise."""

from __future__ import annotations

from torch import Tensor

from robusttune.core.numerics import sqrt
from robusttune.methods.attacks.base import ATTACKS, Attack, AttackRound, standard_normal


@ATTACKS.register("none")
class NoAttack(Attack):
    """No attack: Byzantine clients send what they honestly trained (``own``). It breaks nothing,
    so a breakdown map refuses a cell with it."""

    needs_own = True

    def craft(self, rnd: AttackRound) -> Tensor:
        return rnd.require_own(self.name)


@ATTACKS.register("label_flip")
class LabelFlip(Attack):
    """Label flipping (data side): Byzantine clients train on y -> K - 1 - y and send the result
    (``own``, which the round loop trains on ``poison_labels``). Strength is unused."""

    data_side = True
    needs_own = True

    def poison_labels(self, labels: Tensor, num_classes: int) -> Tensor:
        return num_classes - 1 - labels

    def craft(self, rnd: AttackRound) -> Tensor:
        return rnd.require_own(self.name)


@ATTACKS.register("sign_flip")
class SignFlip(Attack):
    """Sign flipping: each Byzantine client i sends the negation of the update it would honestly
    have sent, scaled by the strength s (default 1):

        m_i = -s * own_i          (own given)
        m_i = -s * mu             (own not given: every Byzantine client sends the same vector)

    The SWB-DM study's "sign-flip" attack. With s = 1 and ``own`` this is exactly ``bit_flip``.

    Strength ladder (1, 3, 10, 100): the flip itself, then scaled up; at s = 100 one Byzantine
    client among up to 100 honest ones reverses the mean of their agreeing updates.
    """

    needs_own = True
    min_strength = 0.0
    why_min_strength = "s < 0 sends +|s| own, an honest helper"
    strength_ladder = (1.0, 3.0, 10.0, 100.0)
    default_adversary = True  # breaks the mean at the first Byzantine client (DESIGN.md)

    def craft(self, rnd: AttackRound) -> Tensor:
        if rnd.own is not None:
            return -self.strength * rnd.own
        mu = rnd.reference(self.name).mean(dim=0)
        return rnd.repeat(-self.strength * mu)


@ATTACKS.register("bit_flip")
class BitFlip(SignFlip):
    """Bit flipping (Allen-Zhu et al., ICLR 2021; Karimireddy, He, Jaggi, ICML 2021 / ICLR 2022,
    the attack in DeMoA's experiments): a Byzantine worker sends -g instead of its own g (epfml's
    ``BitFlippingWorker.get_gradient`` returns ``-super().get_gradient()``).

        m_i = -s * own_i          (own given; s = 1 default)
        m_i = -s * mu             (own not given)

    Equivalent to ``sign_flip`` in this package: the same formula and knob, kept as a separate
    name so that the DeMoA experiments (where messages are momenta, so the Byzantine client sends
    its negated honest momentum) and the SWB-DM ones keep their papers' names. The name "bit
    flipping" refers to flipping the sign bit of every float, not to random bit errors. Not in
    the default worst case: it is ``sign_flip`` there already.
    """

    default_adversary = False  # the same messages as sign_flip, which the worst case runs


@ATTACKS.register("gaussian")
class GaussianNoise(Attack):
    """Additive Gaussian noise: each Byzantine client i sends its honest message plus independent
    noise,

        m_i = b_i + s * rms * xi_i,   xi_i ~ N(0, I_d) drawn from ``generator``,
        rms = sqrt((1/d) sum_j mu_j^2) = ||mu||_2 / sqrt(d),

    where b_i = own_i when ``own`` is given (else b_i = mu) and mu is the honest mean message (the
    mean of ``own`` when h == 0). Default s = 1: the noise has the per-coordinate scale of the
    honest mean update, so its norm ~= ||mu|| (a noise-to-signal ratio of one; the attack stays in
    proportion as updates shrink during training). s >= 0; s = 0 returns the honest message.
    Noise is drawn on the generator's device and moved; generator=None -> seed-0 fallback.

    Strength ladder (1, 10, 100, 1000): noise of growing scale, up to 1000 times the honest
    signal, where the noise alone outweighs the sum of 1000 honest messages.
    """

    needs_own = True
    min_strength = 0.0
    strength_ladder = (1.0, 10.0, 100.0, 1000.0)

    def craft(self, rnd: AttackRound) -> Tensor:
        mu = rnd.reference(self.name).mean(dim=0)
        base = rnd.own if rnd.own is not None else rnd.repeat(mu)
        rms = sqrt(mu.square().mean())
        noise = standard_normal((rnd.n_byzantine, rnd.d), base, rnd.generator)
        return base + (self.strength * rms) * noise
