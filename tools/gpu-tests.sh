#!/usr/bin/env bash
# The `gpu` tests on a GPU host (the lent H200), in the parts of tools/gpu-test-parts.txt:
# all of them take longer than one 10-minute call, so each call runs the parts that
# have not yet passed on this machine, in file order, while the budget lasts.
#
#   bash tools/gpu-tests.sh              the parts not yet passed here, in order
#   bash tools/gpu-tests.sh PART...      those parts not yet passed here, in that order
#   bash tools/gpu-tests.sh --collect    no GPU needed: each part's test ids, as
#                                        "PART<tab>node id" (the CPU suite checks that
#                                        the parts cover every `gpu` test once); with
#                                        --all also "*<tab>node id" for every `gpu` test
#
# Run from the repository root. A passed part is recorded under $KG_GPU_TESTS_STATE
# (default /tmp/kg-gpu-tests, which lives as long as the warm machine), so back-to-back
# calls carry on where the last one stopped; a part that failed or was cut runs again.
# To run a passed part again, point KG_GPU_TESTS_STATE at a new folder.
# A part starts only when its expected seconds are left of $BUDGET_S (default 540).
# Needs JAX with CUDA, numpy and pydantic: a carried .whl/ (../shared/tools/device-wheels.sh
# pydantic) is installed into /tmp/site when pydantic is missing. Logs (pytest -v,
# durations) and a steps table go to $OUT. Exit status 0 only when every part asked for
# (all of them when none is named) has passed.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
parts_file=$here/gpu-test-parts.txt
out=${OUT:-gpu-tests}
budget=${BUDGET_S:-540}
state=${KG_GPU_TESTS_STATE:-/tmp/kg-gpu-tests}
python=${PYTHON:-python3}

# `part_args NAME`: the part's pytest arguments, one per line (quotes honoured by xargs,
# which expands nothing: the parts file is data, not shell).
part_args() {
  local name=$1 line
  line=$(awk -F'\t' -v n="$name" '!/^#/ && $1 == n {print $3}' "$parts_file")
  [ -n "$line" ] || { echo "no part named '$name' in $parts_file" >&2; return 2; }
  printf '%s\n' "$line" | xargs -n 1 printf '%s\n'
}
part_names() { awk -F'\t' '!/^#/ && NF >= 3 {print $1}' "$parts_file"; }
part_seconds() { awk -F'\t' -v n="$1" '!/^#/ && $1 == n {print $2}' "$parts_file"; }

# Every part line: NAME, whole seconds, pytest arguments, tab-separated.
bad=$(awk -F'\t' '!/^#/ && NF && (NF < 3 || $2 !~ /^[0-9]+$/) {print NR": "$0}' "$parts_file")
if [ -n "$bad" ]; then
  echo "$parts_file: a part line needs NAME<tab>SECONDS (whole seconds)<tab>PYTEST ARGS:" >&2
  echo "$bad" >&2; exit 2
fi

if [ "${1:-}" = --collect ]; then  # every part in one interpreter (tools/gpu_collect.py)
  exec "$python" "$here/gpu_collect.py" "$parts_file" "${@:2}"
fi

mkdir -p "$out" "$state"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
. "$here/device-steps.sh"
if ! "$python" -c 'import pydantic' 2>/dev/null && [ -d .whl ]; then
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD

if [ $# -gt 0 ]; then todo=("$@"); else mapfile -t todo < <(part_names); fi
for name in "${todo[@]}"; do part_args "$name" > /dev/null || exit 2; done  # before any run
for name in "${todo[@]}"; do
  if [ -f "$state/$name.passed" ]; then
    printf '%-22s passed in an earlier call on this machine\n' "$name" | tee -a "$out/steps.txt"
    continue
  fi
  need=$(part_seconds "$name"); left=$((budget - SECONDS))
  if [ "$left" -lt "$need" ]; then
    printf '%-22s not run: %s s left of the %s s budget, it needs about %s s\n' \
      "$name" "$left" "$budget" "$need" | tee -a "$out/steps.txt"
    continue
  fi
  mapfile -t args < <(part_args "$name")
  step "$name" "$left" "$python" -m pytest -v -m gpu -p no:cacheprovider --durations=0 "${args[@]}"
  if tail -n 1 "$out/steps.txt" | grep -q 'rc=0 '; then
    touch "$state/$name.passed"
  else
    rm -f "$state/$name.passed"
    echo "    --- $name: failures"; grep -E 'FAILED|ERROR|Error' "$out/$name.log" | head -20 | sed 's/^/    /'
  fi
done

echo "--- parts"
missing=0
for name in "${todo[@]}"; do
  if [ -f "$state/$name.passed" ]; then echo "  passed   $name"; else echo "  NOT YET  $name"; missing=1; fi
done
echo "--- steps"; cat "$out/steps.txt"
exit $missing
