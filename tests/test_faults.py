"""Fault injection: every driver call of every path fails once, and nothing breaks.

The simulated driver fails the N-th call of a kind (``SimBackend.inject``)
with the code the driver would return. For each path (eager ops, capture,
replay, update, rebind, builder, host copies) and each kind, N runs from 1
until the path makes fewer calls than N. After every injected failure: the
error is a documented one (a ``CudaError`` with the driver's code, or what
the library turns it into), nothing leaks (allocator and pinned memory back to
their baseline), no capture is left, the stream works and the next capture
succeeds.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator

import numpy as np
import pytest

import cudagraphs as cg
from cudagraphs._errors import CudaError, CudaGraphsError
from cudagraphs.backends.sim import FAULTS

COUNTS: dict[str, int] = {}  # path -> faults injected (printed by the last test)


@pytest.fixture
def sim(device: cg.Device) -> Iterator[cg.Device]:
    if device.backend.name != "sim":
        pytest.skip("fault injection is a feature of the simulator")
    cg.ops.preload(["float32"], device)
    yield device
    device.backend.clear_faults()


def _eager(dev: cg.Device) -> None:
    x = cg.asarray(np.arange(64, dtype=np.float32))
    y = cg.ops.add(x, x)
    cg.ops.axpy(2.0, x, y)
    assert np.array_equal(y.get(), 4 * np.arange(64))


def _capture_replay(dev: cg.Device) -> None:
    x = cg.asarray(np.arange(64, dtype=np.float32))
    with cg.capture() as g:
        y = cg.ops.add(x, x)  # allocates from the graph's pool
        cg.ops.scale(3.0, y, out=y)
    g.upload()
    g.replay()
    assert np.array_equal(y.get(), 6 * np.arange(64))
    g.close()


def _update_rebind(dev: cg.Device) -> None:
    x1, x2 = cg.full(64, 1.0, "float32"), cg.full(64, 2.0, "float32")
    y = cg.zeros(64, "float32")
    g = cg.capture(lambda: cg.ops.axpy(1.0, x1, y))
    source = cg.capture(lambda: cg.ops.axpy(1.0, x2, y), instantiate=False)
    g.update(source)
    g.rebind(x2, x1)
    g.replay()
    assert np.array_equal(y.get(), np.ones(64))
    g.close()


def _builder(dev: cg.Device) -> None:
    a = cg.asarray(np.arange(64, dtype=np.float32))
    x, out = cg.zeros(64, "float32"), cg.zeros(64, "float32")
    seen: list[int] = []
    b = cg.GraphBuilder()
    n1 = b.memcpy(x, a)
    n2 = b.launch(cg.ops.elementwise_kernel("cg_add", np.dtype("float32")), 1, 64, out, x, x, 64, after=[n1])
    b.host(seen.append, 1, after=[n2])
    g = b.instantiate()
    g.replay()
    assert np.array_equal(out.get(), 2 * np.arange(64))
    assert seen == [1]
    g.close()


def _host_copies(dev: cg.Device) -> None:
    x = cg.asarray(np.arange(64, dtype=np.float32))
    pending = x.get_async()
    slot = cg.HostSlot(64, "float32")
    slot.copy_from(x)
    dev.synchronize()
    assert np.array_equal(pending.result(), np.arange(64))
    assert np.array_equal(slot.array, np.arange(64))
    slot.close()


def _graphed(dev: cg.Device) -> None:
    def fn(x: cg.DeviceArray) -> cg.DeviceArray:
        return cg.ops.scale(2.0, cg.ops.add(x, x))  # a temporary of the shared pool

    f = cg.graphed(fn, buckets=[2, 4])
    for n in (3, 2, 3):
        out = f(cg.asarray(np.arange(n * 4, dtype=np.float32).reshape(n, 4)))
        assert np.array_equal(out.get(), 4 * np.arange(n * 4).reshape(n, 4))
    m = cg.GraphModule(lambda x, *, w: cg.ops.add(x, w), params={"w": cg.ones(4, "float32")})
    m(cg.zeros(4, "float32"))
    assert m.params is not None
    m.params["w"] = cg.full(4, 2.0, "float32")
    m.refresh()
    assert np.array_equal(m(cg.zeros(4, "float32")).get(), np.full(4, 2.0))
    f.close()
    m.graphed.close()


PATHS: dict[str, Callable[[cg.Device], None]] = {
    "eager ops": _eager,
    "capture and replay": _capture_replay,
    "update and rebind": _update_rebind,
    "builder": _builder,
    "host copies": _host_copies,
    "graphed callables": _graphed,
}


def _pinned(dev: cg.Device) -> int:
    """Live pinned host allocations, once the cache gave its buffers back."""
    gc.collect()
    dev.synchronize()
    dev.pinned.clear()
    gc.collect()
    cg.Device(dev.index).allocator.stats()  # a safe point: deferred releases run
    return len(dev.backend._host)


def _handles(dev: cg.Device) -> dict[str, int]:
    gc.collect()
    dev.allocator.stats()  # a safe point: deferred releases run
    return dev.backend.live_handles()  # type: ignore[no-any-return]


def _clean(
    dev: cg.Device, before: cg.AllocatorStats, pinned_before: int, handles_before: dict[str, int]
) -> None:
    gc.collect()
    dev.synchronize()
    assert cg.capture_status(dev.stream) == "none"
    assert dev.allocator.stats().in_use == before.in_use, "device memory leaked"
    assert _pinned(dev) <= pinned_before, "pinned memory leaked"
    handles = _handles(dev)
    assert all(n <= handles_before.get(k, 0) for k, n in handles.items()), (
        f"driver handles leaked: {handles} after, {handles_before} before"
    )
    _capture_replay(dev)  # the stream works and the next capture succeeds


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kind", FAULTS)
def test_every_call_of_the_path_fails_once_and_nothing_breaks(sim: cg.Device, path: str, kind: str) -> None:
    run, backend = PATHS[path], sim.backend
    run(sim)  # warm: compiled kernels, cached blocks
    gc.collect()
    sim.synchronize()
    pinned_before = _pinned(sim)
    before, handles_before = sim.allocator.stats(), _handles(sim)
    for nth in range(1, 200):
        sim.allocator.empty_cache()  # so that the path allocates from the driver too
        backend.inject(kind, nth)
        try:
            run(sim)
        except (CudaGraphsError, MemoryError) as exc:  # a fault may or may not end the path
            assert backend.injected(kind), f"{path}: failed without the fault: {exc!r}"  # noqa: PT017
            cause: BaseException | None = exc
            while cause is not None and not isinstance(cause, CudaError):
                cause = cause.__cause__ or cause.__context__
            code = FAULTS[kind][1]
            assert cause is not None, f"{path}, {kind} #{nth}: {exc!r} is not a driver error"  # noqa: PT017
            assert cause.code == code, f"{path}, {kind} #{nth}: {exc!r}"  # noqa: PT017
            del cause  # its traceback holds the path's frames and their arrays
        fired = backend.injected(kind)
        backend.clear_faults()
        if not fired:  # the path makes fewer calls of this kind than nth
            break
        COUNTS[path] = COUNTS.get(path, 0) + 1
        _clean(sim, before, pinned_before, handles_before)


def test_the_sweep_injected_faults(sim: cg.Device) -> None:
    total = sum(COUNTS.values())
    print(f"\nfault sweep: {total} injected faults: {COUNTS}")
    assert total >= 40  # (47 when written: a path that stops calling the driver shows here)
