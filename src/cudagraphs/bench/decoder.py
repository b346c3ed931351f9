"""A small GPT-style decoder in PyTorch, and what graphs do for its decode step.

The model: ``layers`` pre-norm transformer blocks of width ``width``, a static
KV cache for ``max_batch`` sequences of ``max_len`` tokens, and per-sequence
positions held on the device, so one decode step has static shapes and can
be captured once and replayed at every position. One decode step is run, in
one process and on the same weights:

* eagerly (PyTorch);
* through ``torch.cuda.graph`` (static inputs copied by hand) and
  ``torch.cuda.make_graphed_callables``;
* through ``cg.graphed`` and ``cg.GraphModule`` with batch buckets 1-8.

Each graphed version is checked against the eager logits after the same
steps. A training step at batch 1 (a 32-token sequence: forward, loss,
backward, SGD) is timed eagerly, with its forward and loss through
``make_graphed_callables`` and ``cg.graphed(module, grad=True)``, and whole as
one graph (``torch.cuda.graph``, ``cg.capture``), on copies of the same
weights checked against each other (:func:`training_steps`). The module also
measures the call overhead of a graphed callable
beyond its bare replay, and the capture time and reserved memory of 8 batch
buckets sharing one pool against 8 separate graphs.
"""

from __future__ import annotations

import copy
import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

import cudagraphs as cg
from cudagraphs.bench import graphs

__all__ = ["make_decoder", "run", "training_steps"]


def make_decoder(
    torch: Any,
    *,
    layers: int = 4,
    width: int = 256,
    heads: int = 4,
    vocab: int = 1024,
    max_len: int = 128,
    max_batch: int = 8,
    seed: int = 0,
) -> Any:
    """The decoder (a ``torch.nn.Module`` on the GPU, in eval mode, no gradients)."""
    nn = torch.nn
    hd = width // heads

    class Block(nn.Module):  # type: ignore[misc,name-defined,unused-ignore]
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
            self.fc1, self.fc2 = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    class Decoder(nn.Module):  # type: ignore[misc,name-defined,unused-ignore]
        def __init__(self) -> None:
            super().__init__()
            self.emb, self.pos = nn.Embedding(vocab, width), nn.Embedding(max_len, width)
            self.blocks = nn.ModuleList([Block() for _ in range(layers)])
            self.lnf, self.head = nn.LayerNorm(width), nn.Linear(width, vocab, bias=False)
            self.register_buffer("k_cache", torch.zeros(layers, max_batch, heads, max_len, hd))
            self.register_buffer("v_cache", torch.zeros(layers, max_batch, heads, max_len, hd))
            self.register_buffer("steps", torch.arange(max_len))

        def forward(self, tokens: Any, pos: Any) -> Any:
            """Logits of the next token for each sequence; writes the KV cache at ``pos``."""
            b = tokens.shape[0]
            x = self.emb(tokens) + self.pos(pos)
            rows = torch.arange(b, device=tokens.device)
            bias = torch.where(self.steps[None, :] <= pos[:, None], 0.0, float("-inf"))[:, None, None, :]
            for i, blk in enumerate(self.blocks):
                q, k, v = blk.qkv(blk.ln1(x)).view(b, 3, heads, hd).unbind(1)
                kc, vc = self.k_cache[i], self.v_cache[i]
                kc[rows, :, pos] = k
                vc[rows, :, pos] = v
                att = (q[:, :, None, :] @ kc[:b].transpose(-1, -2)) * hd**-0.5 + bias
                o = (att.softmax(-1) @ vc[:b]).reshape(b, width)
                x = x + blk.proj(o)
                x = x + blk.fc2(torch.nn.functional.gelu(blk.fc1(blk.ln2(x))))
            return self.head(self.lnf(x))

    torch.manual_seed(seed)
    model = Decoder().cuda().eval()
    model.requires_grad_(False)
    return model


def _Wrapper(torch: Any, model: Any) -> Any:
    class Wrapper(torch.nn.Module):  # type: ignore[misc,name-defined,unused-ignore]
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, tokens: Any, pos: Any) -> Any:
            return self.model(tokens, pos)

    return Wrapper()


