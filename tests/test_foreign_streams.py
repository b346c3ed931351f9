"""Other libraries' streams (any object with ``__cuda_stream__``) wherever a ``stream=`` is taken.

A stand-in foreign stream (``__cuda_stream__`` returning ``(0, handle)`` of a
driver stream the test made with the backend, as another library would) goes
through every public API that takes a stream; the wrapper it becomes is made
once per handle, owns nothing, keeps the foreign object alive and shares its
capture state with every other way of naming that handle. The GPU tests with
PyTorch's, CuPy's and cuda.core's streams are in ``test_interop_gpu.py``.
"""

from __future__ import annotations

import gc
import re
import weakref
from typing import Any

import numpy as np
import pytest
from conftest import random_array

import cudagraphs as cg
import cudagraphs.distributed as dist

SAXPY = r"""
extern "C" __global__ void saxpy(float* __restrict__ y, const float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""


def _saxpy_host(y: np.ndarray, x: np.ndarray, a: np.float32, n: np.int32) -> None:
    y[:n] = a * x[:n] + y[:n]


class Foreign:
    """Another library's stream object: it speaks only the CUDA stream protocol."""

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


class Owning(Foreign):
    """Another library's stream that made its driver stream and destroys it when collected (as CuPy's)."""

    def __init__(self, device: cg.Device) -> None:
        self.raw = device.backend.stream_create(device.index)
        super().__init__(int(self.raw))
        weakref.finalize(self, _destroy, device.backend, self.raw)


def _destroy(backend: Any, raw: Any) -> None:
    backend.synchronize(raw)
    backend.destroy(raw)


@pytest.fixture
def foreign(dev: cg.Device) -> Owning:
    return Owning(dev)


@pytest.fixture
def raw(foreign: Owning) -> Any:
    return foreign.raw


# every stream= ------------------------------------------------------------------------------
def test_arrays_copies_and_ops_take_a_foreign_stream(
    dev: cg.Device, foreign: Foreign, rng: np.random.Generator
) -> None:
    a, b = random_array(rng, 257, "float32"), random_array(rng, 257, "float32")
    x = cg.asarray(a, stream=foreign)
    y = cg.empty(257, "float32", stream=foreign)
    y.set(b, stream=foreign)
    np.testing.assert_array_equal(y.get(stream=foreign), b)
    z = cg.full(257, -7.0, "float32", stream=foreign)  # poisoned
    cg.ops.add(x, y, out=z, stream=foreign)
    np.testing.assert_allclose(z.get(stream=foreign), a + b, rtol=1e-6)
    cg.ops.scale(3.0, x, out=z, stream=foreign)
    np.testing.assert_allclose(z.get_async(stream=foreign).result(), 3 * a, rtol=1e-6)
    cg.ops.axpy(0.5, x, y, stream=foreign)
    np.testing.assert_allclose(y.copy(stream=foreign).get(stream=foreign), 0.5 * a + b, rtol=1e-6)
    cg.ops.copy(z, x, stream=foreign)
    np.testing.assert_array_equal(z.get(stream=foreign), a)
    cg.ops.fill(z, 2.5, stream=foreign)
    np.testing.assert_array_equal(cg.zeros(3, "float32", stream=foreign).get(stream=foreign), np.zeros(3))
    np.testing.assert_array_equal(z.get(stream=foreign), np.full(257, 2.5, np.float32))
    x.record_stream(foreign)  # (declares the foreign stream a user of x's memory)


def test_kernels_scalars_random_and_events_take_a_foreign_stream(
    dev: cg.Device, foreign: Foreign, rng: np.random.Generator
) -> None:
    a, b = random_array(rng, 300, "float32"), random_array(rng, 300, "float32")
    x, y = cg.asarray(a, stream=foreign), cg.asarray(b, stream=foreign)
    k = cg.Kernel(SAXPY, "saxpy", host=_saxpy_host)
    k.launch(3, 128, y, x, 0.5, 300, stream=foreign)
    np.testing.assert_allclose(y.get(stream=foreign), np.float32(0.5) * a + b, rtol=1e-6)
    s = cg.DeviceScalar(0.0, dtype="float32")
    s.set(1.25, stream=foreign)
    assert s.get(stream=foreign) == np.float32(1.25)
    gen = cg.random.Generator(7, stream=foreign)
    gen.seed(11, stream=foreign)
    assert gen.get_state(stream=foreign)[0] == 11
    event = cg.Event(dev).record(foreign)
    other = dev.create_stream()
    other.wait(event)
    other.wait(foreign)
    other.synchronize()
    assert not dev.is_capturing(foreign)


