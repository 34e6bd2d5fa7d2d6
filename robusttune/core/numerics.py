"""The float path a process trains on, and the portable mode that pins it.

A run's bits depend on more than its seed: on x86-64, MKL picks its GEMM kernels by CPU model
(AVX2 or AVX-512, Intel or AMD code paths), ATen its vectorised kernels by CPU capability
(``default`` / ``avx2`` / ``avx512``), oneDNN its convolution kernels by ISA *and* cache sizes,
NNPACK its own by ISA, and every one of them sums in a thread-count-dependent order. A chaotic
run (a diverging Krum, an IPM attack at the edge) then reaches different verdicts on different
machines (issue 21: one AMD EPYC with AVX-512 turned a run non-finite that another CPU kept
finite, and moved a quickstart figure from 62.2% to 45.8%).

``numerics: portable`` (the RunSpec key) pins every such choice before torch first computes in
the process that trains:

- ``MKL_CBWR=COMPATIBLE,STRICT``: MKL's conditional numerical reproducibility on its SSE2-level
  "compatible" branch, the only branch MKL accepts on every x86-64 CPU (on an AMD CPU it refuses
  ``AVX2``: ``mkl_cbwr_set`` returns "unsupported branch"; ``AUTO`` picks a branch per CPU);
  STRICT makes it independent of memory alignment.
- ``ATEN_CPU_CAPABILITY=avx2`` on x86-64 (``default`` elsewhere): the same ATen kernels on every
  AVX2 CPU, the AVX-512 ones never chosen. A CPU without AVX2 is refused, not silently downgraded.
- oneDNN and NNPACK off (``torch.backends.mkldnn`` / ``nnpack``): convolutions go through ATen's
  im2col + GEMM, so MKL's pinned branch covers them too (oneDNN blocks by cache size, which no ISA
  cap fixes); ``ONEDNN_MAX_CPU_ISA=SSE41`` is set as well for anything that still reaches it.
- one torch thread (and ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` = 1 for child processes): a
  reduction's order is then the same everywhere. Trials already run one thread each on a CPU.
- on CUDA: deterministic cuDNN (no benchmark autotuning) and a fixed cuBLAS workspace, which give
  the same bits on the same GPU model and driver only.

Which machines were checked is stated in docs/explanations/numerics.md. On aarch64 the mode pins ATen's
``default`` capability, one thread, oneDNN and NNPACK off; its BLAS (OpenBLAS) chooses kernels by
core type, which this mode does not pin, so no cross-machine claim is made there.

One kernel family no setting pins: MKL's vector math (VML). ATen hands some elementwise
operations on contiguous float32 / float64 CPU tensors to it, and in the ``COMPATIBLE`` branch
several of those kernels start from ``rsqrtps`` or ``rcpps``, approximate instructions that Intel,
AMD and QEMU implement with different tables, so their last bit depends on the CPU (issue 44: ALIE's
sigma was one ulp off in 8,879 of 53,002 coordinates on an Intel Xeon, and a quickstart cell moved
from 0.61 to 0.87). Which operations those are was found, for torch 2.14.1, in two steps that
``analysis/vml_audit.py`` repeats: (1) under gdb, with a breakpoint on every exported
``mkl_vml_kernel_*`` symbol of libtorch_cpu.so, each ATen operation was run once on float32 and
float64 in portable mode; the ones that reach VML are :data:`MKL_VML_OPERATIONS` (cross-entropy,
(log-)softmax, sigmoid, GELU, norms, ``rsqrt``, ``reciprocal``, ``pow`` other than 0.5, ``std`` and
``var`` do not: they are ATen's own vectorised code, pinned by its capability); (2) objdump of each
reached ``*_EXHAynn`` kernel, searched for ``rsqrt*`` / ``rcp*`` instructions: the approximate ones
are :data:`MKL_APPROXIMATE_OPERATIONS`. Tracing the attack, aggregation, training and evaluation
tests the same way finds only ``sqrt`` (float32 and float64) on the tool's paths: every call goes
through :func:`sqrt` below, which is correctly rounded in portable mode, and
tests/test_numerics.py keeps the package free of direct calls to the others.

``native`` pins nothing: the float path this process's environment gives (the machine's own
dispatch, or what the user exported). A process has one mode: once it trained in one, a run of the
other is refused in one line, since neither MKL nor ATen can change their dispatch after their
first call. ``pin`` checks what really took effect (ATen's capability, MKL's branch), so a process
that computed before it was pinned is refused instead of silently producing native bits.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from robusttune.core.registry import SpecError

__all__ = [
    "MKL_APPROXIMATE_OPERATIONS",
    "MKL_VML_OPERATIONS",
    "NUMERICS_MODES",
    "FloatPath",
    "environment",
    "float_path",
    "fresh_process_environment",
    "pin",
    "pinned_mode",
    "sqrt",
    "try_pin",
]

NUMERICS_MODES = ("native", "portable")

# mkl_cbwr_get(MKL_CBWR_BRANCH) codes (mkl_service.h): 1 = CNR off, 2 = AUTO, 3 = COMPATIBLE, ...
_MKL_BRANCHES = {
    1: "off",
    2: "auto",
    3: "compatible",
    4: "sse2",
    6: "ssse3",
    7: "sse4_1",
    8: "sse4_2",
    9: "avx",
    10: "avx2",
    12: "avx512",
    15: "avx512_e1",
}
_MKL_CBWR_BRANCH = 1
_MKL_COMPATIBLE = 3

_pinned: str | None = None
# the values pin() replaced in os.environ, so a fresh process of another mode can start without them
_environment_before_pin: dict[str, str | None] = {}

# ATen operations that reach MKL's vector math on contiguous float32 / float64 CPU tensors (torch
# 2.14.1, found with gdb: module docstring), each with the MKL functions it calls.
MKL_VML_OPERATIONS = {
    "acos": ("Acos",),
    "asin": ("Asin",),
    "atan": ("Atan",),
    "cos": ("Cos",),
    "erf": ("Erf",),
    "erfc": ("Erfc",),
    "erfinv": ("ErfInv",),
    "exp": ("Exp",),
    "log": ("Ln",),
    "log10": ("Log10",),
    "log2": ("Log2",),
    "sin": ("Sin",),
    "sqrt": ("Sqrt",),
    "tan": ("Tan",),
    "tanh": ("Tanh",),
    "trunc": ("Trunc",),
    "pow(x, 0.5)": ("Sqrt",),
    "cdist": ("Sqrt",),
    "logsumexp": ("Exp", "Ln"),
}
MKL_APPROXIMATE_OPERATIONS = {
    "float32": ("acos", "asin", "atan", "cdist", "log10", "log2", "pow(x, 0.5)", "sqrt", "tan"),
    "float64": (
        "acos",
        "asin",
        "atan",
        "cdist",
        "log",
        "log10",
        "log2",
        "logsumexp",
        "pow(x, 0.5)",
        "sqrt",
        "tan",
    ),
}


def _x86_64() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def environment(mode: str) -> dict[str, str]:
    """The environment variables a process needs, set before torch first computes, to train in
    ``mode`` (none for ``native``). Child processes (a local Ray's workers) inherit them."""
    if mode == "native":
        return {}
    if mode != "portable":
        raise SpecError(f"numerics must be one of {', '.join(NUMERICS_MODES)}; got {mode!r}")
    return {
        "MKL_CBWR": "COMPATIBLE,STRICT",
        "ATEN_CPU_CAPABILITY": "avx2" if _x86_64() else "default",
        "ONEDNN_MAX_CPU_ISA": "SSE41",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
    }


@functools.lru_cache(maxsize=1)
def _mkl_cbwr_get() -> Callable[[int], int] | None:
    """torch links MKL statically into libtorch_cpu and exports its service entry point
    ``mkl_serv_cbwr_get`` (the public ``mkl_cbwr_get``); this is the one place that reaches it
    (tests/test_numerics.py pins that it is there wherever torch has MKL)."""
    if not torch.backends.mkl.is_available():
        return None
    library = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    try:
        get = ctypes.CDLL(str(library)).mkl_serv_cbwr_get
    except (OSError, AttributeError):
        return None
    get.argtypes, get.restype = [ctypes.c_int], ctypes.c_int
    return get


def _mkl_branch() -> str | None:
    """MKL's conditional-reproducibility branch in this process, or None without MKL."""
    get = _mkl_cbwr_get()
    if get is None:
        return None
    code = get(_MKL_CBWR_BRANCH)
    return _MKL_BRANCHES.get(code, str(code))


@dataclass(frozen=True)
class FloatPath:
    """What this process computes with: the mode it was pinned to (None: not yet), ATen's CPU
    capability, MKL's reproducibility branch (None without MKL), torch threads, and whether
    oneDNN and NNPACK may run."""

    mode: str | None
    aten_capability: str
    mkl_branch: str | None
    threads: int
    mkldnn: bool
    nnpack: bool

    def label(self) -> str:
        """One line for summary.json: ``portable: aten AVX2, mkl compatible, 1 thread, ...``."""
        mkl = "no mkl" if self.mkl_branch is None else f"mkl {self.mkl_branch}"
        return (
            f"{self.mode or 'native'}: aten {self.aten_capability}, {mkl}, "
            f"{self.threads} thread{'s' if self.threads != 1 else ''}, "
            f"onednn {'on' if self.mkldnn else 'off'}, nnpack {'on' if self.nnpack else 'off'}, "
            f"torch {torch.__version__}, {platform.machine()}"
        )


def float_path() -> FloatPath:
    """This process's float path as it stands (reading ATen's capability fixes it)."""
    return FloatPath(
        mode=_pinned,
        aten_capability=torch.backends.cpu.get_cpu_capability(),
        mkl_branch=_mkl_branch(),
        threads=torch.get_num_threads(),
        mkldnn=bool(torch.backends.mkldnn.enabled),
        # torch.backends.nnpack has a setter only; this is its getter
        nnpack=bool(torch._C._get_nnpack_enabled()),
    )


def pinned_mode() -> str | None:
    """The mode this process trains in, or None before its first ``pin``."""
    return _pinned


def pin(mode: str) -> None:
    """Make this process train in ``mode``; call it before torch first computes.

    Idempotent for the process's own mode (it re-applies one thread, which a runner may have
    changed). Raises SpecError, one line, when the process already trains in the other mode or
    computed before it was pinned (ATen's capability or MKL's branch is not the pinned one)."""
    global _pinned  # noqa: PLW0603 - the process's one numerics mode, set once
    if mode not in NUMERICS_MODES:
        raise SpecError(f"numerics must be one of {', '.join(NUMERICS_MODES)}; got {mode!r}")
    if _pinned is not None and _pinned != mode:
        raise SpecError(
            f"numerics {mode}: this process already trains in {_pinned} numerics, which "
            f"it cannot leave (MKL and ATen fix their dispatch at their first call); run "
            f"{mode} runs in a process of their own (robusttune run, a sweep)"
        )
    if mode == "native":
        _pinned = mode
        return
    wanted = environment(mode)
    if _pinned is None:
        for key in wanted:
            _environment_before_pin.setdefault(key, os.environ.get(key))
        os.environ.update(wanted)
        # torch's stubs type the module flag as its descriptor class
        torch.backends.mkldnn.enabled = False  # type: ignore[assignment]
        torch.backends.nnpack.set_flags(False)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    torch.set_num_threads(1)
    capability = torch.backends.cpu.get_cpu_capability()
    branch = _mkl_branch()
    problems = []
    if capability.lower() != wanted["ATEN_CPU_CAPABILITY"]:
        problems.append(
            f"ATen's CPU capability is {capability}, not {wanted['ATEN_CPU_CAPABILITY'].upper()}"
        )
    if branch is not None and branch != _MKL_BRANCHES[_MKL_COMPATIBLE]:
        problems.append(f"MKL's reproducibility branch is {branch}, not compatible")
    if problems:
        cause = (
            "this CPU lacks AVX2"
            if capability.lower() in ("default", "")
            and _x86_64()
            and branch in (None, "compatible")
            else "torch computed in this process before numerics were pinned"
        )
        remedy = (
            "numerics: native"
            if cause == "this CPU lacks AVX2"
            else "run it through robusttune.engine.runners.InProcessRunner or a command (they start a "
            "fresh worker process), import robusttune and run before computing with torch, "
            "or numerics: native"
        )
        raise SpecError(f"numerics portable: {'; '.join(problems)} ({cause}); allowed: {remedy}")
    _pinned = mode


def try_pin(mode: str) -> bool:
    """Pin this process to ``mode`` (:func:`pin`) if it still can be; False when it cannot (it
    trains in the other mode, or torch computed before it was pinned): then runs of ``mode`` need a
    fresh process started with :func:`fresh_process_environment`."""
    if _pinned is not None and _pinned != mode:
        return False
    try:
        pin(mode)
    except SpecError:
        return False
    return True


def fresh_process_environment(mode: str) -> dict[str, str]:
    """The environment a new process needs to train in ``mode``: this process's own, without the
    values a pin of another mode put there, plus :func:`environment` (``mode``)."""
    env = dict(os.environ)
    for key, before in _environment_before_pin.items():
        if before is None:
            env.pop(key, None)
        else:
            env[key] = before
    env.update(environment(mode))
    return env


def sqrt(x: Tensor) -> Tensor:
    """Elementwise square root, correctly rounded (IEEE 754's sqrt) in portable numerics on CPU.

    ``torch.sqrt`` of a contiguous float32 / float64 CPU tensor is MKL's ``vsSqrt`` / ``vdSqrt``,
    whose COMPATIBLE-branch kernel refines an ``rsqrtps`` estimate and lands one ulp off the
    correctly rounded root on some inputs, differently on Intel, AMD and QEMU (module docstring).
    In portable mode the root is taken by numpy's ufunc instead, which runs the hardware's square
    root instruction (``sqrtps`` / ``vsqrtps`` and the scalar ``sqrtss``): IEEE 754 requires it to
    be correctly rounded, so every x86-64 and aarch64 CPU gives the same bits. CUDA tensors, other
    dtypes and native mode keep ``torch.sqrt``. Gradients still flow: the value is the correctly
    rounded one, the derivative torch's, 1 / (2 sqrt(x)).
    Verified bit for bit against Python's correctly rounded ``math.sqrt`` (tests/test_numerics.py).
    """
    if (
        _pinned != "portable"
        or x.device.type != "cpu"
        or x.dtype not in (torch.float32, torch.float64)
    ):
        return torch.sqrt(x)
    out = torch.empty(x.shape, dtype=x.dtype)
    with np.errstate(invalid="ignore"):  # sqrt of a negative is NaN, silently, as in torch
        np.sqrt(x.detach().numpy(), out=out.numpy())
    if x.requires_grad and torch.is_grad_enabled():
        # out and torch's root are at most an ulp apart, so out - root is exact (Sterbenz) and
        # root + (out - root) is out; where they agree (inf included) root is kept as it is
        root = torch.sqrt(x)
        return torch.where(out == root, root, root + (out - root).detach())
    return out
