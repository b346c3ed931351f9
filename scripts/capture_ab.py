"""A/B on a GPU: capture + instantiate of N launches with the ctypes capture-info
read-back vs the cuda.bindings one (prints ms per capture, medians of 7)."""
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


fast = dev.backend._fast_info
for label, impl in (("ctypes", fast), ("bindings", None), ("ctypes", fast), ("bindings", None)):
    dev.backend._fast_info = impl
    once()
    print(f"capture+instantiate {N}: {label:9s} {statistics.median(once() for _ in range(7)):.2f} ms")
dev.backend._fast_info = fast
with cg.capture() as g:
    for _ in range(3):
        k.launch(1, 1, x)
g.set_arg(1, "p", x)  # a node handle read back by the fast path, used by an exec update
g.replay()
print("replay after set_arg:", x.get()[0] == 3.0)
