"""Graph benchmarks: cudagraphs against raw CUDA C, PyTorch, CuPy and cuda.core.

For graphs of 10, 100 and 1000 one-thread kernels (``p[0] += 1``) it measures,
per framework, in one process with the contenders interleaved:

* capture: capture + instantiate (+ upload) time of the graph (ms), and
* per node: GPU time per node over back-to-back replays (µs), both measured
  for each framework alone in a fresh child process, as raw C's are in its
  own program: in the bench process, which has imported every peer and made
  many graphs, every framework's replays ran 1.2 times slower on an H100
  (bare cuda.bindings graphs too) and captures up to 3 times slower. The
  whole-graph update and rebind rows are measured in a fresh process too.
  The in-process times stay in the report as rows of their own;
* call: host time of one replay call (µs), the median of single calls timed
  while the GPU still has room in its queue, less the cost of reading the
  clock twice (measured in the same process; C's clock costs tens of ns).

Run through ``cudagraphs bench`` (or ``python -m cudagraphs.bench.graphs``).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import cudagraphs as cg

from . import rawc

TINY = 'extern "C" __global__ void inc(float* p) { p[0] += 1.0f; }'
SIZES = (10, 100, 1000)

# a framework: build(n) -> (replay, sync); build also returns after instantiating
Framework = Callable[[int], tuple[Callable[[], None], Callable[[], None]]]


def ours() -> Framework:
    """cudagraphs: capture ``n`` launches, upload, replay."""
    dev = cg.Device(0)
    k = cg.Kernel(TINY, "inc", host=lambda p: p.__iadd__(1))
    cg.preload([k], dev)
    x = cg.zeros(1, "float32")

    def build(n: int) -> tuple[Callable[[], None], Callable[[], None]]:
        # (no graph kept beyond its replay: as the peers', the previous one goes when the
        # caller drops it; every live uploaded graph slows the driver's replays a little)
        with cg.capture() as g:
            for _ in range(n):
                k.launch(1, 1, x)
        g.upload()
        return g.replay, dev.stream.synchronize

    return build


def torch_fw() -> Framework | None:
    """PyTorch's CUDAGraph on a side stream (None without torch)."""
    try:
        import torch
    except ImportError:
        return None
    t = torch.zeros(1, device="cuda")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        t.add_(1)
    torch.cuda.synchronize()

    def build(n: int) -> tuple[Callable[[], None], Callable[[], None]]:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            for _ in range(n):
                t.add_(1)
        return g.replay, torch.cuda.synchronize

    return build


