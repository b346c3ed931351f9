"""Stream capture and replay.

Forms, modes, memory policies, lifetime, host data, scalars, the safety rules,
and recovery from failures at every stage.
"""

from __future__ import annotations

import contextlib
import gc
import re
import sys
import threading

import numpy as np
import pytest
from conftest import live_blocks, random_array, settle

import cudagraphs as cg


def baseline(dev: cg.Device) -> cg.AllocatorStats:
    return settle(dev)


def assert_clean(dev: cg.Device, before: cg.AllocatorStats) -> None:
    """No capture left, memory back to where it was, the stream works."""
    gc.collect()
    assert cg.capture_status(dev.stream) == "none"
    assert not dev.captures
    in_use = settle(dev).in_use
    assert in_use == before.in_use, live_blocks(dev)
    probe = cg.asarray(np.arange(4, dtype=np.float32))
    np.testing.assert_array_equal(cg.ops.scale(2.0, probe).get(), [0, 2, 4, 6])
    dev.synchronize()


def test_context_form_replays_against_numpy(dev: cg.Device, rng: np.random.Generator) -> None:
    x_h, y_h = random_array(rng, 1000, "float32"), random_array(rng, 1000, "float32")
    x, y = cg.asarray(x_h), cg.asarray(y_h)
    with cg.capture() as g:
        assert g.state == "capturing"
        cg.ops.axpy(0.5, x, y)
        cg.ops.scale(2.0, y[::2], out=y[::2])
    assert g.state == "ready"
    np.testing.assert_array_equal(y.get(), y_h)  # capturing ran nothing
    ref = y_h.copy()
    for _ in range(3):
        g.replay()
        ref = (np.float32(0.5) * x_h + ref).astype(np.float32)
        ref[::2] *= np.float32(2)
    np.testing.assert_allclose(y.get(), ref, rtol=1e-5)
    assert g.replays == 3
    assert [n.type for n in g.nodes] == ["kernel", "kernel"]
    assert [n.name for n in g.nodes] == ["cg_axpy", "cg_scale_strided"]
    assert "2 nodes (kernel 2); 3 replays" in g.summary()


def test_closure_form_keeps_output(dev: cg.Device, rng: np.random.Generator) -> None:
    a_h, b_h = random_array(rng, 64, "float32"), random_array(rng, 64, "float32")
    a, b = cg.asarray(a_h), cg.asarray(b_h)
    g = cg.capture(lambda p, q: cg.ops.add(p, q), a, b)
    out = g.output
    assert isinstance(out, cg.DeviceArray)
    g.upload()
    g.upload()  # idempotent
    g.replay()
    np.testing.assert_array_equal(out.get(), a_h + b_h)
    with pytest.raises(TypeError, match="needs a callable"):
        cg.capture(3, a)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="positional arguments only with a function"):
        cg.capture(None, a)


def test_replay_on_another_stream(dev: cg.Device, rng: np.random.Generator) -> None:
    x = cg.asarray(random_array(rng, 100, "float32"))
    y = cg.zeros(100, "float32")
    with cg.capture() as g:
        cg.ops.axpy(1.0, x, y)
    s = dev.create_stream()
    s.wait(dev.stream)
    g.replay(stream=s)
    g.replay(stream=s)
    s.synchronize()
    np.testing.assert_allclose(y.get(), 2 * x.get(), rtol=1e-6)
    with pytest.raises(TypeError, match="cudagraphs Stream"):
        g.replay(stream=object())  # type: ignore[arg-type]
    g.close()
    s.close()


@pytest.mark.parametrize("mode", ["thread_local", "global", "relaxed"])
def test_modes(dev: cg.Device, mode: str) -> None:
    x = cg.ones(16, "float32")
    with cg.capture(mode=mode) as g:
        cg.ops.scale(3.0, x, out=x)
    g.replay()
    assert np.all(x.get() == 3)