def _time_steps(step: Callable[[int], Any], sync: Callable[[], None], n: int, rounds: int) -> float:
    """Median over rounds of microseconds per decode step (``step(i)`` queues step i)."""
    samples = []
    for _ in range(rounds):
        sync()
        t0 = time.perf_counter()
        for i in range(n):
            step(i)
        sync()
        samples.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(samples)


def run(quick: bool = False) -> tuple[dict[str, dict[str, float]], list[str]]:
    """Run the decoder benchmarks; returns ``{bench: {contender: value}}`` and notes.

    Needs PyTorch and the cuda backend; returns ({}, [reason]) otherwise.
    """
    try:
        import torch
    except ImportError:
        return {}, ["decoder benchmark skipped: PyTorch is not installed"]
    if cg.backend() != "cuda" or not torch.cuda.is_available():
        return {}, ["decoder benchmark skipped: it needs a GPU (cuda backend and PyTorch's CUDA)"]
    n, rounds = (100, 3) if quick else (300, 5)
    model = make_decoder(torch)
    notes: list[str] = []
    results: dict[str, dict[str, float]] = {}
    tokens = torch.randint(0, 1024, (64, 8), device="cuda", generator=torch.Generator("cuda").manual_seed(1))

    def inputs(i: int, b: int = 1) -> tuple[Any, Any]:
        return tokens[i % 64, :b], torch.full((b,), i % 128, dtype=torch.long, device="cuda")

    def reset() -> None:
        model.k_cache.zero_()
        model.v_cache.zero_()

    # the contenders: each a function queueing step i at batch 1 -----------------------------
    def eager(i: int) -> Any:
        with torch.inference_mode():
            return model(*inputs(i))

    contenders: dict[str, Callable[[int], Any]] = {"PyTorch eager": eager}
    static_t, static_p = inputs(0)
    static_t, static_p = static_t.clone(), static_p.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.inference_mode():
        for _ in range(3):
            model(static_t, static_p)
    torch.cuda.current_stream().wait_stream(side)
    tg = torch.cuda.CUDAGraph()
    with torch.inference_mode(), torch.cuda.graph(tg):
        static_out = model(static_t, static_p)

    def torch_graph(i: int) -> Any:
        t, p = inputs(i)
        static_t.copy_(t)
        static_p.copy_(p)
        tg.replay()
        return static_out

    contenders["PyTorch CUDAGraph"] = torch_graph
    try:
        # (it patches the forward of the module it is given: give it a wrapper, not the model)
        mg = torch.cuda.make_graphed_callables(_Wrapper(torch, model), (static_t.clone(), static_p.clone()))
        contenders["PyTorch make_graphed_callables"] = lambda i: mg(*inputs(i))
    except Exception as exc:  # (its autograd machinery may refuse a model without gradients)
        notes.append(f"make_graphed_callables skipped: {type(exc).__name__}: {exc}")

    def forward(t: Any, p: Any) -> Any:
        with torch.inference_mode():
            return model(t, p)

    graphed = cg.graphed(forward, buckets=list(range(1, 9)))
    contenders["cudagraphs graphed"] = lambda i: graphed(*inputs(i))
    module = cg.GraphModule(model, buckets=list(range(1, 9)))
    contenders["cudagraphs GraphModule"] = lambda i: module(*inputs(i))

    # correctness: the same 6 steps from an empty cache, against eager -----------------------
    reset()
    expect = [eager(i).clone() for i in range(6)][-1]
    worst = 0.0
    for name, step in contenders.items():
        reset()
        got = [step(i) for i in range(6)][-1]
        err = float((got - expect).abs().max())
        worst = max(worst, err)
        if not torch.allclose(got, expect, rtol=1e-3, atol=1e-3):
            raise AssertionError(f"decoder: {name} differs from eager by {err:.3g}")
    notes.append(f"decoder: every graphed decode step matches eager (max abs difference {worst:.2g})")

    # time per decode step, batch 1 ------------------------------------------------------------
    sync = torch.cuda.synchronize
    steps: dict[str, float] = {}
    for _ in range(rounds):  # interleaved
        for name, step in contenders.items():
            us = _time_steps(step, sync, n, 1)
            steps[name] = min(steps.get(name, us), us)
    results["decoder step, batch 1 (µs)"] = steps

    results["decoder training step, batch 1 (µs)"] = train = _training(torch, model, n, rounds, notes)
    results["graphed-callable call overhead (µs)"] = over = _overhead(torch, rounds)
    results.update(_buckets(torch, forward, inputs))
    mem = results["8 buckets: reserved memory (MiB)"]
    best_torch = min(v for k, v in steps.items() if k.startswith("PyTorch") and k != "PyTorch eager")
    for name in ("cudagraphs graphed", "cudagraphs GraphModule"):
        notes.append(
            f"decoder: {name} step is {steps['PyTorch eager'] / steps[name]:.2f}x eager and "
            f"{steps[name] / best_torch:.3f}x PyTorch's best graphed step"
        )
    notes.append(
        "decoder training step (forward, loss, backward, SGD): "
        + ", ".join(
            f"{k} {train['PyTorch eager'] / v:.2f}x" for k, v in train.items() if k != "PyTorch eager"
        )
        + " eager"
    )
    notes.append(
        f"graphed-callable overhead: cudagraphs {over['cudagraphs graphed']:.2f} µs, PyTorch "
        f"make_graphed_callables {over['PyTorch make_graphed_callables']:.2f} µs per call"
    )
    notes.append(
        f"8 buckets sharing one pool reserve {mem['8 buckets, one shared pool']:.2f} MiB: "
        f"{mem['8 buckets, one shared pool'] / max(mem['largest bucket alone'], 1e-9):.2f}x the largest "
        f"bucket alone, against {mem['8 separate graphs']:.2f} MiB for 8 separate graphs"
    )
    return results, notes


