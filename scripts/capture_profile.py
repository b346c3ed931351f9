"""Profile capture + instantiate of N one-thread launches (run with PYTHONPATH
pointing at the tree to profile). Prints the median time and the top
functions by own time, driver calls included."""
import cProfile
import pstats
import statistics
import sys
import time

import cudagraphs as cg

N = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
dev = cg.Device(0)
k = cg.Kernel('extern "C" __global__ void inc(float* p) { p[0] += 1.0f; }', "inc",
              host=lambda p: p.__iadd__(1))
cg.preload([k], dev)
x = cg.zeros(1, "float32")


def once() -> float:
    t0 = time.perf_counter()
    with cg.capture() as g:
        for _ in range(N):
            k.launch(1, 1, x)
    t = time.perf_counter() - t0
    g.close()
    return t * 1e3


once()
print(f"capture+instantiate {N}: {statistics.median(once() for _ in range(9)):.2f} ms")
t0 = time.perf_counter()
for _ in range(N):
    k.launch(1, 1, x)
dev.synchronize()
print(f"eager {N} launches: {(time.perf_counter() - t0) * 1e3:.2f} ms")
prof = cProfile.Profile()
prof.enable()
once()
prof.disable()
pstats.Stats(prof).sort_stats("tottime").print_stats(10)
