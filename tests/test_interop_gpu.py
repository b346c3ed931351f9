"""PyTorch and CuPy inside cudagraphs' captures and graphed callables (GPU only).

What a demanding user relies on: the libraries' kernels land in our graphs
without stream juggling, their temporaries live in memory the graph owns (so
churning the library's allocator between capture and replay cannot corrupt a
replay), arrays come back as the type that went in, and a GraphModule never
replays stale weights.
"""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import pytest

import cudagraphs as cg

pytestmark = pytest.mark.gpu


@pytest.fixture
def cuda() -> Any:
    with cg.override(backend="cuda"):
        yield cg.Device(0)


def _churn_torch(torch: Any) -> None:
    """Allocate, write and free many blocks: reuses anything the graph does not own."""
    junk = [torch.full((n,), float("nan"), device="cuda") for n in (1, 7, 64, 500, 4096, 70000) * 8]
    del junk
    junk = [torch.full((n, 33), -1e30, device="cuda") for n in (3, 17, 128, 900)]
    torch.cuda.synchronize()
    del junk


def _churn_cupy(cp: Any) -> None:
    junk = [cp.full((n,), cp.nan, dtype=cp.float32) for n in (1, 7, 64, 500, 4096, 70000) * 8]
    del junk
    cp.cuda.Device().synchronize()


def test_torch_ops_inside_capture_land_in_the_graph_and_survive_allocator_churn(cuda: cg.Device) -> None:
    torch = pytest.importorskip("torch")
    g_ = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(64, 32, device="cuda", generator=g_)
    w = torch.randn(32, 16, device="cuda", generator=g_)
    out = torch.empty(64, 16, device="cuda")
    torch.relu(x @ w)  # warm up cuBLAS outside the capture
    torch.cuda.synchronize()
    with cg.capture() as g:  # no ExternalStream, no pool: routed by cudagraphs
        t = torch.relu(x @ w)  # temporaries from the graph's MemPool
        u = t * 2 + 1
        out.copy_(u)
    del t, u
    gc.collect()
    assert g.pool.foreign.get("torch") is not None
    assert len(g.nodes) >= 3
    for _ in range(3):
        _churn_torch(torch)
        x.copy_(torch.randn(64, 32, device="cuda", generator=g_))
        out.fill_(float("nan"))
        torch.cuda.synchronize()
        g.replay()
        g.stream.synchronize()
        expect = torch.relu(x @ w) * 2 + 1
        torch.testing.assert_close(out, expect)


def test_cupy_ops_inside_capture_use_the_graphs_pool(cuda: cg.Device) -> None:
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(3)
    x = cp.asarray(rng.standard_normal(10000).astype(np.float32))
    out = cp.empty_like(x)
    reserved = None
    with cg.capture() as g:
        t = cp.sin(x) * 3  # temporaries: cudagraphs arrays of the graph's pool
        cp.add(t, x, out=out)
        reserved = g.pool.reserved
    del t
    assert reserved is not None
    assert reserved >= x.nbytes
    for _ in range(3):
        _churn_cupy(cp)
        x[...] = cp.asarray(rng.standard_normal(10000).astype(np.float32))
        out.fill(cp.nan)
        cp.cuda.Device().synchronize()
        g.replay()
        g.stream.synchronize()
        np.testing.assert_allclose(cp.asnumpy(out), np.sin(cp.asnumpy(x)) * 3 + cp.asnumpy(x), rtol=1e-5)


