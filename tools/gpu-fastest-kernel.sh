#!/usr/bin/env bash
# The fastest kernel on a GPU host: tuning the table (stage B) and the tuned kernel's
# rollouts (stage C), in parts that each fit one 10-minute call on the
# lent H200. Run from the repository root with kernelgate importable (on the H200:
# PYTHONPATH=/tmp/site:$PWD after ../shared/tools/device-bundle.sh's install). Logs, JSON
# and a steps table go to $OUT; the table being tuned lives at /tmp/gpu_table.json between
# calls on one machine (and is copied to $OUT after every step, so a cut call keeps it).
#
#   tools/gpu-fastest-kernel.sh tune DTYPE [HEAD_DIM ...]
#        stage B: the benchmark grid (S = 1024, 4096, 16384; causal and full) of one dtype,
#        at most 4 tilings per kernel and head_dim, one step per head_dim, merged into the
#        table (the first call replaces the committed table, later ones merge)
#   tools/gpu-fastest-kernel.sh serving
#        stage B: MiniLM's serving shapes (float32, bfloat16), merged
#   tools/gpu-fastest-kernel.sh rollouts
#        stage C: a fresh store; `kernelgate rollout --implementation pallas_mosaic_gpu
#        --thresholds thresholds/bf16-long.yaml`, then the same profile with `auto`, the
#        audit of each, the timeline JSON
set -uo pipefail
out=${OUT:-gpu-fastest-kernel}
store=${KG_STORE:-/tmp/kg-store-bf16}
table=/tmp/gpu_table.json
mkdir -p "$out"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1

. "$(dirname "$0")/device-steps.sh"

case ${1:-} in
  tune)
    dtype=${2:?dtype}; shift 2
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/device.txt"
    for d in "${@:-64 128 256}"; do
      merge=--merge; [ -f "$table" ] || merge=
      step "tune-$dtype-d$d" "${KG_STEP_S:-170}" python3 -m kernels.tools.autotune $merge \
        --dtypes "$dtype" --head-dims "$d" --seqs 1024 4096 16384 --max-tilings 4 --out "$table"
      cp "$table" "$out/gpu_table.json" 2>/dev/null
    done
    ;;
  serving)
    step tune-serving 240 python3 -m kernels.tools.autotune --serving --max-tilings 4 --out "$table"
    cp "$table" "$out/gpu_table.json"
    ;;
  rollouts)
    [ -f "$table" ] && cp "$table" kernels/gpu_table.json
    rm -rf "$store"
    step rollout-mosaic 300 python3 -m flows.cli rollout --store-dir "$store" \
      --implementation pallas_mosaic_gpu --thresholds thresholds/bf16-long.yaml
    step rollout-auto 240 python3 -m flows.cli rollout --store-dir "$store" \
      --thresholds thresholds/bf16-long.yaml
    step audit-v1 60 python3 -m flows.cli audit 1 --store-dir "$store"
    step audit-v2 60 python3 -m flows.cli audit 2 --store-dir "$store"
    step audit-production 60 python3 -m flows.cli audit production --store-dir "$store"
    step timeline 30 python3 -m flows.cli timeline --store-dir "$store" --json "$out/timeline.json"
    ;;
  *) sed -n 2,17p "$0"; exit 2 ;;
esac
echo "--- steps"; cat "$out/steps.txt"
