#!/usr/bin/env bash
# A/B of the hot paths, earlier tree (.baseline/src) against this one, alternating
# processes ROUNDS times in one machine session (order effects cancel out).
# PIN_CPUS=2-7 pins every process to those CPUs. Reports the median and the minimum
# per row. (scripts/ab_inprocess.py is more exact: both trees in one process.)
# Usage (on a GPU): bash scripts/ab_hot_paths.sh [ROUNDS]
set -u
ROUNDS=${1:-4}
PIN=""; [ -n "${PIN_CPUS:-}" ] && command -v taskset >/dev/null && PIN="taskset -c $PIN_CPUS"
export CUDAGRAPHS_BACKEND=${CUDAGRAPHS_BACKEND:-cuda} PYTHONUNBUFFERED=1
for i in $(seq "$ROUNDS"); do
  for tree in new old; do
    src=$PWD/src; [ $tree = old ] && src=$PWD/.baseline/src
    PYTHONPATH=$src $PIN python3 scripts/hot_paths.py | sed "s/^/$tree  /"
  done
done | python3 -c '
import collections, re, statistics, sys
rows = collections.defaultdict(lambda: collections.defaultdict(list))
for line in sys.stdin:
    tree, rest = line.split(None, 1)
    m = re.match(r"(.*?)\s+([\d.]+)\s+(ms|us)\s*$", rest.strip())
    if m:
        rows[m.group(1).strip()][tree].append(float(m.group(2)))
print("| row | old (median) | new (median) | new/old | old (min) | new (min) | new/old |")
print("|---|---|---|---|---|---|---|")
for name, t in rows.items():
    o, n = statistics.median(t["old"]), statistics.median(t["new"])
    lo, ln = min(t["old"]), min(t["new"])
    print(f"| {name} | {o:.2f} | {n:.2f} | {n / o:.2f} | {lo:.2f} | {ln:.2f} | {ln / lo:.2f} |")'
