"""Several devices: a data-parallel training step and the latency of small all-reduces.

``cudagraphs bench --devices`` (``python -m cudagraphs.bench.multigpu``) runs
both on every device of the machine (on ``sim``: 2 simulated ones):

* **data-parallel step** of a small MLP (``tanh``-free: x -> relu(x W1) W2,
  mean squared error), each device on its own shard of the batch: forward,
  backward by hand (cudagraphs kernels), one all-reduce of the packed
  gradients, SGD update. Run eagerly and as one graph holding every
  device's work (one replay a step), and checked against the same steps
  run in numpy on the whole batch;
* **all-reduce latency** from 4 B to 1 MiB per rank: cudagraphs eager, and
  20 all-reduces captured into one graph (per all-reduce), beside the bare
  nccl4py graph (NCCL called directly, no cudagraphs in the way) in this
  process, and beside PyTorch (``torch.distributed``, NCCL, one process per
  GPU, eager and through ``torch.cuda.graph``), with cudagraphs'
  one-process-per-GPU communicator in the same two processes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

import cudagraphs as cg
from cudagraphs import distributed as dist

__all__ = ["DP_SOURCE", "allreduce_latency", "dp_step", "main"]

DP_SOURCE = r"""
// C[M,N] = op(A) op(B), op(A) M x K, op(B) K x N; ta/tb: A is K x M, B is N x K (row-major)
extern "C" __global__ void mm(float* C, const float* A, const float* B, int M, int N, int K,
                              int ta, int tb) {
    int i = blockIdx.y * blockDim.y + threadIdx.y, j = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= M || j >= N) return;
    float s = 0.0f;
    for (int k = 0; k < K; ++k)
        s += (ta ? A[(long long)k * M + i] : A[(long long)i * K + k]) *
             (tb ? B[(long long)j * K + k] : B[(long long)k * N + j]);
    C[(long long)i * N + j] = s;
}
// h = relu(h); or, backward, g *= (h > 0)
extern "C" __global__ void relu(float* h, float* g, int n, int backward) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    if (backward) { if (h[i] <= 0.0f) g[i] = 0.0f; } else h[i] = fmaxf(h[i], 0.0f);
}
// dy = scale * (y - t)
extern "C" __global__ void mse_grad(float* dy, const float* y, const float* t, int n, float scale) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dy[i] = scale * (y[i] - t[i]);
}
// w -= lr * g
extern "C" __global__ void sgd(float* w, const float* g, int n, float lr) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) w[i] -= lr * g[i];
}
"""


def _flat(*arrays: np.ndarray) -> list[np.ndarray]:
    return [a.reshape(-1) for a in arrays]


def _mm_host(C: np.ndarray, A: np.ndarray, B: np.ndarray, M: Any, N: Any, K: Any, ta: Any, tb: Any) -> None:
    C, A, B = _flat(C, A, B)
    a = A[: M * K].reshape(K, M).T if ta else A[: M * K].reshape(M, K)
    b = B[: K * N].reshape(N, K).T if tb else B[: K * N].reshape(K, N)
    C[: M * N] = (a @ b).astype(np.float32).ravel()


def _relu_host(h: np.ndarray, g: np.ndarray, n: Any, backward: Any) -> None:
    h, g = _flat(h, g)
    if backward:
        g[:n][h[:n] <= 0] = 0.0
    else:
        np.maximum(h[:n], 0.0, out=h[:n])


def _mse_grad_host(dy: np.ndarray, y: np.ndarray, t: np.ndarray, n: Any, scale: Any) -> None:
    dy, y, t = _flat(dy, y, t)
    dy[:n] = (np.float32(scale) * (y[:n] - t[:n])).astype(np.float32)


def _sgd_host(w: np.ndarray, g: np.ndarray, n: Any, lr: Any) -> None:
    w, g = _flat(w, g)
    w[:n] -= (np.float32(lr) * g[:n]).astype(np.float32)


class _Kernels:
    def __init__(self) -> None:
        self.mm = cg.Kernel(DP_SOURCE, "mm", host=_mm_host)
        self.relu = cg.Kernel(DP_SOURCE, "relu", host=_relu_host)
        self.mse_grad = cg.Kernel(DP_SOURCE, "mse_grad", host=_mse_grad_host)
        self.sgd = cg.Kernel(DP_SOURCE, "sgd", host=_sgd_host)

    def matmul(self, C: Any, A: Any, B: Any, M: int, N: int, K: int, ta: int, tb: int, s: cg.Stream) -> None:
        self.mm.launch(((N + 15) // 16, (M + 15) // 16), (16, 16), C, A, B, M, N, K, ta, tb, stream=s)

    def each(self, kernel: cg.Kernel, n: int, *args: Any, s: cg.Stream) -> None:
        kernel.launch((n + 255) // 256, 256, *args, stream=s)


class _Rank:
    """One device's shard, weights, activations and packed gradients."""

    def __init__(self, dev: cg.Device, x: np.ndarray, t: np.ndarray, w1: np.ndarray, w2: np.ndarray) -> None:
        b, d = x.shape
        h = w1.shape[1]
        self.dev, self.b, self.d, self.h = dev, b, d, h
        self.x, self.t = cg.asarray(x, device=dev), cg.asarray(t, device=dev)
        self.w1, self.w2 = cg.asarray(w1, device=dev), cg.asarray(w2, device=dev)
        self.hid = cg.empty(b * h, "float32", device=dev)
        self.y = cg.empty(b, "float32", device=dev)
        self.dy = cg.empty(b, "float32", device=dev)
        self.dh = cg.empty(b * h, "float32", device=dev)
        self.grads = cg.empty(d * h + h, "float32", device=dev)  # dW1 then dW2: one all-reduce
        self.g1, self.g2 = self.grads[: d * h], self.grads[d * h :]

    def forward_backward(self, k: _Kernels, s: cg.Stream, scale: float) -> None:
        b, d, h = self.b, self.d, self.h
        k.matmul(self.hid, self.x, self.w1, b, h, d, 0, 0, s)  # hid = x W1
        k.each(k.relu, b * h, self.hid, self.hid, b * h, 0, s=s)
        k.matmul(self.y, self.hid, self.w2, b, 1, h, 0, 0, s)  # y = hid W2
        k.each(k.mse_grad, b, self.dy, self.y, self.t, b, scale, s=s)
        k.matmul(self.g2, self.hid, self.dy, h, 1, b, 1, 0, s)  # dW2 = hid^T dy
        k.matmul(self.dh, self.dy, self.w2, b, h, 1, 0, 1, s)  # dh = dy W2^T
        k.each(k.relu, b * h, self.hid, self.dh, b * h, 1, s=s)
        k.matmul(self.g1, self.x, self.dh, d, h, b, 1, 0, s)  # dW1 = x^T dh

    def update(self, k: _Kernels, s: cg.Stream, lr: float) -> None:
        k.each(k.sgd, self.d * self.h, self.w1, self.g1, self.d * self.h, lr, s=s)
        k.each(k.sgd, self.h, self.w2, self.g2, self.h, lr, s=s)


