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
#   tools/gpu-main-job.sh one       one rollout on a fresh store, its version's audit and
#                                   the timeline (a short lease)
#   tools/gpu-main-job.sh staging [POLICY.json]   README's release-manager walkthrough
#                                   from an empty store ($KG_STAGING_STORE, default
#                                   /tmp/kg-staging): a Prefect server, `calibrate` under
#                                   staging.yaml, one `rollout --implementation native`
#                                   under it (with POLICY.json: `--implementation dispatch
#                                   --dispatch-policy POLICY.json`, family dispatch), both
#                                   approvals answered through the API (tools/answer_paused.py)
#   tools/gpu-main-job.sh staging-audit   that store's audit and timeline
#   tools/gpu-main-job.sh longdoc [PRODUCTION] [CANDIDATE]   the long-document claim against
#                                   a fast production: on an empty store
#                                   ($KG_LONGDOC_STORE, default /tmp/kg-longdoc-prod),
#                                   PRODUCTION (default cudnn) rolled out under
#                                   thresholds/adoption-longdoc.yaml against the native
#                                   baseline, then CANDIDATE (default pallas_mosaic_gpu)
#                                   under it against that production; each version's audit
#                                   and the timeline. About 15 minutes on an H100: start it
#                                   with setsid in the background and poll its steps.txt.
#                                   $KG_LONGDOC_THRESHOLDS names another registration, e.g.
#                                   thresholds/adoption-longdoc-hd128.yaml with CANDIDATE fa3
#                                   (the bundle of tools/device-carries.sh, FA3's wheel in it)
#   tools/gpu-main-job.sh longdoc-aa KERNEL [N] [FAMILY]   a live A/A of the adoption test on
#                                   that store: KERNEL (the one in production) rolled out
#                                   against itself N times (default 1) in FAMILY (default
#                                   cudnn); each should end "not worth it", never adopted
#
# The store is $KG_STORE (default /tmp/kg-store): outside the work tree, so it survives
# from one call to the next while the machine is held.
set -uo pipefail
usage() { sed -n '2,/^set -uo pipefail/p' "$0" | sed '$d'; }
case ${1:-} in  # before any folder is made: a usage error writes nothing
  tune|rollouts|after|one|staging|staging-audit) ;;
  longdoc|longdoc-aa)
    [ -f "${KG_LONGDOC_THRESHOLDS:-thresholds/adoption-longdoc.yaml}" ] || {
      echo "no registration ${KG_LONGDOC_THRESHOLDS:-thresholds/adoption-longdoc.yaml} (\$KG_LONGDOC_THRESHOLDS; run from the repository root)" >&2; exit 2; }
    if [ "$1" = longdoc-aa ]; then
      [ -n "${2:-}" ] && [ -d "${KG_LONGDOC_STORE:-/tmp/kg-longdoc-prod}" ] || {
        echo "longdoc-aa needs KERNEL and the store of a longdoc run (\$KG_LONGDOC_STORE)" >&2
        exit 2; }
      [[ ${3:-1} =~ ^[1-9][0-9]*$ ]] || { echo "longdoc-aa: N must be a whole number >= 1, got ${3}" >&2; exit 2; }
    fi ;;
  *) usage; exit 2 ;;
