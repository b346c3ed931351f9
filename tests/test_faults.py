"""Fault injection: every driver call of every path fails once, and nothing breaks.

The simulated driver fails the N-th call of a kind (``SimBackend.inject``)
with the code the driver would return. For each path (eager ops, capture,
replay, update, rebind, builder, host copies, graphed callables, two streams
sharing blocks and a graph pool), each kind, and the allocator's cache cold
(emptied before the run: allocations reach the driver) and warm (a run of
the path left blocks on its streams' free lists), N runs from 1 until the
path makes fewer calls than N. After every injected failure: the error is a
documented one (a ``CudaError`` with the driver's code, or what the library
turns it into), nothing leaks (allocator and pinned memory back to their
baseline, every reserved byte reachable by ``empty_cache()``, the driver's
memory back to its baseline), no release failed later with a warning, no
capture is left, the stream works and the next capture succeeds.
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Callable, Iterator

import numpy as np
import pytest

import cudagraphs as cg
from cudagraphs._errors import CudaError, CudaGraphsError
from cudagraphs.backends.sim import FAULTS

COUNTS: dict[str, int] = {}  # path -> faults injected (printed by the last test)


@pytest.fixture
def sim(dev: cg.Device) -> Iterator[cg.Device]:
    if dev.backend.name != "sim":
        pytest.skip("fault injection is a feature of the simulator")
    yield dev
    dev.backend.clear_faults()


def _eager(dev: cg.Device) -> None:
    x = cg.asarray(np.arange(64, dtype=np.float32))
    y = cg.ops.add(x, x)
    cg.ops.axpy(2.0, x, y)
    assert np.array_equal(y.get(), 4 * np.arange(64))


def _capture_replay(dev: cg.Device) -> None:
    x = cg.asarray(np.arange(64, dtype=np.float32))
    with cg.capture() as g:
        y = cg.ops.add(x, x)  # allocates from the graph's pool
        cg.ops.scale(3.0, y, out=y)
    g.upload()
    g.replay()
    assert np.array_equal(y.get(), 6 * np.arange(64))
    g.close()


def _update_rebind(dev: cg.Device) -> None:
    x1, x2 = cg.full(64, 1.0, "float32"), cg.full(64, 2.0, "float32")
    y = cg.zeros(64, "float32")
    g = cg.capture(lambda: cg.ops.axpy(1.0, x1, y))
    source = cg.capture(lambda: cg.ops.axpy(1.0, x2, y), instantiate=False)
    g.update(source)
    g.rebind(x2, x1)
    g.replay()
    assert np.array_equal(y.get(), np.ones(64))
    g.close()


def _builder(dev: cg.Device) -> None:
    a = cg.asarray(np.arange(64, dtype=np.float32))
    x, out = cg.zeros(64, "float32"), cg.zeros(64, "float32")
    seen: list[int] = []
    b = cg.GraphBuilder()
    n1 = b.memcpy(x, a)
    n2 = b.launch(cg.ops.elementwise_kernel("cg_add", np.dtype("float32")), 1, 64, out, x, x, 64, after=[n1])
    b.host(seen.append, 1, after=[n2])
    g = b.instantiate()
    g.replay()
    assert np.array_equal(out.get(), 2 * np.arange(64))
    assert seen == [1]
    g.close()


def _host_copies(dev: cg.Device) -> None:
    x = cg.asarray(np.arange(64, dtype=np.float32))
    pending = x.get_async()
    slot = cg.HostSlot(64, "float32")
    slot.copy_from(x)
    dev.synchronize()
    assert np.array_equal(pending.result(), np.arange(64))
    assert np.array_equal(slot.array, np.arange(64))
    slot.close()


def _graphed_callable(dev: cg.Device) -> None:
    def fn(x: cg.DeviceArray) -> cg.DeviceArray:
        return cg.ops.scale(2.0, cg.ops.add(x, x))  # a temporary of the shared pool

    f = cg.graphed(fn, buckets=[2, 4])
    for n in (3, 2, 3):
        out = f(cg.asarray(np.arange(n * 4, dtype=np.float32).reshape(n, 4)))
        assert np.array_equal(out.get(), 4 * np.arange(n * 4).reshape(n, 4))
    m = cg.GraphModule(lambda x, *, w: cg.ops.add(x, w), params={"w": cg.ones(4, "float32")})
    m(cg.zeros(4, "float32"))
    assert m.params is not None
    m.params["w"] = cg.full(4, 2.0, "float32")
    m.refresh()
    assert np.array_equal(m(cg.zeros(4, "float32")).get(), np.full(4, 2.0))
    f.close()
    m.graphed.close()


def _two_streams(dev: cg.Device) -> None:
    """Blocks and a graph pool used on two streams: the allocator's events and waits.

    A block freed on one stream taken by the other (an event on its owner),
    a block released with an event on the stream that read it
    (``record_stream``), and a graph pool replayed on both streams whose last
    array dies after its graph (the free of its segment waits for both).
    """
    data = np.arange(1, 257, dtype=np.float32)
    s1 = dev.create_stream()
    try:
        s2 = dev.create_stream()
        try:
            x = cg.asarray(data, stream=s1)
            y = cg.ops.add(x, x, stream=s1)
            s2.wait(s1)
            y.record_stream(s2)
            z = cg.ops.add(y, y, stream=s2)  # s2 reads y
            del x, y  # back to s1's free list, y's with an event on s2
            gc.collect()
            w = cg.empty(256, "float32", stream=s2)  # cold: taken from s1's free list
            cg.ops.scale(0.25, z, out=w, stream=s2)
            with cg.capture(stream=s1) as g:
                t = cg.ops.scale(2.0, w, stream=s1)  # from the graph's pool
            s1.wait(s2)
            g.replay(stream=s1)
            s2.wait(s1)
            g.replay(stream=s2)
            g.close()
            t.record_stream(s2)
            r = cg.ops.add(t, t, stream=s2)
            del t  # the pool's last array: its segment is freed after both streams
            gc.collect()
            assert np.array_equal(r.get(stream=s2), 4 * data)
        finally:
            s2.close()
    finally:
        s1.close()


PATHS: dict[str, Callable[[cg.Device], None]] = {
    "eager ops": _eager,
    "capture and replay": _capture_replay,
    "update and rebind": _update_rebind,
    "builder": _builder,
    "host copies": _host_copies,
    "graphed callables": _graphed_callable,
    "two streams": _two_streams,
}


def _pinned(dev: cg.Device) -> int:
    """Live pinned host allocations, once the cache gave its buffers back."""
    gc.collect()
    dev.synchronize()
    dev.pinned.clear()
    gc.collect()
    cg.Device(dev.index).allocator.stats()  # a safe point: deferred releases run
    return len(dev.backend._host)


def _handles(dev: cg.Device) -> dict[str, int]:
    gc.collect()
    dev.allocator.stats()  # a safe point: deferred releases run
    return dev.backend.live_handles()  # type: ignore[no-any-return]


def _driver_used(dev: cg.Device) -> int:
    """Device memory the driver has given out, once the cache gave its blocks back."""
    dev.allocator.empty_cache()
    free, total = dev.mem_info()
    return total - free


def _clean(
    dev: cg.Device,
    before: cg.AllocatorStats,
    pinned_before: int,
    handles_before: dict[str, int],
    used_before: int,
) -> None:
    gc.collect()
    dev.synchronize()
    assert cg.capture_status(dev.stream) == "none"
    assert dev.allocator.stats().in_use == before.in_use, "device memory leaked"
    used = _driver_used(dev)
    stats = dev.allocator.stats()
    assert stats.reserved == stats.in_use, f"{stats.cached} B reserved that empty_cache() cannot reach"
    assert used == used_before, f"the driver holds {used - used_before} B the allocator lost"
    assert _pinned(dev) <= pinned_before, "pinned memory leaked"
    handles = _handles(dev)
    assert all(n <= handles_before.get(k, 0) for k, n in handles.items()), (
        f"driver handles leaked: {handles} after, {handles_before} before"
    )
    _capture_replay(dev)  # the stream works and the next capture succeeds


@pytest.mark.parametrize("cache", ["cold", "warm"])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kind", FAULTS)
def test_every_call_of_the_path_fails_once_and_nothing_breaks(
    sim: cg.Device, path: str, kind: str, cache: str
) -> None:
    run = PATHS[path]
    run(sim)  # warm: compiled kernels, cached blocks
    gc.collect()
    sim.synchronize()
    pinned_before = _pinned(sim)
    used_before = _driver_used(sim)
    before, handles_before = sim.allocator.stats(), _handles(sim)
    for nth in range(1, 200):
        if cache == "cold":
            sim.allocator.empty_cache()  # so that the path allocates from the driver too
        else:
            run(sim)  # its blocks wait on its streams' free lists (other streams take them)
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            fired = _fail_once(sim, path, kind, nth)
            if fired:
                _clean(sim, before, pinned_before, handles_before, used_before)
        late = [str(w.message) for w in warned if str(w.message).startswith("cudagraphs:")]
        assert not late, f"{path}, {kind} #{nth}: a release failed later: {late}"
        if not fired:  # the path makes fewer calls of this kind than nth
            break
        COUNTS[cache] = COUNTS.get(cache, 0) + 1


def _fail_once(sim: cg.Device, path: str, kind: str, nth: int) -> bool:
    """Run ``path`` with the ``nth`` call of ``kind`` failing; whether it fired."""
    backend = sim.backend
    backend.inject(kind, nth)
    try:
        PATHS[path](sim)
    except (CudaGraphsError, MemoryError) as exc:  # a fault may or may not end the path
        assert backend.injected(kind), f"{path}: failed without the fault: {exc!r}"  # noqa: PT017
        cause: BaseException | None = exc
        while cause is not None and not isinstance(cause, CudaError):
            cause = cause.__cause__ or cause.__context__
        code = FAULTS[kind][1]
        assert cause is not None, f"{path}, {kind} #{nth}: {exc!r} is not a driver error"  # noqa: PT017
        assert cause.code == code, f"{path}, {kind} #{nth}: {exc!r}"  # noqa: PT017
        del cause  # its traceback holds the path's frames and their arrays
    fired = backend.injected(kind)
    backend.clear_faults()
    return fired


def test_the_sweep_injected_faults(sim: cg.Device) -> None:
    total = sum(COUNTS.values())
    print(f"\nfault sweep: {total} injected faults: {COUNTS}")
    # (47 when written, cold only; then 143 cold and 139 warm with the two-stream path and the
    # record and wait kinds: a path that stops calling the driver shows here)
    assert COUNTS.get("cold", 0) >= 120
    assert COUNTS.get("warm", 0) >= 120


# the allocator's events, one failure at a time (issue 26, item 17) ------------------------------
EVENT_KINDS = ["event", "record", "wait"]  # cuEventCreate, cuEventRecord, cuStreamWaitEvent


@pytest.mark.parametrize("kind", EVENT_KINDS)
def test_a_block_of_another_stream_stays_cached_when_the_event_to_take_it_fails(
    sim: cg.Device, kind: str
) -> None:
    s = sim.create_stream()
    sim.allocator.empty_cache()
    x = cg.empty(4096, "uint8")  # on the compute stream
    ptr = x.ptr
    del x
    gc.collect()
    before, handles = sim.allocator.stats(), _handles(sim)
    sim.backend.inject(kind)
    with pytest.raises(CudaError) as info:
        cg.empty(4096, "uint8", stream=s)  # a miss on s: takes the block after an event on its owner
    assert sim.backend.injected(kind)
    assert info.value.code == FAULTS[kind][1]
    after = sim.allocator.stats()
    assert (after.in_use, after.reserved) == (before.in_use, before.reserved)
    assert _handles(sim) == handles  # no event left behind
    y = cg.empty(4096, "uint8", stream=s)  # the block is still there, and taken now
    assert y.ptr == ptr
    data = np.arange(4096) % 251
    y.set(data, stream=s)
    np.testing.assert_array_equal(y.get(stream=s), data)
    del y
    s.close()
    sim.allocator.empty_cache()
    assert sim.allocator.stats().reserved == before.in_use


@pytest.mark.parametrize("kind", ["event", "record"])
def test_a_release_whose_event_fails_raises_nothing_and_empty_cache_frees_the_block(
    sim: cg.Device, kind: str
) -> None:
    s = sim.create_stream()
    sim.synchronize()
    used_before = _driver_used(sim)
    base = sim.allocator.stats()
    data = np.arange(1, 1025, dtype=np.float32)
    x = cg.asarray(data)
    out = cg.empty(1024, "float32", stream=s)
    s.wait(sim.stream)
    cg.ops.copy(out, x, stream=s)  # s reads x, later
    x.record_stream(s)
    ptr = x.ptr
    sim.backend.inject(kind)
    del x  # its release records an event on s: the driver fails it
    gc.collect()
    z = cg.full(1024, 5.0, "float32")  # an unrelated call, where the release runs: no error
    assert sim.backend.injected(kind)
    assert z.ptr != ptr  # x's memory is not reused: no event orders its next user after s
    np.testing.assert_array_equal(out.get(stream=s), data)
    np.testing.assert_array_equal(z.get(), np.full(1024, 5.0))
    del z, out
    gc.collect()
    s.close()
    stats = sim.allocator.stats()
    assert stats.in_use == base.in_use
    assert _driver_used(sim) == used_before  # empty_cache() freed it
    assert sim.allocator.stats().reserved == base.in_use


@pytest.mark.parametrize("kind", EVENT_KINDS)
def test_a_graph_pool_whose_give_back_fails_raises_nothing_later_and_loses_nothing(
    sim: cg.Device, kind: str
) -> None:
    s1, s2 = sim.create_stream(), sim.create_stream()
    sim.synchronize()
    used_before = _driver_used(sim)
    base = sim.allocator.stats()
    data = np.arange(1, 257, dtype=np.float32)
    x = cg.asarray(data, stream=s1)
    with cg.capture(stream=s1) as g:
        t = cg.ops.scale(2.0, x, stream=s1)  # from the graph's pool
    g.replay(stream=s1)
    s2.wait(s1)
    g.replay(stream=s2)  # the pool's segment is freed after the work of both streams
    g.close()
    np.testing.assert_array_equal(t.get(stream=s2), 2 * data)
    sim.backend.inject(kind)
    del t  # the pool's last array
    gc.collect()
    z = cg.full(256, 3.0, "float32")  # an unrelated call, where the pool gives its segment back
    assert sim.backend.injected(kind)
    np.testing.assert_array_equal(z.get(), np.full(256, 3.0))
    del x, z
    gc.collect()
    s1.close()
    s2.close()
    assert sim.allocator.stats().in_use == base.in_use  # the segment is not held for ever
    assert _driver_used(sim) == used_before  # empty_cache() reached it
    assert sim.allocator.stats().reserved == base.in_use


def test_a_graph_pool_segment_whose_free_fails_is_set_aside_not_lost(
    sim: cg.Device, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver refuses the free of a pool's segment: it waits for empty_cache, not in use for ever."""
    s = sim.create_stream()
    sim.synchronize()
    used_before = _driver_used(sim)
    base = sim.allocator.stats()
    data = np.random.default_rng(3).standard_normal(256).astype(np.float32)
    x = cg.asarray(data, stream=s)
    with_x = sim.allocator.stats()
    with cg.capture(stream=s) as g:
        t = cg.ops.scale(2.0, x, stream=s)  # from the graph's pool
    g.replay(stream=s)
    g.close()
    np.testing.assert_allclose(t.get(stream=s), 2 * data, rtol=1e-6)
    real_free, failed = sim.backend.mem_free, []

    def refuse(ptr: int, stream: object) -> None:
        if stream is not None and not failed:  # (the segment's stream-ordered free)
            failed.append(ptr)
            raise CudaError(400, "CUDA_ERROR_INVALID_HANDLE", "cuMemFreeAsync", "destroyed")
        real_free(ptr, stream)

    monkeypatch.setattr(sim.backend, "mem_free", refuse)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (a deferred release that failed warns)
        del t  # the pool's last array
        gc.collect()
        stats = sim.allocator.stats()  # a safe point, where the pool gives its segment back
    monkeypatch.undo()
    assert failed
    assert stats.in_use == with_x.in_use  # set aside: not in use
    assert stats.reserved > with_x.reserved  # but still reserved, for empty_cache
    np.testing.assert_allclose(x.get(stream=s), data, rtol=0)
    del x
    gc.collect()
    s.close()
    assert _driver_used(sim) == used_before  # empty_cache() freed it
    assert sim.allocator.stats().reserved == base.in_use
