"""The cache-attack comparison (analysis/cache_attacks.py) and what it rests on: the cache attacks
act in the simulation as DESIGN.md says. A few rounds on digits, one torch thread."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from robusttune.core.runspec import RunSpec
from robusttune.engine.simulation import Simulation
from tests.scripts import loaded_script

SCRIPT = Path(__file__).resolve().parents[1] / "analysis" / "cache_attacks.py"


@pytest.fixture(scope="module")
def ca():
    with loaded_script(SCRIPT, "cache_attacks_script") as module:
        yield module


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# Cheap versions of the script's runs: the attacks' mechanics, not learning, are under test.
# ALIE over the round's sample, as the papers ran it (the script's setting): under the default
# inputs scope ALIE reads the cache too.
SWB = {
    "dataset": "digits",
    "method": "swb_dm",
    "clients": 20,
    "participation_mode": "fixed",
    "byzantine_fraction": 0.2,
    "local_epochs": 1,
    "swb_views": 1,
    "seed": 0,
    "attack_scope": "sample",
}
DEMOA = {
    "dataset": "digits",
    "method": "demoa",
    "aggregator": "median",
    "clients": 25,
    "participation_mode": "bernoulli",
    "byzantine_fraction": 0.2,
    "server_lr": 0.5,
    "demoa_alpha": 0.1,
    "batch_size": 32,
    "seed": 0,
    "attack_scope": "sample",
}


def cache_rows(sim: Simulation) -> torch.Tensor:
    """The server's per-client cache (SWB-DM's states or DeMoA's momenta), [N, d]."""
    algorithm = sim.algorithm
    return (algorithm.cache if hasattr(algorithm, "cache") else algorithm.momenta).read()


def lockstep(keys: dict, attack_a: str, attack_b: str, rounds: int):
    """Run two specs that differ only in the attack side by side. Per round: the record of the
    first, whether the global models are bit-for-bit equal after the round, and the clients whose
    cache slots differ (a slot holds what its client last sent, so a differing slot is a
    differing message)."""
    a = Simulation(RunSpec(**keys, attack=attack_a, rounds=rounds, eval_every=rounds))
    b = Simulation(RunSpec(**keys, attack=attack_b, rounds=rounds, eval_every=rounds))
    assert torch.equal(a.byzantine, b.byzantine)  # the same Byzantine clients
    out = []
    for _ in range(rounds):
        ra, rb = a.step(), b.step()
        assert (ra.sampled, ra.byzantine_sampled) == (rb.sampled, rb.byzantine_sampled)
        differ = (cache_rows(a) != cache_rows(b)).any(dim=1).nonzero().flatten().tolist()
        out.append((ra, torch.equal(a.params, b.params), differ))
    return out, a.byzantine


def test_hurts_more_needs_the_margin(ca):
    assert ca.hurts_more(0.50, 0.60, margin=0.02)
    assert not ca.hurts_more(0.59, 0.60, margin=0.02)  # lower, but within the margin
    assert not ca.hurts_more(0.70, 0.60, margin=0.02)  # higher
    assert ca.hurts_more(0.59, 0.60, margin=0.0)
    assert ca.hurts_more(math.nan, 0.60) and not ca.hurts_more(0.1, math.nan)


def test_skip_equals_none_only_when_no_sample_can_have_a_byzantine_half(ca):
    assert ca.skip_equals_none(RunSpec(**SWB, participation=0.5))  # B = 4, n = 10
    assert not ca.skip_equals_none(RunSpec(**SWB, participation=0.1))  # B = 4, n = 2
    assert not ca.skip_equals_none(
        RunSpec(**{**SWB, "byzantine_fraction": 0.25}, participation=0.5)
    )
    assert not ca.skip_equals_none(RunSpec(**DEMOA, participation=0.5))  # Bernoulli: any sample


@pytest.mark.parametrize(
    ("keys", "p", "rounds"), [(SWB, 0.5, 1), (DEMOA, 0.5, 6)], ids=["swb_dm", "demoa"]
)
def test_cache_alie_is_not_alie_in_a_cache_run(keys, p, rounds):
    """Same seed, same Byzantine clients: identical until a Byzantine client is sampled; in that
    round exactly the sampled Byzantine clients' slots differ (cache_alie takes mu and sigma over
    the whole cache with n = N, f = B, ALIE over this round's sample), and the models part."""
    steps, byzantine = lockstep({**keys, "participation": p}, "alie", "cache_alie", rounds)
    attacked = [i for i, (r, _, _) in enumerate(steps) if r.byzantine_sampled > 0]
    assert attacked, "no Byzantine client sampled: pick another seed"
    first = attacked[0]
    assert all(equal and not differ for _, equal, differ in steps[:first])
    record, _, differ = steps[first]
    assert len(differ) == record.byzantine_sampled and all(byzantine[differ])
    assert not steps[-1][1]


def test_strategic_skip_without_a_byzantine_majority_is_the_clean_run():
    """N = 20, B = 4, n = 10: no sample has a Byzantine half, so strategic_skip sends exactly the
    honest messages and the run equals the attack-none run bit for bit (label poisoning off)."""
    steps, _ = lockstep({**SWB, "participation": 0.5}, "none", "strategic_skip", 2)
    assert any(r.byzantine_sampled > 0 for r, _, _ in steps)  # Byzantine clients did take part
    assert not any(r.byzantine_majority for r, _, _ in steps)
    assert all(equal and not differ for _, equal, differ in steps)


