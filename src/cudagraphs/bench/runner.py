"""Benchmarks: cudagraphs against raw CUDA C and its Python peers, in one run.

Every contender of a benchmark runs interleaved with the others, for several
rounds; each result is the median, stated as a ratio to raw CUDA C (built
with nvcc in the same run, when nvcc is there) and to the best Python peer.
Peers (cuda.core, CuPy, PyTorch) are measured when importable.

Usage: ``cudagraphs bench [--quick] [--out DIR]`` (or ``python
benchmarks/run.py``) prints the table and writes ``bench.json``, ``bench.md``
and PNG plots to DIR.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import cudagraphs as cg

from . import decoder, graphs, rawc, sampling
from .targets import judge

TINY = 'extern "C" __global__ void inc(float* p) { p[0] += 1.0f; }'

Contender = tuple[str, Callable[[], object], Callable[[], None], bool]  # name, call, sync, ours


def per_call_us(call: Callable[[], object], sync: Callable[[], None], n: int) -> float:
    """Microseconds per call of ``n`` calls between two synchronizations."""
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        call()
    sync()
    return (time.perf_counter() - t0) / n * 1e6


def eager_contenders() -> list[Contender]:
    """The eager-launch contenders: ours, then the peers that import."""
    dev = cg.Device(0)
    x = cg.asarray(np.zeros(1, np.float32))
    zero = cg.zeros(1, "float32")
    k = cg.Kernel(TINY, "inc", host=lambda p: p.__iadd__(1))
    cg.preload([k, cg.ops.elementwise_kernel("cg_add", x.dtype)], dev)
    out: list[Contender] = [
        ("cudagraphs ops.add", lambda: cg.ops.add(x, zero, out=x), dev.synchronize, True),
        ("cudagraphs Kernel.launch", lambda: k.launch(1, 1, x), dev.synchronize, True),
    ]
    if cg.backend() != "cuda":
        return out
    try:
        from cuda.core import Device as CoreDevice
        from cuda.core import LaunchConfig, Program, ProgramOptions, launch

        cdev = CoreDevice(0)
        cdev.set_current()
        stream = cdev.create_stream()
        arch = "sm_" + "".join(map(str, dev.compute_capability))
        kern = Program(TINY, "c++", ProgramOptions(arch=arch)).compile("cubin").get_kernel("inc")
        cfg = LaunchConfig(grid=1, block=1)
        y = cg.zeros(1, "float32")
        arg = np.uintp(y.ptr)  # a pointer by value, as cuda.core's examples pass it
        out.append(("cuda.core launch", lambda: launch(stream, cfg, kern, arg), stream.sync, False))
    except Exception as exc:
        print(f"# cuda.core launch skipped: {exc}", file=sys.stderr)
    try:
        import cupy as cp

        raw = cp.RawKernel(TINY, "inc")
        cx = cp.zeros(1, cp.float32)
        out.append(("CuPy RawKernel", lambda: raw((1,), (1,), (cx,)), cp.cuda.Device().synchronize, False))
    except Exception as exc:
        print(f"# CuPy skipped: {exc}", file=sys.stderr)
    try:
        import torch

        tx = torch.zeros(1, device="cuda")
        out.append(("PyTorch add_", lambda: tx.add_(1.0), torch.cuda.synchronize, False))
    except Exception as exc:
        print(f"# PyTorch skipped: {exc}", file=sys.stderr)
    return out


def alloc_contenders() -> list[Contender]:
    """The allocate-and-free contenders: ours, then the peers that import."""
    dev = cg.Device(0)
    alloc = dev.allocator

    def raw() -> None:
        alloc.raw_free(alloc.raw_malloc(512))

    out: list[Contender] = [
        ("cudagraphs allocator raw_malloc+raw_free", raw, dev.synchronize, True),
        ("cudagraphs cg.empty + del", lambda: cg.empty(128, "float32"), dev.synchronize, True),
    ]
    if cg.backend() != "cuda":
        return out
    try:
        import cupy as cp

        out.append(("CuPy cuda.alloc + del", lambda: cp.cuda.alloc(512), cp.cuda.Device().synchronize, False))
    except Exception as exc:
        print(f"# CuPy skipped: {exc}", file=sys.stderr)
    try:
        import torch

        out.append(
            (
                "PyTorch torch.empty + del",
                lambda: torch.empty(128, device="cuda"),
                torch.cuda.synchronize,
                False,
            )
        )
    except Exception as exc:
        print(f"# PyTorch skipped: {exc}", file=sys.stderr)
    return out


def raw_c(n: int) -> dict[str, float]:
    """The raw CUDA C eager/alloc baseline (empty when nvcc or a GPU is missing)."""
    results = [json.loads(out) for out in rawc.run("launch_alloc.cu", (str(n),), repeats=3)]
    return {k: statistics.median(r[k] for r in results) for k in results[0]} if results else {}


def measure(contenders: list[Contender], n: int, rounds: int) -> dict[str, float]:
    """Median microseconds per call of each contender, interleaved over ``rounds``."""
    for _, call, sync, _ in contenders:  # warm up: compile, first allocations
        per_call_us(call, sync, max(n // 10, 10))
    samples: dict[str, list[float]] = {name: [] for name, *_ in contenders}
    for _ in range(rounds):
        for name, call, sync, _ in contenders:
            samples[name].append(per_call_us(call, sync, n))
    return {name: statistics.median(v) for name, v in samples.items()}


def report(results: dict[str, Any], ours: dict[str, set[str]]) -> str:
    """The Markdown table of ``results`` (ratios to raw C and to the best peer)."""
    lines = [
        f"GPU: {results['gpu']} | backend: {results['backend']} | {results['date']}",
        "",
        "| benchmark | contender | median | × raw C | × best peer | target (this run) |",  # noqa: RUF001
        "|---|---|---|---|---|---|",
    ]
    for bench, rows in results["benchmarks"].items():
        raw = rows.get("raw CUDA C")
        peers = [v for k, v in rows.items() if k not in ours[bench] and k != "raw CUDA C"]
        best_peer = min(peers) if peers else None
        verdicts = judge(bench, rows, ours[bench])
        for name, us in sorted(rows.items(), key=lambda kv: kv[1]):
            r_raw = f"{us / raw:.2f}" if raw else "—"
            r_peer = f"{us / best_peer:.2f}" if best_peer else "—"
            mark = verdicts.get(name, "")
            lines.append(f"| {bench} | {name} | {us:.3f} | {r_raw} | {r_peer} | {mark} |")
    return "\n".join(lines)


def run(quick: bool = False) -> tuple[dict[str, Any], str]:
    """Run every benchmark; return (results, Markdown table)."""
    n, rounds = (2000, 3) if quick else (20000, 7)
    if cg.backend() == "sim":
        n, rounds = min(n, 2000), min(rounds, 3)
    dev = cg.Device(0)
    eager = eager_contenders()
    alloc = alloc_contenders()
    raw = raw_c(n)
    benches = {"eager launch": measure(eager, n, rounds), "alloc+free": measure(alloc, n, rounds)}
    if raw:
        benches["eager launch"]["raw CUDA C"] = raw["eager_us"]
        benches["alloc+free"]["raw CUDA C"] = raw["alloc_free_us"]
    graph_results = graphs.run(
        rounds=3 if quick else 5, sizes=(10, 100) if cg.backend() == "sim" else graphs.SIZES
    )
    benches.update(graph_results)
    decoder_results, decoder_notes = decoder.run(quick)
    sampling_results, sampling_notes = sampling.run(quick)
    decoder_results.update(sampling_results)
    decoder_notes += sampling_notes
    benches.update(decoder_results)
    results: dict[str, Any] = {
        "gpu": dev.name,
        "backend": cg.backend(),
        "date": time.strftime("%Y-%m-%d"),
        "python": platform.python_version(),
        "calls_per_sample": n,
        "rounds": rounds,
        "benchmarks": benches,
    }
    ours = {"eager launch": {c[0] for c in eager if c[3]}, "alloc+free": {c[0] for c in alloc if c[3]}}
    ours.update({bench: {"cudagraphs"} for bench in graph_results})
    ours.update(
        {bench: {k for k in rows if k.startswith("cudagraphs")} for bench, rows in decoder_results.items()}
    )
    table = report(results, ours)
    if decoder_notes:
        table += "\n\n" + "\n".join(decoder_notes)
    for name, row in graph_results.items():
        if name.startswith("whole-graph update") and graphs.IN_PROCESS not in name:
            recapture = graph_results[name.replace("whole-graph update", "re-capture + instantiate")]
            table += (
                f"\n\nWhole-graph update is {recapture['cudagraphs'] / row['cudagraphs']:.1f}x "
                "faster than capturing and instantiating the graph again."
            )
    if cg.backend() == "sim":
        table += "\n\n(sim backend: timings are of the CPU simulation, not of a GPU)"
    return results, table


def write(results: dict[str, Any], table: str, out: Path) -> list[Path]:
    """Write bench.json, bench.md and the plots (when matplotlib is there) into ``out``."""
    from .plots import plot_all

    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(results, indent=2))
    (out / "bench.md").write_text(table + "\n")
    return [out / "bench.json", out / "bench.md", *plot_all(results, out)]


def main(argv: list[str] | None = None) -> int:
    """``cudagraphs bench``: run, print the table, write files with ``--out``."""
    ap = argparse.ArgumentParser(prog="cudagraphs bench", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer calls and rounds (about a minute)")
    ap.add_argument("--out", type=Path, help="directory for bench.json, bench.md and PNG plots")
    args = ap.parse_args(argv)
    results, table = run(args.quick)
    print(table)
    if args.out:
        files = write(results, table, args.out)
        print("\nwrote " + ", ".join(str(f) for f in files))
        if not any(f.suffix == ".png" for f in files):
            print("(no plots: install matplotlib, e.g. `pip install cudagraphs[report]`)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
