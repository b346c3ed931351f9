"""Pinned (page-locked) host buffers, cached for staging copies."""

from __future__ import annotations

import threading

import numpy as np

from .backends.base import Backend

__all__ = ["PinnedBuffer", "PinnedCache"]


class PinnedBuffer:
    """A pinned host buffer: ``array`` is its first ``nbytes`` bytes."""

    __slots__ = ("ptr", "size", "full", "array")

    def __init__(self, ptr: int, size: int, full: np.ndarray, nbytes: int) -> None:
        self.ptr = ptr
        self.size = size
        self.full = full
        self.array = full[:nbytes]


class PinnedCache:
    """Pinned host memory in power-of-two classes, reused between copies.

    ``take`` hands out a buffer; ``give`` returns it once the copy that used
    it has completed (the caller's duty). ``clear`` frees the cached buffers.
    """

    _MIN = 4096

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._lock = threading.Lock()
        self._free: dict[int, list[tuple[int, np.ndarray]]] = {}

    def take(self, nbytes: int) -> PinnedBuffer:
        """A pinned buffer of at least ``nbytes`` bytes."""
        size = max(self._MIN, 1 << max(0, nbytes - 1).bit_length())
        with self._lock:
            cached = self._free.get(size)
            entry = cached.pop() if cached else None
        if entry is None:
            entry = self._backend.host_alloc(size)
        ptr, full = entry
        return PinnedBuffer(ptr, size, full, nbytes)

    def give(self, buf: PinnedBuffer) -> None:
        """Return ``buf`` to the cache (its copies must have completed)."""
        with self._lock:
            self._free.setdefault(buf.size, []).append((buf.ptr, buf.full))

    def clear(self) -> None:
        """Free every cached buffer."""
        with self._lock:
            entries = [e for cached in self._free.values() for e in cached]
            self._free.clear()
        for ptr, _ in entries:
            self._backend.host_free(ptr)
