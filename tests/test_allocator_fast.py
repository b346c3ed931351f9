"""The caching allocator's hot pair in C: ``cg.empty`` from the free list, a Block's release.

Where ``cudagraphs._fastcall`` is built, ``cg.empty``'s common call takes a
cached block in C (``fast_empty``), a Block gives its memory back in the
deallocator of its C base (``BlockBase``), and the allocator's lock is a C
``Lock``. These tests count what C made, check the arrays against numpy and
the Python path (the same sequence in a process where the C part cannot be
imported: same arrays, same reuse, same counters), and cover the cases C
hands to Python: a busy lock, dead blocks waiting, captures, other streams.
Every test runs on each backend in CUDAGRAPHS_TEST_BACKENDS.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import call_while_held, compiled_part_or_skip, random_array

import cudagraphs as cg
from cudagraphs import _allocator

fast = compiled_part_or_skip()


def made_in_c(fn: Any) -> tuple[Any, int]:
    before = fast.alloc_calls()
    out = fn()
    return out, fast.alloc_calls() - before


def test_empty_is_made_in_c_from_the_free_list(device: cg.Device, rng: np.random.Generator) -> None:
    del device  # (cg.empty allocates on the current device, this one)
    gc.collect()
    first = cg.empty(300, "float32")  # (a miss, or a hit: the Python path or C)
    ptr = first.ptr
    del first
    before = _allocator_stats()
    for _ in range(5):
        a, n = made_in_c(lambda: cg.empty(300, "float32"))
        assert n == 1
        assert a.ptr == ptr  # the same block, from the free list
        h = random_array(rng, (300,), "float32")
        a.set(h)
        np.testing.assert_array_equal(a.get(), h)
        assert (a.shape, a.strides, a.dtype, a.size, a.is_contiguous) == ((300,), (4,), np.float32, 300, True)
        assert a._block.owner is a.device.allocator
        assert a._block.extra is None
        assert a._block.nbytes == 1200
        del a
    after = _allocator_stats()
    assert after.hits == before.hits + 5
    assert after.misses == before.misses
    assert after.in_use == before.in_use


def _allocator_stats() -> Any:
    return cg.current_device().allocator.stats()


SCRIPT = """
import gc, json, sys
import numpy as np
if sys.argv[1] == "python":  # the C part cannot be imported: the Python path
    sys.modules["cudagraphs._fastcall"] = None
import cudagraphs as cg
from cudagraphs import _allocator
dev = cg.current_device()
assert (_allocator._fastcall is None) == (sys.argv[1] == "python")
shapes = [5, (3, 4), (), 0, (2, 0, 3), (7,), 600_000, (16, 16)]
dtypes = ["float32", np.float64, np.dtype("int16"), "uint8", "complex64", "float32", "int64", "bool"]
ptrs, arrays, seen = [], [], {}
for rnd in range(3):
    for shape, dtype in zip(shapes, dtypes):
        a = cg.empty(shape, dtype)
        seen.setdefault(a.ptr, len(seen))
        ptrs.append(seen[a.ptr])
        b = a._block
        arrays.append([list(a.shape), list(a.strides), str(a.dtype), a.size, a.is_contiguous, b.nbytes])
        del b
        if rnd != 1:
            del a  # (round 1 keeps its arrays: round 2 cannot reuse those blocks)
        else:
            arrays.append("kept")
            globals().setdefault("keep", []).append(a)
al = dev.allocator
sizes = (1, 512, 513, 5 << 20, 0)
raws = [al.raw_malloc(n) for n in sizes]
for p in raws:
    al.raw_free(p)
again = [al.raw_malloc(n) for n in sizes]
ptrs += [seen.setdefault(p, len(seen)) for p in raws + again]
for p in again:
    al.raw_free(p)
gc.collect()
s = dev.allocator.stats()
print(json.dumps({"ptrs": ptrs, "arrays": arrays,
                  "stats": [s.in_use, s.reserved, s.cached, s.peak, s.hits, s.misses]}))
