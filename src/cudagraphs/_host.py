"""Pinned (page-locked) host memory whose lifetime follows its numpy views.

:func:`pinned_array` returns a numpy ``uint8`` array over a pinned
allocation. The allocation is freed when the last array viewing it is gone
(the ctypes buffer at the bottom of every view's ``base`` chain carries the
finalizer), and the free is deferred while a capture is active on the
device. So a view handed to a user (``HostSlot.array``), a buffer staged into
a graph, or a buffer a pending copy writes into can never outlive its memory.
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from typing import Any

import numpy as np

from . import _recording

__all__ = ["PinnedCache", "pinned_array", "stage"]


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
    weakref.finalize(buffer, _recording.later, device, backend.host_free, ptr)
    array: np.ndarray = np.frombuffer(buffer, dtype=np.uint8)[:nbytes]  # type: ignore[call-overload]
    return array


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
