#!/usr/bin/env bash
# Every GPU figure and the mission through Ray Tune in one command, in two phases: bench/gpu.py
# (kernels, rounds, runs side by side; no Ray) then bench/gpu_tune.py (sweeps and a map as Ray Tune
# trials sharing the GPU against the same on the CPUs). Each script's docstring says what it times.
#   PYTHONPATH=. bash bench/gpu.sh                # on a CUDA machine, under 9 minutes; its output
#                                                 # is kept in bench/results/gpu_<date>_<time>.txt
#   PYTHONPATH=. bash bench/gpu.sh --cpu --tiny   # toy sizes on the CPU (run by the tests)
# Uses the system python3 unless PYTHON names another. Where bench/wheels/ (GPU_BUNDLE_DIR) holds
# the bundle for this Python (make gpu-bundle: Ray trimmed, Optuna, pydantic ...; docs/how-to/gpu.md)
# it is installed first into /tmp/robusttune-gpu-site (GPU_BUNDLE_SITE), which then goes first on
# PYTHONPATH. GPU_BENCH_LOG names the log (default as above; none for --tiny unless named).
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
py="${PYTHON:-python3}"
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"

tiny=0
for arg in "$@"; do [ "$arg" = "--tiny" ] && tiny=1; done
log="${GPU_BENCH_LOG:-}"
if [ -z "$log" ] && [ "$tiny" = 0 ]; then
  log="bench/results/gpu_$(date +%Y-%m-%d_%H%M%S).txt"
fi

phases() {
  site="${GPU_BUNDLE_SITE:-/tmp/robusttune-gpu-site}"
  installed=0
  "$py" bench/gpu_bundle.py install --wheels "${GPU_BUNDLE_DIR:-bench/wheels}" --target "$site" \
    || installed=$?
  case "$installed" in
    0) export PYTHONPATH=".:$site${PYTHONPATH#.}" ;;
    3) ;;  # no bundle for this Python: its own packages (a note says why)
    *) echo "# the bundle's install failed (exit status $installed)"; return "$installed" ;;
  esac
  status=0
  "$py" bench/gpu.py "$@" || status=$?
  if [ "$status" = 2 ]; then  # bad options, or no CUDA without --cpu: gpu.py said which
    return 2
  fi
  "$py" bench/gpu_tune.py --started "$started" "$@" || status=$?
  return "$status"
}

if [ -n "$log" ]; then
  mkdir -p "$(dirname "$log")"
  status=0
  phases "$@" | tee "$log" || status=$?   # pipefail: the phases' status, not tee's
  echo "# log: $log" >&2
  exit "$status"
else
  phases "$@"
fi