"""


def test_c_and_python_paths_give_the_same_arrays_reuse_and_counters(backend: str) -> None:
    env = {**os.environ, "CUDAGRAPHS_BACKEND": backend, "PYTHONPATH": str(Path(cg.__file__).parents[1])}
    runs = {}
    for path in ("c", "python"):
        out = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(SCRIPT), path],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        runs[path] = json.loads(out.stdout.strip().splitlines()[-1])
    assert runs["c"] == runs["python"]
    assert runs["c"]["stats"][4] > 0  # (hits: the free list was used)


def test_the_raw_pair_takes_and_gives_in_c(device: cg.Device, monkeypatch: pytest.MonkeyPatch) -> None:
    alloc, done = device.allocator, {"take": 0, "give": 0}
    take, give = fast.take, fast.give

    def counted_take(*args: Any) -> Any:
        out = take(*args)
        done["take"] += out is not None
        return out

    def counted_give(*args: Any) -> Any:
        out = give(*args)
        done["give"] += bool(out)
        return out

    monkeypatch.setattr(_allocator._fastcall, "take", counted_take)
    monkeypatch.setattr(_allocator._fastcall, "give", counted_give)
    alloc.raw_free(alloc.raw_malloc(700))  # (a miss first, maybe)
    done.update(take=0, give=0)
    before = alloc.stats()
    for _ in range(3):
        ptr = alloc.raw_malloc(700)
        alloc.raw_free(ptr)
    after = alloc.stats()
    assert done["take"] == 3
    assert done["give"] >= 3
    assert (after.hits - before.hits, after.misses - before.misses, after.in_use) == (3, 0, before.in_use)


def test_a_block_dropped_while_the_lock_is_held_is_queued_then_given_back(device: cg.Device) -> None:
    alloc = device.allocator
    gc.collect()
    a = cg.empty(100, "float64")
    ptr = a.ptr
    with alloc._lock:  # (as a garbage collection inside an allocation would find it)
        del a
        assert [d.ptr for d in _allocator._dead] == [ptr]
        assert isinstance(_allocator._dead[0], _allocator._DeadBlock)
    b, n = made_in_c(lambda: cg.empty(100, "float64"))  # dead blocks waiting: the Python path
    assert n == 0
    assert b.ptr == ptr
    assert not _allocator._dead


def test_empty_while_another_thread_holds_the_lock_waits_for_it(device: cg.Device) -> None:
    alloc = device.allocator
    gc.collect()
    cg.empty(64, "float32")  # (a block on the free list)
    before = fast.alloc_calls()
    assert call_while_held(alloc._lock, lambda: cg.empty(64, "float32").shape) == (64,)
    assert fast.alloc_calls() == before


def test_captures_and_devices_or_streams_given_take_the_python_path(device: cg.Device) -> None:
    gc.collect()
    cg.empty(32, "float32")
    s = device.create_stream()
    s.wait(device.stream)
    before = fast.alloc_calls()
    with s, cg.capture(device=device) as g:  # (s captured)
        x = cg.empty(32, "float32")  # the capture's memory
        cg.ops.fill(x, 1.0)
    assert x._block.owner is not device.allocator
    y = cg.empty(32, "float32", device=device)
    z = cg.empty(32, "float32", stream=device.stream)
    assert fast.alloc_calls() == before
    with s:
        w, n = made_in_c(lambda: cg.empty(32, "float32"))  # s's free list (a miss: Python; then C)
        del w
        w, n = made_in_c(lambda: cg.empty(32, "float32"))
    assert n == 1
    assert w.ptr not in (y.ptr, z.ptr)
    g.close()


def test_a_pool_referencing_its_own_blocks_is_never_cleared_under_them(device: cg.Device) -> None:
    """A block keeps its owner alive, unseen by the garbage collector.

    As the release record held by the module did where the C part is not
    built: a cycle through a pool and its own arrays is not collected, rather
    than the pool being cleared before its blocks die.
    """
    import weakref

    gc.collect()
    pool = cg.GraphPool(device)
    s = device.create_stream()
    s.wait(device.stream)
    with s, cg.capture(device=device, pool=pool) as g:
        x = cg.empty(256, "float32")
        cg.ops.fill(x, 2.0)
    g.replay(s)
    s.synchronize()
    g.close()
    pool.junk = [x]  # type: ignore[attr-defined]  # pool -> list -> x -> its block -> pool
    alive = weakref.ref(pool)
    del x, g, pool
    gc.collect()
    _allocator.safe_point()  # (a pool cleared by the collector would fail here, giving back)
    cg.empty(16, "float32")
    held = alive()
    assert held is not None  # kept: its block still holds it
    assert held.junk[0].get()[0] == 2.0
    held.junk.clear()  # the block dies: its memory goes back to the intact pool
    _allocator.safe_point()
    del held
    gc.collect()
    assert alive() is None
    assert not _allocator._dead


def test_an_error_in_a_release_is_reported_not_raised(
    device: cg.Device, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once, named by the block's owner.

    A hook that looked at the block itself (its count at zero, in its
    deallocator) revived it, and each look freed it again: reported again and
    again, then a crash.
    """
    reported: list[tuple[BaseException | None, str]] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: reported.append((u.exc_value, repr(u.object))))
    a = cg.empty(8, "float32")
    ptr = a.ptr
    record = device.allocator._live.pop(ptr)  # (its record lost: the release cannot find it)
    del a
    assert len(reported) == 1, reported
    assert isinstance(reported[0][0], KeyError)
    device.allocator._live[ptr] = record  # (given back by hand, for the test's memory check)
    device.allocator.raw_free(ptr)