def cupy_fw() -> Framework | None:
    """CuPy's stream capture of a RawKernel (None without CuPy)."""
    try:
        import cupy as cp
    except ImportError:
        return None
    raw = cp.RawKernel(TINY, "inc")
    cx = cp.zeros(1, cp.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        raw((1,), (1,), (cx,))
    stream.synchronize()

    def build(n: int) -> tuple[Callable[[], None], Callable[[], None]]:
        with stream:
            stream.begin_capture()
            for _ in range(n):
                raw((1,), (1,), (cx,))
            g = stream.end_capture()
        g.upload(stream)
        return (lambda: g.launch(stream)), stream.synchronize

    return build


def cuda_core_fw() -> Framework | None:
    """cuda.core's GraphBuilder (None without cuda.core's graphs)."""
    try:
        from cuda.core import Device, LaunchConfig, Program, ProgramOptions, launch
    except ImportError:
        return None
    dev = Device(0)
    dev.set_current()
    stream = dev.create_stream()
    cc = "".join(map(str, cg.Device(0).compute_capability))
    kern = Program(TINY, "c++", ProgramOptions(arch=f"sm_{cc}")).compile("cubin").get_kernel("inc")
    cfg = LaunchConfig(grid=1, block=1)
    y = cg.zeros(1, "float32")
    arg = np.uintp(y.ptr)

    def build(n: int) -> tuple[Callable[[], None], Callable[[], None]]:
        gb = dev.create_graph_builder().begin_building()
        for _ in range(n):
            launch(gb, cfg, kern, arg)
        gb.end_building()
        graph = gb.complete()
        graph.upload(stream)
        return (lambda: graph.launch(stream)), stream.sync

    return build


def raw_c(repeats: int = 3) -> dict[int, dict[str, float]]:
    """The raw CUDA C graph baseline, by graph size (empty without nvcc or a GPU).

    The program runs ``repeats`` times, each in a fresh process; every figure
    is the median of its runs (one run's host timings swing by a third). The
    1000-node entry also carries ``update_ms`` and ``set_params_us``.
    """
    runs: dict[int, list[dict[str, float]]] = {}
    for out in rawc.run("graph.cu", repeats=repeats):
        rows = [json.loads(line) for line in out.splitlines() if line.strip()]
        updates = {r["update_nodes"]: r for r in rows if "update_nodes" in r}
        for r in rows:
            if "nodes" in r:
                extra = updates.get(r["nodes"], {})
                row = dict(r, update_ms=extra.get("update_ms"), set_params_us=extra.get("set_params_us"))
                runs.setdefault(r["nodes"], []).append(row)
    return {n: _median_fields(rs) for n, rs in runs.items()}


def _median_fields(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Field by field, the median over ``rows`` of the fields that are numbers (None where none is)."""
    out: dict[str, Any] = {}
    for key in rows[0]:
        values = [r[key] for r in rows if r.get(key) is not None]
        out[key] = statistics.median(values) if values else None
    return out


IN_PROCESS = ", in the bench process"  # in the name of a row measured in the bench process itself


def in_process(bench: str) -> str:
    """The name of ``bench``'s row measured in the bench process itself.

    ``"x (unit)"`` becomes ``"x, in the bench process (unit)"``.
    """
    head, unit = bench.rsplit(" (", 1)
    return f"{head}{IN_PROCESS} ({unit}"


def _settle() -> None:
    """Let what earlier rounds dropped go before the next timing (a device synchronize).

    cudagraphs destroys a dropped graph at its next safe point (never inside
    a capture); the peers destroy theirs when they are dropped. Without this,
    the next timed capture of cudagraphs would pay for destroying the
    previous graph, and the peers' captures would not.
    """
    cg.Device(0).synchronize()


def _per_node(replay: Callable[[], None], sync: Callable[[], None], n: int) -> float:
    reps = max(20, 20000 // n)
    sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        replay()
    sync()
    return (time.perf_counter() - t0) / reps / n * 1e6


def _clock_us() -> float:
    """What two back-to-back ``perf_counter()`` reads measure with nothing between them (µs).

    A Python timing of one call contains this much of the clock's own cost,
    which a C timing (``steady_clock``, tens of ns) barely has; :func:`call_us`
    subtracts it, for every Python contender alike.
    """
    clock = time.perf_counter
    times = []
    for _ in range(2000):
        t0 = clock()
        times.append(clock() - t0)
    return statistics.median(times) * 1e6


def call_us(call: Callable[[], object], sync: Callable[[], None], clock_us: float) -> float:
    """Median µs of one call of ``call`` timed alone (30 calls), less ``clock_us`` (:func:`_clock_us`)."""
    times = []
    clock = time.perf_counter
    sync()
    for _ in range(30):
        t0 = clock()
        call()
        times.append(clock() - t0)
    sync()
    return max(statistics.median(times) * 1e6 - clock_us, 0.0)


PEERS: dict[str, Callable[[], Framework | None]] = {
    "PyTorch CUDAGraph": torch_fw,
    "CuPy Graph": cupy_fw,
    "cuda.core GraphBuilder": cuda_core_fw,
}


def frameworks() -> dict[str, Framework]:
    """cudagraphs, and on the cuda backend every peer that can run here."""
    found = {"cudagraphs": ours()}
    if cg.backend() == "cuda":
        for name, make in PEERS.items():
            try:
                fw = make()
            except Exception as exc:  # a peer that cannot run here is reported, not fatal
                print(f"# {name} skipped: {exc}", file=sys.stderr)
                fw = None
            if fw is not None:
                found[name] = fw
    return found


def clean(name: str, sizes: tuple[int, ...], rounds: int) -> dict[str, dict[int, float]] | None:
    """Framework ``name`` measured alone in a fresh child process, as raw C's program measures itself.

    Returns ``{"capture": {n: ms}, "node": {n: µs}}``: capture + instantiate
    (+ upload) time and GPU µs per node of its graphs of each size; None when
    the child fails (reported).
    """
    got = _child(["--clean", name, str(rounds), *map(str, sizes)], name)
    if got is None:
        return None
    return {metric: {int(n): v for n, v in by_n.items()} for metric, by_n in got.items()}


def _child(args: list[str], what: str) -> Any:
    """The JSON a fresh ``python -m cudagraphs.bench.graphs ARGS`` prints last (None: it failed, reported)."""
    command = [sys.executable, "-m", "cudagraphs.bench.graphs", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=dict(os.environ))
    if done.returncode != 0:
        print(f"# {what} measured in a child process failed: {done.stderr[-500:]}", file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def _clean_child(name: str, rounds: int, sizes: tuple[int, ...]) -> dict[str, dict[int, float]]:
    """What :func:`clean` runs in the child: one framework, each size, ``rounds`` times."""
    make = ours if name == "cudagraphs" else PEERS[name]
    build = make()
    if build is None:
        raise RuntimeError(f"{name} cannot run here")
    out: dict[str, dict[int, float]] = {"capture": {}, "node": {}}
    for n in sizes:
        # (no capture before the timed ones: a graph made and dropped unreplayed slowed every
        # later graph's replays by 1.2x on an H100, cuda.core's too; the median skips the first)
        captures, nodes = [], []
        for _ in range(rounds):
            _settle()
            t0 = time.perf_counter()
            replay, sync = build(n)
            captures.append((time.perf_counter() - t0) * 1e3)
            for _ in range(3):
                replay()
            nodes.append(_per_node(replay, sync, n))
            del replay, sync  # (the graph goes before the next is made)
        out["capture"][n] = statistics.median(captures)
        out["node"][n] = statistics.median(nodes)
    return out


def run(rounds: int = 5, sizes: tuple[int, ...] = SIZES) -> dict[str, dict[str, float]]:
    """{benchmark name: {contender: median}} for every size and metric."""
    frameworks_ = frameworks()
    results: dict[str, dict[str, float]] = {}
    clock_us = _clock_us()
    for n in sizes:
        samples: dict[str, dict[str, list[float]]] = {
            m: {f: [] for f in frameworks_} for m in ("capture", "node", "call")
        }
        for _ in range(rounds):
            for fname, build in frameworks_.items():
                _settle()
                t0 = time.perf_counter()
                replay, sync = build(n)
                samples["capture"][fname].append((time.perf_counter() - t0) * 1e3)
                for _ in range(3):
                    replay()
                samples["node"][fname].append(_per_node(replay, sync, n))
                samples["call"][fname].append(call_us(replay, sync, clock_us))
                del replay, sync  # (dropped here, not inside the next contender's timing)
        results[f"capture+instantiate {n} launches (ms)"] = {
            f: statistics.median(v) for f, v in samples["capture"].items()
        }
        results[f"replay per node, {n}-node graph (µs GPU)"] = {
            f: statistics.median(v) for f, v in samples["node"].items()
        }
        results[f"replay call, {n}-node graph (µs CPU)"] = {
            f: statistics.median(v) for f, v in samples["call"].items()
        }
    if cg.backend() == "cuda":  # capture and per node: each framework alone in a fresh process, as raw C
        for n in sizes:
            bench = f"capture+instantiate {n} launches (ms)"
            results[in_process(bench)] = dict(results[bench])
        for fname in frameworks_:
            alone = clean(fname, sizes, rounds) or {}
            for n, ms in alone.get("capture", {}).items():
                results[f"capture+instantiate {n} launches (ms)"][fname] = ms
            for n, us in alone.get("node", {}).items():
                results[f"replay per node, {n}-node graph (µs GPU)"][fname] = us
    n_up = max(sizes)
    updates = update_benchmarks(n_up, rounds)
    if cg.backend() == "cuda":  # and the same alone in a fresh process, as raw C's
        alone = _child(["--clean-update", str(n_up), str(rounds)], "the update benchmarks")
        for bench, by_contender in (alone or {}).items():
            updates[in_process(bench)] = updates[bench]
            updates[bench] = by_contender
    results.update(updates)
    for n, row in raw_c().items():
        if n in sizes:
            results[f"capture+instantiate {n} launches (ms)"]["raw CUDA C"] = row["capture_ms"]
            results[f"replay per node, {n}-node graph (µs GPU)"]["raw CUDA C"] = row["per_node_us"]
            results[f"replay call, {n}-node graph (µs CPU)"]["raw CUDA C"] = row["call_us"]
        if n == n_up and row.get("update_ms") is not None:
            results[f"whole-graph update, {n} nodes (ms)"]["raw CUDA C"] = row["update_ms"]
        if n == n_up and row.get("set_params_us") is not None:  # the floor of a node-by-node change
            results[f"rebind, {n}-node graph (µs per node)"]["raw CUDA C"] = row["set_params_us"]
    return results


def update_benchmarks(n: int, rounds: int) -> dict[str, dict[str, float]]:
    """Whole-graph update of an n-node graph vs capturing and instantiating anew."""
    dev = cg.Device(0)
    k = cg.Kernel(TINY, "inc", host=lambda p: p.__iadd__(1))
    cg.preload([k], dev)
    x = cg.zeros(1, "float32")

    def launches() -> None:
        for _ in range(n):
            k.launch(1, 1, x)

    g = cg.capture(launches)
    update, recapture, capture_only = [], [], []
    for _ in range(rounds):
        _settle()  # (the resources the previous update let go, released before the timing)
        t0 = time.perf_counter()
        source = cg.capture(launches, instantiate=False)
        t1 = time.perf_counter()
        g.update(source)
        t2 = time.perf_counter()
        cg.capture(launches).close()
        t3 = time.perf_counter()
        capture_only.append((t1 - t0) * 1e3)
        update.append((t2 - t1) * 1e3)
        recapture.append((t3 - t2) * 1e3)
    out = {
        f"whole-graph update, {n} nodes (ms)": {"cudagraphs": statistics.median(update)},
        f"capture (no instantiate) + update, {n} nodes (ms)": {
            "cudagraphs": statistics.median(u + c for u, c in zip(update, capture_only))
        },
        f"re-capture + instantiate, {n} nodes (ms)": {"cudagraphs": statistics.median(recapture)},
    }
    x2, times = cg.zeros(1, "float32"), []
    for _ in range(rounds):
        t0 = time.perf_counter()
        g.rebind(x, x2)
        times.append((time.perf_counter() - t0) / n * 1e6)
        x, x2 = x2, x
    out[f"rebind, {n}-node graph (µs per node)"] = {"cudagraphs": statistics.median(times)}
    core = _cuda_core_update(n, rounds)
    if core is not None:
        out[f"whole-graph update, {n} nodes (ms)"]["cuda.core Graph.update"] = core
    g.close()
    return out


def _cuda_core_update(n: int, rounds: int) -> float | None:
    if cg.backend() != "cuda":
        return None
    try:
        from cuda.core import Device, LaunchConfig, Program, ProgramOptions, launch

        dev = Device(0)
        dev.set_current()
        cc = "".join(map(str, cg.Device(0).compute_capability))
        kern = Program(TINY, "c++", ProgramOptions(arch=f"sm_{cc}")).compile("cubin").get_kernel("inc")
        cfg = LaunchConfig(grid=1, block=1)
        y = cg.zeros(1, "float32")
        arg = np.uintp(y.ptr)

        def builder() -> Any:
            gb = dev.create_graph_builder().begin_building()
            for _ in range(n):
                launch(gb, cfg, kern, arg)
            gb.end_building()
            return gb

        graph = builder().complete()
        times = []
        for _ in range(rounds):
            source = builder()
            t0 = time.perf_counter()
            graph.update(source)
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)
    except Exception as exc:  # reported, not fatal
        print(f"# cuda.core Graph.update skipped: {exc}", file=sys.stderr)
        return None


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--clean":  # (see clean)
        name, reps, *ns = sys.argv[2:]
        print(json.dumps(_clean_child(name, int(reps), tuple(map(int, ns)))))
    elif len(sys.argv) > 3 and sys.argv[1] == "--clean-update":  # (see run)
        print(json.dumps(update_benchmarks(int(sys.argv[2]), int(sys.argv[3]))))
    else:
        out: dict[str, Any] = run(rounds=3)
        print(json.dumps(out, indent=2))
