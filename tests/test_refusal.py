"""Another library's illegal call inside a capture is a named refusal; graphed callables may fall back.

The stand-in library (``_fake_library``) works as PyTorch does inside our
captures: its kernels land on the captured stream, and its host read and
synchronize call the driver, which refuses them; it raises its own error
wrapping the driver's. The refusal must name the user's line and the
library's call, chain the library's error, undo the capture, and leave
the stream and memory usable; unrelated errors pass unchanged. A graphed
callable made with ``fallback="eager"`` runs a refused key eagerly, warns
once, and says why in ``stats()``.
"""

from __future__ import annotations

import gc
import sys
import threading
import warnings
from typing import Any

import _fake_library as fakelib
import numpy as np
import pytest
from conftest import live_blocks, random_array, settle

import cudagraphs as cg


def _next_line() -> str:
    """``file:line`` of the line after the caller's."""
    frame = sys._getframe(1)
    return f"{frame.f_code.co_filename}:{frame.f_lineno + 1}"


def _still_usable(dev: cg.Device, in_use: int, rng: np.random.Generator) -> None:
    """No capture left, memory back where it was, an eager op and a new capture give right numbers."""
    gc.collect()
    assert cg.capture_status() == "none"
    assert not dev.captures
    assert settle(dev).in_use == in_use, live_blocks(dev)
    xh = random_array(rng, 64, "float32")
    x = cg.asarray(xh)
    np.testing.assert_allclose(fakelib.scale(x, 3.0).get(), 3 * xh, rtol=1e-6)
    out = cg.full(64, np.nan, dtype="float32")
    with cg.capture() as g:
        cg.ops.copy(out, fakelib.scale(x, -2.0))
    for _ in range(2):
        out[...] = np.nan
        g.replay()
        np.testing.assert_allclose(out.get(), -2 * xh, rtol=1e-6)
    assert fakelib.item(x[:1]) == pytest.approx(float(xh[0]))


# cg.capture -------------------------------------------------------------------------------
def test_a_host_read_of_another_library_in_a_capture_names_the_users_line(
    dev: cg.Device, rng: np.random.Generator
) -> None:
    x = cg.asarray(random_array(rng, 64, "float32"))
    in_use = settle(dev).in_use
    with pytest.raises(cg.CaptureError) as info, cg.capture():
        y = fakelib.scale(x, 2.0)
        line = _next_line()
        fakelib.item(y[:1])
    err = info.value
    assert type(err) is cg.CaptureError
    text = str(err)
    assert f"fakelib refused _fake_library.item at {line} (`fakelib.item(y[:1])`)" in text
    assert "FakeLibError: CUDA error: " in text
    assert "move that call out of the captured code" in text
    assert 'fallback="eager"' in text
    assert isinstance(err.__cause__, fakelib.FakeLibError)
    assert isinstance(err.__cause__.__cause__, cg.CudaError)
    del y, err, info  # (the traceback's frames hold arrays)
    _still_usable(dev, in_use, rng)


def test_a_synchronize_of_another_library_in_a_captured_function(
    dev: cg.Device, rng: np.random.Generator
) -> None:
    x = cg.asarray(random_array(rng, 64, "float32"))
    in_use = settle(dev).in_use

    def step(a: cg.DeviceArray) -> cg.DeviceArray:
        b = fakelib.scale(a, 2.0)
        fakelib.synchronize()
        return b

    line = f"{step.__code__.co_filename}:{step.__code__.co_firstlineno + 2}"
    with pytest.raises(cg.CaptureError, match=r"fakelib refused _fake_library\.synchronize at ") as info:
        cg.capture(step, x)
    assert f" at {line} (`fakelib.synchronize()`)" in str(info.value)
    assert isinstance(info.value.__cause__, fakelib.FakeLibError)
    del info
    _still_usable(dev, in_use, rng)


