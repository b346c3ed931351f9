"""Quickstart: device arrays, views, built-in ops, a custom kernel, async copies.

Runs on a GPU when one answers, else on the CPU simulator; checks every
result against numpy and prints OK.
"""

import numpy as np

import cudagraphs as cg

rng = np.random.default_rng(0)
print("backend:", cg.backend())

# arrays: from numpy, views share memory
x_h = rng.standard_normal((256, 64)).astype(np.float32)
x = cg.asarray(x_h)
y = cg.zeros_like(x)

# built-in ops (all work on strided views too)
cg.ops.axpy(2.0, x, y)  # y += 2 x
cg.ops.scale(0.5, x[::2], out=y[1::2])  # odd rows of y = half the even rows of x
expect = 2 * x_h
expect[1::2] = 0.5 * x_h[::2]
assert np.allclose(y.get(), expect)

# a custom kernel: CUDA C for the GPU, a numpy reference for the simulator
source = r"""
extern "C" __global__ void clamp(float* v, float lo, float hi, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) v[i] = fminf(fmaxf(v[i], lo), hi);
}
"""
clamp = cg.Kernel(source, "clamp", host=lambda v, lo, hi, n: np.clip(v, lo, hi, out=v))
cg.preload([clamp])
flat = y.reshape(-1)
clamp.launch(-(-flat.size // 256), 256, flat, -1.0, 1.0, flat.size)

# a pipelined copy back: runs on the copy stream while the compute stream continues
pending = y.get_async()
cg.ops.fill(x, 0.0)
assert np.allclose(pending.result(), np.clip(expect, -1, 1))
print("allocator:", cg.Device(0).allocator.stats())
print("OK")
