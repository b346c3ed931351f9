"""Threads: captures, replays, one graphed callable, eager ops and the collector at once.

Every result is checked against numpy; an output of the shared graphed
callable may be stale by the time its thread reads it (another thread called
it), which must then raise StaleOutputError, never give the other thread's
numbers. When the threads are done, the allocator holds what it held before.
"""

from __future__ import annotations

import gc
import threading
import traceback
import warnings
from typing import Any

import numpy as np
import pytest
from conftest import live_blocks, random_array

import cudagraphs as cg
from cudagraphs._allocator import round_size

THREADS = 6
ROUNDS = 8


def _report(errors: list[BaseException]) -> str:
    """The first error with its traceback (it was raised in a worker thread)."""
    return f"{len(errors)} errors; the first: " + "".join(traceback.format_exception(errors[0]))


def _begin(dev: cg.Device) -> int:
    """Get the device ready; return the allocator's bytes in use (what the end must find)."""
    cg.ops.preload_dtypes(["float32"], dev)
    gc.collect()
    dev.synchronize()
    return dev.allocator.stats().in_use


def _run(worker: Any, n: int, errors: list[BaseException]) -> None:
    """Run ``worker(seed)`` in ``n`` threads; none may have failed."""
    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, _report(errors)


def _end(dev: cg.Device, start: int) -> None:
    """Every thread is done and the callable closed: the allocator holds what it held before."""
    gc.collect()
    dev.synchronize()
    assert dev.allocator.stats().in_use == start, live_blocks(dev)


def _scale_add(x: cg.DeviceArray, y: cg.DeviceArray) -> cg.DeviceArray:
    return cg.ops.add(cg.ops.scale(3.0, x), y)


def test_threads_capture_replay_call_one_graphed_callable_and_collect(
    device: cg.Device,
) -> None:
    dev = device
    start = _begin(dev)
    shared = [cg.graphed(_scale_add, device=dev)]
    barrier = threading.Barrier(THREADS)
    counts = {"right": 0, "stale": 0}
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            stream = dev.create_stream()
            with stream:
                barrier.wait(30)
                for r in range(ROUNDS):
                    x_h, y_h = random_array(rng, 256, "float32"), random_array(rng, 256, "float32")
                    x, y = cg.asarray(x_h), cg.asarray(y_h)
                    # a capture of this thread's stream, replayed: z = 2 x + y, twice over
                    z = cg.full(256, -9.0, "float32")  # (poison: the graph writes every element)
                    with cg.capture() as g:
                        cg.ops.add(cg.ops.scale(2.0, x), y, out=z)
                        cg.ops.axpy(1.0, z, z)  # z = 2 z
                    for _ in range(2):
                        g.replay()
                    np.testing.assert_allclose(z.get(), 2 * (2 * x_h + y_h), rtol=1e-5, atol=1e-5)
                    g.close()
                    # the shared callable: this call's numbers, or StaleOutputError
                    out = shared[0](x, y)
                    try:
                        again = cg.ops.add(out, x)  # an eager op reading the output
                        got = out.get()
                        np.testing.assert_allclose(got, 3 * x_h + y_h, rtol=1e-5, atol=1e-5)
                        np.testing.assert_allclose(again.get(), 4 * x_h + y_h, rtol=1e-5, atol=1e-5)
                        kind = "right"
                    except cg.StaleOutputError:
                        kind = "stale"
                    with lock:
                        counts[kind] += 1
                    # eager ops, and the collector in the middle of everything
                    w = cg.ops.scale(0.5, cg.ops.add(x, y))
                    np.testing.assert_allclose(w.get(), 0.5 * (x_h + y_h), rtol=1e-5, atol=1e-5)
                    if r % 3 == seed % 3:
                        gc.collect()
            stream.synchronize()
            stream.close()
        except BaseException as exc:  # reported below
            errors.append(exc)

    _run(worker, THREADS, errors)
    assert counts["right"] + counts["stale"] == THREADS * ROUNDS
    # the callable still computes, then lets go of everything it held
    x_h, y_h = random_array(np.random.default_rng(99), 256, "float32"), np.ones(256, "float32")
    f = shared.pop()
    np.testing.assert_allclose(f(cg.asarray(x_h), cg.asarray(y_h)).get(), 3 * x_h + y_h, rtol=1e-5, atol=1e-5)
    f.close()
    del f
    _end(dev, start)


