"""Where each microsecond of each benchmark row goes, layer by layer, against raw C.

For every row of ``cudagraphs bench`` this times the same work at each layer
of cudagraphs, from the bare driver call through ``cuda.bindings`` (the floor
of any pure-Python library) up to the public call; the difference between two
consecutive layers is what the upper one adds. Raw CUDA C (built with nvcc in
the same run) and the peers stand beside them. On ``sim`` only cudagraphs'
own layers run (there is no driver to call).

Usage::

    python benchmarks/breakdown.py [--quick] [--out DIR] [ROW ...]

ROW: replay, launch, alloc, capture, update, rebind, node, graphed (default:
all). ``--out`` writes ``breakdown.json`` and ``breakdown.md``.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import numpy as np

import cudagraphs as cg
from cudagraphs.backends.base import Copy
from cudagraphs.bench import graphs, rawc
from cudagraphs.bench.runner import per_call_us

TINY = graphs.TINY
CLOCK_US = graphs._clock_us()
Rows = list[tuple[str, float]]
CUDA = cg.backend() == "cuda"


def _drv() -> Any:
    from cuda.bindings import driver

    return driver


def throughput(fn: Callable[[], object], n: int, rounds: int) -> float:
    """Median µs per call over ``rounds`` samples of ``n`` back-to-back calls."""
    sync = cg.Device(0).synchronize
    per_call_us(fn, sync, max(n // 10, 10))
    return statistics.median(per_call_us(fn, sync, n) for _ in range(rounds))


def single(fn: Callable[[], object], rounds: int) -> float:
    """Median over ``rounds`` of the bench's replay-call timing (:func:`graphs.call_us`)."""
    sync = cg.Device(0).synchronize
    return statistics.median(graphs.call_us(fn, sync, CLOCK_US) for _ in range(rounds))


