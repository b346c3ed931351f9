"""Jacobi iteration whose loop runs entirely on the device, in a while node.

Solves A x = b for a diagonally dominant A. Each iteration is a Jacobi step,
a convergence check and a copy; the check sets the loop's condition on the
device, so one graph replay runs every iteration with no host round trip.
Compared with numpy.linalg.solve and timed against the eager loop that reads
the convergence flag back to the host after every iteration. Prints OK.
"""

import time

import numpy as np

import cudagraphs as cg
from cudagraphs.demo import jacobi_kernels, jacobi_shape

# the two kernels (CUDA C++ with numpy references for the simulator): a Jacobi
# step, and a one-block check that counts iterations and writes go[0] = 1
# while the update is above the tolerance; see cudagraphs/demo.py
jacobi, check = jacobi_kernels()

n, tol, max_iterations = 256, 1e-9, 5000
rng = np.random.default_rng(0)
A_h = rng.uniform(0.0, 1.0, (n, n))
# strictly diagonally dominant, barely: Jacobi converges, in a few hundred steps
A_h[np.diag_indices(n)] = 1.05 * (A_h.sum(axis=1) - np.diag(A_h))
b_h = rng.standard_normal(n)
print("backend:", cg.backend())

A, b = cg.asarray(A_h), cg.asarray(b_h)
x, x_new = cg.zeros(n), cg.zeros(n)
go, iterations = cg.zeros(1, "int32"), cg.zeros(1, "int32")
grid, block = jacobi_shape(n)  # one warp per row of A
cg.preload([jacobi, check])
cg.ops.preload_dtypes(["float64", "int32"])

with cg.capture() as solve:
    running = solve.condition(default=1)
    with solve.while_loop(running):
        jacobi.launch(grid, block, x_new, x, A, b, n)
        check.launch(1, 256, x_new, x, go, iterations, tol, max_iterations, n)
        cg.ops.copy(x, x_new)
        cg.ops.set_condition(running, go)
print(solve.summary())

solve.upload()
cg.Device(0).synchronize()
t0 = time.perf_counter()
solve.replay()
graph_iterations = int(iterations.get()[0])  # waits for the replay
t_graph = time.perf_counter() - t0
exact = np.linalg.solve(A_h, b_h)
x_graph = x.get()
assert np.allclose(x_graph, exact, rtol=0, atol=1e-8), np.abs(x_graph - exact).max()
assert 0 < graph_iterations < max_iterations

# the same iteration eagerly: the host reads the flag after every step
x.set(np.zeros(n))
iterations.set(np.zeros(1, np.int32))
t0 = time.perf_counter()
while True:
    jacobi.launch(grid, block, x_new, x, A, b, n)
    check.launch(1, 256, x_new, x, go, iterations, tol, max_iterations, n)
    cg.ops.copy(x, x_new)
    if go.get()[0] == 0:
        break
t_eager = time.perf_counter() - t0
assert int(iterations.get()[0]) == graph_iterations
assert np.allclose(x.get(), x_graph, rtol=0, atol=1e-12)

note = " (simulated)" if cg.backend() == "sim" else ""
print(
    f"{graph_iterations} Jacobi iterations on n={n}: eager with host checks "
    f"{t_eager * 1e3:.2f} ms, one graph replay {t_graph * 1e3:.2f} ms "
    f"({t_eager / t_graph:.1f}x){note}"
)
print("OK")
