# Sourced by the GPU job scripts (tools/gpu-*.sh): `step NAME TIMEOUT_S COMMAND...` runs the
# command under a timeout, logs it to $out/NAME.log and appends a timed line to
# $out/steps.txt. The caller sets $out.
step() {
  local name=$1 limit=$2; shift 2
  local t0 t1 rc
  t0=$(date +%s%N)
  timeout -k 10 "$limit" "$@" > "$out/$name.log" 2>&1; rc=$?
  t1=$(date +%s%N)
  printf '%-22s rc=%-4s %8.1f s   %s\n' "$name" "$rc" "$(( (t1 - t0) / 1000000 ))e-3" "$*" \
    | tee -a "$out/steps.txt"
  tail -n 4 "$out/$name.log" | sed 's/^/    /'
}
