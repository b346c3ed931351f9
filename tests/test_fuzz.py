"""Property-based tests.

Arrays, views, copies and ops against numpy, and random capture programs
against an eager run of the same program.

``CUDAGRAPHS_FUZZ_EXAMPLES`` sets the examples per property (default 60, for CI);
hypothesis prints the failing example and how to reproduce it.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cudagraphs as cg

EXAMPLES = int(os.environ.get("CUDAGRAPHS_FUZZ_EXAMPLES", "60"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=False,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
DTYPES = ("float32", "float64", "int32", "int64")


@pytest.fixture
def dev_all_dtypes(dev: cg.Device) -> cg.Device:
    """``dev`` with the built-in kernels of every dtype the fuzzers draw compiled too."""
    cg.ops.preload_dtypes(list(DTYPES), dev)  # (float32 and int32 are cached already)
    return dev


@st.composite
def arrays(draw: Any, dtype: str | None = None) -> np.ndarray:
    dt = np.dtype(dtype or draw(st.sampled_from(DTYPES)))
    shape = tuple(draw(st.lists(st.integers(0, 6), min_size=1, max_size=3)))
    seed = draw(st.integers(0, 2**32 - 1))
    data = np.random.default_rng(seed).integers(-50, 50, size=shape)
    return data.astype(dt) if dt.kind in "iu" else (data / 7).astype(dt)


@st.composite
def views(draw: Any, shape: tuple[int, ...]) -> tuple[slice, ...]:
    """A basic-slicing view of an array of ``shape``: offsets, steps, reversals."""
    out = []
    for n in shape:
        step = draw(st.sampled_from([1, 1, 2, 3, -1, -2]))
        start = draw(st.integers(0, max(n - 1, 0)))
        out.append(slice(start, None, step) if step > 0 else slice(n - 1 - start, None, step))
    return tuple(out)


@FUZZ
@given(data=st.data())
def test_views_get_and_set_like_numpy(dev_all_dtypes: cg.Device, data: Any) -> None:
    host = data.draw(arrays())
    x = cg.asarray(host)
    index = data.draw(views(host.shape))
    np.testing.assert_array_equal(x[index].get(), host[index])
    part = host[index]
    new = (np.arange(part.size).reshape(part.shape) * 3).astype(host.dtype)
    x[index].set(new)
    expected = host.copy()
    expected[index] = new
    np.testing.assert_array_equal(x.get(), expected)


@FUZZ
@given(data=st.data())
def test_copy_and_fill_on_any_layout_like_numpy(dev_all_dtypes: cg.Device, data: Any) -> None:
    src_h = data.draw(arrays())
    dst_h = data.draw(arrays(dtype=src_h.dtype.name).filter(lambda a: a.ndim == src_h.ndim))
    si, di = data.draw(views(src_h.shape)), data.draw(views(dst_h.shape))
    src_v, dst_v = src_h[si], dst_h[di]
    if src_v.shape != dst_v.shape:  # copy needs one shape: fill instead
        value = data.draw(st.integers(-9, 9))
        x = cg.asarray(dst_h)
        cg.ops.fill(x[di], value)
        expected = dst_h.copy()
        expected[di] = value
        np.testing.assert_array_equal(x.get(), expected)
        return
    src, dst = cg.asarray(src_h), cg.asarray(dst_h)
    cg.ops.copy(dst[di], src[si])
    expected = dst_h.copy()
    expected[di] = src_v
    np.testing.assert_array_equal(dst.get(), expected)


@FUZZ
@given(data=st.data())
def test_arithmetic_ops_like_numpy(dev_all_dtypes: cg.Device, data: Any) -> None:
    a_h = data.draw(arrays())
    b_h = (a_h[::-1].copy() * 2 + 1).astype(a_h.dtype) if a_h.ndim == 1 else a_h + 1
    index = data.draw(views(a_h.shape))
    a, b = cg.asarray(a_h), cg.asarray(b_h)
    alpha = data.draw(st.integers(-3, 3))
    av, bv = a[index], b[index]
    np.testing.assert_allclose(cg.ops.add(av, bv).get(), a_h[index] + b_h[index], rtol=1e-6)
    np.testing.assert_allclose(cg.ops.scale(alpha, av).get(), alpha * a_h[index], rtol=1e-6)
    cg.ops.axpy(alpha, av, bv)
    expected = b_h.copy()
    expected[index] = b_h[index] + alpha * a_h[index]
    np.testing.assert_allclose(b.get(), expected, rtol=1e-6)


# random capture programs -------------------------------------------------------------
N_ARRAYS, SIZE = 4, 37
STEP = st.one_of(
    st.tuples(st.just("add"), st.integers(0, 3), st.integers(0, 3), st.integers(0, 3)),
    st.tuples(st.just("scale"), st.integers(-2, 2), st.integers(0, 3), st.integers(0, 3)),
    st.tuples(st.just("axpy"), st.integers(-2, 2), st.integers(0, 3), st.integers(0, 3)),
    st.tuples(st.just("fill"), st.integers(-5, 5), st.integers(0, 3)),
    st.tuples(st.just("copy"), st.integers(0, 3), st.integers(0, 3)),
    st.tuples(st.just("temp"), st.integers(0, 3), st.integers(0, 3)),  # an allocation and a free
    st.tuples(st.just("scalar"), st.integers(0, 3)),  # alpha read from a device scalar
)


def _run(program: list[tuple[Any, ...]], xs: list[cg.DeviceArray], alpha: cg.DeviceArray) -> None:
    for step in program:
        op = step[0]
        if op == "add":
            cg.ops.add(xs[step[1]], xs[step[2]], out=xs[step[3]])
        elif op == "scale":
            cg.ops.scale(float(step[1]), xs[step[2]], out=xs[step[3]])
        elif op == "axpy":
            cg.ops.axpy(float(step[1]), xs[step[2]], xs[step[3]])
        elif op == "fill":
            cg.ops.fill(xs[step[2]], float(step[1]))
        elif op == "copy":
            cg.ops.copy(xs[step[2]], xs[step[1]])
        elif op == "temp":
            t = cg.ops.add(xs[step[1]], xs[step[1]])  # a new array, then dropped
            cg.ops.axpy(1.0, t, xs[step[2]])
            del t
        else:
            cg.ops.axpy(alpha, xs[step[1]], xs[(step[1] + 1) % N_ARRAYS])


@FUZZ
@given(
    program=st.lists(STEP, min_size=1, max_size=12), replays=st.integers(1, 3), seed=st.integers(0, 2**32 - 1)
)
def test_random_capture_programs_replay_like_eager_runs(
    dev_all_dtypes: cg.Device, program: list[Any], replays: int, seed: int
) -> None:
    start = np.random.default_rng(seed).integers(-3, 4, size=(N_ARRAYS, SIZE)).astype(np.float64)
    eager = [cg.asarray(row) for row in start]
    graphed = [cg.asarray(row) for row in start]
    alpha_e, alpha_g = cg.DeviceScalar(0.5, "float64"), cg.DeviceScalar(0.5, "float64")
    for _ in range(replays):
        _run(program, eager, alpha_e)
    with cg.capture() as g:
        _run(program, graphed, alpha_g)
    # the capture recorded the program without running it: only replays change the arrays
    np.testing.assert_array_equal(np.stack([x.get() for x in graphed]), start)
    for _ in range(replays):
        g.replay()
    np.testing.assert_allclose(
        np.stack([x.get() for x in graphed]), np.stack([x.get() for x in eager]), rtol=1e-12
    )
    g.close()