def test_bad_options(dev: cg.Device) -> None:
    with pytest.raises(ValueError, match="mode must be one of"):
        cg.capture(mode="loose")
    with pytest.raises(ValueError, match="alloc must be one of"):
        cg.capture(alloc="heap")
    with pytest.raises(TypeError, match="pool must be a cudagraphs GraphPool"):
        cg.capture(pool=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="stream must be a cudagraphs Stream"):
        cg.capture(stream=3)  # type: ignore[arg-type]


def test_status_and_one_capture_per_stream(dev: cg.Device) -> None:
    x = cg.ones(8, "float32")
    assert cg.capture_status() == "none"
    assert not cg.is_capturing()
    with cg.capture() as g:
        assert cg.capture_status() == "active"
        assert cg.is_capturing(dev.stream)
        assert dev.allocator.is_capturing()
        with (
            pytest.raises(cg.CaptureError, match="already being captured; one capture per stream"),
            cg.capture(),
        ):
            pass
        cg.ops.fill(x, 2.0)
    assert cg.capture_status() == "none"
    g.replay()
    assert np.all(x.get() == 2)


def test_empty_capture_is_an_error(dev: cg.Device) -> None:
    before = baseline(dev)
    with pytest.raises(cg.CaptureError, match="recorded nothing"), cg.capture():
        pass
    assert_clean(dev, before)


def test_two_threads_capture_two_streams(dev: cg.Device, backend: str) -> None:
    results: dict[int, object] = {}

    def work(i: int) -> None:
        try:
            with cg.override(backend=backend):
                s = dev.create_stream()
                x = cg.full(32, float(i + 1), "float32", stream=s)
                s.synchronize()
                with cg.capture(stream=s) as g:
                    cg.ops.scale(10.0, x, out=x, stream=s)
                g.replay()
                s.synchronize()
                results[i] = x.get(stream=s)
                g.close()
                s.close()
        except BaseException as exc:  # reported below
            results[i] = exc

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(2):
        assert not isinstance(results[i], BaseException), results[i]
        assert np.all(results[i] == (i + 1) * 10)


# memory ----------------------------------------------------------------------
def test_pool_allocations_live_after_capture_and_return_to_cache(
    dev: cg.Device, rng: np.random.Generator
) -> None:
    before = baseline(dev)
    x_h = random_array(rng, 256, "float32")
    x = cg.asarray(x_h)
    with cg.capture() as g:
        t = cg.ops.scale(2.0, x)  # allocated in the graph's private pool
        u = cg.ops.add(t, x)
        del t  # freed during capture: the pool may reuse it in this capture
    assert g.pool.reserved > 0
    g.replay()
    np.testing.assert_allclose(u.get(), 3 * x_h, rtol=1e-6)
    mid = settle(dev)
    g.close()
    assert settle(dev).in_use == mid.in_use  # u keeps the pool alive
    np.testing.assert_allclose(u.get(), 3 * x_h, rtol=1e-6)
    del u, x
    after = settle(dev)
    assert after.in_use == before.in_use
    assert after.cached >= mid.in_use - before.in_use - 1024  # the pool went back to the cache


def test_a_pool_array_used_after_its_graph_closed_is_freed_after_that_work(
    dev: cg.Device, rng: np.random.Generator
) -> None:
    """The pool gives its memory back in stream order: after the work queued on it so far."""
    x_h = random_array(rng, 256, "float32")
    x = cg.asarray(x_h)
    with cg.capture() as g:
        y = cg.ops.scale(2.0, x)  # from the graph's pool
    g.replay()
    g.close()
    z = cg.full(256, np.nan, "float32")
    cg.ops.scale(3.0, y, out=y)  # queued, not run: reads and writes the pool's memory
    cg.ops.add(y, y, out=z)
    del y  # the pool's last array: its memory goes back to the driver
    dev.allocator.stats()  # (a safe point: the release runs here)
    np.testing.assert_allclose(z.get(), 12 * x_h, rtol=1e-6)