def test_graphed_torch_function_with_buckets_returns_tensors(cuda: cg.Device) -> None:
    torch = pytest.importorskip("torch")
    gen = torch.Generator(device="cuda").manual_seed(2)
    w = torch.randn(32, 32, device="cuda", generator=gen) / 8
    b = torch.randn(32, device="cuda", generator=gen)

    def step(x: Any) -> Any:
        h = torch.tanh(x @ w + b)
        return {"h": h, "norm": (h * h).sum(dim=1)}

    f = cg.graphed(step, buckets=[1, 2, 4, 8])
    f.capture_all(torch.zeros(8, 32, device="cuda"))
    for n in (1, 3, 8, 5, 2):
        x = torch.randn(n, 32, device="cuda", generator=gen)
        _churn_torch(torch)
        r = f(x)
        assert isinstance(r["h"], torch.Tensor)
        assert tuple(r["h"].shape) == (n, 32)
        expect = step(x)
        torch.testing.assert_close(r["h"], expect["h"], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(r["norm"], expect["norm"], rtol=1e-4, atol=1e-4)
    st = f.stats()
    assert st["captures"] == 4
    assert st["hits"] == 5


def test_graphed_cupy_function(cuda: cg.Device) -> None:
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(4)

    def fn(x: Any, y: Any) -> Any:
        return cp.exp(x) - y * 2

    f = cg.graphed(fn, buckets=[16, 64])
    for n in (10, 64, 33):
        xh, yh = rng.standard_normal((n, 4)).astype("f4"), rng.standard_normal((n, 4)).astype("f4")
        _churn_cupy(cp)
        r = f(cp.asarray(xh), cp.asarray(yh))
        assert isinstance(r, cp.ndarray)
        np.testing.assert_allclose(cp.asnumpy(r), np.exp(xh) - yh * 2, rtol=1e-5)


def test_graph_module_wraps_a_torch_module_and_refuses_stale_weights(cuda: cg.Device) -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).cuda()
    gm = cg.GraphModule(model, buckets=[1, 4])
    x = torch.randn(3, 16, device="cuda")
    with torch.inference_mode():
        torch.testing.assert_close(gm(x), model(x))
        new = torch.nn.Parameter(torch.randn(32, 16, device="cuda"))
        model[0].weight = new  # a weight reload by replacement
        with pytest.raises(cg.StaleParameterError, match=r"0\.weight"):
            gm(x)
        report = gm.refresh()
        assert report["replaced"] == 1
        assert report["repointed"] >= 1  # PyTorch's kernels read the weight: moved in place
        assert report["recaptured"] == 0
        assert gm.graphed.stats()["captures"] == 1
        torch.testing.assert_close(gm(x), model(x))
        model[2].weight.data = torch.randn(8, 32, device="cuda")  # a .data swap is seen too
        with pytest.raises(cg.StaleParameterError):
            gm(x)
        gm.refresh()
        torch.testing.assert_close(gm(x), model(x))


def test_graph_module_sees_a_torch_parameter_added_and_a_submodule_swapped(cuda: cg.Device) -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(1)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32, bias=False), torch.nn.ReLU(), torch.nn.Linear(32, 8)
    ).cuda()
    gm = cg.GraphModule(model)
    x = torch.randn(3, 16, device="cuda")
    with torch.inference_mode():
        for _ in range(3):  # eagerly, captured, replayed
            torch.testing.assert_close(gm(x), model(x))
        model[0].bias = torch.nn.Parameter(torch.randn(32, device="cuda"))  # None -> a parameter
        with pytest.raises(cg.StaleParameterError, match=r"'0\.bias' were added"):
            gm(x)
        report = gm.refresh()
        assert (report["added"], report["recaptured"]) == (1, 1)
        for _ in range(2):
            torch.testing.assert_close(gm(x), model(x))
        model[2] = torch.nn.Linear(32, 8).cuda()  # a submodule swapped: its parameters are new
        with pytest.raises(cg.StaleParameterError, match=r"'2\.weight', '2\.bias'"):
            gm(x)
        gm.refresh()
        torch.testing.assert_close(gm(x), model(x))


def test_graph_keeps_foreign_arrays_given_to_our_kernels_and_keep(cuda: cg.Device) -> None:
    torch = pytest.importorskip("torch")
    src = torch.arange(1000, dtype=torch.float32, device="cuda")
    out = cg.zeros(1000, "float32")
    view = cg.asarray(src)  # zero-copy
    g = cg.capture(cg.ops.scale, 2.0, view, out)
    extra = torch.ones(4, device="cuda")
    g.keep(extra)
    del src, view
    gc.collect()
    _churn_torch(torch)
    g.replay()
    np.testing.assert_array_equal(out.get(), 2 * np.arange(1000, dtype="float32"))


def test_cyclic_gc_is_paused_while_a_library_is_routed_into_a_capture(cuda: cg.Device) -> None:
    torch = pytest.importorskip("torch")
    x = torch.ones(8, device="cuda")
    for _ in range(2):  # the pause ends with each capture
        assert gc.isenabled()
        with cg.capture() as g:
            # a collection here could free a tensor of a cycle through PyTorch's allocator
            assert not gc.isenabled()
            x.mul_(2)
        assert gc.isenabled()
    with pytest.raises(ZeroDivisionError), cg.capture():  # and with a failed one
        assert not gc.isenabled()
        x.mul_(2)
        1 / 0  # noqa: B018
    assert gc.isenabled()
    g.replay()
    torch.cuda.synchronize()
    assert float(x.sum()) == 8 * 2.0