def _reference(x: np.ndarray, t: np.ndarray, w1: np.ndarray, w2: np.ndarray, steps: int, lr: float) -> Any:
    w1, w2 = w1.astype(np.float64), w2.astype(np.float64)
    for _ in range(steps):
        hid = np.maximum(x @ w1, 0)
        y = hid @ w2
        dy = 2.0 / len(x) * (y - t)
        g2 = hid.T @ dy
        dh = (dy @ w2.T) * (hid > 0)
        g1 = x.T @ dh
        w1, w2 = w1 - lr * g1, w2 - lr * g2
    return w1, w2


def dp_step(
    devices: list[cg.Device], steps: int, *, batch: int = 32, d: int = 64, h: int = 128, lr: float = 0.05
) -> dict[str, Any]:
    """The data-parallel step on ``devices``, eager then graphed; times and the check."""
    rng = np.random.default_rng(0)
    n = len(devices)
    x = rng.standard_normal((batch * n, d)).astype(np.float32)
    t = rng.standard_normal((batch * n, 1)).astype(np.float32)
    w1 = (rng.standard_normal((d, h)) / np.sqrt(d)).astype(np.float32)
    w2 = (rng.standard_normal((h, 1)) / np.sqrt(h)).astype(np.float32)
    k = _Kernels()
    for dev in devices:
        cg.preload([k.mm, k.relu, k.mse_grad, k.sgd], dev)
    group = dist.local_group(devices)
    scale = 2.0 / (batch * n)  # the gradient of the whole batch's mean, summed over ranks
    want = _reference(x.astype(np.float64), t.astype(np.float64), w1, w2, steps, lr)
    results: dict[str, Any] = {"name": f"data-parallel MLP step ({n} devices)", "steps": steps}

    def fresh() -> list[_Rank]:
        ranks = [
            _Rank(dev, x[i * batch : (i + 1) * batch], t[i * batch : (i + 1) * batch], w1, w2)
            for i, dev in enumerate(devices)
        ]
        for dev in devices:
            dev.synchronize()
        return ranks

    def check(ranks: list[_Rank]) -> bool:
        return all(
            np.allclose(r.w1.get().reshape(d, h), want[0], rtol=2e-3, atol=2e-4)
            and np.allclose(r.w2.get().reshape(h, 1), want[1], rtol=2e-3, atol=2e-4)
            for r in ranks
        )

    def sync() -> None:
        for dev in devices:
            dev.synchronize()

    # eager: each device's work on its current stream, then the grouped all-reduce
    ranks = fresh()
    streams = [dev.current_stream() for dev in devices]

    def eager_step() -> None:
        for r, s in zip(ranks, streams):
            r.forward_backward(k, s, scale)
        group.all_reduce([r.grads for r in ranks])
        for r, s in zip(ranks, streams):
            r.update(k, s, lr)

    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        eager_step()
    sync()
    results["eager"] = time.perf_counter() - t0
    ok_eager = check(ranks)

    # graphed: one capture on device 0's stream, the other devices' streams forked into it
    ranks = fresh()
    cap = [dev.create_stream() for dev in devices]
    with cg.capture(stream=cap[0]) as graph:
        for s in cap[1:]:
            s.wait(cap[0])
        for r, s in zip(ranks, cap):
            r.forward_backward(k, s, scale)
        group.all_reduce([r.grads for r in ranks], streams=cap)
        for r, s in zip(ranks, cap):
            r.update(k, s, lr)
        for s in cap[1:]:
            cap[0].wait(s)
    launch = devices[0].current_stream()
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        graph.replay(launch)
    sync()
    results["graph"] = time.perf_counter() - t0
    results["ok"] = ok_eager and check(ranks)
    graph.close()
    group.close()
    return results


