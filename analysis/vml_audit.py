"""Which ATen operations reach MKL's vector math (VML), and which of those kernels are approximate.

The audit behind ``robusttune.core.numerics.MKL_VML_OPERATIONS`` and ``MKL_APPROXIMATE_OPERATIONS``
(issue 44), repeatable on any x86-64 machine with gdb and objdump (``make tools``):

1. **Reached**: a probe process in portable numerics runs each candidate operation once on a
   contiguous float32 and float64 tensor, under gdb with a breakpoint on every exported
   ``mkl_vml_kernel_*`` compute kernel of libtorch_cpu.so; a hit is the operation reaching VML.
2. **Approximate**: each ``*_EXHAynn`` kernel (the COMPATIBLE branch's, which portable mode
   pins), cut out of the library by its symbol's address and size (nm, readelf), is disassembled
   with objdump and searched for ``rsqrt*`` and ``rcp*``: instructions
   whose results differ between Intel, AMD and emulators, so the kernel's last bit does too.
3. **The tool's own runs**: short portable runs of several rules under the attacks that compute
   statistics (ALIE, Gaussian, Fang's Krum attack, MinMax, IPM) are traced the same way; none may
   reach an approximate kernel.

Prints one line per operation, then ``approximate_vml_kernels_reached_by_runs: <count>`` last.
``--quick`` traces one run only (the smoke test's mode).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

APPROXIMATE = re.compile(r"\s(v?rsqrt[0-9a-z]*|v?rcp[0-9a-z]*)\s")
KERNEL = re.compile(r"^mkl_vml_kernel_([sd])([A-Za-z0-9]+)_EXHAynn$")

# Candidate operations: VML's whole float interface as ATen declares it, and the neighbours a
# reader might suspect (rsqrt, reciprocal, pow, norms, the loss and activation kernels).
PROBE = r"""
import json, sys
from robusttune.core.numerics import pin
pin("portable")
import torch, torch.nn.functional as F
x = torch.rand(4096, generator=torch.Generator().manual_seed(0)) * 0.9 + 0.05
square = lambda t: t.view(64, 64)
OPS = {
    "abs": torch.abs, "acos": torch.acos, "asin": torch.asin, "atan": torch.atan,
    "cos": torch.cos, "cosh": torch.cosh, "erf": torch.erf, "erfc": torch.erfc,
    "erfinv": torch.erfinv, "exp": torch.exp, "expm1": torch.expm1, "log": torch.log,
    "log10": torch.log10, "log1p": torch.log1p, "log2": torch.log2, "sin": torch.sin,
    "sinh": torch.sinh, "sqrt": torch.sqrt, "tan": torch.tan, "tanh": torch.tanh,
    "trunc": torch.trunc, "rsqrt": torch.rsqrt, "reciprocal": torch.reciprocal,
    "sigmoid": torch.sigmoid, "lgamma": torch.lgamma, "exp2": torch.exp2,
    "pow(x, 0.5)": lambda t: t.pow(0.5), "pow(x, -0.5)": lambda t: t.pow(-0.5),
    "pow(x, 1.5)": lambda t: t.pow(1.5), "vector_norm": lambda t: torch.linalg.vector_norm(square(t), dim=1),
    "cdist": lambda t: torch.cdist(square(t), square(t)), "std": lambda t: square(t).std(0),
    "log_softmax": lambda t: F.log_softmax(square(t), 1), "softmax": lambda t: F.softmax(square(t), 1),
    "cross_entropy": lambda t: F.cross_entropy(square(t), torch.arange(64)), "gelu": F.gelu,
    "logsumexp": lambda t: square(t).logsumexp(1),
}
for dtype in ("float32", "float64"):
    for name, op in OPS.items():
        print("@@OP " + json.dumps(["op", name, dtype]), flush=True)
        op(x.to(getattr(torch, dtype)))
"""

# The tool's own runs: rules under the attacks whose statistics take roots.
RUN = r"""
import json, sys
from robusttune.core.runspec import RunSpec
from robusttune.engine.simulation import simulate
BASE = {"dataset": "digits", "model": "mlp", "clients": 10, "participation": 0.5, "rounds": 2,
        "local_epochs": 1, "byzantine_fraction": 0.2, "checkpoint_every": 0, "device": "cpu",
        "numerics": "portable"}
RUNS = json.loads(sys.argv[1])
for keys in RUNS:
    print("@@OP " + json.dumps(["run", keys["method"], keys["attack"]]), flush=True)
    for _ in simulate(RunSpec.from_dict({**BASE, **keys})):
        pass
"""
RUNS = [
    {"method": "median", "attack": "alie"},
    {"method": "krum", "attack": "fang_krum"},
    {"method": "trimmed_mean", "attack": "minmax"},
    {"method": "demoa", "attack": "gaussian"},
    {"method": "swb_dm", "attack": "ipm"},
]

TRACER = r"""
import gdb
for setting in ("pagination off", "breakpoint pending on", "print thread-events off",
                "print inferior-events off"):
    gdb.execute("set " + setting)
class Hit(gdb.Breakpoint):
    def stop(self):
        print("@@HIT " + self.location, flush=True)
        return False
