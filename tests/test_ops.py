"""Built-in ops against numpy on random data, contiguous and strided."""

from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import random_array

import cudagraphs as cg

ARITH = ["float32", "float64", "int32", "int64"]
VIEWS = {
    "contiguous": lambda a: a,
    "strided": lambda a: a[::2, 1::3],
    "reversed": lambda a: a[::-1],
    "transposed": lambda a: a.T,
}


def _tol(dtype: str) -> dict[str, float]:
    return {"rtol": 2e-6 if dtype == "float32" else 1e-12, "atol": 0}


@pytest.mark.parametrize("dtype", ARITH)
@pytest.mark.parametrize("view", VIEWS)
def test_add(backend: str, rng: np.random.Generator, dtype: str, view: str) -> None:
    pick = VIEWS[view]
    a_h, b_h, o_h = (random_array(rng, (10, 12), dtype) for _ in range(3))
    a, b, out = cg.asarray(a_h), cg.asarray(b_h), cg.asarray(o_h)  # out is poisoned
    res = cg.ops.add(pick(a), pick(b), out=pick(out))
    assert res.ptr == pick(out).ptr
    expect = o_h.copy()
    pick(expect)[...] = pick(a_h) + pick(b_h)
    np.testing.assert_array_equal(out.get(), expect)
    fresh = cg.ops.add(pick(a), pick(b))
    np.testing.assert_array_equal(fresh.get(), pick(a_h) + pick(b_h))


@pytest.mark.parametrize("dtype", ARITH)
@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("on_device", [False, True])
def test_axpy(backend: str, rng: np.random.Generator, dtype: str, view: str, on_device: bool) -> None:
    pick = VIEWS[view]
    x_h, y_h = random_array(rng, (10, 12), dtype), random_array(rng, (10, 12), dtype)
    alpha = np.dtype(dtype).type(3 if dtype.startswith("int") else 0.37)
    x, y = cg.asarray(x_h), cg.asarray(y_h)
    a = cg.asarray(np.array([alpha])) if on_device else alpha.item()
    cg.ops.axpy(a, pick(x), pick(y))
    expect = y_h.copy()
    pick(expect)[...] = alpha * pick(x_h) + pick(y_h)
    np.testing.assert_allclose(y.get(), expect, **_tol(dtype))


@pytest.mark.parametrize("dtype", ARITH)
@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("on_device", [False, True])
def test_scale(backend: str, rng: np.random.Generator, dtype: str, view: str, on_device: bool) -> None:
    pick = VIEWS[view]
    x_h, o_h = random_array(rng, (10, 12), dtype), random_array(rng, (10, 12), dtype)
    alpha = np.dtype(dtype).type(-2 if dtype.startswith("int") else -1.75)
    x, out = cg.asarray(x_h), cg.asarray(o_h)
    a = cg.asarray(np.array(alpha)) if on_device else alpha.item()
    cg.ops.scale(a, pick(x), out=pick(out))
    expect = o_h.copy()
    pick(expect)[...] = alpha * pick(x_h)
    np.testing.assert_allclose(out.get(), expect, **_tol(dtype))


@pytest.mark.parametrize("dtype", list(cg.SUPPORTED_DTYPES))
@pytest.mark.parametrize("view", VIEWS)
def test_fill(backend: str, rng: np.random.Generator, dtype: str, view: str) -> None:
    pick = VIEWS[view]
    data = random_array(rng, (10, 12), dtype)
    value = random_array(rng, (), dtype)[()]
    x = cg.asarray(data)
    cg.ops.fill(pick(x), value)
    expect = data.copy()
    pick(expect)[...] = value
    np.testing.assert_array_equal(x.get(), expect)


def test_device_alpha_is_read_when_the_kernel_runs(backend: str, rng: np.random.Generator) -> None:
    x_h = random_array(rng, 100, "float32")
    x, y = cg.asarray(x_h), cg.zeros(100, "float32")
    alpha = cg.asarray(np.array([2.0], np.float32))
    cg.ops.axpy(alpha, x, y)
    alpha.set(np.array([5.0], np.float32))
    cg.ops.axpy(alpha, x, y)
    np.testing.assert_allclose(y.get(), 7 * x_h, rtol=2e-6)


def test_op_errors(backend: str) -> None:
    f, i = cg.zeros(4, "float32"), cg.zeros(4, "int32")
    h = cg.zeros(4, "float16")
    misses = h.device.allocator.stats().misses
    hits = h.device.allocator.stats().hits
    with pytest.raises(TypeError, match="add supports float32, float64, int32, int64; got float16"):
        cg.ops.add(h, h)
    after = h.device.allocator.stats()
    assert (after.hits, after.misses) == (hits, misses)  # rejected before allocating out
    with pytest.raises(ValueError, match="no broadcasting"):
        cg.ops.add(f, cg.zeros(5, "float32"))
    with pytest.raises(TypeError, match="dtype mismatch"):
        cg.ops.axpy(1.0, f, i)
    with pytest.raises(TypeError, match=re.escape("alpha 0.5 is not an integer")):
        cg.ops.scale(0.5, i)
    with pytest.raises(ValueError, match="one-element float32 array"):
        cg.ops.axpy(cg.zeros(2, "float32"), f, f)
    with pytest.raises(TypeError, match="alpha must be a real number"):
        cg.ops.axpy("2", f, f)
    with pytest.raises(TypeError, match=re.escape("2.5 is not an integer")):
        cg.ops.fill(i, 2.5)
    with pytest.raises(ValueError, match="cannot store 1000 in a int8 array: out of range"):
        cg.ops.fill(cg.zeros(2, "int8"), 1000)
    with pytest.raises(TypeError, match="takes a scalar"):
        cg.ops.fill(f, [1, 2, 3, 4])
    with pytest.raises(ValueError, match="up to 8 dimensions"):
        cg.ops.fill(cg.zeros((2,) * 9)[..., ::-1], 1.0)
    with pytest.raises(TypeError, match="stream must be a cudagraphs Stream"):
        cg.ops.fill(f, 1.0, stream=3)  # type: ignore[arg-type]
    # after all those errors the ops work
    np.testing.assert_array_equal(cg.ops.add(cg.ops.fill(f, 1.5), f).get(), [3.0] * 4)


def test_zero_size_ops_are_no_ops(backend: str) -> None:
    e = cg.zeros(0, "float32")
    for r in (cg.ops.add(e, e), cg.ops.scale(2.0, e), cg.ops.axpy(2.0, e, e), cg.ops.fill(e, 1.0)):
        assert r.shape == (0,)


def test_the_old_name_of_preload_dtypes_warns_and_compiles(device: cg.Device) -> None:
    """``cg.ops.preload`` (deprecated) is ``cg.ops.preload_dtypes``, told apart from ``cg.preload``."""
    with pytest.warns(DeprecationWarning, match=r"cg\.ops\.preload_dtypes\(dtypes\).*cg\.preload\(kernels\)"):
        cg.ops.preload(["float64"], device)
    a = cg.asarray(np.arange(3, dtype=np.float64))
    np.testing.assert_array_equal(cg.ops.scale(2.0, a).get(), [0.0, 2.0, 4.0])
    assert "preload" not in cg.ops.__all__
