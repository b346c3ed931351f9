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