for name in open(KERNELS).read().split():
    Hit(name)
gdb.execute("run")
"""


def libtorch_cpu() -> Path:
    import torch

    return Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"


def compute_kernels(library: Path) -> dict[str, tuple[int, int]]:
    """Every exported COMPATIBLE-branch VML kernel: name -> (start address, size)."""
    listing = subprocess.run(
        ["nm", "-S", "--defined-only", str(library)], capture_output=True, text=True, check=True
    ).stdout
    kernels = {}
    for line in listing.splitlines():
        parts = line.split()
        if len(parts) == 4 and KERNEL.match(parts[3]):
            kernels[parts[3]] = (int(parts[0], 16), int(parts[1], 16))
    return kernels


def load_segments(library: Path) -> list[tuple[int, int, int]]:
    """The library's LOAD segments, (virtual address, file offset, file size), by readelf."""
    listing = subprocess.run(
        ["readelf", "-lW", str(library)], capture_output=True, text=True, check=True
    ).stdout
    segments = []
    for line in listing.splitlines():
        parts = line.split()
        if parts and parts[0] == "LOAD":
            segments.append((int(parts[2], 16), int(parts[1], 16), int(parts[4], 16)))
    return segments


def approximate_instructions(
    library: Path, start: int, size: int, segments: list[tuple[int, int, int]]
) -> list[str]:
    """The rsqrt* / rcp* instructions in one kernel's code: its bytes cut out of the library
    (objdump over the whole library takes seconds per kernel) and disassembled by objdump."""
    vaddr, offset, _ = next(s for s in segments if s[0] <= start < s[0] + s[2])
    with open(library, "rb") as handle:
        handle.seek(offset + start - vaddr)
        code = handle.read(size)
    with tempfile.NamedTemporaryFile(suffix=".bin") as raw:
        raw.write(code)
        raw.flush()
        listing = subprocess.run(
            ["objdump", "-D", "-b", "binary", "-m", "i386:x86-64", "--no-show-raw-insn", raw.name],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    return sorted(set(APPROXIMATE.findall(listing)))


def traced(code: str, args: list[str], kernels: list[str]) -> dict[tuple[str, str], set[str]]:
    """Run ``python -c code args`` under gdb; the VML kernels each ``@@OP`` label reached."""
    with tempfile.TemporaryDirectory() as tmp:
        names = Path(tmp) / "kernels.txt"
        names.write_text("\n".join(kernels))
        tracer = Path(tmp) / "tracer.py"
        tracer.write_text(f"KERNELS = {str(names)!r}\n" + TRACER)
        done = subprocess.run(
            ["gdb", "-q", "-batch", "-x", str(tracer), "--args", sys.executable, "-c", code, *args],
            capture_output=True,
            text=True,
            check=False,
        )
    reached: dict[tuple[str, str], set[str]] = {}
    label = None
    for line in done.stdout.splitlines():
        if line.startswith("@@OP "):
            label = tuple(json.loads(line[5:]))
            reached[label] = set()
        elif line.startswith("@@HIT ") and label is not None:
            reached[label].add(line[6:].strip())
    if done.returncode != 0 or not reached:
        raise SystemExit(f"vml_audit: the traced process failed: {done.stderr.strip()[-800:]}")
    return reached


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="trace one run only (smoke test)")
    parser.add_argument("--json", type=Path, help="also write the findings to this file")
    options = parser.parse_args(argv)
    library = libtorch_cpu()
    kernels = compute_kernels(library)
    segments = load_segments(library)
    approximate = {
        name: approximate_instructions(library, *kernels[name], segments) for name in kernels
    }
    runs = RUNS[:1] if options.quick else RUNS
    # one traced process for both (gdb reads libtorch_cpu's symbols once: most of the time)
    reached = traced(PROBE + RUN, [json.dumps(runs)], sorted(kernels))
    findings: dict[str, dict] = {}
    for (kind, op, dtype), hits in reached.items():
        if kind != "op":
            continue
        entry = findings.setdefault(op, {"reached": {}, "approximate": {}})
        if hits:
            entry["reached"][dtype] = sorted(hits)
        marks = sorted({mark for hit in hits for mark in approximate[hit]})
        if marks:
            entry["approximate"][dtype] = marks
    for op, entry in findings.items():
        where = (
            ", ".join(
                f"{dtype} {' '.join(found)}"
                + (
                    f" ({' '.join(entry['approximate'][dtype])})"
                    if dtype in entry["approximate"]
                    else ""
                )
                for dtype, found in entry["reached"].items()
            )
            or "ATen's own code"
        )
        print(f"{op}: {where}")
    bad = {
        f"{m} under {a}": sorted(k for k in hits if approximate[k])
        for (kind, m, a), hits in reached.items()
        if kind == "run"
    }
    for run, kernels_hit in bad.items():
        print(f"run {run}: {', '.join(kernels_hit) or 'no approximate VML kernel'}")
    if options.json:
        options.json.write_text(json.dumps({"operations": findings, "runs": bad}, indent=1))
    print(f"approximate_vml_kernels_reached_by_runs: {sum(len(v) for v in bad.values())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
