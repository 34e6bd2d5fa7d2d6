"""Any file in, one line out: generated and mutated files thrown at the loaders and at the
command line's first step (``--dry-run`` of sweep, breakdown and tune; ``report`` of a folder;
a map's stored plan and runs), each example under a time limit. A failure is a traceback, an
exit status other than 0 or 2, or an example slower than the limit (a hang, or memory without
bound: YAML aliases that expand without limit, issue 57).

`make test` runs a few seconds of it (FUZZ_EXAMPLES per test); for a longer search:

    ROBUSTTUNE_FUZZ_EXAMPLES=2000 .venv/bin/python -m pytest tests/test_fuzz_inputs.py   # make fuzz
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from robusttune.commands.cli import main
from robusttune.core.registry import SpecError

ROOT = Path(__file__).resolve().parents[1]
SPACES = ROOT / "search_spaces"
FUZZ_EXAMPLES = int(os.environ.get("ROBUSTTUNE_FUZZ_EXAMPLES", "12"))
LIMIT_S = 20  # seconds an example may take: a dry run is well under one

# make test's few examples are the same every time (CI never meets a new one by chance); a
# longer run draws new ones (and Hypothesis keeps any failure it finds in .hypothesis/)
FUZZED = settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    derandomize="ROBUSTTUNE_FUZZ_EXAMPLES" not in os.environ,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.data_too_large,
    ],
)

# byte strings a hostile or broken file might hold
SNIPPETS = [
    b"\xff\xfe",
    b"\x00",
    b"\xc3",
    "\u00e9\u2028".encode(),
    b"*a",
    b"&a ",
    b"<<: *a\n",
    b"!!python/object/apply:os.system ['true']",
    b"!!binary AAAA",
    b"{",
    b"[",
    b"]",
    b"'",
    b'"',
    b": ",
    b"\n- ",
    b"\n  ",
    b"1e999",
    b"-1",
    b".nan",
    b".inf",
    b"~",
    b"null",
    b"? ",
    b"%YAML 1.1\n",
    b"---\n",
    b"...\n",
    b"\t",
    b"0x10",
    b"99999999999999999999",
    b"[" * 200,
    b"{a: " * 50,
]


def alias_bomb(depth: int, width: int) -> bytes:
    """Nested aliases: ``width`` ** ``depth`` values in a few lines."""
    lines = ["a0: &a0 [" + ", ".join(["1"] * width) + "]"]
    for i in range(1, depth + 1):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    lines.append(f"run: {{rounds: *a{depth}}}")
    lines.append(f"space: {{lr: {{grid: *a{depth}}}}}")
    return ("\n".join(lines) + "\n").encode()


@st.composite
def mutated(draw, seeds: list[bytes]) -> bytes:
    """One of ``seeds`` with a few byte-level edits: flips, inserted snippets, cuts, repeats."""
    data = bytearray(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(0, 6))):
        position = draw(st.integers(0, len(data)))
        kind = draw(st.sampled_from(["flip", "insert", "cut", "repeat", "truncate"]))
        if kind == "flip" and data:
            data[min(position, len(data) - 1)] = draw(st.integers(0, 255))
        elif kind == "insert":
            data[position:position] = draw(st.sampled_from(SNIPPETS))
        elif kind == "cut":
            del data[position : position + draw(st.integers(1, 40))]
        elif kind == "repeat":
            data[position:position] = bytes(data[position : position + draw(st.integers(1, 80))])
        else:
            del data[position:]
    return bytes(data)


def scalars() -> st.SearchStrategy:
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-10, 10**6),
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from(
            [
                "mean",
                "median",
                "krum",
                "sign_flip",
                "digits",
                "mlp",
                "synthetic",
                "fixed",
                "bernoulli",
                "cpu",
                "auto",
                "grid",
                "tpe",
                "nope",
                "",
                "../x",
                "~/y",
            ]
        ),
        st.text(max_size=8),
    )


KEYS = [
    "run",
    "space",
    "search",
    "breakdown",
    "tuning",
    "resources",
    "name",
    "plugins",
    "constraints",
    "max_concurrent",
    "grid",
    "uniform",
    "choice",
    "seeds",
    "seed",
    "rounds",
    "clients",
    "method",
    "aggregator",
    "attack",
    "participation",
    "adversary",
    "budget",
    "num_samples",
    "trim_ratio",
    "lr",
    "cpu",
    "gpu",
    "threshold",
    "start_from",
]


def documents() -> st.SearchStrategy:
    """Generated mappings over the files' own keys, so examples reach validation, not only the
    parser."""
    values = st.recursive(
        scalars(),
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(KEYS), inner, max_size=4)
        ),
        max_leaves=20,
    )
    return st.dictionaries(st.sampled_from(KEYS), values, max_size=6).map(
        lambda d: yaml.safe_dump(d, allow_unicode=True).encode()
    )


def seed_files(*names: str) -> list[bytes]:
    return [(SPACES / name).read_bytes() for name in names] + [alias_bomb(8, 9), alias_bomb(3, 4)]


class TooSlow(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: int):
    """TooSlow in the main thread after ``seconds`` of wall time. pytest-timeout's own alarm
    (the same SIGALRM) is put back afterwards with what was left of it."""

    def stop(signum, frame):
        raise TooSlow(f"example slower than {seconds} s")

    started = time.monotonic()
    previous_handler = signal.signal(signal.SIGALRM, stop)
    previous_delay, previous_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_handler)
        if previous_delay:
            left = max(previous_delay - (time.monotonic() - started), 1e-3)
            signal.setitimer(signal.ITIMER_REAL, left, previous_interval)


def command_status(argv: list[str]) -> tuple[int, str]:
    """The exit status of ``robusttune ARGV`` run in this process, and what it wrote; any
    exception other than SystemExit propagates (the traceback a user would see)."""
    out, err = io.StringIO(), io.StringIO()
    with time_limit(LIMIT_S), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
            return code, out.getvalue() + err.getvalue()
    return 0, out.getvalue() + err.getvalue()


def assert_one_line_or_success(code: int, output: str, data: bytes) -> None:
    assert code in (0, 2), (code, output[-2000:], data[:400])
    if code == 2:
        lines = [line for line in output.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: "), (output[-2000:], data[:400])


@pytest.mark.parametrize(
    ("command", "seeds"),
    [
        ("sweep", ("quickstart.yaml", "demoa.yaml")),
        ("breakdown", ("breakdown.yaml",)),
        ("tune", ("tune_defence.yaml",)),
    ],
)
def test_a_mutated_or_generated_space_is_a_dry_run_or_one_line(tmp_path_factory, command, seeds):
    folder = tmp_path_factory.mktemp(f"fuzz_{command}")
    storage = folder / "store"

    @FUZZED
    @given(data=st.one_of(mutated(seed_files(*seeds)), documents()))
    def check(data: bytes) -> None:
        space = folder / "space.yaml"
        space.write_bytes(data)
        code, output = command_status([command, str(space), "--dry-run", "--storage", str(storage)])
        assert_one_line_or_success(code, output, data)
        assert not storage.exists() or not any(storage.iterdir()), "a dry run wrote a folder"

    check()


def test_a_maps_stored_plan_and_runs_load_or_refuse_in_one_line(tmp_path_factory):
    from robusttune.experiments.breakdown.store import MapStore

    folder = tmp_path_factory.mktemp("fuzz_store")
    plan_seed = (SPACES / "breakdown.yaml").read_bytes()
    line = json.dumps(
        {
            "key": json.dumps({"seed": 1, "rounds": 2}),
            "summary": {"final_accuracy": 0.5, "collapsed": False},
        }
    ).encode()
    runs_seed = b"\n".join([line, line, b'{"key": "{}", "summary": {"final_accuracy": "nan"}}'])

    @FUZZED
    @given(
        plan=st.one_of(mutated([plan_seed, alias_bomb(8, 9)]), documents()),
        runs=mutated([runs_seed, b"\x00" * 64 + line, b"\xff\xfe" + line]),
    )
    def check(plan: bytes, runs: bytes) -> None:
        (folder / "plan.yaml").write_bytes(plan)
        (folder / "runs.jsonl").write_bytes(runs)
        store = MapStore(folder)
        with time_limit(LIMIT_S):
            try:
                store.stored_plan()
            except SpecError as error:  # a fuzzed file may or may not be refused
                assert "\n" not in str(error)  # noqa: PT017
            kept = store.finished()
        assert isinstance(kept, dict)

    check()


def test_a_report_of_a_folder_of_broken_files_is_a_report_or_one_line(tmp_path_factory):
    base = tmp_path_factory.mktemp("fuzz_report")
    run = {
        "final_accuracy": 0.8,
        "final_loss": 0.5,
        "collapsed": False,
        "rounds_run": 2,
        "byzantine_majority_rounds": 0,
        "seconds": 1.0,
        "num_classes": 10,
        "spec": {"method": "median", "attack": "none", "seed": 1, "rounds": 2},
    }
    summary_seed = json.dumps(run).encode()
    rounds_seed = b"round,accuracy,loss\n1,0.5,1.0\n2,0.8,0.5\n"
    sweep_seed = (SPACES / "quickstart.yaml").read_bytes()
    counter = iter(range(10**9))

    @FUZZED
    @given(
        summary=mutated([summary_seed]),
        rounds=mutated([rounds_seed]),
        sweep=st.one_of(mutated([sweep_seed, alias_bomb(8, 9)]), documents()),
    )
    def check(summary: bytes, rounds: bytes, sweep: bytes) -> None:
        folder = base / f"results{next(counter)}"
        trial = folder / "trial_0"
        trial.mkdir(parents=True)
        (trial / "summary.json").write_bytes(summary)
        (trial / "rounds.csv").write_bytes(rounds)
        (folder / "sweep.yaml").write_bytes(sweep)
        code, output = command_status(["report", str(folder), "--out", str(folder / "report")])
        assert_one_line_or_success(code, output, summary[:200] + b" | " + sweep[:200])

    check()
