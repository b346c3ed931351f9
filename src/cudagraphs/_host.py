"""Pinned (page-locked) host memory whose lifetime follows its numpy views.

:func:`pinned_array` returns a numpy ``uint8`` array over a pinned
allocation. The allocation is freed when the last array viewing it is gone
(the ctypes buffer at the bottom of every view's ``base`` chain carries the
finalizer), and the free is deferred while a capture is active on the
device. So a view handed to a user (``HostSlot.array``), a buffer staged into
a graph, or a buffer a pending copy writes into can never outlive its memory.
An eager copy from or into it keeps it until the copy completes
(:func:`hold`): the free waits for the copy, as eager work keeps alive what
it touches.
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from typing import Any

import numpy as np

from . import _recording

__all__ = ["PinnedCache", "hold", "pinned_array", "stage"]


def pinned_array(device: Any, nbytes: int) -> np.ndarray:
    """``nbytes`` of pinned host memory of ``device``'s backend, as a uint8 array.

    Safe during a capture: the allocation is made with the thread's capture
    mode exchanged to relaxed (pinning memory may synchronize).
    """
    backend = device.backend
    old = backend.capture_exchange_mode("relaxed")
    try:
        ptr = backend.host_alloc(nbytes)
    finally:
        backend.capture_exchange_mode(old)
    buffer = (ctypes.c_uint8 * max(nbytes, 1)).from_address(ptr)
    copies: dict[int, Any] = {}  # stream handle -> an event after the last eager copy there
    buffer._copies = copies  # type: ignore[attr-defined]  # (see hold)
    weakref.finalize(buffer, _recording.later, device, _free, backend, ptr, copies)
    array: np.ndarray = np.frombuffer(buffer, dtype=np.uint8)[:nbytes]  # type: ignore[call-overload]
    return array


def _free(backend: Any, ptr: int, copies: dict[int, Any]) -> None:
    for event in copies.values():  # the eager copies that use the memory come first
        backend.synchronize(event._raw)
    backend.host_free(ptr)


def hold(host: np.ndarray, stream: Any) -> None:
    """Keep ``host``'s pinned memory until the work queued on ``stream`` so far completes.

    For an eager copy from or into memory of :func:`pinned_array` (other
    memory: nothing to do, the driver staged pageable memory): dropping
    every view of it then frees it only after the copy. A graph's copies
    keep it alive through the graph instead.
    """
    root: Any = host
    while isinstance(root, np.ndarray):
        root = root.base
    copies = getattr(root, "_copies", None)
    if copies is not None:
        try:
            copies[stream.handle] = stream.record(copies.get(stream.handle))
        except BaseException:  # no event for the free to wait on: the copy completes now
            stream.synchronize()
            raise


def stage(device: Any, host: np.ndarray) -> np.ndarray:
    """A pinned copy of ``host``'s bytes: a snapshot a graph can re-read on every replay."""
    buf = pinned_array(device, host.nbytes)
    buf[...] = np.ascontiguousarray(host).reshape(-1).view(np.uint8)
    return buf


class PinnedCache:
    """Pinned host buffers in power-of-two classes, reused between staging copies.

    ``take`` hands out a buffer; ``give`` returns it once the copy that used
    it has completed (the caller's duty). ``clear`` drops the cached buffers
    (their memory is freed when no view of it is left).
    """

    _MIN = 4096

    def __init__(self, device: Any) -> None:
        self._device = device
        self._lock = threading.Lock()
        self._free: dict[int, list[np.ndarray]] = {}

    def take(self, nbytes: int) -> np.ndarray:
        """A pinned uint8 buffer of at least ``nbytes`` bytes (its ``size`` is its class)."""
        size = max(self._MIN, 1 << max(0, nbytes - 1).bit_length())
        with self._lock:
            cached = self._free.get(size)
            buf = cached.pop() if cached else None
        return buf if buf is not None else pinned_array(self._device, size)

    def give(self, buf: np.ndarray) -> None:
        """Return ``buf`` from :meth:`take` (its copies must have completed)."""
        with self._lock:
            self._free.setdefault(buf.size, []).append(buf)

    def clear(self) -> None:
        """Drop every cached buffer."""
        with self._lock:
            self._free.clear()