def test_a_pool_freed_after_work_on_another_stream_waits_for_that_stream(
    dev: cg.Device, rng: np.random.Generator
) -> None:
    """The free of a pool's segment, on its first stream, waits for the others' work."""
    s1, s2 = dev.create_stream(), dev.create_stream()
    x_h = random_array(rng, 256, "float32")
    x = cg.asarray(x_h, stream=s1)
    out = cg.full(256, np.nan, "float32", stream=s2)
    with cg.capture(stream=s1) as g:
        t = cg.ops.scale(2.0, x, stream=s1)  # from the graph's pool
    g.replay(stream=s1)
    g.close()  # (waits for s1)
    s2.wait(s1)
    cg.ops.copy(out, t, stream=s2)  # s2 reads t, later
    t.record_stream(s2)
    del t  # the pool's last array: its segment is freed on s1, after s2's copy
    dev.allocator.stats()  # (a safe point: the release runs here)
    s1.synchronize()  # (on sim: runs s1 alone, unless it waits on s2)
    np.testing.assert_array_equal(out.get(stream=s2), 2 * x_h)
    s1.close()
    s2.close()


def test_shared_pool_reuses_memory_between_graphs(dev: cg.Device) -> None:
    pool = cg.GraphPool(dev)
    x = cg.ones(1000, "float32")
    with cg.capture(pool=pool) as g1:
        t = cg.ops.scale(2.0, x)
        p1 = t.ptr
        cg.ops.add(t, x, out=x)
        del t
    reserved = pool.reserved
    with cg.capture(pool=pool) as g2:
        t2 = cg.ops.scale(3.0, x)
        assert t2.ptr == p1  # freed in g1's capture, reused by g2's
        cg.ops.add(t2, x, out=x)
        del t2
    assert pool.reserved == reserved
    g1.replay()
    g2.replay()
    assert np.all(x.get() == 12)  # 1 -> 1+2 = 3 -> 3+9 = 12


def test_other_libraries_pools_never_die_inside_a_capture(dev: cg.Device) -> None:
    """Other libraries' pools die after the capture that dropped their graph.

    A graph dropped as the next capture begins (`with cg.capture() as g:` in a
    loop) lets its pool go; what other libraries keep there (PyTorch's
    MemPool, whose destruction during a capture aborts the process) goes only
    after the capture.
    """
    deaths: list[str] = []

    class Foreign:  # stands for torch.cuda.MemPool
        def __del__(self) -> None:
            deaths.append(cg.capture_status(dev.stream))

    x = cg.ones(8, "float32")
    for i in range(3):
        with cg.capture() as g:  # the previous g (and its pool) dies here, mid-capture
            cg.ops.scale(2.0, x, out=x)
            if i == 1:
                assert deaths == []
        g.pool.foreign["lib"] = Foreign()
        g.replay()
        g.close()
    assert deaths == ["none", "none"]  # both died, after their captures
    del g
    gc.collect()
    assert deaths == ["none"] * 3
    np.testing.assert_array_equal(x.get(), np.full(8, 2.0**3, np.float32))  # one replay each


def test_forbid_policy(dev: cg.Device) -> None:
    before = baseline(dev)
    x = cg.ones(8, "float32")
    with (
        pytest.raises(
            cg.CaptureError,
            match=r"allocation of \d+ B during a capture with alloc='forbid'.*test_capture.py",
        ),
        cg.capture(alloc="forbid"),
    ):
        cg.ops.scale(2.0, x, out=x)  # no allocation: fine
        cg.ops.scale(2.0, x)  # allocates: refused
    del x
    assert_clean(dev, before)


def test_graph_policy(dev: cg.Device, rng: np.random.Generator) -> None:
    x_h = random_array(rng, 128, "float32")
    x, y = cg.asarray(x_h), cg.zeros(128, "float32")
    with cg.capture(alloc="graph") as g:
        t = cg.ops.scale(2.0, x)  # driver-managed graph memory
        cg.ops.add(t, x, out=y)
        del t  # a free node
    types = [n.type for n in g.nodes]
    assert "mem_alloc" in types
    assert "mem_free" in types
    g.replay()
    g.replay()
    np.testing.assert_allclose(y.get(), 3 * x_h, rtol=1e-6)
    g.close()
    before = baseline(dev)
    with (
        pytest.raises(cg.CaptureError, match=r"1 array\(s\) allocated under alloc='graph' are still alive"),
        cg.capture(alloc="graph"),
    ):
        escaped = cg.ops.scale(2.0, x)
    del escaped
    assert_clean(dev, before)


