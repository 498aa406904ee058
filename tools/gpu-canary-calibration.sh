#!/usr/bin/env bash
# The canary's calibration on a GPU host (its latency samples, the false-rollback rate of
# A/A canaries, stage 2's canaries and rollouts), in parts that each fit one 10-minute call
# on the lent H200. Run from the repository root with kernelgate importable (on the H200:
# PYTHONPATH=/tmp/site:$PWD after ../shared/tools/device-bundle.sh's install; elsewhere the
# project's venv). Logs, JSON and a steps table go to $OUT.
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
#   tools/gpu-canary-calibration.sh stage2 [store|canaries|rollouts|merge]
#                                              stage 2: one store $KG_S2_STORE (default
#                                              /tmp/kg-store2) built once (a rollout under
#                                              tools/gpu-canary-stage2.yaml, where only the
#                                              canary judges speed; skipped when production
#                                              exists), $KG_RUNS2
#                                              (default 5) A/A canaries against production
#                                              and as many of the slowed variant
#                                              slowed_<production kernel>_x$KG_SLOW_REPEATS
#                                              (default 16; tests/slowed_kernel.py,
#                                              registered through KERNELGATE_KERNELS), then two
#                                              full rollouts (A/A, slowed), then the merge of
#                                              the JSON into $OUT/canary-calibration.json
#                                              (commit to reliability/). No argument: store
#                                              and canaries (one call); then `rollouts` and
#                                              `merge` (the next call, same machine and store);
#                                              `calibrate`: stage 1's `kernelgate calibrate
#                                              --runs $KG_RUNS` on the same store.
#                                              On the H200 use
#                                              KG_S2_THRESHOLDS=tools/gpu-canary-stage2-bf16.yaml
#                                              (the yaml says why: a float32 pallas_gpu store
#                                              was rolled back against xla, 2026-12-01) and
#                                              KG_S2_IMPLEMENTATION=xla (`auto` ->
#                                              pallas_mosaic_gpu, bf16, was rolled back
#                                              against xla too: median ratio 1.022, a true
#                                              detection at MiniLM's small shapes)
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
  stage2)
    part=${2:-first}
    store=${KG_S2_STORE:-/tmp/kg-store2}
    # results kept beside the store ($OUT is fresh in each device call), copied to $OUT
    s2="$store.results"; mkdir -p "$s2"
    s2_thresholds=${KG_S2_THRESHOLDS:-tools/gpu-canary-stage2.yaml}
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$s2/device.txt" 2>&1
    slowed() {  # the slowed variant's name, once production exists
      python3 tools/canary_runs.py slowed-name --store-dir "$store" \
        --repeats "${KG_SLOW_REPEATS:-16}" 2>/dev/null | tail -n 1
    }
    if [ "$part" = first ] || [ "$part" = store ]; then
      [ -f /tmp/gpu_table.json ] && cp /tmp/gpu_table.json kernels/gpu_table.json
      if [ -z "$(slowed)" ]; then
        step s2-store 480 python3 -m flows.cli rollout --store-dir "$store" \
          --thresholds "$s2_thresholds" ${KG_S2_IMPLEMENTATION:+--implementation $KG_S2_IMPLEMENTATION}
      fi
    fi
    name=$(slowed)
    [ -n "$name" ] || { echo "stage2: no production in $store (run: stage2 store)"; exit 1; }
    export KERNELGATE_KERNELS="$name=tests.slowed_kernel:$name"
    echo "stage2: slowed variant $name"
    if [ "$part" = first ] || [ "$part" = canaries ]; then
      step s2-aa-canaries 240 python3 tools/canary_runs.py run --store-dir "$store" \
        --runs "${KG_RUNS2:-5}" --out "$s2/aa-canaries.json"
      grep -E "run [0-9]+/|rolled back" "$out/s2-aa-canaries.log"
      step s2-slowed-canaries 240 python3 tools/canary_runs.py run --store-dir "$store" \
        --runs "${KG_RUNS2:-5}" --candidate "$name" --out "$s2/slowed-canaries.json"
      grep -E "run [0-9]+/|rolled back" "$out/s2-slowed-canaries.log"
    fi
    if [ "$part" = calibrate ]; then
      # stage 1 on the stage-2 store: its registration's canary plan is the local
      # profile's (same latency plan and sizes), served in the registration's model_dtype
      step s2-calibrate 560 python3 -m flows.cli calibrate --store-dir "$store" \
        --runs "${KG_RUNS:-200}"
      find "$store" -type d -name calibration -exec cp -r {} "$s2/" \; 2>/dev/null
      tail -n 3 "$out/s2-calibrate.log"
    fi
    if [ "$part" = rollouts ]; then
      read -r family kernel < <(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); \
print(d['family'], d['production_kernel'])" "$s2/aa-canaries.json")
      step s2-aa-rollout 270 python3 -m flows.cli rollout --store-dir "$store" \
        --thresholds "$s2_thresholds" --family "$family" --implementation "$kernel"
      cp "$out/s2-aa-rollout.log" "$s2/aa-rollout.log"
      step s2-slowed-rollout 270 python3 -m flows.cli rollout --store-dir "$store" \
        --thresholds "$s2_thresholds" --family "$family" --implementation "$name"
      cp "$out/s2-slowed-rollout.log" "$s2/slowed-rollout.log"
      grep -hE "^# kernelgate rollout|decided at stage|reason:" "$s2"/*-rollout.log
    fi
    if [ "$part" = rollouts ] || [ "$part" = merge ]; then
      step s2-merge 60 python3 tools/merge_canary_calibration.py --stage2 "$s2" \
        --into reliability/canary-calibration.json --out "$out/canary-calibration.json"
      tail -n 20 "$out/s2-merge.log"
    fi
    mkdir -p "$out/stage2" && cp -r "$s2"/. "$out/stage2/"
    ;;
  *) sed -n 2,35p "$0"; exit 2 ;;
esac
echo "--- steps"; cat "$out/steps.txt"