LOOP = """
import torch, cudagraphs as cg
x = torch.ones(64, device="cuda")
for _ in range(4):
    with cg.capture() as g:  # the previous g, its pool and PyTorch's MemPool die here
        y = x * 2  # from the graph's MemPool
        x.copy_(y)
        del y
    g.replay()
    g.close()
torch.cuda.synchronize()
assert torch.all(x == 16), x
print("ok")
"""


def test_graphs_of_torch_work_dropped_as_the_next_capture_begins(cuda: cg.Device) -> None:
    """A loop of captures of PyTorch work runs (no MemPool dies inside a capture).

    PyTorch aborts the process when a MemPool dies during a capture (seen on
    a GPU): the loop runs in a child process, so an abort fails this test,
    not the suite.
    """
    pytest.importorskip("torch")
    import os
    import subprocess
    import sys
    from pathlib import Path

    src = str(Path(cg.__file__).resolve().parent.parent)
    env = dict(os.environ, CUDAGRAPHS_BACKEND="cuda", PYTHONPATH=src)
    # (the bound catches a hang, not a slow run: under compute-sanitizer, which follows the
    # child, PyTorch's start and the captures run many times slower than on a bare GPU)
    done = subprocess.run([sys.executable, "-c", LOOP], env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"


def test_graphed_torch_calls_are_repeated(cuda: cg.Device) -> None:
    """Tensors in, tensors out: a call of the last call's key repeats it (GraphedCallable._repeat)."""
    torch = pytest.importorskip("torch")

    def fn(a: Any, b: Any) -> Any:
        return a * 2 + b, b - a

    gen = torch.Generator(device="cuda").manual_seed(3)
    xs = [torch.randn(8, 256, device="cuda", generator=gen) for _ in range(3)]
    y = torch.randn(8, 256, device="cuda", generator=gen)
    runs = []
    for made in ("repeated", "whole"):
        f = cg.graphed(fn)
        got = []
        side = torch.cuda.Stream()
        for k in range(8):
            if made == "whole":
                f._armed = None  # (every call the whole call: the reference)
            x = xs[k % 3]  # moved inputs: the copy node is pointed again
            if k == 5:  # another PyTorch stream: the whole call, which waits for the last one
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    out = f(x, y)
                    got.append([o.clone() for o in out])
                torch.cuda.current_stream().wait_stream(side)
            else:
                out = f(x, y)
                got.append([o.clone() for o in out])
            assert all(type(o) is torch.Tensor for o in out)
            torch.testing.assert_close(got[-1][0], x * 2 + y)
            torch.testing.assert_close(got[-1][1], y - x)
        runs.append(([[o.cpu().numpy() for o in g] for g in got], f.stats(), f._repeats))
    (got_r, stats_r, made_r), (got_w, stats_w, made_w) = runs
    # calls 1-4 and 7 repeated (0 captures; 5 is on another stream, 6 comes back from it)
    assert made_r == 5
    assert made_w == 0
    assert stats_r == stats_w
    for a, b in zip(got_r, got_w):
        for u, v in zip(a, b):
            np.testing.assert_array_equal(u, v)
    f = cg.graphed(lambda a: a * 3)
    t = torch.randn(16, 16, device="cuda", generator=gen)
    p = torch.nn.Parameter(t.clone(), requires_grad=False)
    for _ in range(3):  # a subclass of Tensor, a strided view: results as the whole call's
        torch.testing.assert_close(f(p), p * 3)
        torch.testing.assert_close(f(t.t()), t.t() * 3)
    f = cg.graphed(lambda a: a * 3)
    s = t.clone()
    torch.testing.assert_close(f(s), s * 3)
    torch.testing.assert_close(f(s), s * 3)
    assert f._repeats == 1
    s.t_()  # the same tensor, transposed in place (square: the same key, another layout)
    torch.testing.assert_close(f(s), s * 3)
    cpu = t.cpu()
    with pytest.raises((TypeError, ValueError)):
        f(cpu)  # (a CPU tensor of the armed type: refused as by the whole call)


def test_a_tensor_only_torch_kernels_read_is_kept_when_dropped(cuda: cg.Device) -> None:
    """Read only by PyTorch's kernels in the capture, dropped, its memory offered again: replays stay right.

    (PyTorch's caching allocator hands a freed block to the next tensor of that size: without the
    graph keeping the tensor's storage, every replay would read the new tensor's data.)
    """
    torch = pytest.importorskip("torch")
    gen = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(4096, device="cuda", generator=gen)
    w = torch.randn(4096, device="cuda", generator=gen)
    out = torch.empty(4096, device="cuda")
    torch.cuda.synchronize()
    with cg.capture() as g:
        out.copy_(torch.sin(x) * w + 1)
    want = (torch.sin(x) * w + 1).cpu()
    x_ptr = x.data_ptr()
    del x, w
    taken = [torch.full((4096,), 1e6, device="cuda") for _ in range(16)]  # would reuse x's, w's blocks
    assert all(t.data_ptr() != x_ptr for t in taken)
    _churn_torch(torch)
    for _ in range(3):
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out.cpu(), want, rtol=0, atol=0)
    # what keeps x's memory: its storage, held by the graph (and by nothing once the graph is gone)
    assert any(isinstance(k, torch.UntypedStorage) and k.data_ptr() == x_ptr for k in g._res.keep)
    g.close()