# all-reduce latency -----------------------------------------------------------------------------
SIZES = [4, 64, 1024, 4096, 16384, 65536, 262144, 1048576]  # bytes per rank
PER_GRAPH = 20


def _timed(call: Callable[[], object], sync: Callable[[], None], n: int) -> float:
    """Microseconds per call, the median of 5 rounds of ``n`` calls."""
    rounds = []
    call()
    sync()
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            call()
        sync()
        rounds.append((time.perf_counter() - t0) / n * 1e6)
    return float(np.median(rounds))


def allreduce_latency(devices: list[cg.Device], sizes: list[int], n: int) -> dict[str, dict[int, float]]:
    """Per-all-reduce microseconds in this process: cudagraphs eager and graphed, bare nccl4py."""
    group = dist.local_group(devices)
    out: dict[str, dict[int, float]] = {
        "cudagraphs eager": {},
        "cudagraphs graph": {},
        "cudagraphs graph (one per GPU)": {},
    }

    def sync() -> None:
        for dev in devices:
            dev.synchronize()

    bare = _bare_nccl(devices)
    if bare is not None:
        out["nccl4py graph (bare)"] = {}
    for nbytes in sizes:
        xs = [cg.zeros(nbytes // 4, "float32", device=dev) for dev in devices]
        sync()
        out["cudagraphs eager"][nbytes] = _timed(partial(group.all_reduce, xs), sync, n)
        s = devices[0].create_stream()
        with cg.capture(stream=s) as g:
            for _ in range(PER_GRAPH):
                group.all_reduce(xs, streams=[s] + [None] * (len(devices) - 1))
        replay = partial(g.replay, devices[0].current_stream())
        out["cudagraphs graph"][nbytes] = _timed(replay, sync, max(n // PER_GRAPH, 5)) / PER_GRAPH
        g.close()
        # as the bare one: each rank's stream in a capture of its own, a graph per GPU
        ss = [dev.create_stream() for dev in devices]
        with contextlib.ExitStack() as stack:
            graphs = [stack.enter_context(cg.capture(stream=st)) for st in ss]
            for _ in range(PER_GRAPH):
                group.all_reduce(xs, streams=ss)

        def replay_each(graphs: list[cg.Graph] = graphs, ss: list[cg.Stream] = ss) -> None:
            for graph, st in zip(graphs, ss):
                graph.replay(st)

        per_gpu = _timed(replay_each, sync, max(n // PER_GRAPH, 5)) / PER_GRAPH
        out["cudagraphs graph (one per GPU)"][nbytes] = per_gpu
        for graph in graphs:
            graph.close()
        if bare is not None:
            out["nccl4py graph (bare)"][nbytes] = bare(nbytes, n)
    group.close()
    return out


def _bare_nccl(devices: list[cg.Device]) -> Callable[[int, int], float] | None:
    """The issue's reference: NCCL called directly, one graph per GPU (cudagraphs only captures)."""
    if cg.backend() != "cuda":
        return None
    try:
        import nccl.bindings.nccl as nc
    except ImportError:
        return None
    comms = nc.comm_init_all(len(devices), [d.index for d in devices])
    f32, total = int(nc.DataType.Float32), int(nc.RedOp.Sum)

    def run(nbytes: int, n: int) -> float:
        xs = [cg.zeros(nbytes // 4, "float32", device=dev) for dev in devices]
        streams = [dev.create_stream() for dev in devices]

        def grouped() -> None:
            nc.group_start()
            for c, x, s in zip(comms, xs, streams):
                nc.all_reduce(x.ptr, x.ptr, x.size, f32, total, c, int(s._raw))
            nc.group_end()

        for dev in devices:
            dev.synchronize()
        grouped()  # (connects, outside the capture)
        ctxs = [cg.capture(stream=s, mode="relaxed") for s in streams]
        graphs = [c.__enter__() for c in ctxs]
        for _ in range(PER_GRAPH):
            grouped()
        for c in reversed(ctxs):
            c.__exit__(None, None, None)

        def replay() -> None:
            for g, s in zip(graphs, streams):
                g.replay(s)

        def sync() -> None:
            for s in streams:
                s.synchronize()

        us = _timed(replay, sync, max(n // PER_GRAPH, 5)) / PER_GRAPH
        for g in graphs:
            g.close()
        return us

    return run


_PROCESS_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    import numpy as np
    rank, store_path, sizes = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
    n, per_graph = int(sys.argv[4]), int(sys.argv[5])
    from cudagraphs.bench.multigpu import _timed as timed
    out = {}
    import torch, torch.distributed as td
    torch.cuda.set_device(rank)
    td.init_process_group("nccl", init_method="file://" + store_path + ".torch", rank=rank,
                          world_size=2, device_id=torch.device("cuda", rank))
    out["torch.distributed eager"] = {}
    out["torch.cuda.graph"] = {}
    for nbytes in sizes:
        x = torch.zeros(nbytes // 4, device="cuda")
        out["torch.distributed eager"][nbytes] = timed(lambda: td.all_reduce(x), torch.cuda.synchronize, n)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            td.all_reduce(x)
        torch.cuda.synchronize()
        try:
            tg = torch.cuda.CUDAGraph()
            with torch.cuda.graph(tg):
                for _ in range(per_graph):
                    td.all_reduce(x)
            per = timed(tg.replay, torch.cuda.synchronize, max(n // per_graph, 5))
            out["torch.cuda.graph"][nbytes] = per / per_graph
            # (freed now: a torch graph destroyed by the collector during a later capture
            # would invalidate that capture, as the driver refuses cuGraphExecDestroy there)
            del tg
        except Exception as exc:
            out["torch.cuda.graph"][nbytes] = None
            out["torch graph error"] = repr(exc)[:200]
    import cudagraphs as cg
    from cudagraphs import distributed as dist
    comm = dist.init(rank, 2, store=dist.FileStore(store_path + ".cg"), device=cg.Device(rank))
    dev = comm.device
    out["cudagraphs eager (process/GPU)"] = {}
    out["cudagraphs graph (process/GPU)"] = {}
    for nbytes in sizes:
        x = cg.zeros(nbytes // 4, "float32", device=dev)
        out["cudagraphs eager (process/GPU)"][nbytes] = timed(lambda: comm.all_reduce(x), dev.synchronize, n)
        s = dev.create_stream()
        dev.synchronize()
        with cg.capture(stream=s) as g:
            for _ in range(per_graph):
                comm.all_reduce(x, stream=s)
        per = timed(lambda: g.replay(s), s.synchronize, max(n // per_graph, 5))
        out["cudagraphs graph (process/GPU)"][nbytes] = per / per_graph
        g.close()
    comm.close()
    td.destroy_process_group()
    if rank == 0:
        print("RESULT " + json.dumps(out))
    """
)


def per_process_latency(sizes: list[int], n: int) -> dict[str, dict[int, float]] | None:
    """torch.distributed and cudagraphs' per-process communicator, in two processes (2 GPUs)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "rank.py"
        script.write_text(_PROCESS_SCRIPT)
        env = {**os.environ, "CUDAGRAPHS_BACKEND": "cuda"}
        args = [str(Path(tmp) / "store"), json.dumps(sizes), str(n), str(PER_GRAPH)]
        procs = [
            subprocess.Popen(
                [sys.executable, str(script), str(r), *args],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for r in range(2)
        ]
        outs = []
        for p in procs:
            try:
                outs.append(p.communicate(timeout=300)[0])
            except subprocess.TimeoutExpired:  # (a rank hangs: stop both, report what came)
                for q in procs:
                    q.kill()
                outs.append((p.communicate()[0] or "") + "\n(killed after 300 s)")
    for out in outs:
        for line in out.splitlines():
            if line.startswith("RESULT "):
                raw = json.loads(line[len("RESULT ") :])
                return {
                    k: {int(s): v for s, v in row.items()} for k, row in raw.items() if isinstance(row, dict)
                }
    print("per-process run failed:\n" + "\n".join(o[-2000:] for o in outs), file=sys.stderr)
    return None


def _ratios(rows: dict[str, dict[int, float]], nbytes: int) -> list[str]:
    """The issue's comparisons at ``nbytes`` per rank, where both figures were measured."""
    out = []
    bare = rows.get("nccl4py graph (bare)", {}).get(nbytes)
    torch_eager = rows.get("torch.distributed eager", {}).get(nbytes)
    for name in ("cudagraphs graph", "cudagraphs graph (one per GPU)", "cudagraphs graph (process/GPU)"):
        ours = rows.get(name, {}).get(nbytes)
        if not ours:
            continue
        parts = []
        if bare:
            parts.append(f"{ours / bare:.2f}x the bare nccl4py graph's time")
        if torch_eager:
            parts.append(f"{torch_eager / ours:.1f}x faster than torch.distributed eager")
        if parts:
            out.append(f"{_size(nbytes)}, {name}: " + ", ".join(parts))
    return out


def _size(nbytes: int) -> str:
    return f"{nbytes // 1024} KiB" if nbytes >= 1024 else f"{nbytes} B"


def main(argv: list[str] | None = None) -> int:
    """Run both benchmarks on every device; print the tables (and write JSON with --out)."""
    p = argparse.ArgumentParser(prog="cudagraphs bench --devices")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", help="directory for multigpu.json")
    a = p.parse_args(argv)
    sim = cg.backend() == "sim"
    if sim and cg.device_count() < 2:
        cg.configure(sim_devices=2)
    devices = [cg.Device(i) for i in range(cg.device_count())]
    if len(devices) < 2:
        print("several devices are needed (this machine has one)")
        return 0
    cg.enable_peer_access(devices)
    print(f"cudagraphs multi-device bench — backend: {cg.backend()}, {len(devices)} x {devices[0].name}")
    steps = 5 if sim else (300 if a.quick else 2000)
    dp = dp_step(devices, steps)
    print(
        f"{dp['name']}: {steps} steps, eager {dp['eager'] / steps * 1e6:.1f} us/step, graph "
        f"{dp['graph'] / steps * 1e6:.1f} us/step, {dp['eager'] / dp['graph']:.2f}x, "
        f"{'ok' if dp['ok'] else 'WRONG'} (against numpy on the whole batch)"
    )
    sizes = SIZES[:3] if sim else SIZES
    n = 20 if sim else (200 if a.quick else 1000)
    rows = allreduce_latency(devices, sizes, n)
    if not sim:
        other = per_process_latency(sizes, n)
        if other:
            rows.update(other)
    print(f"\nall-reduce, us per call ({len(devices)} devices, float32 sum; graphs hold {PER_GRAPH})")
    print("one process drives every GPU, except the rows marked process/GPU and torch (2 processes)")
    print(f"{'':34}" + "".join(f"{_size(b):>10}" for b in sizes))
    for name, row in rows.items():
        cells = [row.get(b) for b in sizes]
        print(f"{name:34}" + "".join(f"{c:>10.2f}" if c is not None else f"{'-':>10}" for c in cells))
    for line in _ratios(rows, 4096):
        print(line)
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "multigpu.json").write_text(
            json.dumps({"dp": dp, "allreduce": rows}, indent=1, default=str)
        )
    return 0 if dp["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
