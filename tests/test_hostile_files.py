"""Files from others cannot hang or crash the tool (issue 57): YAML whose aliases nest or refer to
themselves, bytes that are not UTF-8, a section of the wrong type, a results folder of broken
files, and the example plugin's .npz (a zip whose members can expand far past the file). Each
is a valid result or one line with exit status 2, fast. tests/test_fuzz_inputs.py throws
generated and mutated files at the same entry points."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from robusttune.commands.cli import app
from robusttune.core.registry import SpecError
from robusttune.core.yaml_input import MAX_YAML_NODES, expanded_size, parse_yaml

ROOT = Path(__file__).resolve().parents[1]


def nested_aliases(depth: int, width: int) -> str:
    lines = ["name: bomb", "a0: &a0 [" + ", ".join(["1"] * width) + "]"]
    for i in range(1, depth + 1):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    lines += ["run: {rounds: 2}", f"space: {{lr: {{grid: *a{depth}}}}}"]
    return "\n".join(lines) + "\n"


def one_line(args: list[str]) -> str:
    result = CliRunner().invoke(app, args)
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    return lines[0]


def walked(value) -> int:
    """Values a loaded document stands for, counted by walking it (aliases are shared objects,
    walked each time they occur): the independent count."""
    if isinstance(value, dict):
        return 1 + sum(1 + walked(v) for v in value.values())
    if isinstance(value, list):
        return 1 + sum(walked(v) for v in value)
    return 1


def test_expanded_size_counts_what_the_aliases_stand_for():
    import yaml

    for text in (
        "[1, [2, 3], {a: 4}]",
        "a: &x [1, 2]\nb: *x\n",
        nested_aliases(3, 4),
        nested_aliases(2, 7),
        "base: &b {x: 1}\nother: [*b, *b, {c: *b}]\n",
    ):
        assert expanded_size(yaml.compose(text), 10**6) == walked(yaml.safe_load(text)), text
    assert expanded_size(yaml.compose("[1, [2, 3], {a: 4}]"), 100) == 1 + 1 + 3 + 3
    # 9 ** 8 = 43 million leaves in 11 lines: refused by counting, nothing expanded
    with pytest.raises(yaml.YAMLError, match="more than 1,000"):
        expanded_size(yaml.compose(nested_aliases(8, 9)), 1000)


@pytest.mark.parametrize("command", ["sweep", "breakdown", "tune"])
def test_nested_aliases_are_refused_at_once(tmp_path, command):
    space = tmp_path / "bomb.yaml"
    space.write_text(nested_aliases(8, 9))
    started = time.perf_counter()
    line = one_line([command, str(space), "--dry-run", "--storage", str(tmp_path / "s")])
    assert time.perf_counter() - started < 10
    assert "bomb.yaml" in line and f"{MAX_YAML_NODES:,}" in line and "aliases" in line


def test_aliases_within_bounds_and_merge_keys_still_load():
    assert parse_yaml("base: &b {x: 1, y: [1, 2]}\nother: {<<: *b, y: 3}\n", "f") == {
        "base": {"x": 1, "y": [1, 2]},
        "other": {"x": 1, "y": 3},
    }
    small = parse_yaml(nested_aliases(2, 3), "f")
    assert small["space"]["lr"]["grid"] == [[[1, 1, 1]] * 3] * 3


def test_a_recursive_alias_and_deep_nesting_are_one_line():
    with pytest.raises(SpecError, match="recursive structure"):
        parse_yaml("a: &a [1, *a]\n", "cyc.yaml")
    with pytest.raises(SpecError, match="nested too deeply"):
        parse_yaml("[" * 20000 + "]" * 20000, "deep.yaml")


@pytest.mark.parametrize("command", ["sweep", "breakdown", "tune"])
def test_bytes_that_are_not_utf8_are_named_with_their_offset(tmp_path, command):
    space = tmp_path / "latin.yaml"
    data = b"name: x\nrun: {rounds: 2}  # caf\xe9\n"
    space.write_bytes(data)
    line = one_line([command, str(space), "--dry-run", "--storage", str(tmp_path / "s")])
    assert "latin.yaml" in line and "not UTF-8" in line
    offset = data.index(0xE9)
    assert f"0xe9 at offset {offset}" in line


@pytest.mark.parametrize(
    "document", ["run: true\n", "space: [1, 2]\n", "run: {}\nspace: 3\n", "resources: yes\n"]
)
@pytest.mark.parametrize("command", ["sweep", "breakdown", "tune"])
def test_a_section_of_the_wrong_type_is_one_line(tmp_path, command, document):
    space = tmp_path / "typed.yaml"
    space.write_text(document)
    line = one_line([command, str(space), "--dry-run", "--storage", str(tmp_path / "s")])
    assert "typed.yaml" in line


def test_a_folder_or_a_huge_file_is_not_read(tmp_path):
    from robusttune.core.yaml_input import MAX_YAML_BYTES

    assert "not a file" in one_line(["sweep", str(tmp_path), "--dry-run"])
    huge = tmp_path / "huge.yaml"
    with huge.open("wb") as handle:
        handle.truncate(MAX_YAML_BYTES + 1)
    assert f"{MAX_YAML_BYTES:,}" in one_line(["sweep", str(huge), "--dry-run"])


def test_a_map_store_passes_over_lines_that_are_not_utf8(tmp_path):
    from robusttune.experiments.breakdown.store import MapStore

    (tmp_path / "runs.jsonl").write_bytes(b'\xff\xfe{"key": 1}\n{"key": "{}", "summary": 5}\n')
    store = MapStore(tmp_path)
    assert store.finished() == {} and len(store.notes) == 2
    (tmp_path / "plan.yaml").write_bytes(b"- a list, not a plan\n")
    with pytest.raises(SpecError, match="not a breakdown map's plan"):
        store.stored_plan()


# -- the example plugin's .npz ------------------------------------------------------------------
# Importing the example registers its entries in this process's registries, which other tests
# of the same worker list (tests/test_docs.py): it runs in a process of its own.
NPZ_CHECKS = r"""
import sys, zipfile
import numpy as np
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from my_defence import arrays
from robusttune.core.registry import SpecError

