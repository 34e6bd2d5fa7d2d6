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

Which machines were checked is stated in README.md ("Numerics"). On aarch64 the mode pins ATen's
``default`` capability, one thread, oneDNN and NNPACK off; its BLAS (OpenBLAS) chooses kernels by
core type, which this mode does not pin, so no cross-machine claim is made there.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from robusttune.registry import SpecError

__all__ = ["NUMERICS_MODES", "FloatPath", "environment", "pin", "float_path", "pinned_mode"]

NUMERICS_MODES = ("native", "portable")

# mkl_cbwr_get(MKL_CBWR_BRANCH) codes (mkl_service.h): 1 = CNR off, 2 = AUTO, 3 = COMPATIBLE, ...
_MKL_BRANCHES = {1: "off", 2: "auto", 3: "compatible", 4: "sse2", 6: "ssse3", 7: "sse4_1",
                 8: "sse4_2", 9: "avx", 10: "avx2", 12: "avx512", 15: "avx512_e1"}
_MKL_CBWR_BRANCH = 1
_MKL_COMPATIBLE = 3

_pinned: str | None = None


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
        return (f"{self.mode or 'native'}: aten {self.aten_capability}, {mkl}, "
                f"{self.threads} thread{'s' if self.threads != 1 else ''}, "
                f"onednn {'on' if self.mkldnn else 'off'}, nnpack {'on' if self.nnpack else 'off'}, "
                f"torch {torch.__version__}, {platform.machine()}")


def float_path() -> FloatPath:
    """This process's float path as it stands (reading ATen's capability fixes it)."""
    return FloatPath(mode=_pinned, aten_capability=torch.backends.cpu.get_cpu_capability(),
                     mkl_branch=_mkl_branch(), threads=torch.get_num_threads(),
                     mkldnn=bool(torch.backends.mkldnn.enabled),
                     # torch.backends.nnpack has a setter only; this is its getter
                     nnpack=bool(torch._C._get_nnpack_enabled()))


def pinned_mode() -> str | None:
    """The mode this process trains in, or None before its first ``pin``."""
    return _pinned


def pin(mode: str) -> None:
    """Make this process train in ``mode``; call it before torch first computes.

    Idempotent for the process's own mode (it re-applies one thread, which a runner may have
    changed). Raises SpecError, one line, when the process already trains in the other mode or
    computed before it was pinned (ATen's capability or MKL's branch is not the pinned one)."""
    global _pinned
    if mode not in NUMERICS_MODES:
        raise SpecError(f"numerics must be one of {', '.join(NUMERICS_MODES)}; got {mode!r}")
    if _pinned is not None and _pinned != mode:
        raise SpecError(f"numerics {mode}: this process already trains in {_pinned} numerics, which "
                        f"it cannot leave (MKL and ATen fix their dispatch at their first call); run "
                        f"{mode} runs in a process of their own (robusttune run, a sweep)")
    if mode == "native":
        _pinned = mode
        return
    wanted = environment(mode)
    if _pinned is None:
        os.environ.update(wanted)
        torch.backends.mkldnn.enabled = False
        torch.backends.nnpack.set_flags(False)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    torch.set_num_threads(1)
    capability = torch.backends.cpu.get_cpu_capability()
    branch = _mkl_branch()
    problems = []
    if capability.lower() != wanted["ATEN_CPU_CAPABILITY"]:
        problems.append(f"ATen's CPU capability is {capability}, not {wanted['ATEN_CPU_CAPABILITY'].upper()}")
    if branch is not None and branch != _MKL_BRANCHES[_MKL_COMPATIBLE]:
        problems.append(f"MKL's reproducibility branch is {branch}, not compatible")
    if problems:
        cause = ("this CPU lacks AVX2" if capability.lower() in ("default", "") and _x86_64()
                 and branch in (None, "compatible") else
                 "torch computed in this process before numerics were pinned")
        raise SpecError(f"numerics portable: {'; '.join(problems)} ({cause}); allowed: portable in a "
                        f"fresh process on an AVX2 x86-64 CPU, or numerics: native")
    _pinned = mode
