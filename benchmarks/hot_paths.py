"""The library's hot paths, timed or profiled.

For whichever tree is on PYTHONPATH (run an earlier tree and this one in one
machine session to compare; benchmarks/ab_inprocess.py compares them in one
process).

Usage:
  python benchmarks/hot_paths.py                  capture+instantiate of 100 and 1000 launches
                                                  (medians of 7, ms), eager per-call costs (µs)
  python benchmarks/hot_paths.py profile capture  cProfile of one capture of 1000 launches
  python benchmarks/hot_paths.py profile launch   cProfile of 20000 eager launches
  (also: profile capture100 | empty | add, optionally a pstats sort key)
"""

import cProfile
import pstats
import statistics
import sys
import time

import cudagraphs as cg

dev = cg.Device(0)
k = cg.Kernel(
    'extern "C" __global__ void inc(float* p) { p[0] += 1.0f; }', "inc", host=lambda p: p.__iadd__(1)
)
cg.preload([k], dev)
x, z = cg.zeros(1, "float32"), cg.zeros(1, "float32")
cg.ops.add(x, z, out=x)


def capture(n: int) -> float:
    """Milliseconds to capture and instantiate ``n`` launches."""
    t0 = time.perf_counter()
    with cg.capture() as g:
        for _ in range(n):
            k.launch(1, 1, x)
    t = time.perf_counter() - t0
    g.close()
    return t * 1e3


def per_call_us(fn, n: int = 20000, rounds: int = 5) -> float:
    """Microseconds per call of ``fn``: the median of ``rounds`` timings of ``n`` calls."""
    for _ in range(200):
        fn()
    dev.synchronize()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        dev.synchronize()
        times.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(times)


def launches(n: int = 20000) -> None:
    for _ in range(n):
        k.launch(1, 1, x)
    dev.synchronize()


def main(argv: list[str]) -> None:
    if argv[:1] == ["profile"]:
        work = {
            "capture": lambda: capture(1000),
            "capture100": lambda: [capture(100) for _ in range(10)],
            "launch": launches,
            "empty": lambda: [cg.empty(128, "float32") for _ in range(20000)],
            "add": lambda: [cg.ops.add(x, z, out=x) for _ in range(20000)],
        }[argv[1]]
        work()
        prof = cProfile.Profile()
        prof.enable()
        work()
        prof.disable()
        pstats.Stats(prof).sort_stats(argv[2] if len(argv) > 2 else "tottime").print_stats(14)
        return
    for n in (100, 1000):
        capture(n)
        print(f"capture+instantiate {n:5d}: {statistics.median(capture(n) for _ in range(7)):8.2f} ms")
    # the rows of docs/architecture.md's "The compiled part" (run once with the C part and once
    # with CUDAGRAPHS_FASTCALL=0, which keeps every C path off)
    with cg.capture() as g:
        cg.ops.add(x, z, out=x)
    g.upload()
    a, y = cg.ones(256, "float32"), cg.zeros(256, "float32")
    f = cg.graphed(lambda v: cg.ops.scale(2.0, v))
    f(a)
    with cg.capture() as g2:
        cg.ops.scale(2.0, a, out=y)
    print(f"eager Kernel.launch  {per_call_us(lambda: k.launch(1, 1, x)):6.2f} us")
    print(f"eager ops.add        {per_call_us(lambda: cg.ops.add(x, z, out=x)):6.2f} us")
    print(f"cg.empty + free      {per_call_us(lambda: cg.empty(128, 'float32')):6.2f} us")
    print(f"Graph.replay         {per_call_us(g.replay):6.2f} us")
    print(f"graphed call         {per_call_us(lambda: f(a)):6.2f} us")
    print(f"rebind + replay      {per_call_us(lambda: (g2.rebind(y, y), g2.replay())):6.2f} us")


if __name__ == "__main__":
    main(sys.argv[1:])