esac
out=${OUT:-gpu-main-job}
store=${KG_STORE:-/tmp/kg-store}
thresholds=${KG_LONGDOC_THRESHOLDS:-thresholds/adoption-longdoc.yaml}
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
    # the version just built, promoted or not (`production` has nothing to audit after a
    # rollback on a fresh store: exit 3)
    step audit 60 python3 -m flows.cli audit 1 --store-dir "$store"
    step timeline 30 python3 -m flows.cli timeline --store-dir "$store" --json "$out/timeline.json"
    find "$store" -path '*evaluation-heldout*' \( -name evaluation_report.json -o -name reference_cache.json \
      -o -name '*.xplane.pb' \) -exec cp --parents {} "$out/" \; 2>/dev/null
    ;;
  staging)
    sstore=${KG_STAGING_STORE:-/tmp/kg-staging}
    if [ -n "${2:-}" ]; then  # a dispatch policy as the candidate: calibrate its family
      [ -f "$2" ] || { echo "no policy file $2" >&2; exit 2; }
      family=(--family dispatch); candidate=(--implementation dispatch --dispatch-policy "$2")
    else
      family=(); candidate=(--implementation native)
    fi
    rm -rf "$sstore"
    export PREFECT_HOME=/tmp/prefect-home PREFECT_API_URL=http://127.0.0.1:4200/api
    # its own process session, so it outlives this call while the machine is held
    setsid python3 -m prefect server start --host 127.0.0.1 --port 4200 > /tmp/prefect-server.log 2>&1 < /dev/null &
    for _ in $(seq 90); do
      python3 -c "import urllib.request; urllib.request.urlopen('$PREFECT_API_URL/health', timeout=2)" 2>/dev/null && break
      sleep 1
    done
    step calibrate 240 python3 -m flows.cli calibrate --thresholds thresholds/staging.yaml \
      "${family[@]}" --store-dir "$sstore"
    python3 tools/answer_paused.py --answers 2 --approver "release manager (API)" \
      --comment "GPU walkthrough: evidence read in the logs; go" --timeout-s 420 > "$out/answers.log" 2>&1 &
    answerer=$!
    step staging-rollout 420 python3 -m flows.cli rollout "${candidate[@]}" \
      --thresholds thresholds/staging.yaml --store-dir "$sstore"
    # a rollout that ends before its last approval (rolled back, rejected) leaves the
    # answerer waiting: stop it rather than spend device time on its timeout
    kill "$answerer" 2>/dev/null; wait "$answerer" 2>/dev/null
    echo "--- answers"; cat "$out/answers.log"
    cp /tmp/prefect-server.log "$out/" 2>/dev/null
    ;;
  staging-audit)
    sstore=${KG_STAGING_STORE:-/tmp/kg-staging}
    step staging-audit 120 python3 -m flows.cli audit production --store-dir "$sstore"
    step staging-timeline 30 python3 -m flows.cli timeline --store-dir "$sstore" --json "$out/staging-timeline.json"
    ;;
  longdoc)
    lstore=${KG_LONGDOC_STORE:-/tmp/kg-longdoc-prod}
    rm -rf "$lstore"
    production=${2:-cudnn}
    n=0
    # both in the production kernel's family (a family is named for its first kernel by
    # default): the candidate's rollout is then judged against that production
    for kernel in "$production" "${3:-pallas_mosaic_gpu}"; do
      n=$((n + 1))
      step "longdoc-rollout-$n-$kernel" 1200 python3 -m flows.cli rollout --implementation "$kernel" \
        --family "$production" --thresholds "$thresholds" --store-dir "$lstore"
      # the version just built, whatever its end (promoted, not adopted, rolled back)
      step "longdoc-audit-$n" 120 python3 -m flows.cli audit "$n" --family "$production" \
        --store-dir "$lstore"
    done
    step longdoc-timeline 60 python3 -m flows.cli timeline --family "$production" --store-dir "$lstore" \
      --json "$out/longdoc-timeline.json"
    # the signed records the rollouts made: the canary steps' per-document pairs, the
    # adoption decisions (the store is deeper than a call returns, so as one archive)
    (cd "$lstore" && find . \( -path '*canary*' -o -path '*adoption*' \) -name '*.json' -print0 \
      | tar --null -czf "$out/longdoc-records.tgz" -T -) 2>/dev/null
    ;;
  longdoc-aa)
    lstore=${KG_LONGDOC_STORE:-/tmp/kg-longdoc-prod}
    family=${4:-cudnn}
    for i in $(seq 1 "${3:-1}"); do
      step "longdoc-aa-$i-$2" 900 python3 -m flows.cli rollout --implementation "$2" \
        --family "$family" --thresholds "$thresholds" --store-dir "$lstore"
    done
    step longdoc-aa-timeline 60 python3 -m flows.cli timeline --family "$family" --store-dir "$lstore" \
      --json "$out/longdoc-aa-timeline.json"
    (cd "$lstore" && find . \( -path '*canary*' -o -path '*adoption*' \) -name '*.json' -print0 \
      | tar --null -czf "$out/longdoc-aa-records.tgz" -T -) 2>/dev/null
    ;;
  after)
    [ -f /tmp/gpu_table.json ] && cp /tmp/gpu_table.json kernels/gpu_table.json
    step revalidate 240 python3 -m flows.cli revalidate --store-dir "$store"
    step audit 120 python3 -m flows.cli audit production --store-dir "$store"
    step timeline 60 python3 -m flows.cli timeline --store-dir "$store" --json "$out/timeline.json"
    step serving-bench 150 python3 -m kernels.tools.bench --serving-only --out "$out/serving.json"
    ;;
  *) usage; exit 2 ;;
esac
echo "--- steps"; cat "$out/steps.txt"
