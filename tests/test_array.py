"""DeviceArray: dtypes, shapes, views, host round trips, interop surface."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import random_array

import cudagraphs as cg

DTYPES = list(cg.SUPPORTED_DTYPES)


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_every_dtype(backend: str, rng: np.random.Generator, dtype: str) -> None:
    data = random_array(rng, (7, 5), dtype)
    x = cg.asarray(data)
    assert x.dtype == np.dtype(dtype)
    assert x.shape == (7, 5)
    assert x.strides == data.strides
    np.testing.assert_array_equal(x.get(), data)


def test_float16_and_bfloat16_are_supported(backend: str) -> None:
    assert "float16" in cg.SUPPORTED_DTYPES
    pytest.importorskip("ml_dtypes")
    assert "bfloat16" in cg.SUPPORTED_DTYPES
    x = cg.full(3, 1.5, "bfloat16")
    assert x.get().astype(np.float32).tolist() == [1.5, 1.5, 1.5]


@pytest.mark.parametrize("bad", ["floot32", "object", np.dtype("U3"), 3.5])
def test_unknown_dtype(backend: str, bad: object) -> None:
    with pytest.raises(TypeError, match="unsupported dtype"):
        cg.empty(3, bad)


@pytest.mark.parametrize("shape", [-1, (2, -3)])
def test_negative_shape(backend: str, shape: object) -> None:
    with pytest.raises(ValueError, match="negative dimension"):
        cg.zeros(shape)  # type: ignore[arg-type]


def test_bad_shape_type(backend: str) -> None:
    with pytest.raises(TypeError, match="shape must be"):
        cg.zeros("3")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="shape must be"):
        cg.zeros((2.5,))  # type: ignore[arg-type]


def test_constructors(backend: str, rng: np.random.Generator) -> None:
    assert np.all(cg.zeros((3, 2), "int32").get() == 0)
    assert np.all(cg.ones(4, "float32").get() == 1)
    f = cg.full((2, 2), 3.25, "float32")
    assert f.dtype == np.float32
    assert np.all(f.get() == 3.25)
    assert cg.full(3, 7).dtype == np.int64  # inferred as numpy does
    data = random_array(rng, (4, 3), "float64")
    x = cg.asarray(data)
    assert cg.asarray(x) is x
    for like in (cg.empty_like(x), cg.zeros_like(data), cg.full_like(x, 2.0)):
        assert like.shape == (4, 3)
        assert like.dtype == np.float64
    assert np.all(cg.zeros_like(x).get() == 0)
    assert np.all(cg.full_like(x, 2.0).get() == 2.0)
    assert cg.empty_like(x, "int8").dtype == np.int8
    assert cg.asarray([1, 2, 3], "float32").get().tolist() == [1.0, 2.0, 3.0]
    assert cg.asarray(5.0).shape == ()
    assert cg.zeros(0).get().shape == (0,)
    assert cg.empty((2, 0, 3)).size == 0


def test_empty_memory_is_not_silently_zero_on_sim(device: cg.Device) -> None:
    if device.backend.name != "sim":
        pytest.skip("only the simulator guarantees a poison pattern")
    device.allocator.empty_cache()  # a fresh block, not a recycled one
    x = cg.empty(64, "uint8")
    assert np.all(x.get() == 0xCD)


INDEXES = [
    (slice(None, None, 2),),
    (slice(None, None, -1),),
    (1,),
    (-1, slice(1, 4)),
    (Ellipsis, 2),
    (None, slice(None), None),
    (slice(5, 1, -2), slice(None, None, 3)),
    (slice(100, 200),),
    (slice(2, 3), Ellipsis, None),
]


@pytest.mark.parametrize("index", INDEXES)
def test_views_match_numpy(backend: str, rng: np.random.Generator, index: tuple) -> None:
    data = random_array(rng, (6, 7), "float32")
    x = cg.asarray(data)
    view = x[index]
    expect = data[index]
    assert view.shape == expect.shape
    assert view.strides == expect.strides
    np.testing.assert_array_equal(view.get(), expect)


def test_transpose_reshape(backend: str, rng: np.random.Generator) -> None:
    data = random_array(rng, (2, 3, 4), "int32")
    x = cg.asarray(data)
    np.testing.assert_array_equal(x.T.get(), data.T)
    np.testing.assert_array_equal(x.transpose(1, 0, 2).get(), data.transpose(1, 0, 2))
    np.testing.assert_array_equal(x.reshape(6, -1).get(), data.reshape(6, -1))
    np.testing.assert_array_equal(x.reshape((4, 6)).get(), data.reshape(4, 6))
    np.testing.assert_array_equal(x.ravel().get(), data.ravel())
    with pytest.raises(ValueError, match="cannot reshape array of size 24"):
        x.reshape(5, 5)
    with pytest.raises(ValueError, match="only one dimension may be -1"):
        x.reshape(-1, -1)
    with pytest.raises(ValueError, match="needs a contiguous array"):
        x.T.reshape(-1)
    with pytest.raises(ValueError, match="not a permutation"):
        x.transpose(0, 0, 1)
    np.testing.assert_array_equal(x.T.copy().reshape(-1).get(), data.T.reshape(-1))


def test_out_of_range_indexes(backend: str) -> None:
    x = cg.zeros((4, 5))
    with pytest.raises(IndexError, match="index 4 is out of bounds for axis 0 with size 4"):
        x[4]
    with pytest.raises(IndexError, match="index -6 is out of bounds for axis 1 with size 5"):
        x[0, -6]
    with pytest.raises(IndexError, match="too many indices"):
        x[0, 0, 0]
    with pytest.raises(TypeError, match="only integers, slices"):
        x[[0, 1]]
    with pytest.raises(IndexError, match="single ellipsis"):
        x[..., ...]


def test_as_strided_bounds(backend: str, rng: np.random.Generator) -> None:
    data = random_array(rng, 12, "float32")
    x = cg.asarray(data)
    v = cg.as_strided(x, (3, 2), (16, 4), offset=4)
    np.testing.assert_array_equal(v.get(), np.lib.stride_tricks.as_strided(data[1:], (3, 2), (16, 4)))
    with pytest.raises(ValueError, match="view out of range: it reaches bytes \\[0, 52\\)"):
        cg.as_strided(x, (13,), (4,))
    with pytest.raises(ValueError, match="out of range"):
        cg.as_strided(x, (2,), (4,), offset=-4)
    with pytest.raises(ValueError, match="out of range"):
        cg.as_strided(x[6:], (7,), (4,))  # beyond the end of the allocation


def test_setitem_and_set(backend: str, rng: np.random.Generator) -> None:
    data = random_array(rng, (5, 6), "float64")
    x = cg.asarray(data)
    ref = data.copy()
    x[1] = 3.5
    ref[1] = 3.5
    row = random_array(rng, 5, "float64")
    x[:, 2] = row
    ref[:, 2] = row
    block = ref[::2, 1::3].copy()
    x[::2, ::3] = cg.asarray(block)
    ref[::2, ::3] = block
    x[4] = np.arange(6)  # int64 data into float64: same kind is allowed
    ref[4] = np.arange(6)
    np.testing.assert_array_equal(x.get(), ref)
    with pytest.raises(ValueError, match="shape mismatch"):
        x[0] = np.ones(4)
    with pytest.raises(TypeError, match="without changing its kind"):
        cg.zeros(3, "int32").set(np.array([1.5, 2.5, 3.5]))


def test_no_implicit_numpy_conversion(backend: str) -> None:
    with pytest.raises(TypeError, match=r"call \.get\(\)"):
        np.asarray(cg.zeros(3))
    assert "DeviceArray shape=(3,) dtype=float64" in repr(cg.zeros(3))
    with pytest.raises(TypeError, match="not created directly"):
        cg.DeviceArray()


def test_interop_surface(device: cg.Device) -> None:
    x = cg.zeros((2, 3), "float32")
    if device.backend.name == "cuda":
        cai = x.__cuda_array_interface__
        assert cai["version"] == 3
        assert cai["data"] == (x.ptr, False)
        assert cai["shape"] == (2, 3)
        assert cai["typestr"] == "<f4"
        assert cai["strides"] is None
        assert x.T.__cuda_array_interface__["strides"] == (4, 12)
        assert x.__dlpack_device__() == (2, 0)
        assert type(x.__dlpack__()).__name__ == "PyCapsule"
    else:
        assert not hasattr(x, "__cuda_array_interface__")
        with pytest.raises(BufferError, match="needs the cuda backend"):
            x.__dlpack__()


def test_more_than_64_dimensions_are_refused(backend: str, rng: np.random.Generator) -> None:
    """Issue 26 item 16: numpy's limit (64) holds for every way to make an array or a view.

    A 70-dimension array used to be accepted and broke later, unrelated calls on sim.
    """
    many = (1,) * 70
    data = random_array(rng, (1,) * 63 + (3,), "float32")
    x = cg.asarray(data)  # 64 dimensions: the most numpy takes
    np.testing.assert_array_equal(x.get(), data)
    flat = cg.asarray(data.reshape(-1))
    for make in (
        lambda: cg.empty(many, "float32"),
        lambda: cg.zeros(many),
        lambda: cg.HostSlot(many),
        lambda: flat.reshape(*many[:-1], 3),
        lambda: x[None],
        lambda: cg.as_strided(flat, many, (4,) * 70),
    ):
        with pytest.raises(ValueError, match="at most 64 dimensions"):
            make()
    y = cg.asarray(data.reshape(-1) * 2)
    np.testing.assert_array_equal(y.get(), data.reshape(-1) * 2)  # later calls unharmed


@pytest.mark.parametrize("key", [True, False, np.True_, (0, True), (Ellipsis, False)], ids=str)
def test_a_boolean_scalar_index_is_refused(backend: str, key: object) -> None:
    """Issue 26 item 16: numpy reads x[True] as a mask (a new axis), not as x[1]: refused."""
    x = cg.asarray(np.arange(6.0).reshape(2, 3))
    with pytest.raises(IndexError, match="boolean index"):
        x[key]
    assert x[1].get().tolist() == [3.0, 4.0, 5.0]  # (integers still index)
