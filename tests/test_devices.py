"""Several devices in one process: counting them, peer access, copies between them.

On ``sim`` with 2 and 4 simulated devices (CI); on ``cuda`` where the machine
has two GPUs or more (``CUDAGRAPHS_TEST_BACKENDS=cuda,sim``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import cuda_device_count

import cudagraphs as cg
from cudagraphs.backends.base import CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, Copy
from cudagraphs.backends.sim import SimBackend


def _pairs(devs: list[cg.Device]) -> list[tuple[cg.Device, cg.Device]]:
    return [(a, b) for a in devs for b in devs if a is not b]


def test_device_count_and_every_device_at_once(devices: list[cg.Device]) -> None:
    assert cg.device_count() == len(devices)
    assert len({d.index for d in devices}) == len(devices)
    rng = np.random.default_rng(5)
    data = [rng.standard_normal(64).astype(np.float32) for _ in devices]
    arrays = [cg.asarray(x, device=d) for x, d in zip(data, devices)]
    for a, d in zip(arrays, devices):
        assert a.device is d
        cg.ops.scale(2.0, a, out=a)
    for a, x in zip(arrays, data):
        np.testing.assert_array_equal(a.get(), 2 * x)


def test_copy_between_every_pair(devices: list[cg.Device]) -> None:
    rng = np.random.default_rng(7)
    for src_dev, dst_dev in _pairs(devices):
        for dtype in ("float32", "int64"):
            x = (rng.standard_normal((33, 5)) * 100).astype(dtype)
            src = cg.asarray(x, device=src_dev)
            dst = cg.full((33, 5), -1, dtype, device=dst_dev)  # poisoned
            assert cg.ops.copy(dst, src) is dst
            np.testing.assert_array_equal(dst.get(), x)
    assert all(len(d.peers) == len(devices) - 1 for d in devices)  # enabled both ways, once


def test_strided_copies_between_devices(devices: list[cg.Device]) -> None:
    a_dev, b_dev = devices[0], devices[-1]
    x = np.arange(6 * 8, dtype=np.float64).reshape(6, 8) * 1.5
    src = cg.asarray(x, device=a_dev)
    out = cg.full((8, 6), np.nan, "float64", device=b_dev)
    cg.ops.copy(out, src.T)  # a strided source, made dense on its device first
    np.testing.assert_array_equal(out.get(), x.T)
    big = cg.full((6, 16), np.nan, "float64", device=b_dev)
    cg.ops.copy(big[:, ::2], src)  # a strided destination, filled from a dense temporary
    got = big.get()
    np.testing.assert_array_equal(got[:, ::2], x)
    assert np.isnan(got[:, 1::2]).all()  # nothing else written


def test_copy_is_in_stream_order_on_both_devices(devices: list[cg.Device]) -> None:
    """Work queued before the copy is seen by it; work queued after it waits for it."""
    a_dev, b_dev = devices[0], devices[1]
    n = 1 << 12
    for i in range(5):
        src = cg.full(n, float(i), "float32", device=a_dev)
        cg.ops.scale(3.0, src, out=src)  # queued on a's stream before the copy
        dst = cg.full(n, -1.0, "float32", device=b_dev)
        cg.ops.copy(dst, src, stream=b_dev.current_stream())
        cg.ops.fill(src, 99.0)  # after the copy, on a's stream: must not reach dst
        cg.ops.scale(2.0, dst, out=dst)  # after the copy, on b's stream
        np.testing.assert_array_equal(dst.get(), np.full(n, 6.0 * i, np.float32))
        np.testing.assert_array_equal(src.get(), np.full(n, 99.0, np.float32))


def test_copy_on_the_source_devices_stream(devices: list[cg.Device]) -> None:
    a_dev, b_dev = devices[0], devices[1]
    s = a_dev.create_stream()
    x = np.random.default_rng(3).standard_normal(100).astype(np.float32)
    src = cg.asarray(x, device=a_dev)
    dst = cg.zeros(100, "float32", device=b_dev)
    s.wait(a_dev.current_stream())  # (a stream given explicitly is ordered by its caller)
    cg.ops.copy(dst, src, stream=s)
    np.testing.assert_array_equal(dst.get(), x)  # b's stream waited for s
    s.close()


def test_captured_copy_replays_across_devices(devices: list[cg.Device]) -> None:
    a_dev, b_dev = devices[0], devices[1]
    cg.enable_peer_access()
    rng = np.random.default_rng(11)
    x = rng.standard_normal(256).astype(np.float32)
    src = cg.asarray(x, device=a_dev)
    dst = cg.zeros(256, "float32", device=b_dev)
    s = b_dev.create_stream()
    with cg.capture(stream=s) as g:
        cg.ops.copy(dst, src, stream=s)
        cg.ops.scale(2.0, dst, out=dst, stream=s)
    assert dst.get().tolist() == [0.0] * 256  # captured, not run
    for k in range(3):
        y = rng.standard_normal(256).astype(np.float32)
        src.set(y)
        s.wait(a_dev.current_stream())  # the graph reads a's memory: ordered by the caller
        g.replay()
        s.synchronize()
        np.testing.assert_array_equal(dst.get(), 2 * y, err_msg=f"replay {k}")
    g.close()
    s.close()


def test_copy_argument_errors(devices: list[cg.Device]) -> None:
    a_dev, b_dev = devices[0], devices[1]
    src = cg.zeros(8, "float32", device=a_dev)
    with pytest.raises(TypeError, match="dst is int32 but src is float32"):
        cg.ops.copy(cg.zeros(8, "int32", device=b_dev), src)
    with pytest.raises(ValueError, match=r"dst has shape \(4,\) but src has \(8,\)"):
        cg.ops.copy(cg.zeros(4, "float32", device=b_dev), src)
    with pytest.raises(TypeError, match="must be a cudagraphs DeviceArray"):
        cg.ops.copy(np.zeros(8, np.float32), src)
    if len(devices) > 2:
        third = devices[2].create_stream()
        with pytest.raises(ValueError, match="the stream must be a Stream of"):
            cg.ops.copy(cg.zeros(8, "float32", device=b_dev), src, stream=third)
        third.close()


def test_peer_access_api(devices: list[cg.Device]) -> None:
    a_dev, b_dev = devices[0], devices[1]
    assert a_dev.can_access_peer(a_dev) is False
    with pytest.raises(ValueError, match="reaches its own memory"):
        a_dev.enable_peer_access(a_dev)
    with pytest.raises(TypeError, match="takes a cudagraphs Device, got int"):
        a_dev.enable_peer_access(1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="takes Devices"):
        cg.enable_peer_access([a_dev, 1])  # type: ignore[list-item]
    enabled = cg.enable_peer_access()
    assert sorted(enabled) == sorted((a.index, b.index) for a, b in _pairs(devices) if a.can_access_peer(b))
    assert b_dev in a_dev.peers
    a_dev.enable_peer_access(b_dev)  # idempotent


def test_enabling_peer_access_during_a_capture_is_refused_and_the_capture_kept(
    devices: list[cg.Device], monkeypatch: pytest.MonkeyPatch
) -> None:
    a_dev, b_dev = devices[0], devices[1]
    monkeypatch.setattr(a_dev, "_peers", set())  # (as if not enabled yet)
    x = cg.ones(16, "float32", device=a_dev)
    src = cg.zeros(16, "float32", device=b_dev)
    with cg.capture(device=a_dev) as g:
        cg.ops.scale(2.0, x, out=x)
        with pytest.raises(cg.CaptureError, match=r"enable_peer_access.*before capturing"):
            cg.ops.copy(x, src)
        cg.ops.scale(3.0, x, out=x)  # the capture goes on
    g.replay()
    np.testing.assert_array_equal(x.get(), np.full(16, 6.0, np.float32))
    g.close()


def test_devices_without_a_peer_path_copy_through_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    with cg.override(backend="sim", sim_devices=2, sim_peer=False):
        a_dev, b_dev = cg.Device(0), cg.Device(1)
        for obj in (a_dev, b_dev, a_dev.backend):  # (GPUs that never had a peer path)
            monkeypatch.setattr(obj, "_peers", set())
        assert not a_dev.can_access_peer(b_dev)
        with pytest.raises(ValueError, match="has no peer path"):
            a_dev.enable_peer_access(b_dev)
        x = np.random.default_rng(2).standard_normal(50).astype(np.float32)
        src = cg.asarray(x, device=a_dev)
        dst = cg.full(50, np.nan, "float32", device=b_dev)
        cg.ops.copy(dst, src)  # staged by the driver (cuMemcpyPeerAsync)
        np.testing.assert_array_equal(dst.get(), x)
        s = b_dev.create_stream()
        with pytest.raises(cg.CaptureError, match="no peer path"), cg.capture(stream=s):
            cg.ops.copy(dst, src, stream=s)
        assert not b_dev.is_capturing(s)
        with cg.capture(stream=s) as g:  # the stream is usable again
            cg.ops.scale(2.0, dst, out=dst, stream=s)
        g.replay()
        s.synchronize()
        np.testing.assert_array_equal(dst.get(), 2 * x)
        g.close()
        s.close()


def test_sim_refuses_what_the_driver_refuses_between_devices() -> None:
    """The rows measured on two H200s (``test_driver_refuses_...`` checks them on GPUs)."""
    with cg.override(sim_devices=2):
        sim = SimBackend()
        s0 = sim.stream_create(0)
        a = sim.mem_alloc(0, 64, s0)
        b = sim.mem_alloc(1, 64, s0)
        with pytest.raises(cg.CudaError) as err:
            sim.memcpy(s0, Copy(b, a, 64, "dtod"))
        assert err.value.code == CUDA_ERROR_INVALID_VALUE
        assert "peer access 0->1, 1->0 is not enabled" in str(err.value)
        sim.memcpy(s0, Copy(b, a, 64, "peer"))  # staged: legal
        sim.activate(0, peer=1)
        sim.activate(1, peer=0)
        sim.memcpy(s0, Copy(b, a, 64, "dtod"))
        sim.capture_begin(s0, "thread_local")
        with pytest.raises(cg.CudaError) as err:
            sim.memcpy(s0, Copy(b, a, 64, "peer"))
        assert err.value.code == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
        with pytest.raises(cg.CudaError):
            sim.capture_end(s0)  # invalidated


DRIVER_CHECK = textwrap.dedent("""
    import cudagraphs as cg
    from cudagraphs.backends.base import Copy
    be = cg.Device(0).backend
    cg.Device(1)
    s0, s1 = cg.Device(0).stream._raw, cg.Device(1).stream._raw
    a, b = be.mem_alloc(0, 64, s0), be.mem_alloc(1, 64, s1)
    be.synchronize(s0)
    be.synchronize(s1)
    be.activate(0)
    try:
        be.memcpy(s0, Copy(b, a, 64, "dtod"))
    except cg.CudaError as e:
        print("plain", e.name)
    be.memcpy(s0, Copy(b, a, 64, "peer"))
    be.synchronize(s0)
    print("staged ok")
    be.activate(0, peer=1)
    be.activate(1, peer=0)
    be.memcpy(s0, Copy(b, a, 64, "dtod"))
    be.synchronize(s0)
    print("plain after access ok")