def test_an_error_raised_once_the_capture_is_invalidated_is_a_refusal(
    dev: cg.Device, rng: np.random.Generator
) -> None:
    """Code that catches the library's error and raises its own still gets the named refusal."""
    x = cg.asarray(random_array(rng, 64, "float32"))
    in_use = settle(dev).in_use
    with pytest.raises(cg.CaptureError) as info, cg.capture():
        try:
            fakelib.item(fakelib.scale(x, 2.0)[:1])
        except fakelib.FakeLibError:
            line = _next_line()
            raise ValueError("no value") from None
    assert f"ValueError refused a call at {line}" in str(info.value)
    assert type(info.value.__cause__) is ValueError
    del info
    _still_usable(dev, in_use, rng)


@pytest.mark.parametrize(
    "error", [ValueError("a user's error"), fakelib.FakeLibError("fakelib: bad shape"), KeyboardInterrupt()]
)
def test_errors_that_do_not_break_the_capture_pass_unchanged(
    dev: cg.Device, rng: np.random.Generator, error: BaseException
) -> None:
    x = cg.asarray(random_array(rng, 64, "float32"))
    in_use = settle(dev).in_use
    with pytest.raises(type(error)) as info, cg.capture():
        fakelib.scale(x, 2.0)
        raise error
    assert info.value is error
    assert error.__cause__ is None
    with pytest.raises(fakelib.FakeLibError, match="cannot handle an array of shape") as lib, cg.capture():
        fakelib.fails(fakelib.scale(x, 2.0))
    assert lib.value.__cause__ is None
    del info, lib
    error.__traceback__ = None
    _still_usable(dev, in_use, rng)


def test_cudagraphs_own_refusal_is_raised_as_it_was(dev: cg.Device, rng: np.random.Generator) -> None:
    x = cg.asarray(random_array(rng, 64, "float32"))
    with pytest.raises(cg.CaptureError) as info, cg.capture():
        line = _next_line()
        fakelib.scale(x, 2.0).get()
    assert info.value.__cause__ is None
    assert not str(info.value).startswith("fakelib")
    assert line in str(info.value)
    del info
    _still_usable(dev, settle(dev).in_use, rng)


# graphed callables ------------------------------------------------------------------------
def _reads_in_bucket_8(x: cg.DeviceArray) -> cg.DeviceArray:
    y = fakelib.scale(x, 2.0)
    if x.shape[0] == 8:  # (captured on the bucket's static input)
        fakelib.item(y[:1])
    return y


_READ_LINE = _reads_in_bucket_8.__code__.co_firstlineno + 3


def test_a_refused_key_raises_by_default_and_tries_again(dev: cg.Device, rng: np.random.Generator) -> None:
    f = cg.graphed(_reads_in_bucket_8, buckets=[4, 8], device=dev)
    assert f.fallback == "raise"
    x = cg.asarray(random_array(rng, (6,), "float32"))
    in_use = settle(dev).in_use
    for _ in range(2):  # no graph, nothing kept: the next call captures again
        with pytest.raises(cg.CaptureError) as info:
            f(x)
        text = str(info.value)
        assert f"fakelib refused _fake_library.item at {__file__}:{_READ_LINE}" in text
        assert 'cg.graphed(fn, fallback="eager")' in text
        assert isinstance(info.value.__cause__, fakelib.FakeLibError)
    assert f.stats()["eager"] == {}
    assert f.stats()["captures"] == 0
    xh = random_array(rng, (3,), "float32")
    np.testing.assert_allclose(f(cg.asarray(xh)).get(), 2 * xh, rtol=1e-6)  # bucket 4 is graphed
    assert list(f.graphs) == [4]
    f.close()
    del info
    assert settle(dev).in_use == in_use, live_blocks(dev)
    _still_usable(dev, in_use, rng)


def _refusals(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, cg.FallbackWarning)]