def test_a_cupy_array_only_cupy_kernels_read_is_kept_when_dropped(cuda: cg.Device) -> None:
    cp = pytest.importorskip("cupy")
    x_h = np.random.default_rng(4).standard_normal(4096).astype(np.float32)
    x = cp.asarray(x_h)
    out = cp.empty(4096, dtype=cp.float32)
    cp.cuda.Device().synchronize()
    with cg.capture() as g:
        cp.multiply(cp.sin(x), 2, out=out)
    x_ptr = x.data.ptr
    del x
    taken = [cp.full(4096, 1e6, dtype=cp.float32) for _ in range(16)]
    assert all(t.data.ptr != x_ptr for t in taken)
    _churn_cupy(cp)
    out.fill(cp.nan)
    g.replay()
    cp.cuda.Device().synchronize()
    np.testing.assert_allclose(cp.asnumpy(out), 2 * np.sin(x_h), rtol=1e-6)
    g.close()


def test_graphed_torch_step_keeps_a_module_it_closes_over(cuda: cg.Device) -> None:
    """A graphed function over a module the caller then drops: the weights stay while the graphs live."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(5)
    held = {"lin": torch.nn.Linear(64, 64).cuda()}
    w, b = held["lin"].weight.detach().clone(), held["lin"].bias.detach().clone()
    step = cg.graphed(lambda x: torch.tanh(held["lin"](x)))
    x = torch.randn(8, 64, device="cuda")
    with torch.no_grad():
        for _ in range(3):
            step(x)
    held.clear()  # the module and its parameters dropped: only the graph reads their memory
    gc.collect()
    _churn_torch(torch)
    with torch.no_grad():
        got = step(x).clone()
    torch.testing.assert_close(got, torch.tanh(x @ w.T + b), rtol=1e-5, atol=1e-5)


def test_torch_streams_are_accepted_by_capture_graphed_and_replay(cuda: cg.Device) -> None:
    """A torch.cuda.Stream where cudagraphs takes a stream: the work lands on it, in order with torch's."""
    torch = pytest.importorskip("torch")
    ts = torch.cuda.Stream()
    x = torch.randn(4096, device="cuda")
    out = torch.empty(4096, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(ts):
        torch.sin(x)  # (warm, on that stream)
    with cg.capture(stream=ts) as g, torch.cuda.stream(ts):
        out.copy_(torch.sin(x) * 3)
    assert g.stream.handle == ts.cuda_stream
    out.fill_(float("nan"))
    torch.cuda.synchronize()
    g.replay(ts)
    with torch.cuda.stream(ts):
        after = out * 1  # torch's next work on the stream sees the replay's result
    ts.synchronize()
    torch.testing.assert_close(after, torch.sin(x) * 3)
    step = cg.graphed(lambda a: torch.cos(a) + 1, stream=ts)
    for _ in range(3):
        y = torch.randn(64, device="cuda")
        # (y is made on torch's current stream, the call's copy of it on ts: ordering them is the
        # caller's, as with torch's own streams; without it the copy raced randn under load, seen
        # on an H200 with 8 processes: 64 of 64 elements wrong)
        ts.wait_stream(torch.cuda.current_stream())
        got = step(y)
        ts.synchronize()
        torch.testing.assert_close(torch.as_tensor(got), torch.cos(y) + 1)
    g.close()


def test_cupy_and_cuda_core_streams_are_accepted(cuda: cg.Device) -> None:
    cp = pytest.importorskip("cupy")
    from cuda.core import Device as CoreDevice

    x_h = np.random.default_rng(6).standard_normal(1024).astype(np.float32)
    core = CoreDevice(0)
    core.set_current()
    for make in (lambda: cp.cuda.Stream(non_blocking=True), core.create_stream):
        s = make()
        x = cg.asarray(x_h, stream=s)
        y = cg.full(1024, -1.0, "float32", stream=s)
        with cg.capture(stream=s) as g:
            cg.ops.scale(2.0, x, out=y, stream=s)
        g.replay(s)
        np.testing.assert_allclose(y.get(stream=s), 2 * x_h, rtol=1e-6)
        g.close()


def test_a_capture_failing_at_its_end_with_dlpack_views_alive_raises_its_own_error(
    cuda: cg.Device, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PyTorch frees our DLPack views while the error unwinds: their deleters keep that error.

    (Measured on an H200 before the fix: the deleter, a ctypes callback, ran with the exception set,
    and the graphed call ended in "SystemError: ... returned NULL without setting an exception".)
    """
    torch = pytest.importorskip("torch")
    from cudagraphs import interop

    def broken(*args: Any) -> Any:
        raise ValueError("planted failure at the end of the capture")

    step = cg.graphed(lambda t: torch.sin(t) + 1)
    t = torch.randn(64, device="cuda")
    monkeypatch.setattr(interop, "keep_foreign", broken)
    with pytest.raises(ValueError, match="planted failure"):
        for _ in range(3):
            step(t)
    monkeypatch.undo()
    got = [torch.as_tensor(step(t)).clone() for _ in range(3)]  # the callable still works
    torch.testing.assert_close(got[-1], torch.sin(t) + 1)


def test_captures_of_torch_cublas_and_cupy_kernels_see_every_node(cuda: cg.Device) -> None:
    """PyTorch's kernels, cuBLAS's and CuPy's give their arguments to the driver: nothing unseen, no warning.

    (A node whose arguments cannot be read, whose memory cudagraphs could not keep, is warned of.)
    """
    import warnings

    torch = pytest.importorskip("torch")
    cp = pytest.importorskip("cupy")
    gen = torch.Generator(device="cuda").manual_seed(5)
    x = torch.randn(64, 256, device="cuda", generator=gen)
    w = torch.randn(256, 256, device="cuda", generator=gen)
    c = cp.arange(1024, dtype=cp.float32)
    out = torch.empty(64, 256, device="cuda")
    torch.softmax(x @ w, -1)  # (cuBLAS and the kernels loaded before the capture)
    cp.sum(cp.sin(c))
    torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("error", cg.CudaGraphsWarning)
        with cg.capture() as g:
            out.copy_(torch.softmax(torch.nn.functional.gelu(x @ w), -1))
            s = cp.sum(cp.sin(c))
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, torch.softmax(torch.nn.functional.gelu(x @ w), -1))
    want = float(np.sin(np.arange(1024, dtype=np.float32)).sum())
    np.testing.assert_allclose(float(s.get()), want, rtol=1e-4)
    g.close()


def test_threads_each_capturing_torch_kernels_replay_what_they_captured(cuda: cg.Device) -> None:
    """Eight threads, each capturing PyTorch's kernels on a stream of its own, twenty times over.

    Every capture's end reads its graph's PyTorch pool (the graph holds another
    library's nodes), in eight threads at once; each replay must give what the
    same ops give eagerly. (Issue 28: the interpreter crashed when every
    capture's end took a pool snapshot, in threads, after this file's tests.)
    """
    import threading

    torch = pytest.importorskip("torch")
    errors: list[str] = []

    def run(seed: int) -> None:
        try:
            with cg.override(backend="cuda"):
                s = cg.Device(0).create_stream()
                ts = torch.cuda.Stream()
                gen = torch.Generator(device="cuda").manual_seed(seed)
                for r in range(20):
                    with torch.cuda.stream(ts):
                        x = torch.randn(4096, device="cuda", generator=gen)
                        out = torch.empty_like(x)
                        ts.synchronize()  # (never the device: the other threads' streams capture)
                        with cg.capture(stream=s) as g:
                            out.copy_(torch.sin(x) * 2)
                        want = torch.sin(x) * 2
                        out.fill_(float("nan"))
                        ts.synchronize()
                        g.replay(stream=s)
                        s.synchronize()
                        if not torch.equal(out, want):
                            errors.append(f"thread {seed} round {r}: the replay differs from the eager ops")
                        if r % 2:
                            g.close()
                        del g, x, out
                s.close()
        except BaseException as exc:  # (reported below)
            errors.append(f"thread {seed}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, f"{len(errors)} failures: {errors[:3]}"
