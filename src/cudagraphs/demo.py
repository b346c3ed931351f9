"""The flagship demo (``cudagraphs demo`` / ``make demo``): launch-bound work, eager vs graph.

Two workloads users recognise, each run eagerly and as a graph, checked
against numpy, and timed:

* **Jacobi solve** of a linear system, the whole iteration inside one
  device-side while node (no host round trip per iteration);
* **MLP decode step**: a deep, narrow network (6 layers of width 64, as in
  small-batch decoding) applied token after token, one captured step
  replayed per token. Matmuls go through ``cg.ops.matmul`` (cuBLASLt, with
  the ``blas`` extra), else through a naive cudagraphs kernel;
* **GPT decoder** (on a GPU with PyTorch): a 4-layer, width-256 decoder
  written in PyTorch with a static KV cache, decoding greedily token after
  token, eagerly and through :class:`cudagraphs.GraphModule`.

On the ``sim`` backend the sizes are small and the timings are simulated.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import cudagraphs as cg

__all__ = [
    "EXAMPLES",
    "JACOBI_SOURCE",
    "build_jacobi",
    "build_mlp",
    "jacobi_kernels",
    "jacobi_shape",
    "main",
]

JACOBI_SOURCE = r"""
// one warp per row of the row-major A: its lanes read consecutive elements
// (coalesced), then add their partial sums with shuffles
extern "C" __global__ void jacobi_step(double* x_new, const double* x, const double* A,
                                       const double* b, int n) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= n) return;  // (the whole warp: row is the same for its lanes)
    const double* a = A + (long long)row * n;
    double s = 0.0;
    for (int j = lane; j < n; j += 32) s += a[j] * x[j];
    for (int offset = 16; offset > 0; offset /= 2) s += __shfl_down_sync(0xffffffffu, s, offset);
    if (lane == 0) x_new[row] = (b[row] - s + a[row] * x[row]) / a[row];
}

// one block: max |x_new - x|, the iteration count, and whether to go on
extern "C" __global__ void converged(const double* x_new, const double* x, int* go,
                                     int* iterations, double tol, int max_iterations, int n) {
    __shared__ double worst[256];
    double m = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) m = fmax(m, fabs(x_new[i] - x[i]));
    worst[threadIdx.x] = m;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s /= 2) {
        if (threadIdx.x < s) worst[threadIdx.x] = fmax(worst[threadIdx.x], worst[threadIdx.x + s]);
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        int it = iterations[0] + 1;
        iterations[0] = it;
        go[0] = (worst[0] > tol && it < max_iterations) ? 1 : 0;
    }
}
"""

MLP_SOURCE = r"""
// y = act(W x + b) for one vector: one thread per output row
extern "C" __global__ void dense(float* y, const float* W, const float* x, const float* b,
                                 int rows, int cols, int act) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows) return;
    float s = b[i];
    for (int j = 0; j < cols; ++j) s += W[(long long)i * cols + j] * x[j];
    y[i] = act == 1 ? fmaxf(s, 0.0f) : (act == 2 ? tanhf(s) : s);
}

