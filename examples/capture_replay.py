"""Capture once, replay many times: a small launch-bound step loop as a graph.

Shows the safety features: a DeviceScalar changed between replays, a
HostSlot read on every replay, host data snapshotted at capture, memory from
the graph's pool, inputs kept alive by the graph. Checks everything against
numpy and prints OK. Runs on a GPU when one answers, else on the simulator.
"""

import gc
import time

import numpy as np

import cudagraphs as cg

rng = np.random.default_rng(0)
dev = cg.Device(0)
print("backend:", cg.backend())
n, steps = 1 << 12, 20
cg.ops.preload_dtypes(["float32"])  # optional: compile now, not on first use (legal in a capture too)

x = cg.asarray(rng.standard_normal(n).astype(np.float32))
state = cg.zeros(n, "float32")
dt = cg.DeviceScalar(0.01)  # changed between replays, read on the device
forcing = cg.HostSlot(n, "float32")  # pinned: each replay copies its current contents
bias = rng.standard_normal(n).astype(np.float32)

with cg.capture() as step:
    f = cg.empty(n, "float32")  # from the graph's private pool
    f.set(forcing)  # host -> device at replay time
    b = cg.asarray(bias)  # host data: snapshot taken now, owned by the graph
    for _ in range(steps):
        cg.ops.axpy(dt, x, state)  # state += dt * x
        cg.ops.axpy(dt, f, state)  # state += dt * forcing
    cg.ops.add(state, b, out=state)
print(step.summary())

bias[:] = 0  # too late: the graph holds its own copy
del x, b  # the graph keeps x alive
gc.collect()

# numpy reference: the same draws from the same seed
ref_rng = np.random.default_rng(0)
x_host = ref_rng.standard_normal(n).astype(np.float32)
bias_ref = ref_rng.standard_normal(n).astype(np.float32)
ref = np.zeros(n, np.float32)
for k in range(5):
    v, force = 0.01 * (k + 1), rng.standard_normal(n).astype(np.float32)
    dt.set(v)
    forcing.array[...] = force
    step.replay()
    dev.stream.synchronize()  # the slot is read when the replay runs
    for _ in range(steps):
        ref = (np.float32(v) * x_host + ref).astype(np.float32)
        ref = (np.float32(v) * force + ref).astype(np.float32)
    ref = ref + bias_ref
assert np.allclose(state.get(), ref, rtol=1e-4, atol=1e-4), np.abs(state.get() - ref).max()

# timing: the same work eagerly and as one replay
x2 = cg.asarray(x_host)
dev.synchronize()
t0 = time.perf_counter()
for _ in range(steps):
    cg.ops.axpy(dt, x2, state)
    cg.ops.axpy(dt, x2, state)
dev.synchronize()
eager = time.perf_counter() - t0
t0 = time.perf_counter()
step.replay()
dev.synchronize()
graph = time.perf_counter() - t0
print(
    f"{2 * steps + 1} kernels: eager {eager * 1e6:.0f} us, one replay {graph * 1e6:.0f} us"
    + (" (simulated)" if cg.backend() == "sim" else "")
)
step.close()
print("OK")
