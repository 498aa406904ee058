#!/usr/bin/env bash
# How fast the command line answers --help and refuses bad input (BENCHMARKS.md):
# each command once to warm the file cache, then the median of 3 runs, wall and CPU
# (user + sys) seconds. Prints a markdown table and the load average, and writes the same
# rows as JSON (seconds; the load average and date with them).
# Usage: tools/cli-latency.sh [store dir for the family checks] [JSON file]
#   KG=path/to/kernelgate picks the executable (default .venv/bin/kernelgate).
set -u
cd "$(dirname "$0")/.."
S=${1:-$(mktemp -d)}
JSON=${2:-.kernelgate/cli-latency.json}
KG=${KG:-.venv/bin/kernelgate}
[ -x "$KG" ] || { echo "no $KG: make venv, or KG=path/to/kernelgate $0" >&2; exit 2; }
mkdir -p "$(dirname "$JSON")"
rows=()
echo "| command | wall | CPU |"
echo "|---|---|---|"
for a in "--help" "rollout --help" "audit --help" "rollout --implementation bogus" \
         "rollout --family Bad!" "rollout --family nosuch --store-dir $S" \
         "rollout --thresholds README.md" "timeline --family nosuch --store-dir $S" \
         "audit --family nosuch --store-dir $S"; do
  $KG $a >/dev/null 2>&1 || true
  # median of 3 by wall time: "wall cpu"
  m=$(for _ in 1 2 3; do /usr/bin/time -f "%e %U %S" $KG $a 2>&1 >/dev/null | tail -1; done \
      | sort -n | sed -n 2p | awk '{printf "%.2f %.2f", $1, $2 + $3}')
  name="kernelgate ${a//$S/STORE}"
  read -r wall cpu <<< "$m"
  printf '| `%s` | %s s | %s s |\n' "$name" "$wall" "$cpu"
  rows+=("{\"command\": \"$name\", \"wall_s\": $wall, \"cpu_s\": $cpu}")
done
load=$(cut -d' ' -f1-3 /proc/loadavg)
echo "load average: $load ($(nproc) cores)"
{ printf '{"date": "%s", "load_average": "%s", "cores": %s, "median_of": 3, "rows": [\n' \
    "$(date -u +%FT%TZ)" "$load" "$(nproc)"
  (IFS=$'\n'; echo "${rows[*]}") | sed '$!s/$/,/'
  printf ']}\n'; } > "$JSON"
echo "wrote $JSON"