""")


@pytest.mark.skipif(
    cuda_device_count() < 2, reason="GPU test: needs two GPUs and CUDAGRAPHS_TEST_BACKENDS=cuda,sim"
)
def test_driver_refuses_a_plain_copy_between_devices_until_peer_access() -> None:
    """What the sim's rows above say, on the GPUs, in a fresh process (no access yet)."""
    r = subprocess.run(
        [sys.executable, "-c", DRIVER_CHECK],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "CUDAGRAPHS_BACKEND": "cuda"},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:3] == [
        "plain CUDA_ERROR_INVALID_VALUE",
        "staged ok",
        "plain after access ok",
    ]


def test_doctor_reports_the_devices_and_their_peer_paths() -> None:
    env = {**os.environ, "CUDAGRAPHS_BACKEND": "sim", "CUDAGRAPHS_SIM_DEVICES": "3"}
    r = subprocess.run(
        [sys.executable, "-m", "cudagraphs", "doctor"], capture_output=True, text=True, timeout=120, env=env
    )
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert "devices: 3" in lines
    i = next(k for k, line in enumerate(lines) if line.startswith("peer paths"))
    assert lines[i + 1].split() == ["0", "1", "2"]
    assert [line.split() for line in lines[i + 2 : i + 5]] == [
        ["0", "-", "ok", "ok"],
        ["1", "ok", "-", "ok"],
        ["2", "ok", "ok", "-"],
    ]
    env["CUDAGRAPHS_SIM_PEER"] = "0"
    r = subprocess.run(
        [sys.executable, "-m", "cudagraphs", "doctor"], capture_output=True, text=True, timeout=120, env=env
    )
    assert "  0     -    no    no" in r.stdout