# lifetime and host data -----------------------------------------------------------
def test_graph_keeps_inputs_alive(dev: cg.Device, rng: np.random.Generator) -> None:
    x_h = random_array(rng, 5000, "float32")
    x, y = cg.asarray(x_h), cg.zeros(5000, "float32")
    s = cg.DeviceScalar(2.0)
    with cg.capture() as g:
        cg.ops.axpy(s, x, y)
    del x, s
    gc.collect()
    junk = [cg.full(5000, 7.0, "float32") for _ in range(4)]  # would reuse x's block if freed
    g.replay()
    np.testing.assert_allclose(y.get(), 2 * x_h, rtol=1e-6)
    del junk


def test_host_data_is_snapshotted_at_capture(dev: cg.Device, rng: np.random.Generator) -> None:
    data = random_array(rng, 100, "float32")
    y = cg.zeros(100, "float32")
    with cg.capture() as g:
        c = cg.asarray(data)  # staged into pinned memory the graph owns
        cg.ops.add(y, c, out=y)
        y[:10] = np.arange(10)  # set() of host data: also a snapshot
    expected = data.copy()
    expected[:10] = np.arange(10)
    data[:] = -1  # later changes to the numpy array do not reach the graph
    del c
    gc.collect()
    g.replay()
    np.testing.assert_allclose(y.get(), expected, rtol=1e-6)


def test_host_slot_is_read_and_written_at_each_replay(dev: cg.Device, rng: np.random.Generator) -> None:
    inp = cg.HostSlot(64, "float32")
    out = cg.HostSlot(64, "float32")
    x, y = cg.zeros(64, "float32"), cg.zeros(64, "float32")
    with cg.capture() as g:
        x.set(inp)
        cg.ops.scale(2.0, x, out=y)
        out.copy_from(y)
    for _ in range(3):
        v = random_array(rng, 64, "float32")
        inp.array[...] = v
        out.array[...] = np.nan
        g.replay()
        dev.stream.synchronize()
        np.testing.assert_array_equal(out.array, 2 * v)
    with pytest.raises(ValueError, match="slot is \\(64,\\) float32, array is \\(3,\\) float32"):
        inp.copy_to(cg.zeros(3, "float32"))
    del inp, out
    gc.collect()
    g.replay()  # the graph keeps the slots alive
    g.close()


def test_device_scalar(dev: cg.Device, rng: np.random.Generator) -> None:
    s = cg.DeviceScalar(0.5)
    assert s.get() == 0.5
    assert s.dtype == np.float32
    assert s.size == 1
    x_h = random_array(rng, 300, "float32")
    x, y = cg.asarray(x_h), cg.zeros(300, "float32")
    with cg.capture() as g:
        cg.ops.axpy(s, x, y)
    total = np.zeros(300, np.float32)
    for v in (0.5, -1.25, 3.0):
        s.set(v)
        g.replay()
        total = (np.float32(v) * x_h + total).astype(np.float32)
    np.testing.assert_allclose(y.get(), total, rtol=1e-5)
    i = cg.DeviceScalar(3, "int32")
    with pytest.raises(TypeError, match="not an integer"):
        i.set(2.5)
    with pytest.raises(ValueError, match="does not fit in int32"):
        i.set(1 << 40)
    with pytest.raises(TypeError, match="takes a number"):
        i.set("4")
    with pytest.raises(cg.CaptureInvalidatedError), cg.capture():
        cg.ops.axpy(s, x, y)
        with pytest.raises(cg.CaptureError, match="would freeze the value into the graph"):
            s.set(1.0)


