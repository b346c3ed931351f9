"""PyTorch's and CuPy's calls that break a capture are refusals naming the user's line (GPU only).

Measured on an H100 with torch 2.11: ``.item()`` inside a graphed PyTorch
function surfaced as PyTorch's ``AcceleratorError`` without the user's line.
Each test checks the CaptureError, the line, the chained error, and that the
next capture works and gives the right numbers.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import pytest

import cudagraphs as cg

pytestmark = pytest.mark.gpu


@pytest.fixture
def cuda() -> Any:
    with cg.override(backend="cuda"):
        yield cg.Device(0)


def _next_line() -> str:
    frame = sys._getframe(1)
    return f"{frame.f_code.co_filename}:{frame.f_lineno + 1}"


def _torch_capture_works(torch: Any) -> None:
    x = torch.randn(256, device="cuda")
    out = torch.empty(256, device="cuda")
    with cg.capture() as g:
        out.copy_(x * 3 + 1)
    x.copy_(torch.randn(256, device="cuda"))
    out.fill_(float("nan"))
    g.replay(torch.cuda.current_stream())  # (after PyTorch's writes of x and out, in stream order)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, x * 3 + 1)
    assert (x + 1).sum().item() == pytest.approx(float(x.sum().item()) + 256, rel=1e-4)


@pytest.mark.parametrize("call", ["item", "synchronize"])
def test_torch_host_read_and_synchronize_in_cg_capture(cuda: cg.Device, call: str) -> None:
    torch = pytest.importorskip("torch")
    x = torch.randn(256, device="cuda")
    (x * 2).sum().item()  # warm up outside the capture
    with pytest.raises(cg.CaptureError) as info, cg.capture():
        y = x * 2
        line = _next_line()
        y.sum().item() if call == "item" else torch.cuda.synchronize()
    text = str(info.value)
    assert f" at {line} " in text
    assert "PyTorch refused" in text
    if call == "synchronize":
        assert "torch.cuda.synchronize" in text
    assert info.value.__cause__ is not None
    assert cg.capture_status() == "none"
    del info
    _torch_capture_works(torch)


def test_torch_item_in_a_graphed_function_names_its_line(cuda: cg.Device) -> None:
    torch = pytest.importorskip("torch")

    def fn(x: Any) -> Any:
        y = x * 2
        y.sum().item()
        return y

    line = f"{fn.__code__.co_filename}:{fn.__code__.co_firstlineno + 2}"
    f = cg.graphed(fn)
    with pytest.raises(cg.CaptureError, match="PyTorch refused") as info:
        f(torch.randn(64, device="cuda"))
    assert f" at {line} (`y.sum().item()`)" in str(info.value)
    assert 'fallback="eager"' in str(info.value)
    del info
    _torch_capture_works(torch)


def test_torch_item_in_one_bucket_falls_back_to_eager(cuda: cg.Device) -> None:
    torch = pytest.importorskip("torch")

    def fn(x: Any) -> Any:
        y = x * 2 + 1
        if x.shape[0] > 4:
            y[0].item()
        return y

    f = cg.graphed(fn, buckets=[4, 8], fallback="eager")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (3, 6, 7, 2):
            x = torch.randn(n, device="cuda")
            torch.testing.assert_close(f(x), x * 2 + 1)
    assert sum(issubclass(w.category, cg.FallbackWarning) for w in caught) == 1
    stats = f.stats()
    assert list(stats["eager"]) == [8]
    assert list(stats["graphs"]) == [4]
    assert stats["graphs"][4]["hits"] == 1
    assert "PyTorch refused" in stats["eager"][8]["reason"]
    _torch_capture_works(torch)


@pytest.mark.parametrize("graphed", [False, True])
def test_cupy_host_read_in_a_capture(cuda: cg.Device, graphed: bool) -> None:
    cp = pytest.importorskip("cupy")
    a = cp.arange(256, dtype=cp.float32)
    float((a * 2).sum())  # warm up outside the capture

    def fn(x: Any) -> Any:
        y = x * 2
        y[:1].get()
        return y

    line = f"{fn.__code__.co_filename}:{fn.__code__.co_firstlineno + 2}"
    with pytest.raises(cg.CaptureError) as info:
        if graphed:
            cg.graphed(fn)(a)
        else:
            cg.capture(fn, a)
    assert f" at {line} " in str(info.value)
    assert info.value.__cause__ is not None
    del info
    out = cp.empty_like(a)
    with cg.capture() as g:
        out[...] = a * 3
    out.fill(cp.nan)
    g.replay()
    cp.cuda.Device().synchronize()
    cp.testing.assert_allclose(out, cp.arange(256, dtype=cp.float32) * 3)