def test_the_lock() -> None:
    lock = fast.Lock()
    assert not lock.locked()
    assert lock.acquire(False) is True
    assert lock.locked()
    assert lock.acquire(blocking=False) is False
    lock.release()
    with pytest.raises(RuntimeError, match="release unlocked lock"):
        lock.release()
    with lock:
        assert lock.locked()
    assert not lock.locked()
    with pytest.raises(TypeError):
        fast.Lock(1)
    with pytest.raises(ValueError, match="non-blocking"):
        lock.acquire(False, timeout=1)
    with pytest.raises(ValueError, match="non-negative"):
        lock.acquire(timeout=-2)
    lock.acquire()
    start = time.perf_counter()
    assert lock.acquire(timeout=0.1) is False  # (held: the timeout ends the wait)
    assert time.perf_counter() - start >= 0.09
    assert lock.acquire(timeout=0) is False
    done: list[float] = []
    t = threading.Thread(target=lambda: (lock.acquire(), done.append(time.perf_counter()), lock.release()))
    t.start()
    time.sleep(0.1)
    assert not done  # a blocking acquire waits (the GIL released) for the holder
    lock.release()
    t.join(10)
    assert done
    assert lock.acquire(timeout=1) is True
    lock.release()


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs signal.setitimer (POSIX)")
@pytest.mark.parametrize("how", ["acquire", "with"])
def test_a_signal_ends_a_blocking_wait_for_the_lock(how: str) -> None:
    """Ctrl-C reaches a thread waiting for the allocator's lock, as with threading.Lock."""

    class Interrupted(Exception):
        pass

    def interrupt(signum: int, frame: Any) -> None:
        raise Interrupted

    lock = fast.Lock()
    holder_done = threading.Event()

    def hold() -> None:  # (let go after 5 s: a wait the signal cannot end fails, not hangs)
        holder_done.wait(5)
        lock.release()

    lock.acquire()
    holder = threading.Thread(target=hold)
    holder.start()
    old = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.2)
    start = time.perf_counter()
    try:
        with pytest.raises(Interrupted):
            if how == "acquire":
                lock.acquire()
            else:
                with lock:
                    pass
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        holder_done.set()
        holder.join(10)
    assert time.perf_counter() - start < 4  # ended by the signal, not by the holder
    assert not lock.locked()  # (the interrupted wait did not take it)


def test_a_replaced_allocator_is_the_one_empty_takes_from(
    device: cg.Device, monkeypatch: pytest.MonkeyPatch
) -> None:
    """C reads the device's allocator each call: one set on the device after a C call is used."""
    del device
    dev = cg.current_device()
    gc.collect()
    cg.empty(48, "float32")  # (dropped at once: a block on the old allocator's free list)
    a, n = made_in_c(lambda: cg.empty(48, "float32"))
    assert n == 1
    assert a._block.owner is dev.allocator
    del a
    new = _allocator.CachingAllocator(dev)
    monkeypatch.setattr(dev, "allocator", new)
    b, n = made_in_c(lambda: cg.empty(48, "float32"))  # (a miss in the new one: Python)
    assert n == 0
    assert b._block.owner is new
    del b
    c, n = made_in_c(lambda: cg.empty(48, "float32"))
    assert n == 1
    assert c._block.owner is new
    del c
    monkeypatch.undo()
    new.empty_cache()


