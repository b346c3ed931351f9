"""Capture + instantiate of N one-thread launches at two sizes, and eager
per-call costs, for whichever tree is on PYTHONPATH (run old and new in one
machine session to compare). Medians of 7; prints ms or µs."""
import statistics
import time

import cudagraphs as cg

dev = cg.Device(0)
k = cg.Kernel('extern "C" __global__ void inc(float* p) { p[0] += 1.0f; }', "inc",
              host=lambda p: p.__iadd__(1))
cg.preload([k], dev)
x, z = cg.zeros(1, "float32"), cg.zeros(1, "float32")
cg.ops.add(x, z, out=x)


def capture_ms(n: int) -> float:
    def once() -> float:
        t0 = time.perf_counter()
        with cg.capture() as g:
            for _ in range(n):
                k.launch(1, 1, x)
        t = time.perf_counter() - t0
        g.close()
        return t * 1e3
    once()
    return statistics.median(once() for _ in range(7))


def per_call_us(fn, n: int = 20000) -> float:
    fn()
    dev.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    dev.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


for n in (100, 1000):
    print(f"capture+instantiate {n:5d}: {capture_ms(n):8.2f} ms")
print(f"eager Kernel.launch  {per_call_us(lambda: k.launch(1, 1, x)):6.2f} us")
print(f"eager ops.add        {per_call_us(lambda: cg.ops.add(x, z, out=x)):6.2f} us")
print(f"cg.empty + free      {per_call_us(lambda: cg.empty(128, 'float32')):6.2f} us")
