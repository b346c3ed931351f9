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
    assert tuple(t.shape) == (4, 8)
    assert t.stride() == (1, 4)
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


def test_cupy_and_torch_kernels_inside_capture_replay_correctly(cuda: cg.Device) -> None:
    cp = pytest.importorskip("cupy")
    torch = pytest.importorskip("torch")
    cg.ops.preload_dtypes(["float32"], cuda)
    source = (
        'extern "C" __global__ void twice(float* p, int n) { int i = threadIdx.x; if (i < n) p[i] *= 2.0f; }'
    )
    raw = cp.RawKernel(source, "twice")
    data = np.random.default_rng(8).standard_normal(64).astype(np.float32)
    x = cg.asarray(data)
    cx = cp.asarray(x)  # zero-copy view of x
    tx = torch.from_dlpack(x)  # zero-copy view of x
    s = cuda.create_stream()
    cp_stream = cp.cuda.ExternalStream(s.handle)
    torch_stream = torch.cuda.ExternalStream(s.handle)
    with cp_stream:
        raw((1,), (64,), (cx, np.int32(64)))  # compile outside the capture
    s.wait(cuda.stream)
    s.synchronize()
    x.set(data)
    cuda.stream.synchronize()
    with cg.capture(stream=s) as g:
        with cp_stream:
            raw((1,), (64,), (cx, np.int32(64)))  # CuPy kernel: x *= 2
        with torch.cuda.stream(torch_stream):
            tx.add_(1.0)  # PyTorch op on a preallocated tensor: x += 1
        cg.ops.scale(3.0, x, out=x, stream=s)  # ours: x *= 3
    assert len(g.nodes) == 3
    assert all(n.type == "kernel" for n in g.nodes)
    s.synchronize()
    np.testing.assert_array_equal(x.get(stream=s), data)  # capture ran nothing
    ref = data.copy()
    for _ in range(2):
        g.replay()
        ref = (ref * 2 + 1) * 3
    s.synchronize()
    np.testing.assert_allclose(x.get(stream=s), ref, rtol=1e-6)
    g.close()
    s.close()


def test_soak_100k_replays_with_scalar_updates(cuda: cg.Device) -> None:
    cg.ops.preload_dtypes(["float64"], cuda)
    rng = np.random.default_rng(9)
    x_h = rng.integers(-5, 6, 256).astype(np.float64)  # sums stay exact in float64
    x, y = cg.asarray(x_h), cg.zeros(256, "float64")
    s = cg.DeviceScalar(0.0, "float64")
    with cg.capture() as g:
        cg.ops.axpy(s, x, y)
    g.upload()
    cuda.synchronize()
    free_before = cuda.mem_info()[0]
    stats_before = cuda.allocator.stats()
    total = 0
    for i in range(100_000):
        v = i % 7 - 3
        s.set(v)
        g.replay()
        total += v
    cuda.synchronize()
    np.testing.assert_array_equal(y.get(), total * x_h)
    assert g.replays == 100_000
    assert cuda.allocator.stats() == stats_before
    assert cuda.mem_info()[0] == free_before
    g.close()
