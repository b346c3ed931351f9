"""Devices, streams and events."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import cudagraphs as cg


def test_device_is_canonical_across_threads(backend: str) -> None:
    seen: list[cg.Device] = []

    def get() -> None:
        with cg.override(backend=backend):
            seen.append(cg.Device(0))

    threads = [threading.Thread(target=get) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 8
    assert all(d is cg.Device(0) for d in seen)
    assert cg.current_device() is cg.Device(0)


def test_a_thread_that_first_used_the_device_and_ended_leaves_it_usable(backend: str) -> None:
    """The first use of a device, from a worker thread that then ends: the device still works.

    A fresh process, so that the worker's use is the first. The context's
    retain used to be cached by cuda.core per thread and released as that
    thread ended, which destroyed the primary context for every thread
    (CUDA_ERROR_CONTEXT_IS_DESTROYED on the next call).
    """
    code = textwrap.dedent(
        """
        import gc, threading
        import numpy as np
        import cudagraphs as cg

        def first():
            x = cg.asarray(np.arange(4, dtype=np.float32))
            assert cg.ops.scale(3.0, x).get().tolist() == [0, 3, 6, 9]

        t = threading.Thread(target=first)
        t.start()
        t.join()
        del t
        gc.collect()
        x = cg.asarray(np.arange(4, dtype=np.float32))
        with cg.capture() as g:
            cg.ops.scale(2.0, x, out=x)
        g.replay()
        print(x.get().tolist())
        """
    )
    env = {**os.environ, "CUDAGRAPHS_BACKEND": backend}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[0.0, 2.0, 4.0, 6.0]"


def test_device_properties(device: cg.Device) -> None:
    assert device.backend_name == device.backend.name
    assert device.total_memory > 0
    assert len(device.compute_capability) == 2
    free, total = device.mem_info()
    assert 0 <= free <= total
    assert device.stream is not device.copy_stream
    assert "Device 0" in repr(device)


@pytest.mark.parametrize(
    ("bad", "error"), [(-1, ValueError), (1.5, TypeError), ("0", TypeError), (True, TypeError)]
)
def test_bad_device_index(backend: str, bad: object, error: type) -> None:
    with pytest.raises(error, match=r"non-negative int|a device index is an int"):
        cg.Device(bad)  # type: ignore[arg-type]


def test_missing_device_is_a_clear_error(device: cg.Device) -> None:
    # (an index no Device was made for: a test run before this one in the process may have
    # made more sim devices, under a larger CUDAGRAPHS_SIM_DEVICES, and Device(i) is made once)
    made = [i + 1 for (name, i) in cg.Device._instances if name == device.backend.name]
    n = max([device.backend.device_count(), *made])
    with pytest.raises(cg.BackendUnavailableError, match=f"device {n} does not exist"):
        cg.Device(n)


def test_stream_protocol_and_close(device: cg.Device) -> None:
    s = device.create_stream()
    assert s.__cuda_stream__() == (0, s.handle)
    s.synchronize()
    assert s.query() is True
    s.close()
    s.close()  # idempotent
    assert s.closed
    with pytest.raises(ValueError, match="stream was closed"):
        s.synchronize()
    device.stream.close()  # built-in streams ignore close
    assert not device.stream.closed


def test_events_order_streams_and_time(device: cg.Device, rng: np.random.Generator) -> None:
    s = device.create_stream()
    data = rng.standard_normal(4096).astype(np.float32)
    x = cg.asarray(data)
    y = cg.empty_like(x)
    start, end = cg.Event(device, timing=True), cg.Event(device, timing=True)
    start.record()
    cg.ops.scale(2.0, x, out=y)
    end.record()
    s.wait(end)  # work on s now runs after the scale
    z = cg.empty_like(
        x,
    )
    cg.ops.copy(z, y, stream=s)
    y.record_stream(s)
    s.synchronize()
    assert end.query()
    assert start.elapsed_ms(end) >= 0.0
    np.testing.assert_array_equal(z.get(stream=s), data * 2)
    with pytest.raises(ValueError, match="timing=True"):
        cg.Event(device).elapsed_ms(end)
    s.wait(device.stream)  # waiting on a stream records an event on it
    with pytest.raises(TypeError, match="Event or a stream"):
        s.wait(3)  # type: ignore[arg-type]
    s.close()


def test_elapsed_ms_before_the_events_complete_is_not_ready(device: cg.Device) -> None:
    """The driver answers CUDA_ERROR_NOT_READY for recorded events whose work has not run."""
    gate = threading.Event()
    b = cg.GraphBuilder(device=device)
    b.host(gate.wait, 60)  # holds the stream (a GPU's) until the gate opens
    blocker = b.instantiate()
    s = device.create_stream()
    start, end = cg.Event(device, timing=True), cg.Event(device, timing=True)
    never = cg.Event(device, timing=True)
    try:
        start.record(s)
        blocker.replay(stream=s)
        end.record(s)
        with pytest.raises(cg.CudaError, match="synchronize the end event") as info:
            start.elapsed_ms(end)
        assert info.value.name == "CUDA_ERROR_NOT_READY"
    finally:
        gate.set()
    end.synchronize()
    assert start.elapsed_ms(end) >= 0.0
    with pytest.raises(cg.CudaError, match="created with timing=True and recorded") as info:
        start.elapsed_ms(never)  # never recorded
    assert info.value.name == "CUDA_ERROR_INVALID_HANDLE"
    blocker.close()
    s.close()


def test_a_handle_once_wrapped_as_external_can_be_owned_by_a_new_stream(device: cg.Device) -> None:
    """Another library's stream, wrapped, then destroyed by it: the driver may give its handle again.

    (Found on an H100: the bad-input sweep wrapped a stream as external, the
    stream was destroyed, and the next ``create_stream()`` got its handle and
    was refused as "a built-in or external stream".)
    """
    backend = device.backend
    raw = backend.stream_create(device.index)  # the other library's stream
    wrapped = device.external_stream(int(raw))
    assert int(wrapped._raw) == int(raw)
    owned = cg.Stream(device, raw, owned=True)  # as create_stream() would, given the same handle
    x = cg.asarray(np.arange(8, dtype=np.float32), stream=owned)
    np.testing.assert_array_equal(cg.ops.scale(2.0, x, stream=owned).get(stream=owned), 2 * np.arange(8))
    owned.close()
    assert owned.closed
