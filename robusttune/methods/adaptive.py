"""The adaptive adversary (``breakdown.adversary: adaptive``): beyond its attack's strength
ladder, a point with Byzantine clients that the ladder did not break gets ``adaptive_budget``
more runs at strengths an Optuna study proposes to minimise the point's score (accuracy, 0 when
collapsed), within the ladder's range. The ladder is the floor: its runs are told to the study
first and stay in the worst case, so the adaptive outcome is never milder than the ladder's.

`spec_evaluator` drives the studies (one per open point, every proposal of a wave run as one
batch); this module is one study: `StrengthSearch`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import optuna

__all__ = ["StrengthSearch", "spans_a_range"]

KEY = "attack_strength"


def spans_a_range(ladder: Sequence[float]) -> bool:
    """Whether an attack's strength ladder leaves anything to search: two or more strengths (an
    attack with one strength, or none, has its worst case in the ladder already)."""
    return len(set(ladder)) > 1


class StrengthSearch:
    """An Optuna study over attack_strength, log-uniform on [min(ladder), max(ladder)] (TPE seeded
    with ``seed``), minimising the score; ``tried`` are the (strength, score) pairs already run
    (the ladder), told to the study before its first proposal.

    Deterministic: the same seed and the same told scores give the same proposals, so a resumed
    map asks for the same runs again and finds them in its runs.jsonl."""

    def __init__(
        self, ladder: Sequence[float], tried: Sequence[tuple[float, float]], seed: int
    ) -> None:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        low, high = min(ladder), max(ladder)
        if not 0 < low < high:
            raise ValueError(
                f"an adaptive search needs a ladder of positive strengths spanning "
                f"a range; got {list(ladder)}"
            )
        self.distribution = optuna.distributions.FloatDistribution(low, high, log=True)
        self.study = optuna.create_study(
            direction="minimize", sampler=optuna.samplers.TPESampler(seed=seed)
        )
        for strength, score in tried:
            self.study.add_trial(
                optuna.trial.create_trial(
                    params={KEY: strength}, distributions={KEY: self.distribution}, value=score
                )
            )
        self._asked: optuna.trial.Trial | None = None

    def ask(self) -> dict[str, float]:
        """The next strength to run, as an adversary variant ``{attack_strength: s}``."""
        self._asked = self.study.ask({KEY: self.distribution})
        return {KEY: float(self._asked.params[KEY])}

    def tell(self, score: float) -> None:
        """The score of the strength last asked."""
        if self._asked is None:
            raise RuntimeError("tell() before ask()")
        self.study.tell(self._asked, score)
        self._asked = None
