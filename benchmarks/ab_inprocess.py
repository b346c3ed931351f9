"""A/B of the hot paths with both trees in ONE process, interleaved.

Timings of microsecond paths taken in two processes differ by 10-20% for
reasons that are not the code (CPU placement, the driver's threads, heap
layout). Here the earlier tree (``.baseline/src/cudagraphs``, imported as the
package ``cudagraphs_old``) and this one (``src/cudagraphs``) run side by
side in one process, on one CUDA context, alternating within every round.
Each row gives the median over rounds of the per-round ratio new/old: since
a raw C baseline is the same for both, that ratio is also the change of the
row's ratio to raw C.

Usage: PYTHONPATH=src python benchmarks/ab_inprocess.py [ROUNDS] [OLD_SRC]
(AB_NOGC=1 in the environment disables the garbage collector after setup.)
"""

from __future__ import annotations

import gc
import importlib.util
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

TINY = 'extern "C" __global__ void inc(float* p) { p[0] += 1.0f; }'


def load_old(src: Path) -> ModuleType:
    root = src / "cudagraphs"
    spec = importlib.util.spec_from_file_location(
        "cudagraphs_old", root / "__init__.py", submodule_search_locations=[str(root)]
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["cudagraphs_old"] = module
    spec.loader.exec_module(module)
    return module


def workloads(cg: ModuleType) -> dict[str, tuple[Callable[[], None], int, str]]:
    """Name -> (one call, calls per sample, unit)."""
    dev = cg.Device(0)
    k = cg.Kernel(TINY, "inc", host=lambda p: p.__iadd__(1))
    cg.preload([k], dev)
    x, z = cg.zeros(1, "float32"), cg.zeros(1, "float32")
    cg.ops.add(x, z, out=x)
    with cg.capture() as g10:
        for _ in range(10):
            k.launch(1, 1, x)
    g10.upload()
    keep = [g10]

    def capture(n: int) -> Callable[[], None]:
        def run() -> None:
            with cg.capture() as g:
                for _ in range(n):
                    k.launch(1, 1, x)
            g.close()

        return run

    def phase(n: int, which: int) -> Callable[[], None]:
        """A capture of n launches that reports one phase: 0 launches, 1 end, 2 close (ms)."""

        def run() -> None:
            t = [0.0] * 4
            with cg.capture() as g:
                t[0] = time.perf_counter()
                for _ in range(n):
                    k.launch(1, 1, x)
                t[1] = time.perf_counter()
            t[2] = time.perf_counter()
            g.close()
            t[3] = time.perf_counter()
            run.last = (t[which + 1] - t[which]) * 1e3  # type: ignore[attr-defined]

        return run

    def launches1000() -> None:
        for _ in range(1000):
            k.launch(1, 1, x)

    target, rebound = cg.capture(launches1000), cg.capture(launches1000)
    keep += [target, rebound]
    pair = [x, cg.zeros(1, "float32")]

    def update() -> None:  # times g.update(source) alone
        source = cg.capture(launches1000, instantiate=False)
        t0 = time.perf_counter()
        target.update(source)
        update.last = (time.perf_counter() - t0) * 1e3  # type: ignore[attr-defined]

    def rebind() -> None:  # µs per node
        t0 = time.perf_counter()
        rebound.rebind(pair[0], pair[1])
        rebind.last = (time.perf_counter() - t0) * 1e3  # type: ignore[attr-defined]
        pair.reverse()

    def replay() -> None:
        g10.replay()
        dev.synchronize()

    def replay_call() -> None:  # host time of one call, while the GPU has room in its queue
        dev.synchronize()
        single = []
        for _ in range(20):
            t0 = time.perf_counter()
            g10.replay()
            single.append(time.perf_counter() - t0)
        dev.synchronize()
        replay_call.last = statistics.median(single) * 1e6  # type: ignore[attr-defined]

    def step(a: object) -> object:
        k.launch(1, 1, a)
        return a

    f = cg.graphed(step)
    xg = cg.zeros(1, "float32")
    for _ in range(3):  # eager, capture, replay: then repeat calls
        f(xg)
    keep.append(f)

    out = {
        "eager Kernel.launch (us)": (lambda: k.launch(1, 1, x), 5000, "us"),
        "graphed call, 1 input (us)": (lambda: f(xg), 5000, "us"),
        "eager ops.add (us)": (lambda: cg.ops.add(x, z, out=x), 5000, "us"),
        "cg.empty + free (us)": (lambda: cg.empty(128, "float32"), 5000, "us"),
        "replay+sync, 10 nodes (us)": (replay, 1000, "us"),
        "replay call, 10 nodes (us CPU)": (replay_call, 1, "median"),
        "capture+instantiate 100 (ms)": (capture(100), 5, "ms"),
        "capture+instantiate 1000 (ms)": (capture(1000), 2, "ms"),
        "capture 1000: the launches (ms)": (phase(1000, 0), 1, "median"),
        "capture 1000: end + instantiate (ms)": (phase(1000, 1), 1, "median"),
        "capture 1000: close (ms)": (phase(1000, 2), 1, "median"),
        "whole-graph update, 1000 nodes (ms)": (update, 1, "median"),
        "rebind, 1000-node graph (µs per node)": (rebind, 1, "median"),
    }
    out["_keep"] = (lambda: keep, 0, "")  # type: ignore[assignment]
    return out


def sample(call: Callable[[], None], n: int, unit: str, sync: Callable[[], None]) -> float:
    if unit == "median":  # the call times itself
        call()
        return call.last  # type: ignore[attr-defined,no-any-return]
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        call()
    sync()
    return (time.perf_counter() - t0) / n * (1e6 if unit == "us" else 1e3)


def main(argv: list[str]) -> int:
    rounds = int(argv[0]) if argv else 15
    old_src = Path(argv[1]) if len(argv) > 1 else Path(".baseline/src")
    import cudagraphs as new

    old = load_old(old_src)
    trees = {"old": (old, workloads(old)), "new": (new, workloads(new))}
    names = [n for n in trees["new"][1] if not n.startswith("_")]
    times: dict[str, dict[str, list[float]]] = {n: {"old": [], "new": []} for n in names}
    for name in names:  # warm up
        for cg, w in trees.values():
            call, n, unit = w[name]
            sample(call, max(n // 5, 1), unit, cg.Device(0).synchronize)
    if os.environ.get("AB_NOGC"):
        gc.collect()
        gc.disable()
    for r in range(rounds):
        order = ("old", "new") if r % 2 == 0 else ("new", "old")
        for name in names:
            for tree in order:
                cg, w = trees[tree]
                call, n, unit = w[name]
                times[name][tree].append(sample(call, n, unit, cg.Device(0).synchronize))
    print(
        f"{rounds} rounds, gc {'off' if os.environ.get('AB_NOGC') else 'on'}, "
        f"old = {old.__file__}, new = {new.__file__}"
    )
    print("| row | old (median) | new (median) | new/old (median of per-round ratios) |")
    print("|---|---|---|---|")
    for name in names:
        o, n_ = times[name]["old"], times[name]["new"]
        ratio = statistics.median(b / a for a, b in zip(o, n_))
        print(f"| {name} | {statistics.median(o):.3f} | {statistics.median(n_):.3f} | {ratio:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