// y = act(y + b), after a matmul wrote y = W x
extern "C" __global__ void bias_act(float* y, const float* b, int rows, int act) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows) return;
    float s = y[i] + b[i];
    y[i] = act == 1 ? fmaxf(s, 0.0f) : (act == 2 ? tanhf(s) : s);
}
"""


def _jacobi_step_host(x_new: np.ndarray, x: np.ndarray, A: np.ndarray, b: np.ndarray, n: Any) -> None:
    m = A.reshape(n, n)
    d = np.diag(m)
    x_new[:n] = (b[:n] - m @ x[:n] + d * x[:n]) / d


def _converged_host(
    x_new: np.ndarray,
    x: np.ndarray,
    go: np.ndarray,
    iterations: np.ndarray,
    tol: Any,
    max_iterations: Any,
    n: Any,
) -> None:
    iterations[0] += 1
    go[0] = int(np.max(np.abs(x_new[:n] - x[:n])) > tol and iterations[0] < max_iterations)


def _dense_host(
    y: np.ndarray, W: np.ndarray, x: np.ndarray, b: np.ndarray, rows: Any, cols: Any, act: Any
) -> None:
    s = (W.reshape(rows, cols) @ x[:cols] + b[:rows]).astype(np.float32)
    y[:rows] = np.maximum(s, 0) if act == 1 else (np.tanh(s) if act == 2 else s)


def _bias_act_host(y: np.ndarray, b: np.ndarray, rows: Any, act: Any) -> None:
    s = (y[:rows] + b[:rows]).astype(np.float32)
    y[:rows] = np.maximum(s, 0) if act == 1 else (np.tanh(s) if act == 2 else s)


def jacobi_shape(n: int) -> tuple[int, int]:
    """(grid, block) of the Jacobi step for ``n`` rows: one warp a row, 4 rows a block."""
    block = 128
    return -(-n // (block // 32)), block


def jacobi_kernels() -> tuple[cg.Kernel, cg.Kernel]:
    """The Jacobi step and the convergence check (with numpy references)."""
    return (
        cg.Kernel(JACOBI_SOURCE, "jacobi_step", host=_jacobi_step_host),
        cg.Kernel(JACOBI_SOURCE, "converged", host=_converged_host),
    )


def _time(fn: Callable[[], Any], device: cg.Device) -> float:
    device.synchronize()
    t0 = time.perf_counter()
    fn()
    device.synchronize()
    return time.perf_counter() - t0


def _progress(label: str, done: int, total: int, started: float) -> None:
    """A progress bar on stderr, once the work has run for over two seconds."""
    if time.perf_counter() - started < 2.0:
        return
    width = 30
    filled = int(width * done / max(total, 1))
    end = "\n" if done >= total else ""
    print(
        f"\r  {label:<18} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}",
        end=end,
        file=sys.stderr,
        flush=True,
    )


def build_jacobi(n: int, device: cg.Device) -> tuple[cg.Graph, dict[str, Any]]:
    """The Jacobi solve as a graph (one while node), with its problem and arrays."""
    step, check = jacobi_kernels()
    rng = np.random.default_rng(0)
    A_h = rng.uniform(0.0, 1.0, (n, n))
    A_h[np.diag_indices(n)] = 1.05 * (A_h.sum(axis=1) - np.diag(A_h))
    b_h = rng.standard_normal(n)
    tol, max_iterations = 1e-9, 5000
    A, b = cg.asarray(A_h), cg.asarray(b_h)
    x, x_new = cg.zeros(n), cg.zeros(n)
    go, iterations = cg.zeros(1, "int32"), cg.zeros(1, "int32")
    grid, block = jacobi_shape(n)
    cg.preload([step, check], device)

    def one_iteration() -> None:
        step.launch(grid, block, x_new, x, A, b, n)
        check.launch(1, 256, x_new, x, go, iterations, tol, max_iterations, n)
        cg.ops.copy(x, x_new)

    with cg.capture() as solve:
        running = solve.condition(default=1)
        with solve.while_loop(running):
            one_iteration()
            cg.ops.set_condition(running, go)
    return solve, {
        "A": A_h,
        "b": b_h,
        "x": x,
        "go": go,
        "iterations": iterations,
        "one_iteration": one_iteration,
        "max_iterations": max_iterations,
    }


def jacobi_demo(n: int, device: cg.Device) -> dict[str, Any]:
    """Solve A x = b by Jacobi, eagerly (host checks) and in one while node."""
    solve, p = build_jacobi(n, device)
    x, go, iterations, one_iteration = p["x"], p["go"], p["iterations"], p["one_iteration"]
    max_iterations, A_h, b_h = p["max_iterations"], p["A"], p["b"]
    solve.upload()

    def eager() -> None:
        started = time.perf_counter()
        while True:
            one_iteration()
            if go.get()[0] == 0:  # the host decides: a copy and a wait per iteration
                break
            if time.perf_counter() - started > 2.0:  # (no second copy per iteration before)
                _progress("jacobi (eager)", int(iterations.get()[0]), max_iterations, started)

    t_eager = _time(eager, device)
    steps = int(iterations.get()[0])
    x_eager = x.get()
    x.set(np.zeros(n))
    iterations.set(np.zeros(1, np.int32))
    t_graph = _time(solve.replay, device)
    exact = np.linalg.solve(A_h, b_h)
    ok = (
        int(iterations.get()[0]) == steps
        and np.allclose(x.get(), exact, atol=1e-7)
        and np.allclose(x_eager, exact, atol=1e-7)
    )
    solve.close()
    return {
        "name": f"Jacobi solve, n={n}",
        "steps": f"{steps} iterations",
        "eager": t_eager,
        "graph": t_graph,
        "ok": ok,
    }


def _matmul_dense(device: cg.Device) -> Callable[..., None] | None:
    """A dense layer as ``cg.ops.matmul`` (cuBLASLt on a GPU) and a bias+activation kernel.

    None where the matmul cannot run here (the cuda backend without the
    ``blas`` extra).
    """
    probe = cg.ones((2, 2), "float32", device=device)
    try:
        cg.ops.matmul(probe, probe)
    except (ImportError, cg.CudaGraphsError) as exc:
        print(f"  (cg.ops.matmul unavailable, using a cudagraphs kernel: {exc})", file=sys.stderr)
        return None
    kernel = cg.Kernel(MLP_SOURCE, "bias_act", host=_bias_act_host)
    cg.preload([kernel], device)

    def dense(y: cg.DeviceArray, W: cg.DeviceArray, x: cg.DeviceArray, b: cg.DeviceArray, act: int) -> None:
        rows, cols = W.shape
        cg.ops.matmul(W, x.reshape(cols, 1), out=y.reshape(rows, 1))
        kernel.launch(-(-rows // 128), 128, y, b, rows, act)

    return dense


def build_mlp(d: int, device: cg.Device, layers: int = 6) -> tuple[cg.Graph, dict[str, Any]]:
    """One decode step of a ``layers``-deep MLP of width ``d`` as a graph."""
    kernel = cg.Kernel(MLP_SOURCE, "dense", host=_dense_host)
    cg.preload([kernel], device)
    rng = np.random.default_rng(1)
    weights = [(rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32) for _ in range(layers)]
    biases = [(rng.standard_normal(d) * 0.1).astype(np.float32) for _ in range(layers)]
    x0 = rng.standard_normal(d).astype(np.float32)
    Ws, bs = [cg.asarray(w) for w in weights], [cg.asarray(b) for b in biases]
    x, tmp = cg.asarray(x0), cg.zeros(d, "float32")

    def ours(y: cg.DeviceArray, W: cg.DeviceArray, v: cg.DeviceArray, bias: cg.DeviceArray, act: int) -> None:
        rows, cols = W.shape
        kernel.launch(-(-rows // 128), 128, y, W, v, bias, rows, cols, act)

    engine, dense = "cudagraphs kernels", ours
    matmul_dense = _matmul_dense(device)
    if matmul_dense is not None:
        engine, dense = "cg.ops.matmul", matmul_dense

    def step() -> None:
        # ping-pong between x and tmp; an even number of layers ends in x
        for i in range(layers):
            src, dst = (x, tmp) if i % 2 == 0 else (tmp, x)
            dense(dst, Ws[i], src, bs[i], 2 if i == layers - 1 else 1)

    step()  # warm up (matmul plans, kernels) outside the capture
    x.set(x0)
    with cg.capture() as decode:
        step()
    return decode, {"weights": weights, "biases": biases, "x0": x0, "x": x, "step": step, "engine": engine}


def mlp_demo(d: int, tokens: int, device: cg.Device) -> dict[str, Any]:
    """A deep, narrow MLP applied token after token: eager launches vs one replay per token."""
    decode, p = build_mlp(d, device)
    x, x0, step, engine = p["x"], p["x0"], p["step"], p["engine"]
    decode.upload()

    def eager() -> None:
        started = time.perf_counter()
        for t in range(tokens):
            step()
            _progress("mlp (eager)", t + 1, tokens, started)

    def replayed() -> None:
        started = time.perf_counter()
        for t in range(tokens):
            decode.replay()
            _progress("mlp (graph)", t + 1, tokens, started)

    t_eager = _time(eager, device)
    x_eager = x.get()
    x.set(x0)
    t_graph = _time(replayed, device)
    ref = x0.copy()
    layers = len(p["weights"])
    for _ in range(tokens):
        for i, (W, b) in enumerate(zip(p["weights"], p["biases"])):
            s = (W @ ref + b).astype(np.float32)
            ref = np.tanh(s) if i == layers - 1 else np.maximum(s, 0)
    ok = np.allclose(x.get(), ref, atol=1e-3) and np.allclose(x_eager, ref, atol=1e-3)
    decode.close()
    return {
        "name": f"MLP decode, {layers}x{d} ({engine})",
        "steps": f"{tokens} tokens",
        "eager": t_eager,
        "graph": t_graph,
        "ok": ok,
    }


def decoder_demo(tokens: int, device: cg.Device) -> dict[str, Any] | None:
    """A 4-layer GPT-style decoder in PyTorch, decoding token after token: eager vs GraphModule.

    None where PyTorch or a GPU is missing (it runs PyTorch's kernels).
    """
    if not device.backend.capabilities.shares_memory:
        return None
    try:
        import torch
    except ImportError:
        return None
    from .bench.decoder import make_decoder

    model = make_decoder(torch)
    graphed = cg.GraphModule(model, buckets=[1, 2, 4, 8])
    first = torch.tensor([7], device="cuda")

    def run(step: Callable[[Any, Any], Any]) -> tuple[Any, list[int]]:
        model.k_cache.zero_()
        model.v_cache.zero_()
        token, out = first, []
        started = time.perf_counter()
        for t in range(tokens):
            logits = step(token, torch.full((1,), t % 128, dtype=torch.long, device="cuda"))
            token = logits.argmax(-1)  # greedy decoding, on the device
            out.append(token)
            _progress("decoder", t + 1, tokens, started)
        return logits, [int(t) for t in torch.cat(out).tolist()]

    def eager(tok: Any, pos: Any) -> Any:
        with torch.inference_mode():
            return model(tok, pos)

    run(graphed)  # capture (and warm up) outside the timing
    results: dict[str, Any] = {}
    for name, step in (("eager", eager), ("graph", graphed)):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        results[name] = run(step)
        torch.cuda.synchronize()
        results[name + "_s"] = time.perf_counter() - t0
    ok = results["eager"][1] == results["graph"][1] and torch.allclose(
        results["eager"][0], results["graph"][0], rtol=1e-3, atol=1e-3
    )
    return {
        "name": "GPT decoder 4x256 (PyTorch)",
        "steps": f"{tokens} tokens",
        "eager": results["eager_s"],
        "graph": results["graph_s"],
        "ok": ok,
    }


def main(argv: list[str] | None = None) -> int:
    """Run both workloads and print the table; non-zero exit on a wrong result."""
    dev = cg.Device(0)
    sim = cg.backend() == "sim"
    cg.ops.preload_dtypes(["float32", "float64", "int32"], dev)
    print(f"cudagraphs demo — backend: {cg.backend()}, device: {dev.name}")
    if sim:
        print("(no GPU answered: running the CPU simulator; sizes are small and timings simulated)")
    rows = [jacobi_demo(64 if sim else 256, dev), mlp_demo(64, 20 if sim else 2000, dev)]
    decoder = decoder_demo(500, dev)
    if decoder is not None:
        rows.append(decoder)
    elif not sim:
        print("(the PyTorch decoder workload needs PyTorch: pip install torch)")
    header = f"{'workload':<34} {'steps':>16} {'eager ms':>10} {'graph ms':>10} {'speedup':>8}  check"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['name']:<34} {r['steps']:>16} {r['eager'] * 1e3:>10.2f} {r['graph'] * 1e3:>10.2f} "
            f"{r['eager'] / r['graph']:>7.1f}x  {'ok' if r['ok'] else 'WRONG'}"
        )
    return 0 if all(r["ok"] for r in rows) else 1


EXAMPLES: dict[str, Callable[[cg.Device], cg.Graph]] = {
    "jacobi": lambda device: build_jacobi(64, device)[0],
    "mlp": lambda device: build_mlp(64, device)[0],
}
"""Graphs ``cudagraphs show --example NAME`` can draw."""
