"""The bench decoder's step with sampling: top-k, then ``torch.multinomial``, graphed.

A decode step that samples draws random numbers on the GPU: graphed, every
replay must draw new ones. Contenders, at batch 1, on the same weights:
PyTorch eagerly, ``torch.cuda.graph`` (which registers the default
generator, so its replays advance it), and ``cg.graphed``. Tokens are
compared with eager ones drawn after the same ``torch.manual_seed``; the
graphed contenders must also draw different tokens at different steps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import cudagraphs as cg
from cudagraphs.bench.decoder import _time_steps, make_decoder

__all__ = ["run"]

TOP_K = 50


def run(quick: bool = False) -> tuple[dict[str, dict[str, float]], list[str]]:
    """``{bench: {contender: µs}}`` and notes; ({}, [reason]) without PyTorch or a GPU."""
    try:
        import torch
    except ImportError:
        return {}, ["sampling benchmark skipped: PyTorch is not installed"]
    if cg.backend() != "cuda" or not torch.cuda.is_available():
        return {}, ["sampling benchmark skipped: it needs a GPU (cuda backend and PyTorch's CUDA)"]
    n, rounds = (100, 3) if quick else (300, 5)
    model = make_decoder(torch)
    notes: list[str] = []
    pos = [torch.full((1,), i % 128, dtype=torch.long, device="cuda") for i in range(128)]

    def sample(tokens: Any, p: Any) -> Any:
        with torch.inference_mode():
            logits = model(tokens, p)
            top, idx = logits.topk(TOP_K, dim=-1)
            choice = torch.multinomial(torch.softmax(top, dim=-1), 1)
            return idx.gather(-1, choice)[:, 0]

    tok = torch.zeros(1, dtype=torch.long, device="cuda")
    contenders: dict[str, Callable[[int], Any]] = {"PyTorch eager": lambda i: sample(tok, pos[i % 128])}
    static_t, static_p = tok.clone(), pos[0].clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            sample(static_t, static_p)
    torch.cuda.current_stream().wait_stream(side)
    tg = torch.cuda.CUDAGraph()
    with torch.cuda.graph(tg):
        static_out = sample(static_t, static_p)

    def torch_graph(i: int) -> Any:
        static_p.copy_(pos[i % 128])
        tg.replay()
        return static_out

    contenders["PyTorch CUDAGraph"] = torch_graph
    try:
        graphed = cg.graphed(sample, generators=True)
        graphed(tok, pos[0])  # (eager, then the capture)
        graphed(tok, pos[1])
        contenders["cudagraphs graphed"] = lambda i: graphed(tok, pos[i % 128])
    except Exception as exc:  # (reported, not hidden: the row is then missing from the run)
        notes.append(f"sampling: cudagraphs graphed skipped: {type(exc).__name__}: {exc}")

    # the same draws as eager after the same seed, and different draws at different steps
    for name, step in contenders.items():
        torch.manual_seed(7)
        got = [int(step(i)) for i in range(8)]
        torch.manual_seed(7)
        want = [int(sample(tok, pos[i])) for i in range(8)]
        if name != "PyTorch eager" and got != want:
            notes.append(f"sampling: {name} drew {got}, eager {want} after the same seed")
        if len(set(got)) == 1:
            raise AssertionError(f"sampling: {name} drew the same token at every step: {got}")

    steps: dict[str, float] = {}
    for _ in range(rounds):  # interleaved
        for name, step in contenders.items():
            us = _time_steps(step, torch.cuda.synchronize, n, 1)
            steps[name] = min(steps.get(name, us), us)
    if "cudagraphs graphed" in steps:
        ours = steps["cudagraphs graphed"]
        notes.append(
            f"sampling decoder: cudagraphs graphed step is {steps['PyTorch eager'] / ours:.2f}x eager and "
            f"{ours / steps['PyTorch CUDAGraph']:.3f}x torch.cuda.graph's"
        )
    return {"sampling decoder step, batch 1 (µs)": steps}, notes