def _trainable(torch: Any, model: Any) -> Any:
    """A copy of the decoder that trains, with its loss: causal attention over a whole sequence.

    ``forward(seq)`` is the cross-entropy of each next token of ``seq`` (batch, length + 1);
    ``logits(tokens)`` the decoder's part alone.
    """
    decoder = copy.deepcopy(model).train().requires_grad_(True)
    heads = 4  # (make_decoder's default)

    class Trainable(torch.nn.Module):  # type: ignore[misc,name-defined,unused-ignore]
        def __init__(self) -> None:
            super().__init__()
            self.m = decoder

        def logits(self, tokens: Any) -> Any:
            m = self.m
            b, t = tokens.shape
            width = m.emb.weight.shape[1]
            hd = width // heads
            x = m.emb(tokens) + m.pos(m.steps[:t])
            for blk in m.blocks:
                q, k, v = blk.qkv(blk.ln1(x)).view(b, t, 3, heads, hd).permute(2, 0, 3, 1, 4).unbind(0)
                o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
                x = x + blk.proj(o.transpose(1, 2).reshape(b, t, width))
                x = x + blk.fc2(torch.nn.functional.gelu(blk.fc1(blk.ln2(x))))
            return m.head(m.lnf(x))

        def forward(self, seq: Any) -> Any:
            logits = self.logits(seq[:, :-1])
            return torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), seq[:, 1:].reshape(-1)
            )

    return Trainable()


def _sgd(torch: Any, module: Any) -> Any:
    """Every contender's optimizer: SGD, one multi-tensor update for all the parameters."""
    return torch.optim.SGD(module.parameters(), lr=1e-3, foreach=True)


def _stepper(loss_of: Callable[[Any], Any], opt: Any, data: Any) -> Callable[[int], Any]:
    """Training step i on ``data[i % 16]``: zero_grad (to None), the loss, its backward, the step."""

    def step(i: int) -> Any:
        opt.zero_grad(set_to_none=True)
        loss = loss_of(data[i % 16])
        loss.backward()
        opt.step()
        return loss

    return step


