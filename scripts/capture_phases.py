"""Where a capture's time goes: enter, the launches, exit (end + instantiate), close.

Medians of 30 captures of 1, 100 and 1000 one-thread launches, in µs, for
whichever tree is on PYTHONPATH. ``nogc`` as an argument disables the
garbage collector (to tell its share apart).

Usage: PYTHONPATH=src python scripts/capture_phases.py [nogc]
"""

import gc
import statistics
import sys
import time

import cudagraphs as cg

k = cg.Kernel(
    'extern "C" __global__ void inc(float* p) { p[0] += 1.0f; }', "inc", host=lambda p: p.__iadd__(1)
)
x = cg.zeros(1, "float32")
k.launch(1, 1, x)


def capture(n: int) -> tuple[float, float, float, float]:
    t0 = time.perf_counter()
    with cg.capture() as g:
        t1 = time.perf_counter()
        for _ in range(n):
            k.launch(1, 1, x)
        t2 = time.perf_counter()
    t3 = time.perf_counter()
    g.close()
    del g
    t4 = time.perf_counter()
    return t1 - t0, t2 - t1, t3 - t2, t4 - t3


if "nogc" in sys.argv:
    gc.disable()
print(f"{cg.__file__}: µs per phase (enter, launches, exit, close+del)")
for n in (1, 100, 1000):
    for _ in range(3):
        capture(n)
    phases = list(zip(*[capture(n) for _ in range(30)]))
    print(f"{n:5d} " + " ".join(f"{statistics.median(p) * 1e6:9.1f}" for p in phases))
