"""GPU-only behaviour: zero-copy interop with CuPy and PyTorch, DLPack lifetime."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import cudagraphs as cg

pytestmark = pytest.mark.gpu


@pytest.fixture
def cuda() -> cg.Device:
    with cg.override(backend="cuda"):
        yield cg.Device(0)


def test_cupy_reads_and_writes_through_cuda_array_interface(cuda: cg.Device) -> None:
    cp = pytest.importorskip("cupy")
    data = np.random.default_rng(5).standard_normal((16, 8)).astype(np.float32)
    x = cg.asarray(data)
    view = cp.asarray(x[:, ::2])  # zero-copy, strided
    np.testing.assert_array_equal(cp.asnumpy(view), data[:, ::2])
    view *= 2
    cp.cuda.Device().synchronize()
    expect = data.copy()
    expect[:, ::2] *= 2
    np.testing.assert_array_equal(x.get(), expect)


def test_torch_from_dlpack_shares_memory_and_keeps_it_alive(cuda: cg.Device) -> None:
    torch = pytest.importorskip("torch")
    data = np.random.default_rng(6).standard_normal((8, 4))
    x = cg.asarray(data)
    t = torch.from_dlpack(x.T)
    assert tuple(t.shape) == (4, 8) and t.stride() == (1, 4)
    del x
    gc.collect()
    junk = [cg.full((8, 4), 9.0) for _ in range(4)]  # would reuse x's block if freed early
    np.testing.assert_array_equal(t.cpu().numpy(), data.T)
    t.mul_(3)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(t.cpu().numpy(), data.T * 3)
    del junk


def test_unconsumed_capsule_is_freed(cuda: cg.Device) -> None:
    x = cg.zeros(10)
    for _ in range(100):
        cap = x.__dlpack__()
        del cap
    from cudagraphs import _dlpack

    gc.collect()
    assert not _dlpack._alive


def test_dlpack_with_consumer_stream(cuda: cg.Device) -> None:
    torch = pytest.importorskip("torch")
    s = torch.cuda.Stream()
    x = cg.full(1000, 2.0, "float32")
    with torch.cuda.stream(s):
        t = torch.from_dlpack(x)  # torch passes its stream; we order it after our work
        total = float(t.sum())
    assert total == 2000.0