@pytest.mark.parametrize("where", ["fakelib", "cudagraphs"])
def test_fallback_eager_runs_a_refused_key_eagerly_and_the_others_graphed(
    dev: cg.Device, rng: np.random.Generator, where: str
) -> None:
    """A refusal by the stand-in library, or by cudagraphs itself (a host read of our array)."""

    def fn(x: cg.DeviceArray) -> cg.DeviceArray:
        y = fakelib.scale(x, 2.0)
        if x.shape[0] == 8:
            _ = fakelib.item(y[:1]) if where == "fakelib" else y[:1].get()
        return y

    line = f"{__file__}:{fn.__code__.co_firstlineno + 3}"
    f = cg.graphed(fn, buckets=[2, 4, 8], fallback="eager", device=dev)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (7, 3, 6, 3, 8, 1, 5):
            xh = random_array(rng, (n,), "float32")
            out = f(cg.asarray(xh))
            eager = n > 4
            assert type(out) is (cg.DeviceArray if eager else cg.GraphOutput)
            np.testing.assert_allclose(out.get(), 2 * xh, rtol=1e-6)
            out[...] = np.nan  # poisoned: the next call must write every value again
    refusals = _refusals(caught)
    assert len(refusals) == 1, refusals
    assert "runs eagerly from now on" in refusals[0]
    assert line in refusals[0]
    assert caught[0].filename == __file__  # (warned at the user's call)
    stats = f.stats()
    assert set(stats["eager"]) == {8}
    assert stats["eager"][8]["hits"] == 3
    assert line in stats["eager"][8]["reason"]
    if where == "fakelib":
        assert "fakelib refused _fake_library.item" in stats["eager"][8]["reason"]
    assert {b: g["hits"] for b, g in stats["graphs"].items()} == {4: 1, 2: 0}
    assert stats["captures"] == 2
    assert stats["calls"] == 7
    assert stats["misses"] == 3
    assert sorted(f.graphs) == [2, 4]


def test_two_threads_on_a_refused_key_both_get_results_and_one_warning(
    dev: cg.Device, rng: np.random.Generator
) -> None:
    f = cg.graphed(_reads_in_bucket_8, buckets=[8], fallback="eager", device=dev)
    inputs = [random_array(rng, (7,), "float32") for _ in range(2)]
    results: list[Any] = [None, None]
    start = threading.Barrier(2)

    def call(k: int) -> None:
        stream = dev.create_stream()
        with stream:
            x = cg.asarray(inputs[k], stream=stream)
            start.wait()
            results[k] = f(x).get(stream=stream)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        threads = [threading.Thread(target=call, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(_refusals(caught)) == 1
    for k in range(2):
        np.testing.assert_allclose(results[k], 2 * inputs[k], rtol=1e-6)
    assert set(f.stats()["eager"]) == {8}


def test_graph_module_takes_the_fallback(dev: cg.Device, rng: np.random.Generator) -> None:
    w = cg.asarray(random_array(rng, (8,), "float32"))

    def fn(x: cg.DeviceArray, *, w: cg.DeviceArray) -> cg.DeviceArray:
        return cg.ops.add(_reads_in_bucket_8(x), w[: x.shape[0]])

    m = cg.GraphModule(fn, params={"w": w}, buckets=[4, 8], fallback="eager", device=dev)
    assert m.graphed.fallback == "eager"
    wh = w.get()
    for n in (6, 3):
        xh = random_array(rng, (n,), "float32")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = m(cg.asarray(xh))
        assert len(_refusals(caught)) == (n == 6)
        np.testing.assert_allclose(out.get(), 2 * xh + wh[:n], rtol=1e-6)
    assert set(m.graphed.stats()["eager"]) == {8}
    assert list(m.graphed.graphs) == [4]
    m.params["w"] = cg.asarray(random_array(rng, (8,), "float32"))
    m.refresh()  # (the key run eagerly has no graph to repoint)
    xh = random_array(rng, (6,), "float32")
    np.testing.assert_allclose(m(cg.asarray(xh)).get(), 2 * xh + m.params["w"].get()[:6], rtol=1e-6)
