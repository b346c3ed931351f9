"""The caching allocator's hot pair: ``cg.empty`` from the free list, a Block's release.

Where the package is built, ``_allocator``, ``_array`` and the modules they
call are compiled by Cython from their Python source (docs/architecture.md,
"The compiled part"): ``Block``, ``CachingAllocator`` and ``DeviceArray`` are
extension types, a Block's release is its type's finalizer, and the
allocator's lock the C part's ``Lock``. These tests check the arrays against
numpy, the same sequence in the built package and in a plain-Python copy
(same arrays, same reuse, same counters), and the cases around the hot pair:
a busy lock, dead blocks waiting, captures, other streams, replaced
allocators. Every test runs on each backend in CUDAGRAPHS_TEST_BACKENDS, and
in CI's plain-Python run of the suite too.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import call_while_held, random_array

import cudagraphs as cg
from cudagraphs import _allocator


def test_empty_reuses_the_block_on_the_free_list(device: cg.Device, rng: np.random.Generator) -> None:
    del device  # (cg.empty allocates on the current device, this one)
    gc.collect()
    first = cg.empty(300, "float32")  # (a miss, or a hit)
    ptr = first.ptr
    del first
    before = _allocator_stats()
    for _ in range(5):
        a = cg.empty(300, "float32")
        assert a.ptr == ptr  # the same block, from the free list
        a.set(-1.0)  # (poisoned: the values below are the ones set)
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
import cudagraphs as cg
from cudagraphs import _allocator
dev = cg.current_device()
if sys.argv[1] == "plain":  # (the copy without compiled files: every module is Python's)
    assert _allocator.__file__.endswith(".py") and _allocator._fastcall is None
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


def test_built_and_plain_python_give_the_same_arrays_reuse_and_counters(
    backend: str, plain_python_path: str
) -> None:
    built = str(Path(cg.__file__).parents[1])
    runs = {}
    for how, path in (("built", built), ("plain", plain_python_path)):
        env = {**os.environ, "CUDAGRAPHS_BACKEND": backend, "PYTHONPATH": path}
        out = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(SCRIPT), how],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        runs[how] = json.loads(out.stdout.strip().splitlines()[-1])
    assert runs["built"] == runs["plain"]
    assert runs["built"]["stats"][4] > 0  # (hits: the free list was used)


def test_the_raw_pair_reuses_its_block(device: cg.Device) -> None:
    alloc = device.allocator
    alloc.raw_free(alloc.raw_malloc(700))  # (a miss first, maybe)
    first = alloc.raw_malloc(700)
    alloc.raw_free(first)
    before = alloc.stats()
    for _ in range(3):
        ptr = alloc.raw_malloc(700)
        assert ptr == first  # (the free list's block, not a new one)
        assert alloc.stats().in_use == before.in_use + 1024  # (its size class)
        alloc.raw_free(ptr)
    after = alloc.stats()
    assert (after.hits - before.hits, after.misses - before.misses, after.in_use) == (3, 0, before.in_use)
    with pytest.raises(ValueError, match="not an address this allocator gave"):
        alloc.raw_free(first)  # (given back already)


def test_a_block_dropped_while_the_lock_is_held_is_queued_then_given_back(device: cg.Device) -> None:
    alloc = device.allocator
    gc.collect()
    a = cg.empty(100, "float64")
    ptr = a.ptr
    with alloc._lock:  # (as a garbage collection inside an allocation would find it)
        del a
        assert [d.ptr for d in _allocator._dead] == [ptr]
        assert isinstance(_allocator._dead[0], _allocator._DeadBlock)
    b = cg.empty(100, "float64")  # (the dead block given back first, then taken)
    assert b.ptr == ptr
    assert not _allocator._dead


def test_empty_while_another_thread_holds_the_lock_waits_for_it(device: cg.Device) -> None:
    alloc = device.allocator
    gc.collect()
    cg.empty(64, "float32")  # (a block on the free list)
    assert call_while_held(alloc._lock, lambda: cg.empty(64, "float32").shape) == (64,)


def test_captures_and_devices_or_streams_given(device: cg.Device) -> None:
    gc.collect()
    cg.empty(32, "float32")
    s = device.create_stream()
    s.wait(device.stream)
    with s, cg.capture(device=device) as g:  # (s captured)
        x = cg.empty(32, "float32")  # the capture's memory
        cg.ops.fill(x, 1.0)
    assert x._block.owner is not device.allocator
    y = cg.empty(32, "float32", device=device)
    z = cg.empty(32, "float32", stream=device.stream)
    assert y._block.owner is device.allocator
    assert z._block.owner is device.allocator
    with s:
        w = cg.empty(32, "float32")  # s's free list (a miss first)
        first = w.ptr
        del w
        w = cg.empty(32, "float32")
    assert w.ptr == first  # (s's own block again)
    assert w.ptr not in (y.ptr, z.ptr)
    g.replay(s)
    s.synchronize()
    np.testing.assert_array_equal(x.get(), np.ones(32, np.float32))
    g.close()


def test_a_pool_referencing_its_own_blocks_is_collected_after_they_give_back(device: cg.Device) -> None:
    """A cycle through a graph pool and its own arrays: blocks release into the intact pool.

    A block's release is its finalizer, which the collector runs for every
    object of the cycle before it clears any (the pool is whole when its
    blocks give their memory back), and the pool then gives its segments
    back to the allocator.
    """
    gc.collect()
    alloc = device.allocator
    in_use = alloc.stats().in_use
    pool = cg.GraphPool(device)
    s = device.create_stream()
    s.wait(device.stream)
    with s, cg.capture(device=device, pool=pool) as g:
        x = cg.empty(256, "float32")
        cg.ops.fill(x, 2.0)
    g.replay(s)
    s.synchronize()
    g.close()
    assert x.get()[0] == 2.0
    assert alloc.stats().in_use > in_use  # (the pool's segment)
    pool.junk = [x]  # type: ignore[attr-defined]  # pool -> list -> x -> its block -> pool
    alive = weakref.ref(pool)
    del x, g, pool
    gc.collect()
    _allocator.safe_point()
    assert alive() is None  # collected
    assert not _allocator._dead
    s.synchronize()
    _allocator.safe_point()
    assert alloc.stats().in_use == in_use  # its segment given back


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


def test_a_replaced_allocator_is_the_one_empty_takes_from(
    device: cg.Device, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cg.empty reads the device's allocator on each call."""
    del device
    dev = cg.current_device()
    gc.collect()
    a = cg.empty(48, "float32")
    assert a._block.owner is dev.allocator
    del a
    new = _allocator.CachingAllocator(dev)
    monkeypatch.setattr(dev, "allocator", new)
    b = cg.empty(48, "float32")
    assert b._block.owner is new
    first = b.ptr
    del b
    c = cg.empty(48, "float32")
    assert c._block.owner is new
    assert c.ptr == first
    del c
    monkeypatch.undo()
    assert cg.empty(48, "float32")._block.owner is dev.allocator
    new.empty_cache()


def test_a_subclass_of_the_allocator_serves_empty(device: cg.Device, monkeypatch: pytest.MonkeyPatch) -> None:
    """An allocator subclass (its methods overridable) set on the device; a current stream's count intact."""
    del device
    dev = cg.current_device()
    taken: list[int] = []

    class Other(_allocator.CachingAllocator):
        def raw_malloc(self, nbytes: int, stream: Any = None) -> int:
            ptr = super().raw_malloc(nbytes, stream)
            taken.append(ptr)
            return ptr

    other = Other(dev)
    monkeypatch.setattr(dev, "allocator", other)
    s = dev.create_stream()
    s.wait(dev.stream)
    with s:
        cg.empty(40, "float32")  # (what the allocator keeps of s, made once)
        gc.collect()
        before = sys.getrefcount(s)
        kept = []
        for _ in range(50):
            x = cg.empty(40, "float32")
            assert x._block.owner is other
            kept.append(x)
        gc.collect()
        assert sys.getrefcount(s) == before
        assert len(taken) == 51  # (the override ran for each)
        del x, kept
    s.synchronize()
    monkeypatch.undo()
    other.empty_cache()
