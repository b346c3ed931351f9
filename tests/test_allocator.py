"""The caching allocator: reuse, stream tags, stats, OOM recovery."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import cudagraphs as cg
from cudagraphs._allocator import round_size


def test_size_classes() -> None:
    assert round_size(1) == 512
    assert round_size(513) == 1024
    assert round_size(1 << 20) == 1 << 20
    assert round_size((1 << 20) + 1) == 2 << 20
    assert round_size(5 << 20) == 6 << 20


def test_freed_block_is_reused_on_the_same_stream(device: cg.Device) -> None:
    alloc = device.allocator
    x = cg.empty(1000, "float32")
    ptr = x.ptr
    before = alloc.stats()
    del x
    gc.collect()
    y = cg.empty(1000, "float32")
    after = alloc.stats()
    assert y.ptr == ptr
    assert after.hits == before.hits + 1
    assert after.misses == before.misses


def test_stats_return_to_baseline(device: cg.Device) -> None:
    gc.collect()
    base = device.allocator.stats()
    arrays = [cg.empty(n, "float64") for n in (10, 1000, 100_000, 300_000)]
    views = [a[::2] for a in arrays]
    mid = device.allocator.stats()
    assert mid.in_use >= base.in_use + 8 * (10 + 1000 + 100_000 + 300_000)
    assert mid.peak >= mid.in_use
    del arrays
    gc.collect()
    assert device.allocator.stats().in_use == mid.in_use  # views keep blocks alive
    del views
    gc.collect()
    end = device.allocator.stats()
    assert end.in_use == base.in_use
    assert end.cached == end.reserved - end.in_use
    device.allocator.empty_cache()
    assert device.allocator.stats().cached == 0
    device.allocator.reset_peak()
    assert device.allocator.stats().peak == device.allocator.stats().in_use


def test_empty_cache_frees_what_is_freed_after_it(device: cg.Device) -> None:
    """A block of one size and stream, freed after an empty_cache, is cached where the next one frees it.

    (The allocator keeps the free list of its last size and stream at hand:
    emptying the cache must not leave it a list of its own, unseen by stats
    and by the next empty_cache.)
    """
    alloc = device.allocator
    gc.collect()
    alloc.empty_cache()
    for _ in range(3):
        for _ in range(2):  # (a miss, then a hit: the list at hand is the cached one)
            x = cg.empty(1000, "float32")
            del x
            gc.collect()
        stats = alloc.stats()
        assert stats.cached == stats.reserved - stats.in_use > 0
        alloc.empty_cache()
        assert alloc.stats().cached == 0
    y = cg.empty(1000, "float32")
    ptr = y.ptr
    del y
    gc.collect()
    assert cg.empty(1000, "float32").ptr == ptr  # (freed after the last empty_cache: reused)


def test_cross_stream_reuse_waits_for_the_owner(device: cg.Device) -> None:
    s = device.create_stream()
    device.allocator.empty_cache()
    x = cg.empty(4096, "uint8")  # on the compute stream
    ptr = x.ptr
    del x
    gc.collect()
    before = device.allocator.stats()
    y = cg.empty(4096, "uint8", stream=s)  # a miss on s: steals the block with an event
    assert y.ptr == ptr
    assert device.allocator.stats().misses == before.misses + 1
    assert device.allocator.stats().reserved == before.reserved
    y.set(np.arange(4096) % 251)
    np.testing.assert_array_equal(y.get(), np.arange(4096) % 251)
    del y
    gc.collect()
    s.close()


def test_no_block_of_a_capturing_stream_is_taken_while_it_captures(device: cg.Device) -> None:
    """A miss takes another stream's cached block only while no capture is active.

    Taking it records an event on the block's stream: were that stream being
    captured, the event would join the taker's stream to the capture (which
    then ends with unjoined work) and order nothing outside it.
    """
    a, b = device.create_stream(), device.create_stream()
    device.allocator.empty_cache()
    x = cg.empty(8192, "uint8", stream=a)  # a block cached on a once dropped
    ptr = x.ptr
    del x
    gc.collect()
    y = cg.zeros(4, "float32", stream=a)
    with cg.capture(stream=a) as g:
        cg.ops.fill(y, 1.0, stream=a)
        z = cg.empty(8192, "uint8", stream=b)  # a miss on b, an uncaptured stream
        assert z.ptr != ptr  # not the block of the capturing stream
        assert cg.capture_status(b) == "none"
    assert sorted(n.type for n in g.nodes) == ["kernel"]
    z.set(np.arange(8192) % 251, stream=b)
    np.testing.assert_array_equal(z.get(stream=b), np.arange(8192) % 251)
    g.replay(a)
    np.testing.assert_array_equal(y.get(stream=a), 1.0)
    g.close()
    del z
    gc.collect()
    a.close()
    b.close()


def test_use_on_defers_reuse(device: cg.Device, rng: np.random.Generator) -> None:
    s = device.create_stream()
    data = rng.standard_normal(10_000)
    x = cg.asarray(data)
    out = cg.empty_like(x)
    s.wait(device.stream)
    cg.ops.copy(out, x, stream=s)
    x.record_stream(s)
    del x
    gc.collect()
    z = cg.zeros(10_000)  # may take x's block: it waits for s first
    s.synchronize()
    np.testing.assert_array_equal(out.get(stream=s), data)
    assert np.all(z.get() == 0)
    s.close()


def test_release_threshold_comes_from_settings(backend: str) -> None:
    import os
    import subprocess
    import sys

    code = "import cudagraphs as cg; print(cg.settings().pool_release_threshold_mb); cg.Device(0)"
    env = {**os.environ, "CUDAGRAPHS_POOL_RELEASE_THRESHOLD_MB": "64", "CUDAGRAPHS_BACKEND": backend}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "64"
    assert cg.Settings().pool_release_threshold_mb == 512


def test_out_of_memory_is_clear_and_recoverable(device: cg.Device, rng: np.random.Generator) -> None:
    keep = cg.asarray(rng.standard_normal(1000))
    spare = cg.empty(1 << 20, "uint8")
    del spare
    gc.collect()
    before = device.allocator.stats()
    too_big = device.total_memory + (1 << 30)
    with pytest.raises(cg.OutOfMemoryError) as info:
        cg.empty(too_big, "uint8")
    err = info.value
    assert isinstance(err, MemoryError)
    assert err.requested >= too_big
    assert err.limit == device.total_memory
    assert err.in_use == before.in_use
    assert "out of memory on device 0: tried to allocate" in str(err)
    assert "free arrays you no longer need" in str(err)
    after = device.allocator.stats()
    assert after.oom_retries == before.oom_retries + 1
    assert after.cached == 0  # the cache was emptied before giving up
    assert after.in_use == before.in_use
    # the allocator and the stream still work
    y = cg.empty_like(keep)
    cg.ops.scale(2.0, keep, out=y)
    np.testing.assert_array_equal(y.get(), keep.get() * 2)


def test_allocator_knows_capture_state(device: cg.Device) -> None:
    s = device.create_stream()
    assert not device.allocator.is_capturing()
    assert not device.allocator.is_capturing(s)
    x = cg.ones(4, "float32", stream=s)
    with cg.capture(stream=s) as g:
        assert device.allocator.is_capturing(s)
        assert not device.allocator.is_capturing()
        cg.ops.scale(2.0, x, out=x, stream=s)
    assert not device.allocator.is_capturing(s)
    g.close()
    s.close()