def test_capture_replay_and_graphed_take_a_foreign_stream(
    dev: cg.Device, foreign: Foreign, rng: np.random.Generator
) -> None:
    x = cg.asarray(random_array(rng, 128, "float32"), stream=foreign)
    y = cg.full(128, -1.0, "float32", stream=foreign)
    with cg.capture(stream=foreign) as g:
        assert cg.is_capturing(foreign)
        assert cg.capture_status(foreign) == "active"
        cg.ops.scale(2.0, x, out=y, stream=foreign)
    assert g.stream is dev.external_stream(foreign)
    g.upload(foreign)
    for _ in range(2):
        data = random_array(rng, 128, "float32")
        x.set(data, stream=foreign)
        y.set(np.full(128, -1.0, np.float32), stream=foreign)  # poisoned
        g.replay(foreign)
        np.testing.assert_allclose(y.get(stream=foreign), 2 * data, rtol=1e-6)

    f = cg.graphed(lambda v: cg.ops.scale(3.0, v), stream=foreign, warmup=1)
    for _ in range(3):
        data = random_array(rng, 64, "float32")
        got = f(cg.asarray(data, stream=foreign)).get(stream=foreign)
        np.testing.assert_allclose(got, 3 * data, rtol=1e-6)


def test_collectives_take_foreign_streams(devices: list[cg.Device], rng: np.random.Generator) -> None:
    fs = [Owning(d) for d in devices]
    group = dist.local_group(devices)
    try:
        data = [random_array(rng, (5, 3), "float32") for _ in devices]
        xs = [cg.asarray(v, stream=f) for v, f in zip(data, fs)]
        outs = [cg.full((5, 3), -9.0, "float32", stream=f) for f in fs]  # poisoned
        group.all_reduce(xs, outs, streams=fs)
        for o, f in zip(outs, fs):
            np.testing.assert_allclose(o.get(stream=f), np.sum(data, axis=0), rtol=1e-5)
    finally:
        for d in devices:
            d.synchronize()
        group.close()


# one stream --------------------------------------------------------------------------------
def test_work_through_the_wrapper_and_through_the_handle_is_one_stream_in_order(
    dev: cg.Device, raw: Any, foreign: Foreign, rng: np.random.Generator
) -> None:
    """No wait between them: the wrapper and the handle's Stream are one queue.

    Had the wrapper its own queue, the simulator's interleaving would run the
    steps out of order (the result is checked against numpy, the buffers poisoned).
    """
    direct = cg.Stream(dev, raw, owned=False)  # the handle's queue, named without the protocol
    a = random_array(rng, 1000, "float32")
    x = cg.asarray(a, stream=foreign)
    y = cg.full(1000, np.nan, "float32", stream=foreign)
    want = a.copy()
    for i in range(12):
        if i % 2:
            cg.ops.scale(1.5, x, out=y, stream=foreign)
            cg.ops.add(y, y, out=x, stream=direct)
            want = (want * np.float32(1.5)) * 2
        else:
            cg.ops.copy(y, x, stream=direct)
            cg.ops.add(x, y, out=x, stream=foreign)
            want = want + want
    dev.synchronize()
    np.testing.assert_allclose(x.get(), want, rtol=1e-5)


# the wrapper ------------------------------------------------------------------------------
def test_one_wrapper_per_handle_that_owns_nothing_and_keeps_its_object(
    dev: cg.Device, raw: Any, foreign: Foreign
) -> None:
    w = dev.external_stream(foreign)
    assert type(w) is cg.Stream
    assert w.handle == int(raw)
    assert w.device is dev
    assert dev.external_stream(foreign) is w
    assert dev.external_stream(Foreign(int(raw))) is w  # another object of the same handle
    w.close()  # not owned: closing never destroys the other library's stream
    assert not w.closed
    cg.zeros(4, stream=foreign).get(stream=foreign)  # (the driver stream still works)
    assert w._foreign is foreign  # (kept alive by its wrapper)


@pytest.mark.xfail(
    strict=True,
    reason="the allocator's _streams (stream key -> Stream) keeps every stream it allocated on, "
    "so a wrapper used for an allocation, and its foreign object, live as long as the device",
)
def test_a_dropped_foreign_stream_does_not_leak_its_wrapper(dev: cg.Device) -> None:
    f = Owning(dev)
    handle = f.handle
    x = cg.zeros(8, stream=f)
    x.get(stream=f)
    dead_object, dead_wrapper = weakref.ref(f), weakref.ref(dev.external_stream(f))
    del f, x
    dev.allocator.empty_cache()  # (the allocator's cache keeps the streams its free blocks were used on)
    gc.collect()
    assert dead_object() is None
    assert dead_wrapper() is None
    assert handle not in dev._streams


def test_a_handle_of_ours_is_our_stream(dev: cg.Device) -> None:
    s = dev.create_stream()
    assert dev.external_stream(Foreign(s.handle)) is s
    assert dev.external_stream(Foreign(dev.stream.handle)) is dev.stream
    with cg.capture(stream=Foreign(s.handle)) as g:
        assert s._recording is not None
        cg.ops.fill(cg.empty(4, "float32", stream=s), 1.0, stream=s)
    g.replay(s)
    s.synchronize()
    s.close()


