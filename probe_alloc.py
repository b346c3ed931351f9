"""Scratch probe (deleted after): the allocation pair on the GPU, against CuPy."""

import time

import cupy as cp

import cudagraphs as cg
from cudagraphs import _fastcall as fast

dev = cg.Device(0)
al = dev.allocator


def t(fn, n=100000):
    """Best of 7 rounds, µs per call."""
    best = 1e9
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


cg.empty(128, "float32")
rows = {
    "cg.empty + del": lambda: cg.empty(128, "float32"),
    "fast_empty + del": lambda: fast.fast_empty(128, "float32"),
    "raw pair": lambda: al.raw_free(al.raw_malloc(512)),
    "CuPy cuda.alloc + del": lambda: cp.cuda.alloc(512),
}
before = fast.alloc_calls()
for _ in range(2):
    for k, fn in rows.items():
        print(f"{k:24s} {t(fn):7.3f} us")
print("made in C:", fast.alloc_calls() - before)
