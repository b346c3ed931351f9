"""One process per GPU: data-parallel SGD whose step (with its all-reduce) is one graph.

Run without arguments, it starts one process of itself per device (two on
the simulator, every GPU otherwise), as ``torchrun`` would; each process is
a rank of one communicator, met through a ``FileStore`` in a temporary
directory. Each rank owns a shard of the targets; a step computes the
gradient of ``0.5 * mean ||w - t||^2`` on its shard, averages it over the
ranks (an all-reduce inside the captured graph) and updates its copy of
``w``. Every rank's ``w`` is checked against numpy on the whole data set,
and the launcher prints OK. On several machines the same code runs with a
``TCPStore`` on one host instead of the file store (see docs/distributed.md).
"""

import os
import subprocess
import sys
import tempfile

import numpy as np

import cudagraphs as cg
from cudagraphs import distributed as dist

N, STEPS, LR = 4096, 8, 0.25  # parameters, steps per graph, learning rate


def targets(rank: int) -> np.ndarray:
    """Rank ``rank``'s shard: every rank can make every shard (for the check)."""
    return np.random.default_rng(rank).standard_normal(N).astype(np.float32)


def rank_main(rank: int, world: int, store_path: str) -> None:
    """One rank: join, capture the step, replay it, check against numpy."""
    comm = dist.init(rank, world, store=dist.FileStore(store_path), device=cg.Device(rank), timeout=60)
    dev, s = comm.device, comm.device.create_stream()
    w = cg.zeros(N, "float32", device=dev, stream=s)
    t = cg.asarray(targets(rank), device=dev, stream=s)
    g = cg.empty(N, "float32", device=dev, stream=s)
    s.synchronize()
    with cg.capture(stream=s) as step:  # STEPS steps: 3 kernels and an all-reduce each
        for _ in range(STEPS):
            cg.ops.copy(g, w, stream=s)
            cg.ops.axpy(-1.0, t, g, stream=s)  # g = w - t: this shard's gradient
            comm.all_reduce(g, op="avg", stream=s)  # the mean over every shard
            cg.ops.axpy(-LR, g, w, stream=s)  # w -= lr * g
    for _ in range(3):
        step.replay(s)
    comm.synchronize(s, timeout=60)  # a rank that never came: CollectiveTimeoutError

    mean = np.mean([targets(r) for r in range(world)], axis=0)
    ref = np.zeros(N, np.float32)
    for _ in range(3 * STEPS):
        ref -= np.float32(LR) * (ref - mean)
    np.testing.assert_allclose(w.get(stream=s), ref, rtol=1e-5, atol=1e-6)
    print(f"rank {rank}/{world} on {dev}: w matches numpy after {3 * STEPS} steps")
    step.close()
    comm.close()


def launch() -> None:
    """Start one process per device and wait for them all."""
    on_sim = cg.backend() == "sim"
    world = 2 if on_sim else cg.device_count()
    env = {**os.environ, "CUDAGRAPHS_BACKEND": cg.backend()}
    if on_sim:
        env["CUDAGRAPHS_SIM_DEVICES"] = str(world)
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        procs = [
            subprocess.Popen([sys.executable, __file__, str(r), str(world), store], env=env)
            for r in range(world)
        ]
        codes = [p.wait(timeout=300) for p in procs]
    if any(codes):
        sys.exit(f"a rank failed: exit codes {codes}")
    print(f"OK ({world} process{'es' if world > 1 else ''}, backend {cg.backend()})")


if __name__ == "__main__":
    if len(sys.argv) == 4:
        rank_main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
    else:
        launch()