# safety ------------------------------------------------------------------------------
ILLEGAL = {
    "stream sync": (lambda d, x: d.stream.synchronize(), "Stream.synchronize()"),
    "device sync": (lambda d, x: d.synchronize(), "Device.synchronize()"),
    "get": (lambda d, x: x.get(), "DeviceArray.get()"),
    "get_async": (lambda d, x: x.get_async(), "DeviceArray.get_async()"),
    "stream query": (lambda d, x: d.stream.query(), "Stream.query()"),
    "event sync": (lambda d, x: d.stream.record().synchronize(), "Event.synchronize()"),
    "empty_cache": (lambda d, x: d.allocator.empty_cache(), "empty_cache()"),
}


@pytest.mark.parametrize("case", ILLEGAL)
def test_illegal_work_names_the_call_and_line(dev: cg.Device, case: str) -> None:
    call, name = ILLEGAL[case]
    before = baseline(dev)
    x = cg.ones(8, "float32")
    with pytest.raises(cg.CaptureError) as info, cg.capture():
        cg.ops.scale(2.0, x, out=x)
        call(dev, x)
    message = str(info.value)
    del info  # its traceback holds the frames that hold x
    assert name in message
    assert "cannot be recorded in a graph" in message
    assert "test_capture.py:" in message  # the user's line
    assert "is now invalid" in message
    assert np.all(x.get() == 1)  # nothing of the failed capture ever ran
    del x
    assert_clean(dev, before)


def test_swallowed_capture_error_still_invalidates(dev: cg.Device) -> None:
    x = cg.ones(8, "float32")
    with pytest.raises(cg.CaptureInvalidatedError, match=r"DeviceArray.get\(\)"), cg.capture():
        cg.ops.scale(2.0, x, out=x)
        with contextlib.suppress(cg.CaptureError):
            x.get()
    assert cg.capture_status() == "none"


def test_relaxed_mode_allows_work_on_other_streams(dev: cg.Device) -> None:
    other = cg.full(4, 5.0, "float32")
    x = cg.ones(4, "float32")
    s = dev.create_stream()
    with cg.capture(stream=s, mode="relaxed") as g:
        cg.ops.scale(2.0, x, out=x, stream=s)
        assert other.get().tolist() == [5.0] * 4  # another stream, relaxed: allowed
    g.replay()
    s.synchronize()
    assert x.get(stream=s).tolist() == [2.0] * 4
    g.close()
    s.close()


# failures at every stage ---------------------------------------------------------------
class Boom(Exception):
    pass


@pytest.mark.parametrize("stage", ["before first op", "mid-capture", "keyboard interrupt"])
def test_user_exceptions_undo_everything(dev: cg.Device, stage: str) -> None:
    before = baseline(dev)
    x = cg.ones(64, "float32")
    error = KeyboardInterrupt if stage == "keyboard interrupt" else Boom
    with pytest.raises(error), cg.capture():
        if stage != "before first op":
            t = cg.ops.scale(2.0, x)  # pool memory, then the failure
            cg.ops.add(t, x, out=x)
            del t
        raise error()
    assert np.all(x.get() == 1)
    del x
    assert_clean(dev, before)