def _whole_step(torch: Any, module: Any, opt: Any, data: Any, kind: str) -> Callable[[int], Any]:
    """Training step i as one graph's replay: forward, loss, backward and SGD step captured whole.

    PyTorch's recipe: three eager steps on a side stream first (libraries' workspaces made before
    the capture), then ``.grad`` set to None (the backward's gradients become the graph's memory,
    written by each replay). The warm-up's steps are undone (the parameters copied back), so that
    every contender trains the same weights. ``kind``: ``"torch"`` captures with
    ``torch.cuda.graph``, ``"cudagraphs"`` with ``cg.capture``; both replay on PyTorch's current
    stream, after the copy of the step's tokens into the graph's static input.
    """
    static = data[0].clone()
    saved = [p.detach().clone() for p in module.parameters()]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            module(static).backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    with torch.no_grad():
        for p, was in zip(module.parameters(), saved):
            p.copy_(was)
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    replay: Callable[[], Any]
    if kind == "torch":
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            loss = module(static)
            loss.backward()
            opt.step()
        replay = graph.replay
    else:
        with cg.capture() as g:
            loss = module(static)
            loss.backward()
            opt.step()
        stream = cg.Device(0).external_stream(torch.cuda.current_stream().cuda_stream)
        replay = functools.partial(g.replay, stream)

    def step(i: int) -> Any:
        static.copy_(data[i % 16])
        replay()
        return loss

    return step


def training_steps(torch: Any, model: Any, data: Any, notes: list[str]) -> dict[str, Callable[[int], Any]]:
    """Each contender's training step i at batch 1, on its own copy of the decoder's weights.

    One step: zero_grad (to None), the forward and the cross-entropy loss of a 32-token sequence
    (``data[i % 16]``, (1, 33) tokens), the backward and an SGD step (``foreach=True``):

    * eagerly;
    * the forward and loss through PyTorch's ``make_graphed_callables`` and through
      ``cg.graphed(module, grad=True)`` (a forward and a backward graph), zero_grad, the
      backward's start and the optimizer's step eager;
    * the whole step as one graph, by ``torch.cuda.graph`` and by ``cg.capture``.
    """
    steps: dict[str, Callable[[int], Any]] = {}
    eager = _trainable(torch, model)
    steps["PyTorch eager"] = _stepper(eager, _sgd(torch, eager), data)
    try:
        # (it patches the forward of the module it is given)
        mgc = _trainable(torch, model)
        graphed_mgc = torch.cuda.make_graphed_callables(mgc, (data[0].clone(),))
        steps["PyTorch make_graphed_callables"] = _stepper(graphed_mgc, _sgd(torch, mgc), data)
    except Exception as exc:
        notes.append(f"training step: make_graphed_callables skipped: {type(exc).__name__}: {exc}")
    ours = _trainable(torch, model)
    steps["cudagraphs graphed (grad=True)"] = _stepper(cg.graphed(ours, grad=True), _sgd(torch, ours), data)
    for name, kind in (
        ("PyTorch CUDAGraph (whole step)", "torch"),
        ("cudagraphs capture (whole step)", "cudagraphs"),
    ):
        whole = _trainable(torch, model)
        steps[name] = _whole_step(torch, whole, _sgd(torch, whole), data, kind)
    return steps