def test_a_capture_through_one_object_is_seen_through_every_name_of_its_handle(
    dev: cg.Device, raw: Any, foreign: Foreign
) -> None:
    twin = Foreign(int(raw))
    with cg.capture(stream=foreign) as g:
        assert cg.is_capturing(twin)
        assert dev.external_stream(int(raw))._recording is not None
        x = cg.empty(16, "float32", stream=twin)  # recorded, from the capture's pool
        cg.ops.fill(x, 4.0, stream=twin)
    assert not cg.is_capturing(twin)
    g.replay(twin)
    np.testing.assert_array_equal(x.get(stream=twin), np.full(16, 4.0, np.float32))


def test_graphed_calls_on_a_foreign_stream_keep_its_wrapper(
    dev: cg.Device, foreign: Foreign, rng: np.random.Generator
) -> None:
    f = cg.graphed(lambda v: cg.ops.scale(2.0, v), stream=foreign, warmup=0)
    data = random_array(rng, 32, "float32")
    w = dev.external_stream(foreign)
    for _ in range(3):
        np.testing.assert_allclose(
            f(cg.asarray(data, stream=foreign)).get(stream=foreign), 2 * data, rtol=1e-6
        )
        assert dev.external_stream(foreign) is w


# errors --------------------------------------------------------------------------------------
class _Broken:
    def __init__(self, answer: Any) -> None:
        self.answer = answer

    def __cuda_stream__(self) -> Any:
        return self.answer


class _NotCallable:
    __cuda_stream__ = (0, 5)


@pytest.mark.parametrize(
    ("stream", "message"),
    [
        (_Broken([0, 5]), r"must return a tuple \(version 0, handle\), got \[0, 5\]"),
        (_Broken((0, 5, 6)), r"must return a tuple \(version 0, handle\)"),
        (_Broken((1, 5)), r"protocol version 1: cudagraphs speaks version 0"),
        (_Broken((True, 5)), r"protocol version True"),
        (_Broken((0, "0x5")), r"must return an int handle .*got str"),
        (_Broken((0, 5.0)), r"must return an int handle .*got float"),
        (_Broken((0, True)), r"must return an int handle .*got bool"),
        (_Broken((0, -1)), r"returned handle -1, not a 64-bit address"),
        (_NotCallable(), r"must be a method returning \(0, handle\)"),
    ],
)
def test_a_broken_cuda_stream_protocol_is_a_type_error(dev: cg.Device, stream: Any, message: str) -> None:
    for call in (
        lambda: cg.zeros(4, stream=stream),
        lambda: cg.capture(stream=stream),
        lambda: cg.graphed(lambda v: v, stream=stream),
    ):
        with pytest.raises(TypeError, match=message):
            call()


@pytest.mark.parametrize("stream", [5, "stream", object(), 2.0])
def test_what_is_not_a_stream_is_a_type_error_naming_the_protocol(dev: cg.Device, stream: Any) -> None:
    x = cg.zeros(4, "float32")
    g = cg.capture(lambda: cg.ops.fill(x, 1.0))
    for call in (
        lambda: cg.zeros(4, stream=stream),
        lambda: x.get(stream=stream),
        lambda: cg.ops.fill(x, 1.0, stream=stream),
        lambda: cg.capture(stream=stream),
        lambda: g.replay(stream),
        lambda: cg.Event(dev).record(stream),
    ):
        with pytest.raises(TypeError, match=r"object with __cuda_stream__.*got"):
            call()


def test_a_handle_the_driver_does_not_know_is_its_error(dev: cg.Device) -> None:
    """On sim: the driver's answer to a destroyed handle (on a GPU, passing one is undefined).

    (Measured on an H200: cuStreamGetCtx of a destroyed stream's handle crashed the process.)
    """
    if dev.backend_name == "cuda":
        pytest.skip("a destroyed stream's handle crashes the real driver: the simulator's answer only")
    raw = dev.backend.stream_create(dev.index)
    handle = int(raw)
    dev.backend.destroy(raw)
    with pytest.raises(cg.CudaError) as info:
        cg.zeros(4, stream=Foreign(handle))
    assert info.value.name in ("CUDA_ERROR_INVALID_HANDLE", "CUDA_ERROR_INVALID_CONTEXT")


def test_a_foreign_stream_of_another_device(devices: list[cg.Device], rng: np.random.Generator) -> None:
    d0, d1 = devices[0], devices[1]
    f = Owning(d1)
    x0 = cg.zeros(4, "float32", device=d0)
    both = rf"is on {re.escape(str(d1))}, the work on {re.escape(str(d0))}"
    with pytest.raises(ValueError, match=both):
        x0.get(stream=f)
    with pytest.raises(ValueError, match=both):
        cg.ops.fill(x0, 1.0, stream=f)
    with pytest.raises(ValueError, match=both):
        cg.capture(stream=f, device=d0)
    data = random_array(rng, 4, "float32")
    x1 = cg.asarray(data, stream=f)  # (no device=: the stream's)
    assert x1.device is d1
    assert d1.external_stream(f).device is d1
    np.testing.assert_array_equal(x1.get(stream=f), data)
