#!/usr/bin/env bash
# A GPU dispatch policy from measurement to production, in parts that each fit one
# 10-minute device call. Run from the repository root with kernelgate importable (on the
# lent GPU: PYTHONPATH=/tmp/site:$PWD after the wheels' install; tools/device-carries.sh
# packs the wheels and prints the calls). Logs, JSON and a steps table go to $OUT (few files: a call returns at most 8).
#
#   tools/gpu-dispatch.sh evidence DTYPE [START:]   one dtype's buckets of the policy's space
#                                          ($KG_DISPATCH_DTYPES, default all three)
#                                          as a piece, kept in $KG_DISPATCH (default
#                                          /tmp/kg-dispatch) for the merge; every piece of
#                                          one policy with the same $KG_DISPATCH_REPEATS;
#                                          cut at $KG_DISPATCH_BUDGET_S (default 480 s), the
#                                          log then names the START: of the rest; with
#                                          $KG_DISPATCH_SERVED (a served-shapes file:
#                                          python -m evaluation.longdoc.served_shapes) the
#                                          buckets holding its shapes are measured at them
#   tools/gpu-dispatch.sh merge            the pieces there joined into evidence.json and
#                                          policy.json (kernels.tools.dispatch_merge)
#   tools/gpu-dispatch.sh longdoc [K ...]  the long-document workload served by each
#                                          single kernel K (default pallas_mosaic_gpu) and
#                                          by `auto` serving that policy, same arrivals,
#                                          in both run orders (K first, then auto first;
#                                          about 150 s each on an H100)
#                                          ($KG_LONGDOC_WORKLOAD, default longdoc-modernbert-base)
#   tools/gpu-dispatch.sh rollout [POLICY] `kernelgate rollout --implementation dispatch`
#                                          of that policy (or the file POLICY, e.g. a
#                                          committed merge) into $KG_STORE, and its audit
#   tools/gpu-dispatch.sh xproc [N]        the canary's same-kernel A/A across placements
#                                          (`xla` in the flow's process against a worker,
#                                          worker against worker, in-process twice; N
#                                          compared requests each, default 600:
#                                          tools/xproc_aa.py)
#   tools/gpu-dispatch.sh auto             `kernelgate rollout` with no kernel named: auto
#                                          resolves to the store's production policy, which
#                                          is nothing to roll out (exit 2, the line naming
#                                          its version and sha256); the audit and timeline
#
# $KG_DISPATCH and $KG_STORE lie outside the work tree, so they survive from one call to
# the next while the machine is held.
set -uo pipefail
usage() { sed -n '2,/^set -uo pipefail/p' "$0" | sed '$d'; }  # this header, every mode
case ${1:-} in  # before any folder is made: a usage error writes nothing
  evidence) [ -n "${2:-}" ] || { echo "usage: tools/gpu-dispatch.sh evidence DTYPE [START:]" >&2; exit 2; } ;;
  merge|longdoc|rollout|auto|xproc) ;;
  *) usage; exit 2 ;;
esac
out=${OUT:-gpu-dispatch}
work=${KG_DISPATCH:-/tmp/kg-dispatch}
store=${KG_STORE:-/tmp/kg-store}
space=${KG_DISPATCH_DTYPES:-bfloat16,float16,float32}
workload=${KG_LONGDOC_WORKLOAD:-longdoc-modernbert-base}
mkdir -p "$out" "$work"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1

. "$(dirname "$0")/device-steps.sh"

policy_env() {  # the merged policy and its fingerprint, as `auto` reads them
  export KERNELGATE_DISPATCH_POLICY="$work/policy.json"
  KERNELGATE_DISPATCH_POLICY_SHA256=$(python3 -c "
from kernels.dispatch_policy import DispatchPolicy
print(DispatchPolicy.model_validate_json(open('$work/policy.json').read()).fingerprint())")
  export KERNELGATE_DISPATCH_POLICY_SHA256
}

case ${1:-} in
  evidence)
    dtype=${2:?which dtype}
    from=${3:-}   # START: the rest of a piece an earlier call cut at its time budget
    name=$dtype${from:+-from-${from%%:*}}
    if [ ! -f "$work/device.txt" ]; then  # once per machine: a call returns few files
      { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
        python3 -c "import jax; print('jax', jax.__version__, jax.devices())"
        # the kernels' source as the evidence records it (a copied work tree's .git, if
        # any, need not be the commit that was copied)
        python3 -c "from kernels.build import combined_digest, source_digests
print('kernels source sha256', combined_digest(source_digests()))"; } > "$work/device.txt" 2>&1
      cp "$work/device.txt" "$out/"
    fi
    # cut between buckets before the call's 10 minutes would cut one (and lose the piece)
    step "evidence-$name" 580 python3 -m kernels.tools.dispatch_evidence --dtypes "$space" \
      --slice-dtypes "$dtype" ${from:+--slice-buckets "$from"} \
      --budget-s "${KG_DISPATCH_BUDGET_S:-480}" \
      ${KG_DISPATCH_REPEATS:+--repeats "$KG_DISPATCH_REPEATS"} \
      ${KG_DISPATCH_SERVED:+--served-shapes "$KG_DISPATCH_SERVED"} --out "$out/$name"
    mkdir -p "$work/$name" && cp "$out/$name/piece.json" "$work/$name/"
    ;;
  merge)
    step merge 120 python3 -m kernels.tools.dispatch_merge --out "$work" "$work"/*/piece.json
    # the table is merge.log; evidence.json is the pieces' union (the same merge re-makes it)
    cp "$work/policy.json" "$out/"
    ;;
  longdoc)
    shift; policy_env
    # both run orders per kernel: the second replay runs on a warmer device (2.5-2.7 %
    # at 1k-2k on an H100), and policy_check cancels that only with both given
    for k in "${@:-pallas_mosaic_gpu}"; do
      step "longdoc-$k" 400 python3 -m evaluation.longdoc.bench --workload "$workload" \
        --kernels "$k,auto" --json "$out/longdoc-$k-vs-policy.json"
      step "longdoc-auto-$k" 400 python3 -m evaluation.longdoc.bench --workload "$workload" \
        --kernels "auto,$k" --json "$out/longdoc-policy-vs-$k.json"
    done
    ;;
  rollout)
    policy=${2:-$work/policy.json}
    step rollout-dispatch 560 python3 -m flows.cli rollout --implementation dispatch \
      --dispatch-policy "$policy" --store-dir "$store"
    # the version this rollout made, wherever it ended (a rolled-back one has no alias)
    made=$(grep -o 'kernelgate audit [0-9]* --family dispatch' "$out/rollout-dispatch.log" \
      | tail -n 1 | cut -d' ' -f3)
    step audit-dispatch 120 python3 -m flows.cli audit "${made:-production}" --family dispatch \
      --store-dir "$store"
    ;;
  xproc)
    step xproc-aa 560 python3 -m tools.xproc_aa --requests "${2:-600}" --out "$out/xproc-aa.json"
    ;;
  auto)
    step rollout-auto 500 python3 -m flows.cli rollout --store-dir "$store"
    step audit 120 python3 -m flows.cli audit production --store-dir "$store"
    # the JSON only: a call returns at most 8 files
    timeout 60 python3 -m flows.cli timeline --store-dir "$store" --json "$out/timeline.json" > /dev/null 2>&1
    ;;
  *) usage; exit 2 ;;
esac
echo "--- steps"; cat "$out/steps.txt"
