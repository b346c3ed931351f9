"""One capture recording work on several devices' streams, joined by events.

On ``sim`` with 2 and 4 simulated devices (CI); on ``cuda`` where the machine
has two GPUs or more (``CUDAGRAPHS_TEST_BACKENDS=cuda,sim``).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import cudagraphs as cg
from cudagraphs import _recording


def _fork_join_graph(devs: list[cg.Device]) -> tuple[cg.Graph, list[cg.DeviceArray], list[cg.DeviceArray]]:
    """A graph on devs[0]'s stream: every device scales its own input and adds its neighbour's."""
    cg.enable_peer_access()
    n = 512
    xs = [cg.zeros(n, "float32", device=d) for d in devs]
    ys = [cg.full(n, -7.0, "float32", device=d) for d in devs]
    streams = [d.create_stream() for d in devs]
    with cg.capture(stream=streams[0]) as g:
        for s in streams[1:]:
            s.wait(streams[0])  # fork: s joins the capture
        for k, (d, s) in enumerate(zip(devs, streams)):
            nxt = xs[(k + 1) % len(devs)]
            tmp = cg.empty(n, "float32", device=d, stream=s)  # from the capture's pool on d
            cg.ops.copy(tmp, nxt, stream=s)
            cg.ops.scale(3.0, xs[k], out=ys[k], stream=s)
            cg.ops.add(ys[k], tmp, out=ys[k], stream=s)
        for s in streams[1:]:
            streams[0].wait(s)  # join back
    return g, xs, ys


def test_one_capture_records_every_devices_stream(devices: list[cg.Device]) -> None:
    g, xs, ys = _fork_join_graph(devices)
    assert all(y.get()[0] == -7.0 for y in ys)  # captured, not run
    assert not any(_recording.active(d) for d in devices)  # every device left the capture
    rng = np.random.default_rng(3)
    for rep in range(3):
        data = [rng.standard_normal(512).astype(np.float32) for _ in devices]
        for x, v in zip(xs, data):
            x.set(v)  # on each device's current stream: the replay waits for it
        for y in ys:
            cg.ops.fill(y, np.nan)  # poisoned before the replay (also on the current streams)
        g.replay(devices[0].current_stream())  # (the other devices' current streams: implied)
        for k, y in enumerate(ys):  # read on each device's current stream: after the replay
            want = 3 * data[k] + data[(k + 1) % len(devices)]
            np.testing.assert_allclose(y.get(), want, rtol=1e-6, err_msg=f"replay {rep}, device {k}")
    g.close()


def test_memory_a_joined_device_allocates_is_its_own(devices: list[cg.Device]) -> None:
    a, b = devices[0], devices[1]
    sa, sb = a.create_stream(), b.create_stream()
    with cg.capture(stream=sa) as g:
        sb.wait(sa)
        tmp = cg.empty(256, "float32", device=b, stream=sb)
        assert tmp.device is b
        if b.backend_name == "sim":
            assert b.backend._memory.owner_of(tmp.ptr) == b.index
        cg.ops.fill(tmp, 1.0, stream=sb)
        del tmp  # dies inside the capture: its release waits for the end on b too
        sa.wait(sb)
    g.replay()
    sa.synchronize()
    g.close()


def test_a_stream_never_joined_back_fails_the_capture_cleanly(devices: list[cg.Device]) -> None:
    a, b = devices[0], devices[1]
    sa, sb = a.create_stream(), b.create_stream()
    x = cg.zeros(64, "float32", device=b)
    b.synchronize()  # (x's zeros are queued on b's current stream, not on sb)
    with pytest.raises((cg.CaptureError, cg.CudaError), match=r"UNJOINED|joined"), cg.capture(stream=sa):
        sb.wait(sa)
        cg.ops.fill(x, 1.0, stream=sb)
        cg.ops.fill(cg.zeros(4, "float32", device=a, stream=sa), 2.0, stream=sa)
    # nothing is left capturing: both streams and devices work as before
    assert sb._recording is None
    assert sa._recording is None
    assert not _recording.active(a)
    assert not _recording.active(b)
    assert cg.capture_status(sb) == "none"
    cg.ops.fill(x, 5.0, stream=sb)
    sb.synchronize()
    assert (x.get() == 5.0).all()
    b.synchronize()


def test_a_joined_device_counts_as_capturing(devices: list[cg.Device]) -> None:
    a, b = devices[0], devices[1]
    sa, sb = a.create_stream(), b.create_stream()
    with cg.capture(stream=sa) as g:
        sb.wait(sa)
        assert b.is_capturing(sb)
        assert _recording.active(b)
        cg.ops.fill(cg.zeros(8, "float32", device=b, stream=sb), 1.0, stream=sb)
        sa.wait(sb)
    assert g.state == "ready"
    assert not b.is_capturing(sb)
    assert not _recording.active(b)
    g.close()
    # a device-wide synchronize of the joined device is refused like one of the captured one
    with pytest.raises(cg.CaptureInvalidatedError), cg.capture(stream=sa):
        sb.wait(sa)
        with pytest.raises(cg.CaptureError, match=r"Device.synchronize\(\)"):
            b.synchronize()
        sa.wait(sb)
    assert not _recording.active(b)
    b.synchronize()


def test_forking_from_another_thread_is_refused(devices: list[cg.Device]) -> None:
    a, b = devices[0], devices[1]
    sa, sb = a.create_stream(), b.create_stream()
    errors: list[BaseException] = []
    with cg.capture(stream=sa) as g:
        ev = sa.record()

        def other() -> None:
            try:
                sb.wait(ev)
            except BaseException as exc:
                errors.append(exc)

        t = threading.Thread(target=other)
        t.start()
        t.join()
        cg.ops.fill(cg.zeros(8, "float32", device=a, stream=sa), 1.0, stream=sa)
    assert len(errors) == 1
    assert isinstance(errors[0], cg.CaptureError)
    assert "fork" in str(errors[0])
    assert sb._recording is None
    g.close()


def test_captures_on_two_devices_at_once_from_one_thread(devices: list[cg.Device]) -> None:
    # a capture mode is a rule of the thread: while the thread captures on one device, a graph
    # it captured on another is instantiated on first use (the driver refuses it before)
    a, b = devices[0], devices[1]
    sa, sb = a.create_stream(), b.create_stream()
    xa, xb = cg.zeros(32, "float32", device=a), cg.zeros(32, "float32", device=b)
    a.synchronize()
    b.synchronize()
    with cg.capture(stream=sa) as ga:
        cg.ops.fill(xa, 1.0, stream=sa)
        with cg.capture(stream=sb) as gb:
            cg.ops.fill(xb, 2.0, stream=sb)
        assert gb.state == "captured"  # not instantiated while the thread captures on a
    assert ga.state == "ready"
    ga.replay()
    gb.replay()
    sa.synchronize()
    sb.synchronize()
    assert (xa.get() == 1.0).all()
    assert (xb.get() == 2.0).all()
    assert gb.state == "ready"


@pytest.mark.parametrize(("mode", "refused"), [("thread_local", True), ("relaxed", False)])
def test_a_capture_mode_binds_the_thread_on_every_device(
    devices: list[cg.Device], mode: str, refused: bool
) -> None:
    # the driver itself (no cudagraphs rule in the way): a synchronize of device 1's stream
    # while this thread captures on device 0
    a, b = devices[0], devices[1]
    sa, sb = a.create_stream(), b.create_stream()
    backend = a.backend
    backend.capture_begin(sa._raw, mode)
    try:
        if refused:
            with pytest.raises(cg.CudaError, match="STREAM_CAPTURE_UNSUPPORTED"):
                backend.synchronize(sb._raw)
        else:
            backend.synchronize(sb._raw)
    finally:
        try:
            graph = backend.capture_end(sa._raw)
        except cg.CudaError:
            assert refused  # (the refused call invalidated the capture)
        else:
            backend.destroy(graph)


def test_graph_memory_of_a_joined_device_is_freed_after_its_work(devices: list[cg.Device]) -> None:
    a, b = devices[0], devices[1]
    sa, sb = a.create_stream(), b.create_stream()
    with cg.capture(stream=sa, alloc="graph") as g:
        sb.wait(sa)
        tmp = cg.empty(64, "float32", device=b, stream=sb)
        cg.ops.fill(tmp, 3.0, stream=sb)
        del tmp  # its free node goes on sb, after the fill
        cg.ops.fill(cg.zeros(4, "float32", device=a, stream=sa), 1.0, stream=sa)  # (frees it here)
        sa.wait(sb)
    nodes, edges = a.backend.graph_topology(g._res.graph)
    kinds = [n.type for n in nodes]
    fill = next(i for i, n in enumerate(nodes) if n.type == "kernel")
    free = kinds.index("mem_free")
    assert (fill, free) in edges, (kinds, edges)
    g.close()


def test_new_memory_on_a_device_outside_the_capture_is_a_capture_error(
    devices: list[cg.Device], rng: np.random.Generator
) -> None:
    """Issue 26 item 13: new memory on a device not in the capture is a clear CaptureError.

    It names the line and says to fork the stream into the capture; the capture stays valid.
    It was a raw CudaError (the driver refusing cuMemAllocFromPoolAsync) with no line or hint.
    """
    a, b = devices[0], devices[1]
    data = rng.standard_normal(300).astype(np.float32)
    xb = cg.asarray(data, device=b)
    xa, out = cg.ones(300, "float32", device=a), cg.full(300, np.nan, "float32", device=a)
    b.allocator.empty_cache()  # (no cached block: the allocation needs the driver)
    with cg.capture(device=a) as g:
        cg.ops.scale(2.0, xa, out=out)
        with pytest.raises(
            cg.CaptureError, match=r"test_multidevice_capture.py:\d+ on stream .* fork"
        ) as err:
            cg.ops.scale(2.0, xb)  # a new array on b, on b's stream: not in the capture
        assert "other.wait(captured)" in str(err.value)
        assert cg.capture_status() == "active"  # refused before the driver could invalidate it
    g.replay()
    np.testing.assert_allclose(out.get(), np.full(300, 2.0, np.float32))
    # forked, the same work is recorded (and runs at each replay)
    sb = b.create_stream()
    got = []
    with cg.capture(device=a) as g2:
        sb.wait(a.current_stream())
        got.append(cg.ops.scale(2.0, xb, stream=sb))
        a.current_stream().wait(sb)
    xb.set(data + 1)
    g2.replay()
    np.testing.assert_allclose(got[0].get(), 2 * (data + 1), rtol=1e-6)  # (b's stream: after)
    g.close()
    g2.close()
    sb.close()