def test_a_current_stream_survives_empty_handing_over_to_python(
    device: cg.Device, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A current stream found in C, then the Python path taken: its reference count is intact."""
    del device
    dev = cg.current_device()

    class Other(_allocator.CachingAllocator):  # (not the class C takes blocks from)
        pass

    other = Other(dev)
    monkeypatch.setattr(dev, "allocator", other)
    s = dev.create_stream()
    s.wait(dev.stream)
    with s:
        cg.empty(40, "float32")  # (what the allocator keeps of s, made once)
        gc.collect()
        before = sys.getrefcount(s)
        kept = []  # (held: a release would queue a record, which sends empty to Python before C looks)
        for _ in range(50):
            x, n = made_in_c(lambda: cg.empty(40, "float32"))
            assert n == 0
            assert x._block.owner is other
            kept.append(x)
        gc.collect()
        assert sys.getrefcount(s) == before
        del x, kept
    s.synchronize()
    monkeypatch.undo()
    other.empty_cache()


def test_the_lock_excludes_under_contention() -> None:
    """Four threads, each taking the lock 200 times around a read, a switch and a write."""
    lock = fast.Lock()
    box = [0]

    def work() -> None:
        for _ in range(200):
            with lock:
                seen = box[0]
                time.sleep(0)  # (another thread runs here: without the lock, an update is lost)
                box[0] = seen + 1
            if lock.acquire(timeout=1):
                box[0] += 1
                lock.release()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert box[0] == 4 * 200 * 2
    assert not lock.locked()


def _python_empty() -> Any:
    """cudagraphs.empty as the interpreter calls its code (a copy keeps the default entry)."""
    import types

    f = cg.empty
    copy = types.FunctionType(f.__code__, f.__globals__, f.__name__, f.__defaults__, f.__closure__)
    copy.__kwdefaults__ = f.__kwdefaults__
    return copy


def test_empty_is_entered_in_c_where_python_allows_it(device: cg.Device, rng: np.random.Generator) -> None:
    """Python 3.12+: cg.empty's own calls reach fast_empty without running its code."""
    import inspect

    from cudagraphs import _array

    del device
    assert (sys.version_info >= (3, 12)) == _array._EMPTY_IN_C
    assert list(inspect.signature(cg.empty).parameters) == ["shape", "dtype", "device", "stream"]
    gc.collect()
    reference = _python_empty()
    code = cg.empty.__code__
    entered: list[str] = []  # the calls of empty's own code (a Python frame) a call made

    def watch(frame: Any, event: str, arg: Any) -> None:
        if frame.f_code is code and event == "call":
            entered.append(event)

    for call in (
        lambda f: f(24),  # (the default dtype)
        lambda f: f(24, "float32"),
        lambda f: f(24, dtype="int32"),
        lambda f: f((4, 6), np.float64),
    ):
        f_out = call(cg.empty)  # (a miss first: a block of its size then waits on the free list)
        del f_out
        entered.clear()
        sys.setprofile(watch)
        try:
            out, n = made_in_c(lambda call=call: call(cg.empty))
        finally:
            sys.setprofile(None)
        assert n == 1
        assert entered == ([] if _array._EMPTY_IN_C else ["call"])
        ref = call(reference)
        assert (out.shape, out.dtype, out.strides, type(out)) == (
            ref.shape,
            ref.dtype,
            ref.strides,
            type(ref),
        )
        h = random_array(rng, out.shape, str(out.dtype))
        out.set(h)
        np.testing.assert_array_equal(out.get(), h)
        del out, ref
    for bad in ((-1,), (3, "no-such-dtype"), ("x",), (3.5,)):
        with pytest.raises((TypeError, ValueError)) as got:
            cg.empty(*bad)
        with pytest.raises(got.type) as want:
            reference(*bad)
        assert str(got.value) == str(want.value)


def test_the_reentrant_lock() -> None:
    """Lock(reentrant=True) is threading.RLock's subset: its owner takes it again, only it gives it back."""
    lock = fast.Lock(reentrant=True)
    with pytest.raises(RuntimeError, match="un-acquired"):
        lock.release()
    assert lock.acquire() is True
    assert lock.acquire(False) is True  # (the owner, again)
    with lock:
        assert lock.locked()
    got: list[Any] = []

    def other() -> None:
        got.append(lock.acquire(False))
        try:
            lock.release()
        except RuntimeError as e:
            got.append(str(e))
        got.append(lock.acquire(timeout=5))  # (waits for the owner's last release)
        got.append(time.perf_counter())
        lock.release()

    t = threading.Thread(target=other)
    t.start()
    time.sleep(0.1)
    lock.release()
    time.sleep(0.1)
    assert got[:2] == [False, "cannot release un-acquired lock"]
    assert len(got) == 2  # held once more: the other thread still waits
    released = time.perf_counter()
    lock.release()
    t.join(10)
    assert got[2] is True
    assert got[3] >= released
    assert not lock.locked()
    with pytest.raises(TypeError):
        fast.Lock(True)  # (keyword only)