class Bare:
    """Driver-level objects made through cuda.bindings alone, for the floor layers."""

    def __init__(self) -> None:
        drv = _drv()
        self.drv = drv
        dev = cg.Device(0)
        k = cg.Kernel(TINY, "inc")
        self.fn = k.function(dev).fn
        self.stream = dev.stream._raw
        self.ptr = int(drv.cuMemAlloc(64)[1])
        self.arg = ctypes.c_uint64(self.ptr)
        self.ptrs = (ctypes.c_void_p * 1)(ctypes.addressof(self.arg))
        self.params = ctypes.addressof(self.ptrs)

    def launch(self, stream: Any = None) -> None:
        self.drv.cuLaunchKernel(
            self.fn, 1, 1, 1, 1, 1, 1, 0, self.stream if stream is None else stream, self.params, 0
        )

    def capture(self, n: int, ptr: int | None = None) -> tuple[Any, float, float]:
        """(graph, ms capturing, ms instantiating) of ``n`` bare launches."""
        drv = self.drv
        if ptr is not None:
            self.arg.value = ptr
        s = drv.cuStreamCreate(drv.CUstream_flags.CU_STREAM_NON_BLOCKING)[1]
        t0 = time.perf_counter()
        drv.cuStreamBeginCapture(s, drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        for _ in range(n):
            drv.cuLaunchKernel(self.fn, 1, 1, 1, 1, 1, 1, 0, s, self.params, 0)
        err, graph = drv.cuStreamEndCapture(s)
        t1 = time.perf_counter()
        err, exec_ = drv.cuGraphInstantiate(graph, 0)
        t2 = time.perf_counter()
        assert not err, err
        self.arg.value = self.ptr
        drv.cuStreamDestroy(s)
        return (graph, exec_), (t1 - t0) * 1e3, (t2 - t1) * 1e3


def row_replay(q: bool, raw: dict[int, dict[str, float]]) -> dict[str, Rows]:
    rounds = 5 if q else 15
    out: dict[str, Rows] = {}
    dev = cg.Device(0)
    k = cg.Kernel(TINY, "inc", host=lambda p: p.__iadd__(1))
    x = cg.zeros(1, "float32")
    for n in graphs.SIZES if CUDA else (10, 100):
        with cg.capture() as g:
            for _ in range(n):
                k.launch(1, 1, x)
        g.upload()
        rows: Rows = []
        if n in raw:
            rows.append(("raw CUDA C cudaGraphLaunch", raw[n]["call_us"]))
        if CUDA:
            drv, exec_, s = _drv(), g._exec, dev.stream._raw
            launch = drv.cuGraphLaunch
            rows.append(
                ("cuda.bindings cuGraphLaunch", single(lambda f=launch, e=exec_, s=s: f(e, s), rounds))
            )
            backend = dev.backend
            rows.append(
                ("backend.graph_launch", single(lambda b=backend, e=exec_, s=s: b.graph_launch(e, s), rounds))
            )
        rows.append(("Graph.replay()", single(g.replay, rounds)))
        out[f"replay call, {n}-node graph (µs CPU)"] = rows
        g.close()
    return out


def row_launch(q: bool, raw: dict[str, float]) -> dict[str, Rows]:
    n, rounds = (2000, 3) if q else (20000, 7)
    dev = cg.Device(0)
    x, zero = cg.zeros(1, "float32"), cg.zeros(1, "float32")
    k = cg.Kernel(TINY, "inc", host=lambda p: p.__iadd__(1))
    add = cg.ops.elementwise_kernel("cg_add", x.dtype)
    cg.preload([k, add], dev)
    rows: Rows = []
    if raw:
        rows.append(("raw CUDA C <<<>>>", raw["eager_us"]))
    stream = dev.stream
    if CUDA:
        bare = Bare()
        drv, s = bare.drv, stream._raw
        rows.append(
            (
                "cuda.bindings cuStreamQuery (the cost of any bindings call)",
                throughput(lambda: drv.cuStreamQuery(s), n, rounds),
            )
        )
        rows.append(("cuda.bindings cuLaunchKernel, arguments packed", throughput(bare.launch, n, rounds)))
        if dev.backend.fastcall:
            from cudagraphs import _fastcall

            fn_, params = int(bare.fn), bare.params
            call = _fastcall.cuLaunchKernel
            rows.append(
                (
                    "cudagraphs._fastcall cuLaunchKernel, arguments packed (the C floor)",
                    throughput(lambda: call(fn_, 1, 1, 1, 1, 1, 1, 0, s, params, 0), n, rounds),
                )
            )
        try:
            from cuda.core import LaunchConfig, ObjectCode, Stream, launch

            from cudagraphs._kernel import _IMAGES

            image = next(v for (src, _, _), v in _IMAGES.items() if v is not None and src == TINY)
            ck = ObjectCode.from_cubin(image).get_kernel("inc")
            cs, cfg, p = Stream.from_handle(stream.handle), LaunchConfig(grid=1, block=1), np.uintp(x.ptr)
            rows.append(
                (
                    "cuda.core launch (same cubin, config cached)",
                    throughput(lambda: launch(cs, cfg, ck, p), n, rounds),
                )
            )
        except Exception as exc:  # a peer that cannot run is reported
            print(f"# cuda.core launch skipped: {exc}", file=sys.stderr)
        from cudagraphs.backends.base import KernelLaunch

        fn = k.function(dev)
        spec = KernelLaunch(fn, (1, 1, 1), (1, 1, 1), 0, (x.ptr,), (None,))
        backend = dev.backend
        rows.append(
            (
                "backend.launch (pack_into + cuLaunchKernel)",
                throughput(lambda: backend.launch(s, spec), n, rounds),
            )
        )
    vals = (x.ptr,)
    rows.append(
        (
            "Kernel.enqueue (arguments checked)",
            throughput(lambda: k.enqueue(dev, stream, (1, 1, 1), (1, 1, 1), 0, vals, (x,)), n, rounds),
        )
    )
    rows.append(("Kernel.launch", throughput(lambda: k.launch(1, 1, x), n, rounds)))
    rows.append(("ops.add", throughput(lambda: cg.ops.add(x, zero, out=x), n, rounds)))
    return {"eager launch (µs)": rows}


def row_alloc(q: bool, raw: dict[str, float]) -> dict[str, Rows]:
    n, rounds = (2000, 3) if q else (20000, 7)
    dev = cg.Device(0)
    alloc = dev.allocator
    rows: Rows = []
    if raw:
        rows.append(("raw CUDA C cudaMallocAsync+cudaFreeAsync", raw["alloc_free_us"]))
    if CUDA:
        drv = _drv()
        pool = dev.backend._pools[0]
        s = dev.stream._raw

        def pair() -> None:
            drv.cuMemFreeAsync(drv.cuMemAllocFromPoolAsync(512, pool, s)[1], s)

        rows.append(("cuda.bindings cuMemAllocFromPoolAsync+cuMemFreeAsync", throughput(pair, n, rounds)))
        try:
            import cupy as cp

            rows.append(("CuPy cuda.alloc + del", throughput(lambda: cp.cuda.alloc(512), n, rounds)))
            rows.append(
                ("CuPy cupy.empty (an array) + del", throughput(lambda: cp.empty(128, "float32"), n, rounds))
            )
        except ImportError:
            pass
    rows.append(
        (
            "allocator raw_malloc+raw_free (cached)",
            throughput(lambda: alloc.raw_free(alloc.raw_malloc(512)), n, rounds),
        )
    )
    rows.append(("allocator malloc (Block) + drop", throughput(lambda: alloc.malloc(512), n, rounds)))
    rows.append(("cg.empty + drop", throughput(lambda: cg.empty(128, "float32"), n, rounds)))
    return {"alloc+free (µs)": rows}


def row_capture(q: bool, raw: dict[int, dict[str, float]]) -> dict[str, Rows]:
    n = 1000 if CUDA else 200
    rounds = 3 if q else 7
    k = cg.Kernel(TINY, "inc", host=lambda p: p.__iadd__(1))
    x = cg.zeros(1, "float32")
    cg.preload([k], cg.Device(0))
    rows: Rows = []
    if n in raw:
        rows.append(("raw CUDA C capture+instantiate", raw[n]["capture_ms"]))
    if CUDA:
        bare = Bare()
        parts = []
        for _ in range(rounds):
            (graph, exec_), cap, inst = bare.capture(n)
            parts.append((cap, inst))
            bare.drv.cuGraphExecDestroy(exec_)
            bare.drv.cuGraphDestroy(graph)
        rows.append(("cuda.bindings: begin + launches + end", statistics.median(p[0] for p in parts)))
        rows.append(("cuda.bindings: cuGraphInstantiate", statistics.median(p[1] for p in parts)))
    begin, body, end, inst = [], [], [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        c = cg.capture(instantiate=False)
        g = c.__enter__()
        t1 = time.perf_counter()
        for _ in range(n):
            k.launch(1, 1, x)
        t2 = time.perf_counter()
        c.__exit__(None, None, None)
        t3 = time.perf_counter()
        g.instantiate()
        t4 = time.perf_counter()
        g.close()
        begin.append(t1 - t0)
        body.append(t2 - t1)
        end.append(t3 - t2)
        inst.append(t4 - t3)
    rows.append(
        ("cudagraphs: begin (capture options, stream, cuStreamBeginCapture)", statistics.median(begin) * 1e3)
    )
    rows.append((f"cudagraphs: {n} Kernel.launch while captured", statistics.median(body) * 1e3))
    rows.append(("cudagraphs: end (graph made, records resolved)", statistics.median(end) * 1e3))
    rows.append(("cudagraphs: instantiate", statistics.median(inst) * 1e3))
    return {f"capture+instantiate {n} launches (ms)": rows}


def row_update(q: bool, raw: dict[int, dict[str, float]]) -> dict[str, Rows]:
    n = 1000 if CUDA else 200
    rounds = 5 if q else 11
    k = cg.Kernel(TINY, "inc", host=lambda p: p.__iadd__(1))
    x = cg.zeros(1, "float32")

    def launches() -> None:
        for _ in range(n):
            k.launch(1, 1, x)

    g = cg.capture(launches)
    rows: Rows = []
    if n in raw and raw[n].get("update_ms") is not None:
        rows.append(("raw CUDA C cudaGraphExecUpdate", raw[n]["update_ms"]))
    if CUDA:
        drv = _drv()
        bare = Bare()
        (_, bexec), _, _ = bare.capture(n)
        times = []
        for _ in range(rounds):
            (src, sexec), _, _ = bare.capture(n)
            drv.cuGraphExecDestroy(sexec)
            t0 = time.perf_counter()
            drv.cuGraphExecUpdate(bexec, src)
            times.append(time.perf_counter() - t0)
            drv.cuGraphDestroy(src)
        rows.append(
            (
                "cuda.bindings cuGraphExecUpdate, graph captured through bindings",
                statistics.median(times) * 1e3,
            )
        )
        times = []
        for _ in range(rounds):
            source = cg.capture(launches, instantiate=False)
            t0 = time.perf_counter()
            drv.cuGraphExecUpdate(g._exec, source._res.graph)
            times.append(time.perf_counter() - t0)
            source.close()
        rows.append(("cuda.bindings cuGraphExecUpdate, cudagraphs' graphs", statistics.median(times) * 1e3))
        times, kept = [], []
        for _ in range(rounds):  # as Graph.update leaves it: the previous source graph alive
            source = cg.capture(launches, instantiate=False)
            t0 = time.perf_counter()
            drv.cuGraphExecUpdate(g._exec, source._res.graph)
            times.append(time.perf_counter() - t0)
            kept.append(source)
            if len(kept) > 1:
                kept.pop(0).close()
        rows.append(
            ("  same, the previous source graph kept until the next update", statistics.median(times) * 1e3)
        )
        for source in kept:
            source.close()
    times = []
    for _ in range(rounds):
        source = cg.capture(launches, instantiate=False)
        t0 = time.perf_counter()
        g.update(source)
        times.append(time.perf_counter() - t0)
    rows.append(("Graph.update", statistics.median(times) * 1e3))
    g.close()
    return {f"whole-graph update, {n} nodes (ms)": rows}


def row_rebind(q: bool, raw: dict[int, dict[str, float]]) -> dict[str, Rows]:
    n = 1000 if CUDA else 200
    rounds = 5 if q else 11
    k = cg.Kernel(TINY, "inc", host=lambda p: p.__iadd__(1))
    x, x2 = cg.zeros(1, "float32"), cg.zeros(1, "float32")
    g = cg.capture(lambda: [k.launch(1, 1, x) for _ in range(n)])
    rows: Rows = []
    if raw.get(n, {}).get("set_params_us") is not None:  # the driver's own cost: the floor
        rows.append(("raw CUDA C cudaGraphExecKernelNodeSetParams", raw[n]["set_params_us"]))
    if CUDA:
        drv, dev = _drv(), cg.Device(0)
        bare = Bare()
        (graph, exec_), _, _ = bare.capture(n)
        nodes = drv.cuGraphGetNodes(graph, n)[1]
        p = drv.cuGraphKernelNodeGetParams(nodes[0])[1]
        p.kernelParams = bare.params
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for node in nodes:
                drv.cuGraphExecKernelNodeSetParams(exec_, node, p)
            times.append((time.perf_counter() - t0) / n * 1e6)
        rows.append(
            ("cuda.bindings cuGraphExecKernelNodeSetParams, params prepared", statistics.median(times))
        )
        from cudagraphs.backends.base import KernelLaunch

        spec = KernelLaunch(k.function(dev), (1, 1, 1), (1, 1, 1), 0, (x2.ptr,), (None,))
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for node in nodes:
                dev.backend.graph_update(exec_, node, spec)
            times.append((time.perf_counter() - t0) / n * 1e6)
        rows.append(("backend.graph_update (params built + set)", statistics.median(times)))
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        g.rebind(x, x2)
        times.append((time.perf_counter() - t0) / n * 1e6)
        x, x2 = x2, x
    rows.append(("Graph.rebind", statistics.median(times)))
    g.close()
    return {f"rebind, {n}-node graph (µs per node)": rows}


def row_node(q: bool, raw: dict[int, dict[str, float]]) -> dict[str, Rows]:
    """GPU time per node of a 1000-node graph, by how the graph was made."""
    if not CUDA:
        return {}
    n, rounds = 1000, 5 if q else 11
    drv, dev = _drv(), cg.Device(0)
    k = cg.Kernel(TINY, "inc", host=lambda p: p.__iadd__(1))
    x = cg.zeros(1, "float32")
    bare = Bare()
    s = dev.stream._raw
    own = drv.cuStreamCreate(drv.CUstream_flags.CU_STREAM_NON_BLOCKING)[1]

    def per_node(exec_: Any, stream: Any) -> float:
        launch = drv.cuGraphLaunch
        launch(exec_, stream)
        drv.cuStreamSynchronize(stream)
        vals = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(20):
                launch(exec_, stream)
            drv.cuStreamSynchronize(stream)
            vals.append((time.perf_counter() - t0) / 20 / n * 1e6)
        return statistics.median(vals)

    rows: Rows = []
    if n in raw:
        rows.append(("raw CUDA C", raw[n]["per_node_us"]))
    (graph, exec_), _, _ = bare.capture(n)
    rows.append(("bindings capture, cuMemAlloc memory", per_node(exec_, s)))
    (_, exec2), _, _ = bare.capture(n, ptr=x.ptr)
    rows.append(("bindings capture, cudagraphs' pool memory", per_node(exec2, s)))
    g = cg.capture(lambda: [k.launch(1, 1, x) for _ in range(n)])
    rows.append(("cudagraphs capture, replayed by the driver call", per_node(g._exec, s)))
    rows.append(("cudagraphs capture, replayed on a fresh stream", per_node(g._exec, own)))
    # the bench process holds the streams of four frameworks: do other streams slow a
    # graph's nodes down?
    streams = [drv.cuStreamCreate(drv.CUstream_flags.CU_STREAM_NON_BLOCKING)[1] for _ in range(16)]
    rows.append(("cudagraphs capture, 16 more streams alive (idle)", per_node(g._exec, s)))
    for extra in streams:
        drv.cuStreamDestroy(extra)
    rows.append(("cudagraphs capture, those streams destroyed", per_node(g._exec, s)))
    # the bench keeps every graph it built (15 of each framework): do many uploaded
    # executables slow a graph's nodes down?
    others = [cg.capture(lambda: [k.launch(1, 1, x) for _ in range(n)]).upload() for _ in range(20)]
    for other in others:
        drv.cuGraphLaunch(other._exec, s)
    rows.append(("cudagraphs capture, 20 other 1000-node graphs uploaded", per_node(g._exec, s)))
    bonly = [bare.capture(n)[0] for _ in range(20)]
    for _, e in bonly:
        drv.cuGraphUpload(e, s)
    rows.append(("bindings capture, 20 more graphs uploaded", per_node(exec_, s)))
    nodes = len(g.nodes)
    edges = len(g.edges)
    bnodes = drv.cuGraphGetNodes(graph, 0)[2]
    bedges = drv.cuGraphGetEdges(graph)
    print(f"# node graph: cudagraphs {nodes} nodes {edges} edges; bindings {bnodes} nodes {bedges[-1]} edges")
    dot = os.environ.get("BREAKDOWN_DOT")
    if dot:  # both graphs' nodes in full, for a diff (the driver's verbose DOT)
        small = cg.capture(lambda: [k.launch(1, 1, x) for _ in range(3)])
        (bsmall, _), _, _ = bare.capture(3, ptr=x.ptr)
        drv.cuGraphDebugDotPrint(small._res.graph, f"{dot}/cudagraphs.dot".encode(), 0xFFFF)
        drv.cuGraphDebugDotPrint(bsmall, f"{dot}/bindings.dot".encode(), 0xFFFF)
    return {f"replay per node, {n}-node graph (µs GPU)": rows}


def row_graphed(q: bool, raw: dict[str, float]) -> dict[str, Rows]:
    rounds = 5 if q else 15
    dev = cg.Device(0)
    a, b = cg.asarray(np.ones(256, np.float32)), cg.asarray(np.ones(256, np.float32))
    f1 = cg.graphed(lambda u: cg.ops.scale(2.0, u))
    f2 = cg.graphed(lambda u, v: cg.ops.add(u, v))
    f1(a), f2(a, b)
    rows: Rows = []
    (g1,) = f1.graphs.values()
    (g2,) = f2.graphs.values()
    if "copy_us" in raw:  # an input's copy into the graph's static buffer, from C: the floor
        rows.append(("raw CUDA C cudaMemcpyAsync, 1 KiB device to device (one input copy)", raw["copy_us"]))
    if CUDA:
        drv = _drv()
        s, c = dev.stream._raw, cg.empty(256, "float32")
        rows.append(
            (
                "cuda.bindings cuMemcpyDtoDAsync (one input copy)",
                single(lambda: drv.cuMemcpyDtoDAsync(c.ptr, a.ptr, 1024, s), rounds),
            )
        )
        copy = Copy(c.ptr, a.ptr, 1024, "dtod")
        rows.append(("backend.memcpy (the fast call)", single(lambda: dev.backend.memcpy(s, copy), rounds)))
    rows.append(("Graph.replay() of its graph (1 input)", single(g1.replay, rounds)))
    rows.append(("graphed call, 1 input", single(lambda: f1(a), rounds)))
    rows.append(("Graph.replay() of its graph (2 inputs)", single(g2.replay, rounds)))
    rows.append(("graphed call, 2 inputs", single(lambda: f2(a, b), rounds)))
    return {"graphed-callable call (µs CPU)": rows}


ROWS = ("replay", "launch", "alloc", "capture", "update", "rebind", "node", "graphed")


def run(which: tuple[str, ...], quick: bool) -> dict[str, Rows]:
    graph_raw = graphs.raw_c()
    launch_raw = {}
    out = rawc.run("launch_alloc.cu", ("20000",), repeats=3)
    if out:
        res = [json.loads(o) for o in out]
        launch_raw = {key: statistics.median(r[key] for r in res) for key in res[0]}
    results: dict[str, Rows] = {}
    for name in which:
        gc.collect()
        fn = globals()[f"row_{name}"]
        args = (quick, launch_raw if name in ("launch", "alloc", "graphed") else graph_raw)
        results.update(fn(*args))
    return results


PEERS = ("raw CUDA C", "CuPy", "cuda.core")
BASES = ("Graph.replay() of",)


def table(results: dict[str, Rows]) -> str:
    lines = [
        f"GPU: {cg.Device(0).name} | backend: {cg.backend()} | {time.strftime('%Y-%m-%d')}",
        "",
        "| row | layer | value | + over the layer above | × raw C |",  # noqa: RUF001
        "|---|---|---|---|---|",
    ]
    for row, layers in results.items():
        raw = next((v for name, v in layers if name.startswith("raw CUDA C")), None)
        prev = None
        for name, value in layers:
            # peers and parts of a sum stand alone; a layer adds to the one above it
            alone = name.startswith(PEERS) or ": " in name or name.startswith(BASES)
            delta = "" if prev is None or alone else f"{value - prev:+.3f}"
            ratio = f"{value / raw:.2f}" if raw else "—"
            lines.append(f"| {row} | {name} | {value:.3f} | {delta} | {ratio} |")
            if name.startswith(BASES) or not alone:
                prev = value
    return "\n".join(lines)


def preload(names: str) -> None:
    """Import and start other libraries first (``--with torch,cupy``), as the bench process has them."""
    for name in filter(None, names.split(",")):
        if name == "torch":
            import torch

            torch.zeros(1, device="cuda").add_(1)
            torch.cuda.synchronize()
        elif name == "cupy":
            import cupy

            cupy.zeros(1).sum()
            cupy.cuda.Device().synchronize()
        else:
            raise SystemExit(f"--with: unknown library {name!r} (torch, cupy)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--with", dest="libs", default="", help="libraries to load first: torch,cupy")
    ap.add_argument("--gc-freeze", action="store_true", help="gc.freeze() the objects made so far")
    ap.add_argument("rows", nargs="*", choices=[*ROWS, []], default=[])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    preload(args.libs)
    if args.gc_freeze:
        gc.collect()
        gc.freeze()
    results = run(tuple(args.rows) or ROWS, args.quick)
    text = table(results)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "breakdown.json").write_text(json.dumps(results, indent=2))
        (args.out / "breakdown.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
