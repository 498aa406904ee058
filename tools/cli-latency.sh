#!/usr/bin/env bash
# How fast the command line answers --help and refuses bad input (BENCHMARKS.md):
# each command once to warm the file cache, then the median of 3 runs, wall and CPU
# (user + sys) seconds. Usage: tools/cli-latency.sh [store dir for the family checks]
set -u
cd "$(dirname "$0")/.."
S=${1:-$(mktemp -d)}
KG=.venv/bin/kernelgate
for a in "--help" "rollout --help" "audit --help" "rollout --implementation bogus" \
         "rollout --family Bad!" "rollout --family nosuch --store-dir $S" \
         "rollout --thresholds README.md" "timeline --family nosuch --store-dir $S" \
         "audit --family nosuch --store-dir $S"; do
  $KG $a >/dev/null 2>&1 || true
  for _ in 1 2 3; do /usr/bin/time -f "%e %U %S" $KG $a 2>&1 >/dev/null | tail -1; done \
    | sort -n | sed -n 2p \
    | awk -v a="kernelgate ${a//$S/STORE}" '{printf "| `%s` | %.2f s | %.2f s |\n", a, $1, $2 + $3}'
done
uptime
