"""Compare two `cudagraphs bench` runs of one session.

Each cudagraphs row as a ratio to raw CUDA C (or, where a row has no raw C
contender, in absolute terms), earlier version against this one.

Usage: python benchmarks/compare_bench.py BASELINE/bench.json NEW/bench.json
Prints a Markdown table; the last column is the change of the ratio (+10% = worse).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def ours(row: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in row.items() if k.startswith("cudagraphs")}


def main(old_path: str, new_path: str) -> int:
    old = json.loads(Path(old_path).read_text())["benchmarks"]
    new = json.loads(Path(new_path).read_text())["benchmarks"]
    print("| row | contender | before | after | before / C | after / C | change |")
    print("|---|---|---|---|---|---|---|")
    for bench, row in new.items():
        before_row = old.get(bench, {})
        for name, after in ours(row).items():
            before = before_row.get(name)
            raw_after, raw_before = row.get("raw CUDA C"), before_row.get("raw CUDA C")
            if before is None:
                continue
            if raw_after and raw_before:
                r_before, r_after = before / raw_before, after / raw_after
                cells = f"{r_before:.2f} | {r_after:.2f} | {100 * (r_after / r_before - 1):+.0f}%"
            else:
                cells = f"— | — | {100 * (after / before - 1):+.0f}% (absolute)"
            print(f"| {bench} | {name} | {before:.3f} | {after:.3f} | {cells} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
