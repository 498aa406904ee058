#!/usr/bin/env bash
# FlashAttention-3's techniques on a Hopper GPU: pallas_mosaic_gpu's variant switches, each
# timed beside the default in a step of its own (kernels.tools.variants: cuDNN and the
# matmul ceiling in the same process, median of 3 passes, float64 checks, the ptxas
# register/spill report). A variant that fails to compile or hangs ends its own step only.
#
#   bash tools/gpu-fa3-variants.sh [priority]   every variant, bf16 head_dim 64 and 256,
#                                               non-causal, S=16384 (where we lose most)
#   bash tools/gpu-fa3-variants.sh grid NAME..  the named variants beside the default on
#                                               the full bf16 grid (d64/128/256, causal
#                                               and not, S=4096 B4 and 16384 B1);
#                                               KG_DTYPES="bfloat16 float16": both dtypes;
#                                               `grid default`: the registered kernel alone
#                                               beside cuDNN on every row (variants with
#                                               head_dims narrow the grid to theirs)
#   bash tools/gpu-fa3-variants.sh tests        the `gpu` tests of every variant
#                                               (poisoned padding, low-precision extremes):
#                                               tools/gpu-tests.sh's first three parts,
#                                               which need two back-to-back calls
#
# Run from the repository root. Needs JAX with CUDA, numpy and pydantic (kernels.config
# imports it): a carried .whl/ (../shared/tools/device-wheels.sh pydantic) is installed
# into /tmp/site when pydantic is missing. Logs, JSON and a steps table go to $OUT; the
# whole run stays within $BUDGET_S seconds (default 530), steps past it are skipped.
set -uo pipefail
out=${OUT:-gpu-fa3-variants}
budget=${BUDGET_S:-530}
mkdir -p "$out"
# No persistent compilation cache: ptxas must run, so that its report is printed.
unset JAX_COMPILATION_CACHE_DIR
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 MOSAIC_GPU_DUMP_PTXAS=1

. "$(dirname "$0")/device-steps.sh"

if ! python3 -c 'import pydantic' 2>/dev/null && [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
if ! python3 -c 'import pydantic, kernels.pallas_mosaic_gpu' > "$out/import.log" 2>&1; then
  echo "cannot import kernels (pydantic missing? carry .whl/ from" \
       "../shared/tools/device-wheels.sh pydantic):"; cat "$out/import.log"; exit 3
fi
{ nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader
  python3 -c "import jax; print('jax', jax.__version__, jax.devices())"; } | tee "$out/device.txt"

# `timed NAME LIMIT CMD...`: `step`, unless the budget is spent; the step's limit is
# cut to what is left. Prints the step's log in full when it failed.
timed() {
  local name=$1 limit=$2; shift 2
  local left=$((budget - SECONDS))
  if [ "$left" -lt 20 ]; then
    printf '%-22s skipped: %s s of the %s s budget left\n' "$name" "$left" "$budget" \
      | tee -a "$out/steps.txt"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  step "$name" "$limit" "$@"
  if ! tail -n 1 "$out/steps.txt" | grep -q 'rc=0 '; then
    echo "    --- $name.log (rc != 0), in full:"; sed 's/^/    /' "$out/$name.log"
  fi
}

variants() { python3 -c 'import json; print(" ".join(e["name"] for e in
  json.load(open("kernels/tools/fa3_variants.json"))["variants"] if e["name"] != "default"))'; }

case ${1:-priority} in
  priority)
    # Each 80 s step holds the default and one variant on two shapes: no A/A twin here
    # (the grid's calls time it).
    for v in $(variants); do
      timed "v-$v" 80 python3 -m kernels.tools.variants --shapes priority --variants "$v" \
        --no-aa --out "$out/$v.json"
    done
    ;;
  grid)
    shift
    timed grid "$budget" python3 -m kernels.tools.variants --shapes grid --variants "$@" \
      ${KG_DTYPES:+--dtypes $KG_DTYPES} --out "$out/grid.json"
    ;;
  tests)
    # The variants' 28 tests alone take longer than one call (about 560 s on the H200, 2026-12-02):
    # tools/gpu-tests.sh runs them in parts and goes on in the next call.
    OUT=$out BUDGET_S=$((budget - SECONDS)) bash "$(dirname "$0")/gpu-tests.sh" \
      variants-bf16 variants-f16 poisoned
    exit $?
    ;;
  *) sed -n 2,21p "$0"; exit 2 ;;
esac
echo "--- tables"
for f in "$out"/v-*.log "$out"/grid.log; do
  [ -f "$f" ] || continue
  echo "== $(basename "$f" .log)"
  # the per-run table printed last by kernels.tools.variants
  awk '/^shape /{buf=""} {buf=buf $0 "\n"} END{printf "%s", buf}' "$f" | grep -v '^ptxas\|^    ' || true
done
echo "--- steps"; cat "$out/steps.txt"
