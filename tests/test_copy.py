"""Host<->device copies, device copies between any views, pipelined D2H."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from conftest import random_array

import cudagraphs as cg

LAYOUTS = [
    (lambda a: a, lambda a: a),
    (lambda a: a[::2], lambda a: a[1::2]),
    (lambda a: a.T, lambda a: a.T),
    (lambda a: a[::-1, ::3], lambda a: a[:, ::-1][::-1, ::3]),
    (lambda a: a[2:5, None, 1:4], lambda a: a[1:4, None, :3]),
]


@pytest.mark.parametrize("dtype", ["float32", "int8", "float16", "float64", "complex128"])
@pytest.mark.parametrize("layout", range(len(LAYOUTS)))
def test_strided_copy_between_views(backend: str, rng: np.random.Generator, dtype: str, layout: int) -> None:
    pick_dst, pick_src = LAYOUTS[layout]
    src_h = random_array(rng, (8, 9), dtype)
    dst_h = random_array(rng, (8, 9), dtype)  # poison: every element must be overwritten
    src, dst = cg.asarray(src_h), cg.asarray(dst_h)
    dv, sv = pick_dst(dst), pick_src(src)
    if dv.shape != sv.shape:
        sv = pick_src(src)[tuple(slice(0, n) for n in dv.shape)]
    expect = dst_h.copy()
    pick_dst(expect)[...] = _np_view(pick_src, src_h, dv.shape)
    cg.ops.copy(dv, sv)
    np.testing.assert_array_equal(dst.get(), expect)


def _np_view(pick, data, shape):
    v = pick(data)
    return v[tuple(slice(0, n) for n in shape)] if v.shape != shape else v


def test_copy_checks_shapes_and_dtypes(backend: str) -> None:
    a, b = cg.zeros((3, 4)), cg.zeros((4, 3))
    with pytest.raises(ValueError, match=r"shape mismatch, dst has shape \(3, 4\) and src has \(4, 3\)"):
        cg.ops.copy(a, b)
    with pytest.raises(TypeError, match="dtype mismatch, dst is float64 and src is float32"):
        cg.ops.copy(a, cg.zeros((3, 4), "float32"))
    with pytest.raises(TypeError, match="must be a cudagraphs DeviceArray"):
        cg.ops.copy(a, np.zeros((3, 4)))  # type: ignore[arg-type]
    # the stream still works
    b.T.set(np.ones((3, 4)))
    cg.ops.copy(a, b.T)
    assert np.all(a.get() == 1)


def test_get_async_overlaps_and_returns_data(device: cg.Device, rng: np.random.Generator) -> None:
    data = random_array(rng, (64, 33), "float32")
    x = cg.asarray(data)
    pending = x[:, ::2].get_async()
    cg.ops.fill(x, 0.0)  # queued after the copy started: must not affect it
    np.testing.assert_array_equal(pending.result(), data[:, ::2])
    assert pending.done()
    assert pending.result() is pending.result()
    np.testing.assert_array_equal(x.get(), np.zeros_like(data))


def test_get_async_keeps_source_alive(device: cg.Device, rng: np.random.Generator) -> None:
    data = random_array(rng, 50_000, "float64")
    x = cg.asarray(data)
    pending = x.get_async()
    del x
    gc.collect()
    junk = [cg.full(50_000, 1.0) for _ in range(4)]  # would reuse x's block if it were freed
    np.testing.assert_array_equal(pending.result(), data)
    del junk


def test_get_async_dropped_unread_recycles_pinned_memory(device: cg.Device) -> None:
    x = cg.ones(1000, "float32")
    for _ in range(5):
        x.get_async()
        gc.collect()
    assert np.all(x.get_async().result() == 1)


def test_zero_size_copies(backend: str) -> None:
    x = cg.zeros((0, 3))
    assert x.get().shape == (0, 3)
    assert x.get_async().result().shape == (0, 3)
    x.set(np.zeros((0, 3)))
    cg.ops.copy(x, cg.zeros((0, 3)))


def test_get_async_source_memory_is_not_reused_before_the_copy_reads_it(
    device: cg.Device, rng: np.random.Generator
) -> None:
    x_h = random_array(rng, 1024, "float32")
    x = cg.asarray(x_h)
    pending = x.get_async()  # reads x on the copy stream, later
    del x
    gc.collect()
    y = cg.empty(1024, "float32")  # may take x's memory from the cache
    cg.ops.fill(y, 9.0)  # must wait for the copy (record_stream) before writing
    device.stream.synchronize()
    np.testing.assert_array_equal(pending.result(), x_h)


def test_memory_freed_by_one_stream_and_reused_by_another_waits_for_the_first(
    device: cg.Device, rng: np.random.Generator
) -> None:
    a, b = device.create_stream(), device.create_stream()
    x_h = random_array(rng, 1024, "float32")
    x = cg.asarray(x_h, stream=a)
    x.record_stream(b)
    out = cg.zeros(1024, "float32", stream=b)
    device.synchronize()
    cg.ops.copy(out, x, stream=b)  # b reads x, later
    del x
    gc.collect()  # back to a's cache, with an event on b
    z = cg.empty(1024, "float32", stream=a)
    cg.ops.fill(z, 5.0, stream=a)  # must wait for b's read of the old contents
    a.synchronize()
    np.testing.assert_array_equal(out.get(stream=b), x_h)
    a.close()
    b.close()


def test_a_block_taken_from_another_streams_cache_waits_for_that_stream(
    device: cg.Device, rng: np.random.Generator
) -> None:
    a, b = device.create_stream(), device.create_stream()
    device.synchronize()
    device.allocator.empty_cache()
    x_h = random_array(rng, 2048, "float32")
    x = cg.asarray(x_h, stream=a)
    out = cg.zeros(2048, "float32", stream=a)
    a.synchronize()
    cg.ops.copy(out, x, stream=a)  # a reads x, later
    del x
    gc.collect()  # x's block goes back to a's cache
    y = cg.empty(2048, "float32", stream=b)  # a miss on b: takes a's block, after a's work
    cg.ops.fill(y, 7.0, stream=b)
    b.synchronize()
    np.testing.assert_array_equal(out.get(stream=a), x_h)
    a.close()
    b.close()


def test_a_dlpack_consumer_stream_waits_for_the_producers_work(
    device: cg.Device, rng: np.random.Generator
) -> None:
    """The wait ``__dlpack__(stream=...)`` gives the consumer's stream (on both backends)."""
    from cudagraphs._dlpack import order_consumer

    consumer = device.create_stream()
    x_h = random_array(rng, 2048, "float32")
    x, out = cg.zeros(2048, "float32"), cg.zeros(2048, "float32", stream=consumer)
    device.synchronize()
    x.set(x_h)  # queued on the producer's (current) stream
    order_consumer(device, consumer.handle)
    cg.ops.copy(out, x, stream=consumer)  # the consumer reads x
    consumer.synchronize()
    np.testing.assert_array_equal(out.get(stream=consumer), x_h)
    consumer.close()
