"""A/B on a GPU, one process: capture + instantiate of N launches with the
node read-back after each captured op (ctypes / cuda.bindings / stubbed out),
at two sizes, and eager per-call costs. Medians of 7; prints ms or µs."""
import statistics
import sys
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


backend = dev.backend
real = backend.capture_info
fast = getattr(backend, "_fast_info", None)
variants = {"read-back": None}
if fast is not None:
    variants = {"ctypes": fast, "bindings": None}
for n in (100, 1000):
    for label, impl in variants.items():
        if fast is not None:
            backend._fast_info = impl
        print(f"capture+instantiate {n:5d}: {label:9s} {capture_ms(n):8.2f} ms")
    if fast is not None:
        backend._fast_info = fast
        backend.capture_info = lambda s: ("active", [None])
        print(f"capture+instantiate {n:5d}: {'stubbed':9s} {capture_ms(n):8.2f} ms")
        backend.capture_info = real
print(f"eager Kernel.launch  {per_call_us(lambda: k.launch(1, 1, x)):6.2f} us")
print(f"eager ops.add        {per_call_us(lambda: cg.ops.add(x, z, out=x)):6.2f} us")
print(f"cg.empty + free      {per_call_us(lambda: cg.empty(128, 'float32')):6.2f} us")