folder = Path(sys.argv[2])

def refused(path, words, read=False):
    try:
        arrays._read(str(path)) if read else arrays.array_headers(path)
    except SpecError as error:
        assert words in str(error) and "\n" not in str(error), (path, str(error))
        return
    raise AssertionError(f"{path} was accepted")

good = folder / "good.npz"
rng = np.random.default_rng(0)
np.savez(good, x_train=rng.normal(size=(20, 3)), y_train=rng.integers(0, 3, 20),
         x_test=rng.normal(size=(6, 3)), y_test=rng.integers(0, 3, 6))
headers = arrays.array_headers(good)
assert headers["x_train"][0] == (20, 3) and headers["y_test"][0] == (6,), headers
assert arrays._read(str(good)).train_x.shape == (20, 3)
# members whose headers claim 10^12 floats: refused by arithmetic, nothing allocated
bomb = folder / "bomb.npz"
with zipfile.ZipFile(bomb, "w") as archive:
    for name, shape in (("x_train", (10 ** 9, 1000)), ("y_train", (10 ** 9,)),
                        ("x_test", (2, 1000)), ("y_test", (2,))):
        header = np.lib.format.header_data_from_array_1_0(np.zeros((1,)))
        header["shape"] = shape
        with archive.open(f"{name}.npy", "w") as member:
            np.lib.format.write_array_header_1_0(member, header)
refused(bomb, "at most")
for name, data in (("text.npz", b"not a zip"), ("empty.npz", b"")):
    (folder / name).write_bytes(data)
    refused(folder / name, "not a readable .npz")
np.savez(folder / "short.npz", x_train=np.zeros((3, 2)), y_train=np.zeros(3))
refused(folder / "short.npz", "lacks x_test, y_test")
np.savez(folder / "ragged.npz", x_train=np.zeros((3, 2)), y_train=np.zeros(4),
         x_test=np.zeros((2, 2)), y_test=np.zeros(2))
refused(folder / "ragged.npz", "shapes")
np.savez(folder / "negative.npz", x_train=np.zeros((3, 2)), y_train=np.array([0, -1, 1]),
         x_test=np.zeros((2, 2)), y_test=np.zeros(2, dtype=np.int64))
refused(folder / "negative.npz", "integer labels from 0", read=True)
print("checked")
"""


def test_an_npz_is_checked_from_its_headers_before_anything_is_decompressed(tmp_path):
    import subprocess

    result = subprocess.run(
        [sys.executable, "-c", NPZ_CHECKS, str(ROOT / "examples"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0 and result.stdout.strip() == "checked", result.stderr[-3000:]


def test_a_start_from_csv_that_is_not_one_is_one_line(tmp_path):
    from robusttune.experiments.breakdown import read_prior

    for name, data in (
        ("latin.csv", b"status,breakdown_fraction\nok,0.1 caf\xe9\n"),
        ("ragged.csv", b'status,breakdown_fraction\n"ok\n'),
        ("other.csv", b"a,b\n1,2\n"),
    ):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(SpecError, match=r"breakdown.start_from") as caught:
            read_prior(tmp_path / name)
        assert "\n" not in str(caught.value)
    (tmp_path / "fine.csv").write_bytes(b"status,breakdown_fraction\nok,0.1\nok,x\n")
    table = read_prior(tmp_path / "fine.csv")
    assert table["breakdown_fraction"].iloc[0] == 0.1 and table["breakdown_fraction"].isna().iloc[1]