@pytest.mark.parametrize("copy_outputs", [False, True])
def test_threads_reading_outputs_get_their_own_result_or_stale(
    device: cg.Device,
    copy_outputs: bool,
) -> None:
    """The issue's program: 8 threads x rounds of call-then-read; a copy is never stale."""
    dev = device
    start = _begin(dev)
    shared = [cg.graphed(_scale_add, device=dev, copy_outputs=copy_outputs)]
    wrong: list[Any] = []
    errors: list[BaseException] = []
    stale = [0]

    def worker(seed: int) -> None:
        rng = np.random.default_rng(100 + seed)
        try:
            stream = dev.create_stream()
            with stream:
                for _ in range(ROUNDS):
                    x_h, y_h = random_array(rng, 256, "float32"), random_array(rng, 256, "float32")
                    out = shared[0](cg.asarray(x_h), cg.asarray(y_h))
                    try:
                        got = out.get()
                    except cg.StaleOutputError:
                        stale[0] += 1
                        continue
                    if not np.allclose(got, 3 * x_h + y_h, rtol=1e-5, atol=1e-5):
                        wrong.append(got)
            stream.synchronize()
            stream.close()
        except BaseException as exc:  # reported below
            errors.append(exc)

    _run(worker, 8, errors)
    assert not wrong, f"{len(wrong)} wrong results"
    if copy_outputs:
        assert stale[0] == 0
    shared.pop().close()
    _end(dev, start)


def test_a_graphed_call_from_a_new_thread_points_its_input_copy(device: cg.Device) -> None:
    """A thread that never made a CUDA context current moves a graph's input copy.

    The copy node's update takes the thread's current context; with none
    (a fresh thread) the driver crashed the process (found by the stress
    test above on an H100). Each thread's input lives at its own address.
    """
    rng = np.random.default_rng(7)
    f = cg.graphed(lambda x: cg.ops.scale(2.0, x), device=device)
    first = random_array(rng, (64,), "float32")
    for _ in range(3):  # eager, capture, replay: the graph copies its input in
        np.testing.assert_allclose(f(cg.asarray(first)).get(), 2 * first, rtol=1e-6)
    results: list[np.ndarray] = []
    errors: list[BaseException] = []
    data = [random_array(rng, (64,), "float32") for _ in range(3)]
    inputs: list[cg.DeviceArray] = []  # (each kept alive: the next one cannot take its address)

    def worker(h: np.ndarray) -> None:
        try:
            x = cg.asarray(h)  # a new address: the copy node is pointed at it
            inputs.append(x)
            results.append(f(x).get())
        except BaseException as exc:
            errors.append(exc)

    for h in data:  # one after the other: each thread is new
        t = threading.Thread(target=worker, args=(h,))
        t.start()
        t.join()
    assert not errors, _report(errors)
    for got, h in zip(results, data, strict=True):
        np.testing.assert_allclose(got, 2 * h, rtol=1e-6)
    f.close()