def test_strategic_skip_attacks_in_the_first_byzantine_majority_round():
    """Bernoulli p = 0.1 over N = 25: honest (equal to none, model and cache) in every round
    before the first Byzantine-majority sample, including rounds with a Byzantine minority;
    malicious in it: exactly the sampled Byzantine clients' slots differ."""
    steps, byzantine = lockstep(
        {**DEMOA, "participation": 0.1, "seed": 1}, "none", "strategic_skip", 5
    )
    majority = [i for i, (r, _, _) in enumerate(steps) if r.byzantine_majority]
    assert majority, "no Byzantine-majority round: pick another seed"
    first = majority[0]
    assert any(r.byzantine_sampled > 0 for r, _, _ in steps[:first]), (
        "no Byzantine-minority round before the first majority: pick another seed"
    )
    assert all(equal and not differ for _, equal, differ in steps[:first])
    record, _, differ = steps[first]
    assert len(differ) == record.byzantine_sampled and all(byzantine[differ])


def test_small_comparison_verdicts_follow_the_accuracies(ca):
    """A small version of the script's grid on digits: the table and every verdict are functions
    of the recorded accuracies (yes iff the cache attack's mean is below ALIE's by the margin)."""
    methods = [
        ca.Method(
            "swb_dm",
            {k: v for k, v in SWB.items() if k not in ("seed", "byzantine_fraction")},
            ((0.5, 1),),
        ),
        ca.Method(
            "demoa (median)",
            {k: v for k, v in DEMOA.items() if k not in ("seed", "byzantine_fraction")},
            ((0.1, 30), (0.5, 10)),
        ),
    ]
    cells = ca.grid(methods, fractions=[0.2], seeds=[0])
    results = ca.run_grid(cells)
    assert len(results) == len(cells) == 3 * len(ca.ATTACKS)
    # the provable copy: swb_dm at p = 0.5 cannot be attacked by strategic_skip
    copied = [c for c, r in results.items() if r["copied"]]
    assert [(c.method, c.p, c.attack) for c in copied] == [("swb_dm", 0.5, "strategic_skip")]

    summary = ca.summarize(results)
    margin = 0.02
    found = ca.verdicts(summary, margin)
    assert {(v.method, v.attack) for v in found} == {
        (m.label, a) for m in methods for a in ca.CACHE_ATTACKS
    }
    for v in found:
        runs = {
            a: [r["accuracy"] for c, r in results.items() if (c.method, c.attack) == (v.method, a)]
            for a in (v.attack, "alie")
        }
        cache_acc = sum(runs[v.attack]) / len(runs[v.attack])
        alie_acc = sum(runs["alie"]) / len(runs["alie"])
        assert v.cache_accuracy == pytest.approx(cache_acc)
        assert v.alie_accuracy == pytest.approx(alie_acc)
        assert v.more == (cache_acc < alie_acc - margin)
        for _p, c, a, more, _ in v.per_p:
            assert more == (c < a - margin)
        # one seed: the same-seed pairs are the per-p comparisons
        assert v.pairs == len(v.per_p) and v.paired_lower == sum(m for _, _, _, m, _ in v.per_p)
        assert v.line().startswith(
            f"{v.attack} hurts {v.method} more than alie at beta=0.2: "
            f"{'yes' if v.more else 'no'} (acc {cache_acc:.3f} vs {alie_acc:.3f}"
        )

    # the attacks do act: on DeMoA the four attacks do not all end at the same accuracy
    demoa = {
        round(s.accuracy, 6) for k, s in summary.items() if k[0] == "demoa (median)" and k[2] == 0.1
    }
    assert len(demoa) > 1

    text = ca.report(summary, found, margin, "python analysis/cache_attacks.py --test", 0.0)
    for v in found:
        assert v.line() in text
    for s in summary.values():
        assert f"{s.accuracy:.3f} ({s.collapsed}/{s.runs})" in text
    for (method, beta, p, attack), s in summary.items():
        if attack == "none":
            noisy = any(
                s.accuracy < summary[(method, beta, p, a)].accuracy - margin for a in ca.ATTACKS[1:]
            )
            notes = ca.noise_notes(summary, margin)
            assert noisy == any(f"{method} at beta=0.2, p={p:g}:" in n for n in notes)
    expected = "Answer: yes" if any(v.more for v in found) else "Answer: no"
    assert ca.answer(found, margin).startswith(expected)


def test_set_reaches_every_run_and_keys_the_grid_varies_are_refused(ca, capsys):
    cells = ca.grid(
        ca.methods(quick=True),
        [0.2],
        [0, 1],
        overrides={"dataset": "fashion_mnist", "train_samples": 12000},
    )
    specs = [cell.spec() for cell in cells]
    assert {(s.dataset, s.train_samples) for s in specs} == {("fashion_mnist", 12000)}
    # the dataset's defaults reach the keys the methods leave unset (Fashion-MNIST: lr 0.01,
    # 2 local epochs); DeMoA's own batch of 32 stays
    swb = next(s for s in specs if s.method == "swb_dm")
    assert (swb.lr, swb.local_epochs) == (RunSpec(dataset="fashion_mnist").lr, 2)
    assert {s.batch_size for s in specs if s.method == "demoa"} == {32}
    # the grid's own axes stay the grid's
    assert {s.attack for s in specs} == set(ca.ATTACKS) and {s.seed for s in specs} == {0, 1}
    with pytest.raises(ca.SpecError, match="--set seed: the comparison varies it per run"):
        ca.grid(ca.methods(quick=True), [0.2], [0], overrides={"seed": 3})
    # from the command line: one line, status 2, before any run
    assert ca.main(["--set", "rounds=3"]) == 2
    assert ca.main(["--set", "train_samples=0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "cache_attacks.py: --set rounds: the comparison varies it per run; allowed: "
        "any other RunSpec key (e.g. dataset, train_samples)",
        "cache_attacks.py: train_samples must be an integer >= 1; got 0",
    ]
