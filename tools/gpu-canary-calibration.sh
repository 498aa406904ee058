#!/usr/bin/env bash
# Issue 21 on a GPU host, in parts that each fit one 10-minute call on the lent H200. Run
# from the repository root with kernelgate importable (on the H200: PYTHONPATH=/tmp/site:$PWD
# after ../shared/tools/device-bundle.sh's install; elsewhere the project's venv). Logs,
# JSON and a steps table go to $OUT.
#
#   tools/gpu-canary-calibration.sh samples    per-request ABBA samples through the serving
#                                              path: A/A and a slowed candidate (attention
#                                              repeated $KG_REPEATS times) for each GPU kernel
#                                              -> $OUT/latency/h200-<kernel>.json (commit to
#                                              tests/data/latency/), then the simulation test
#   tools/gpu-canary-calibration.sh calibrate  a rollout (production = the native flash
#                                              kernel), then `kernelgate calibrate --runs
#                                              $KG_RUNS` (default 200) at the registered
#                                              (local-dry-run) plan's sizes, and an audit
#   tools/gpu-canary-calibration.sh aa         $KG_AA (default 5) A/A rollouts of the same
#                                              kernel against production, each decision kept
#
# The store is $KG_STORE (default /tmp/kg-store), kept between calls on one machine.
set -uo pipefail
out=${OUT:-gpu-canary-calibration}
store=${KG_STORE:-/tmp/kg-store}
repeats=${KG_REPEATS:-8}
mkdir -p "$out/latency"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1

. "$(dirname "$0")/device-steps.sh"

case ${1:-} in
  samples)
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/device.txt"
    for kernel in ${KG_KERNELS:-pallas_gpu xla}; do
      step "samples-$kernel" 240 python3 -m evaluation.latency_samples --implementation "$kernel" \
        --requests 300 --slowdown-repeats "$repeats" --out "$out/latency/h200-$kernel.json"
    done
    cp "$out"/latency/*.json tests/data/latency/ 2>/dev/null
    step simulation 120 python3 -m pytest -q -p no:cacheprovider -n 0 tests/test_canary_simulation.py
    step simulation-json 120 python3 -m tests.latency_sim --out "$out/canary-calibration-sim.json"
    ;;
  calibrate)
    [ -f /tmp/gpu_table.json ] && cp /tmp/gpu_table.json kernels/gpu_table.json
    step rollout 420 python3 -m flows.cli rollout --store-dir "$store"
    step calibrate 540 python3 -m flows.cli calibrate --store-dir "$store" --runs "${KG_RUNS:-200}"
    step audit 60 python3 -m flows.cli audit production --store-dir "$store" --no-load-model
    ;;
  aa)
    for i in $(seq 1 "${KG_AA:-5}"); do
      step "aa-rollout-$i" 300 python3 -m flows.cli rollout --store-dir "$store"
    done
    step timeline 60 python3 -m flows.cli timeline --store-dir "$store" --json "$out/timeline.json"
    ;;
  *) sed -n 2,18p "$0"; exit 2 ;;
esac
echo "--- steps"; cat "$out/steps.txt"