def test_a_stream_closed_by_its_thread_while_a_release_uses_it_is_destroyed_after(
    device: cg.Device, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 26 item 8: a pool's segment, freed in one thread on another thread's stream.

    The release found the stream open; its thread closed (destroyed) it before
    the release queued the free there: the free failed on a destroyed stream
    and the segment stayed in use for ever. Here the other thread closes it at
    that very point (between ordering the free after the graph's streams and
    queuing it), every time.
    """
    dev = device
    start = _begin(dev)
    backend, real_wait = dev.backend, dev.backend.stream_wait_event
    handles = backend.live_handles() if backend.name == "sim" else {}
    s1, s2 = dev.create_stream(), dev.create_stream()
    x_h = random_array(np.random.default_rng(8), 256, "float32")
    x = cg.asarray(x_h, stream=s1)
    with cg.capture(stream=s1) as g:
        t = cg.ops.scale(2.0, x, stream=s1)  # from the graph's pool
    g.replay(stream=s1)
    s2.wait(s1)
    g.replay(stream=s2)  # the segment is freed on one of them, after the other
    g.close()
    np.testing.assert_allclose(t.get(stream=s2), 2 * x_h, rtol=1e-6)
    closed: list[cg.Stream] = []

    def wait_then_close(raw: Any, event: Any) -> None:  # the free is next, on `raw`
        real_wait(raw, event)
        if not closed:
            victim = s1 if raw is s1._raw else s2
            closer = threading.Thread(target=victim.close)  # its thread closes it now
            closer.start()
            closer.join(30)
            assert not closer.is_alive()  # (the close does not wait for the release)
            closed.append(victim)

    monkeypatch.setattr(backend, "stream_wait_event", wait_then_close)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (a deferred release that failed warns)
        del t  # the pool's last array: its segment goes back to the driver
        gc.collect()
        dev.allocator.stats()  # a safe point, where the release runs
    monkeypatch.undo()
    assert len(closed) == 1
    assert closed[0].closed
    s1.close()
    s2.close()
    np.testing.assert_allclose(x.get(), x_h, rtol=0)  # the device still works
    del x
    _end(dev, start)
    if backend.name == "sim":  # both streams destroyed (the one closed mid-release after it)
        assert backend.live_handles().get("stream", 0) == handles.get("stream", 0)


def test_a_pool_segment_given_back_as_another_thread_gets_its_address(
    backend: str, device: cg.Device, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread's allocation that the driver serves at a pool segment's address just freed.

    From a segment's free on, the driver may give its address to another
    thread's allocation; the segment's record was removed after the free,
    outside the allocator's lock, so it took that allocation's record instead
    (its block's release then raised KeyError, and the segment's bytes stayed
    counted in use; seen on an H100). The free is driven here into exactly
    that window; the simulator reuses the address as the driver does.
    """
    if backend != "sim":
        pytest.skip("the free is driven into the window through the simulator; the driver cannot be")
    sim, alloc = device.backend, device.allocator
    start = _begin(device)
    alloc.empty_cache()  # nothing cached: the other thread's allocation is a miss
    nbytes = 1000  # the segment's size: the other thread's allocation fits in its freed range
    pool = cg.GraphPool(device)
    segment = pool.allocate(nbytes)  # the pool's first block: at its segment's address
    real_free, real_alloc = sim.mem_free, sim.mem_alloc
    got: list[cg.Block] = []
    errors: list[BaseException] = []
    threads: list[threading.Thread] = []

    def alloc_once_freed(ordinal: int, n: int, stream: Any) -> int:
        if n == round_size(nbytes):  # the segment's stream-ordered free is done: its address is
            sim.synchronize(device.stream._raw)  # the lowest freed one this allocation fits in
        return real_alloc(ordinal, n, stream)

    def other() -> None:
        try:
            got.append(alloc.malloc(nbytes))
        except BaseException as exc:
            errors.append(exc)

    def free_then_other_thread_allocates(ptr: int, stream: Any) -> None:
        real_free(ptr, stream)
        t = threading.Thread(target=other)
        threads.append(t)
        t.start()
        if not alloc._lock.locked():  # nothing holds the other thread back: it allocates now
            t.join()

    monkeypatch.setattr(sim, "mem_alloc", alloc_once_freed)
    monkeypatch.setattr(sim, "mem_free", free_then_other_thread_allocates)
    pool.release(segment, None)  # the pool's last block: its segment goes back to the driver
    for t in threads:
        t.join(300)
    monkeypatch.undo()
    assert not errors, _report(errors)
    (block,) = got
    assert block.ptr == segment  # (the address was reused: the case under test)
    device.synchronize()
    assert alloc.stats().in_use == start + round_size(nbytes), live_blocks(device)
    got.clear()
    del block  # its release finds its record: no KeyError, nothing left in use
    _end(device, start)


def test_a_graph_released_after_its_replay_stream_was_closed_waits_for_that_stream(
    device: cg.Device, monkeypatch: pytest.MonkeyPatch
) -> None:
    """During another thread's capture, close a graph, then the stream it replayed on.

    Both are deferred until the capture ends; the graph's release then runs
    first, and must still wait for the replay on that stream (closed, not yet
    destroyed) before its executable and memory go: it used to skip a closed
    stream, and the stream was synchronized only by its destruction, after.
    """
    cg.ops.preload_dtypes(["float32"], device)
    s, other = device.create_stream(), device.create_stream()
    x, y = cg.zeros(16, "float32"), cg.zeros(4, "float32")
    device.synchronize()
    with cg.capture(stream=s) as g:
        cg.ops.scale(2.0, x, out=x, stream=s)
    g.replay(s)
    raw, backend, log = s._raw, device.backend, []
    sync, destroy = backend.synchronize, backend.destroy
    monkeypatch.setattr(
        backend, "synchronize", lambda t, block=True: (log.append(("sync", t)), sync(t, block))[1]
    )
    monkeypatch.setattr(backend, "destroy", lambda h: (log.append(("destroy", h)), destroy(h))[1])
    began, done, errors = threading.Event(), threading.Event(), []

    def capture() -> None:
        try:
            with cg.capture(stream=other, mode="thread_local"):
                cg.ops.fill(y, 1.0, stream=other)
                began.set()
                done.wait(10)
        except BaseException as exc:  # (reported below)
            errors.append(exc)
            began.set()

    t = threading.Thread(target=capture)
    t.start()
    began.wait(10)
    exec_ = g._exec
    g.close()  # (deferred: a capture is active)
    s.close()  # (deferred too; the stream is closed from here)
    done.set()
    t.join(10)
    assert not errors, _report(errors)
    assert ("destroy", exec_) in log
    first_sync = next((i for i, e in enumerate(log) if e == ("sync", raw)), None)
    assert first_sync is not None, log
    assert first_sync < log.index(("destroy", exec_)), (
        f"the graph went before its replay stream was waited for: {log}"
    )