@pytest.mark.parametrize("stage", ["instantiate", "begin"])
def test_driver_failure_after_capture_undoes_everything(
    dev: cg.Device, stage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = baseline(dev)
    x = cg.ones(64, "float32")
    name = {"instantiate": "graph_instantiate", "begin": "capture_info"}[stage]

    def broken(*args: object, **kwargs: object) -> None:
        raise cg.CudaError(2, "CUDA_ERROR_OUT_OF_MEMORY", "cuGraphInstantiate", "injected")

    monkeypatch.setattr(dev.backend, name, broken)
    with pytest.raises(cg.CudaError, match="injected"), cg.capture():
        t = cg.ops.scale(2.0, x)
        cg.ops.add(t, x, out=x)
        del t
    monkeypatch.undo()
    del x
    assert_clean(dev, before)


def test_failure_in_upload_leaves_graph_usable(dev: cg.Device, monkeypatch: pytest.MonkeyPatch) -> None:
    before = baseline(dev)
    x = cg.ones(64, "float32")
    with cg.capture() as g:
        t = cg.ops.scale(2.0, x)
        cg.ops.add(t, x, out=x)
        del t

    launch = dev.backend.graph_launch

    def broken(exec_: object, stream: object, upload: bool = False) -> None:
        if upload:
            raise cg.CudaError(2, "CUDA_ERROR_OUT_OF_MEMORY", "cuGraphUpload", "injected")
        launch(exec_, stream)

    monkeypatch.setattr(dev.backend, "graph_launch", broken)
    with pytest.raises(cg.CudaError, match="injected"):
        g.upload()
    monkeypatch.undo()
    g.upload()
    g.replay()
    assert np.all(x.get() == 3)
    g.close()
    del x
    assert_clean(dev, before)


def test_close_is_idempotent_and_final(dev: cg.Device) -> None:
    before = baseline(dev)
    x = cg.ones(8, "float32")
    with cg.capture() as g:
        cg.ops.scale(2.0, x, out=x)
    g.replay()
    g.close()
    g.close()
    assert g.state == "closed"
    with pytest.raises(RuntimeError, match="this graph is closed"):
        g.replay()
    with pytest.raises(TypeError, match=re.escape("made by cg.capture")):
        cg.Graph()
    with cg.capture() as g2:
        cg.ops.scale(2.0, x, out=x)
    del g2  # garbage collection closes it
    gc.collect()
    assert np.all(x.get() == 2)
    del x
    assert_clean(dev, before)


def test_refcount_of_inputs_drops_after_close(dev: cg.Device) -> None:
    x = cg.ones(8, "float32")
    start = sys.getrefcount(x)
    with cg.capture() as g:
        cg.ops.scale(2.0, x, out=x)
    assert sys.getrefcount(x) > start
    g.close()
    settle(dev)
    assert sys.getrefcount(x) == start


def test_a_graph_captured_inside_another_capture_is_instantiated_on_first_use(dev: cg.Device) -> None:
    x = cg.zeros(4, "float32", device=dev)
    side = dev.create_stream()
    with cg.capture(device=dev) as outer:
        with cg.capture(stream=side) as inner:  # the driver refuses to instantiate here
            cg.ops.fill(x, 1.0, stream=side)
        assert inner.state == "captured"
        with pytest.raises(cg.CaptureError, match="forbids instantiating"):
            inner.instantiate()  # refused before the driver would invalidate the capture
        inner.replay(stream=outer.stream)  # embedded as a child node
        cg.ops.scale(2.0, x, x, stream=outer.stream)
    assert outer.state == "ready"
    outer.replay()
    np.testing.assert_array_equal(x.get(), np.full(4, 2.0, "float32"))
    x.set(np.zeros(4, "float32"))
    side.wait(dev.current_stream())  # (the set is queued on the current stream)
    inner.replay(stream=side)  # instantiated now, on first use
    assert inner.state == "ready"
    side.synchronize()
    np.testing.assert_array_equal(x.get(), np.ones(4, "float32"))


# replay inside a capture (issue 26, item 4) ----------------------------------------------
def _doubling_graph(dev: cg.Device, x: cg.DeviceArray) -> cg.Graph:
    """A graph captured on a stream of its own: x *= 2."""
    dev.current_stream().synchronize()  # (x was written there; the graph's stream reads it)
    own = dev.create_stream()
    with cg.capture(stream=own) as g:
        cg.ops.scale(2.0, x, out=x, stream=own)
    own.synchronize()
    return g


def test_replay_without_stream_inside_a_capture_is_embedded(dev: cg.Device, rng: np.random.Generator) -> None:
    x_h = random_array(rng, 64, "float32")
    x = cg.asarray(x_h)
    g = _doubling_graph(dev, x)
    with cg.capture() as outer:  # the current stream is captured: g.replay() lands in outer
        g.replay()
        cg.ops.axpy(1.0, x, x)  # x += x
    dev.synchronize()
    np.testing.assert_array_equal(x.get(), x_h)  # nothing ran while capturing
    assert "child" in {n.type for n in outer.nodes}
    outer.replay()
    outer.replay()
    np.testing.assert_allclose(x.get(), x_h * 16, rtol=1e-6)
    assert g.replays == 0  # it ran only as outer's child node


def test_replay_without_stream_inside_a_graphed_function_is_embedded(dev: cg.Device) -> None:
    acc = cg.ones(8, "float32")
    g = _doubling_graph(dev, acc)

    def body(x: cg.DeviceArray) -> cg.DeviceArray:
        g.replay()  # acc *= 2, in the graphed body's graph
        cg.ops.axpy(1.0, x, acc)  # acc += x
        return acc

    f = cg.graphed(body, warmup=0)
    one = cg.ones(8, "float32")
    seen = [float(f(one).get()[0]) for _ in range(3)]
    assert seen == [3.0, 7.0, 15.0]  # each call: acc = 2 acc + 1 (eagerly once: 3, 3, 3)


def test_replay_beside_a_capture_of_this_thread_is_refused(dev: cg.Device, rng: np.random.Generator) -> None:
    x_h = random_array(rng, 64, "float32")
    x = cg.asarray(x_h)
    g = _doubling_graph(dev, x)
    y = cg.zeros(64, "float32")
    other = dev.create_stream()
    before = dev.allocator.stats().in_use
    refused = r"Graph.replay\(\) on stream .* while this thread captures"
    for how in ({}, {"stream": dev.stream}):  # the default (g's stream), or one given
        with pytest.raises(cg.CaptureError, match=refused), cg.capture(stream=other):
            cg.ops.fill(y, 1.0, stream=other)
            g.replay(**how)  # would run now, outside the capture of `other`
    dev.synchronize()
    np.testing.assert_array_equal(x.get(), x_h)  # g never ran
    assert g.replays == 0
    assert dev.allocator.stats().in_use == before
    g.replay()  # after the capture: on its own stream, as before
    g.stream.synchronize()
    np.testing.assert_array_equal(x.get(), x_h * 2)


def test_replay_from_another_thread_beside_a_capture_runs(dev: cg.Device, rng: np.random.Generator) -> None:
    """Only a capture of the replaying thread refuses: another thread's replay runs."""
    x_h = random_array(rng, 64, "float32")
    x = cg.asarray(x_h)
    g = _doubling_graph(dev, x)
    errors: list[BaseException] = []
    backend = dev.backend.name

    def replay() -> None:
        try:
            with cg.override(backend=backend):
                g.replay()
        except BaseException as exc:  # reported below
            errors.append(exc)

    y = cg.zeros(8, "float32")
    with cg.capture():
        cg.ops.fill(y, 1.0)
        t = threading.Thread(target=replay)
        t.start()
        t.join()
    assert not errors, errors
    g.stream.synchronize()
    np.testing.assert_array_equal(x.get(), x_h * 2)


# a graph that is not ready (issue 26, item 9) ------------------------------------------------
def test_a_closed_graph_names_the_operation_refused(dev: cg.Device) -> None:
    x = cg.ones(8, "float32")
    y = cg.ones(8, "float32")
    with cg.capture() as g:
        cg.ops.scale(2.0, x, out=x)
    with cg.capture(instantiate=False) as source:
        cg.ops.scale(2.0, x, out=x)
    g.close()
    calls = {
        "Graph.replay()": lambda: g.replay(),
        "Graph.upload()": lambda: g.upload(),
        "Graph.update()": lambda: g.update(source),
        "Graph.rebind()": lambda: g.rebind(x, y),
        "Graph.repoint()": lambda: g.repoint(x, y),
        "Graph.set_arg()": lambda: g.set_arg(0, 0, 1.0),
    }
    for op, call in calls.items():
        with pytest.raises(cg.GraphStateError) as info:
            call()
        assert isinstance(info.value, cg.CudaGraphsError)
        assert isinstance(info.value, RuntimeError)  # (what it was before: still caught there)
        assert str(info.value).startswith(f"{op}: this graph is closed"), str(info.value)
        assert "capture it again" in str(info.value)
    with pytest.raises(cg.GraphStateError, match=r"Graph.replay\(\): this graph is captured.*instantiate"):
        source.replay()
    g.close()  # (still idempotent)