def _training(torch: Any, model: Any, n: int, rounds: int, notes: list[str]) -> dict[str, float]:
    """Microseconds per training step at batch 1 (a 32-token sequence), each contender's.

    The contenders are :func:`training_steps`'; their first 4 steps' losses are checked
    against eager's first (each trains its own copy of the same weights on the same data).
    """
    gen = torch.Generator("cuda").manual_seed(2)
    data = torch.randint(0, 1024, (16, 1, 33), device="cuda", generator=gen)
    made = training_steps(torch, model, data, notes)
    losses = {name: [float(step(i)) for i in range(4)] for name, step in made.items()}
    want = losses["PyTorch eager"]
    err = max(abs(a - b) for got in losses.values() for a, b in zip(want, got))
    if err > 1e-3:
        worst = max(losses, key=lambda k: max(abs(a - b) for a, b in zip(want, losses[k])))
        raise AssertionError(f"decoder training: {worst}'s steps differ from eager by {err:.3g}")
    notes.append(f"decoder training: 4 steps of each contender match eager (max loss difference {err:.2g})")
    times: dict[str, float] = {}
    for _ in range(rounds):  # interleaved
        for name, step in made.items():
            us = _time_steps(step, torch.cuda.synchronize, max(n // 3, 30), 1)
            times[name] = min(times.get(name, us), us)
    return times


def _overhead(torch: Any, rounds: int) -> dict[str, float]:
    """Per-call CPU cost of a graphed callable beyond its bare replay, for a tiny function.

    Each call is timed alone on the host (:func:`cudagraphs.bench.graphs.call_us`): timed
    between synchronizations, a call shorter than its graph's GPU time would hide its cost.
    """
    x = torch.randn(8, 256, device="cuda")

    def fn(a: Any) -> Any:
        return a * 2 + 1

    class Fn(torch.nn.Module):  # type: ignore[misc,name-defined,unused-ignore]
        def forward(self, a: Any) -> Any:
            return fn(a)

    sync = torch.cuda.synchronize
    tg = torch.cuda.CUDAGraph()
    sx = x.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(sx)
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(tg):
        fn(sx)
    mg = torch.cuda.make_graphed_callables(Fn(), (x.clone(),))
    ours = cg.graphed(fn)
    ours(x)
    graph = next(iter(ours.graphs.values()))
    stream = cg.Device(0).external_stream(torch.cuda.current_stream().cuda_stream)
    calls = {
        "PyTorch CUDAGraph.replay": tg.replay,
        "PyTorch make_graphed_callables": lambda: mg(x),
        "cudagraphs Graph.replay": lambda: graph.replay(stream),
        "cudagraphs graphed": lambda: ours(x),
    }
    clock_us = graphs._clock_us()
    for call in calls.values():  # (warm)
        for _ in range(3):
            call()
    best: dict[str, float] = {}
    for _ in range(rounds * 3):  # interleaved
        for name, call in calls.items():
            us = graphs.call_us(call, sync, clock_us)
            best[name] = min(best.get(name, us), us)
    return {
        "PyTorch make_graphed_callables": best["PyTorch make_graphed_callables"]
        - best["PyTorch CUDAGraph.replay"],
        "cudagraphs graphed": best["cudagraphs graphed"] - best["cudagraphs Graph.replay"],
    }


def _buckets(
    torch: Any, forward: Callable[..., Any], inputs: Callable[..., Any]
) -> dict[str, dict[str, float]]:
    """Capture time and reserved memory: 8 buckets sharing a pool, 8 separate graphs, the largest alone."""

    def measure(make: Callable[[], list[Any]]) -> tuple[float, float]:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        made = make()
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        # what the graphs' pools hold: cudagraphs' and PyTorch's MemPool (cuBLAS's workspace too)
        mib = sum(f.stats()["reserved"] for f in made) / 2**20
        for f in made:
            f.close()
        return ms, mib

    def shared() -> list[Any]:
        return [cg.graphed(forward, buckets=list(range(1, 9)), warmup=1).capture_all(*inputs(0, 8))]

    def separate() -> list[Any]:
        return [cg.graphed(forward, buckets=[b], warmup=1).capture_all(*inputs(0, b)) for b in range(1, 9)]

    def largest() -> list[Any]:
        return [cg.graphed(forward, buckets=[8], warmup=1).capture_all(*inputs(0, 8))]

    largest()  # (kernels and libraries warm)
    out_ms, out_mib = {}, {}
    for name, make in (
        ("8 buckets, one shared pool", shared),
        ("8 separate graphs", separate),
        ("largest bucket alone", largest),
    ):
        out_ms[name], out_mib[name] = measure(make)
    return {"8 buckets: capture + instantiate (ms)": out_ms, "8 buckets: reserved memory (MiB)": out_mib}
