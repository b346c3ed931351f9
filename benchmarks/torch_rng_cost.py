"""What PyTorch's random numbers cost a replay and a capture (the shadow graph).

A graph whose capture drew PyTorch random numbers replays its shadow
``torch.cuda.CUDAGraph`` before each launch (``cudagraphs.interop._torch_rng``)
and launches through the backend; a graph that drew none keeps no shadow.
This times, on the CPU, ``Graph.replay`` of three graphs of the same small
kernels: one without random numbers, one with a ``torch.rand``, and
``torch.cuda.CUDAGraph.replay`` of PyTorch's own capture of the random one;
and the capture of each (a capture that routes PyTorch pays the shadow's
start and end).

Usage (GPU, PyTorch installed): PYTHONPATH=src python benchmarks/torch_rng_cost.py [REPLAYS]
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

import cudagraphs as cg


def _per_call_us(fn: Callable[[], None], n: int, sync: Callable[[], None]) -> float:
    rounds = []
    for _ in range(5):
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        rounds.append((time.perf_counter() - t0) / n * 1e6)
        sync()
    return statistics.median(rounds)


def main(n: int) -> None:
    import torch

    x = torch.randn(1024, device="cuda")
    out = torch.empty(1024, device="cuda")

    def plain() -> None:
        out.copy_(x * 2 + 1)

    def random() -> None:
        out.copy_(x * 2 + torch.rand(1024, device="cuda"))

    plain()
    random()
    torch.cuda.synchronize()
    times = {}
    for name, fn in (("plain", plain), ("random", random)):
        t0 = time.perf_counter()
        with cg.capture(generators=True) as g:
            fn()
        times[name] = (time.perf_counter() - t0) * 1e3
        sync = g.stream.synchronize
        us = _per_call_us(g.replay, n, sync)
        kept = g._rng is not None
        print(f"cudagraphs {name:6s}: replay {us:6.2f} us CPU, capture {times[name]:7.2f} ms, shadow: {kept}")
    tg = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        random()
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(tg):
        random()
    us = _per_call_us(tg.replay, n, torch.cuda.synchronize)
    print(f"torch.cuda.CUDAGraph random: replay {us:6.2f} us CPU")
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")


if __name__ == "__main__":
    with cg.override(backend="cuda"):
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000)
