#!/usr/bin/env bash
# Every GPU figure in one command (bench/gpu.py says which and how they are timed):
#   PYTHONPATH=. bash bench/gpu.sh                # on a CUDA machine, under 8 minutes
#   PYTHONPATH=. bash bench/gpu.sh --cpu --tiny   # toy sizes on the CPU (run by the tests)
# Uses the system python3 unless PYTHON names another; needs torch, numpy and scipy, not Ray.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" bench/gpu.py "$@"
