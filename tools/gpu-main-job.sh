#!/usr/bin/env bash
# The main job on a GPU host, in parts that each fit one 10-minute call on the
# lent H200. Run from the repository root with kernelgate importable (on the H200:
# PYTHONPATH=/tmp/site:$PWD after ../shared/tools/device-bundle.sh's install; anywhere
# else: the project's virtual environment). Logs, JSON and a steps table go to $OUT.
#
#   tools/gpu-main-job.sh tune      serving-shape autotune (float32, bf16) merged into
#                                   kernels/gpu_table.json, then the `gpu` tests of the
#                                   shared-memory and float32-precision kinds
#   tools/gpu-main-job.sh rollouts  two `kernelgate rollout`s, default arguments
#   tools/gpu-main-job.sh after     revalidate, audit, timeline JSON, serving benchmark
#   tools/gpu-main-job.sh one       one rollout, its audit and timeline (a short lease)
#
# The store is $KG_STORE (default /tmp/kg-store): outside the work tree, so it survives
# from one call to the next while the machine is held.
set -uo pipefail
out=${OUT:-gpu-main-job}
store=${KG_STORE:-/tmp/kg-store}
mkdir -p "$out"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1

. "$(dirname "$0")/device-steps.sh"

case ${1:-} in
  tune)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
    python3 -c "import jax; print('jax', jax.__version__, jax.devices())" | tee -a "$out/device.txt"
    step autotune-f32 180 python3 -m kernels.tools.autotune --serving --dtypes float32
    step autotune-bf16 120 python3 -m kernels.tools.autotune --serving --dtypes bfloat16
    cp kernels/gpu_table.json "$out/" && cp kernels/gpu_table.json /tmp/gpu_table.json
    step gpu-tests 200 python3 -m pytest -q -m gpu -p no:cacheprovider \
      tests/test_kernels_gpu_limits.py tests/test_kernels_precision.py tests/test_kernels_dispatch.py
    ;;
  rollouts)
    # the table tuned by `tune` in an earlier call on this machine, if any
    [ -f /tmp/gpu_table.json ] && cp /tmp/gpu_table.json kernels/gpu_table.json
    step rollout-1 290 python3 -m flows.cli rollout --store-dir "$store"
    step rollout-2 290 python3 -m flows.cli rollout --store-dir "$store"
    ;;
  one)  # what fits the last minutes of a lease: one rollout, its audit and timeline
    step rollout-1 420 python3 -m flows.cli rollout --store-dir "$store"
    step audit 60 python3 -m flows.cli audit production --store-dir "$store"
    step timeline 30 python3 -m flows.cli timeline --store-dir "$store" --json "$out/timeline.json"
    find "$store" -path '*evaluation-heldout*' \( -name evaluation_report.json -o -name reference_cache.json \
      -o -name '*.xplane.pb' \) -exec cp --parents {} "$out/" \; 2>/dev/null
    ;;
  after)
    [ -f /tmp/gpu_table.json ] && cp /tmp/gpu_table.json kernels/gpu_table.json
    step revalidate 240 python3 -m flows.cli revalidate --store-dir "$store"
    step audit 120 python3 -m flows.cli audit production --store-dir "$store"
    step timeline 60 python3 -m flows.cli timeline --store-dir "$store" --json "$out/timeline.json"
    step serving-bench 150 python3 -m kernels.tools.bench --serving-only --out "$out/serving.json"
    ;;
  *) sed -n 2,15p "$0"; exit 2 ;;
esac
echo "--- steps"; cat "$out/steps.txt"
