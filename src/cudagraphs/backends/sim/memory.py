"""The memory of the simulated devices: numpy byte buffers at fake device addresses.

Addresses are aligned and global to the process, as the driver's virtual
addresses are; a freed range goes to the next allocation that fits, lowest
first (unless reuse is off); fresh memory holds a poison byte; graph memory
keeps its address while its graph lives. An address is resolved when work
runs, so touching freed memory fails then, with CUDA_ERROR_ILLEGAL_ADDRESS.
"""

from __future__ import annotations

import bisect
import ctypes
import threading

import numpy as np

from ..base import CUDA_ERROR_ILLEGAL_ADDRESS, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY
from .rules import error

__all__ = ["ALIGN", "BASE_ADDRESS", "POISON", "DeviceMemory", "host_bytes"]

POISON = 0xCD
"""The byte fresh device memory holds (real device memory holds whatever was there)."""
ALIGN = 512
BASE_ADDRESS = 0x7F00_0000_0000


class DeviceMemory:
    """All simulated device allocations of the process (addresses are global)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.starts: list[int] = []
        self.buffers: dict[int, np.ndarray] = {}
        self.owner: dict[int, tuple[int, int]] = {}  # start -> (device ordinal, bytes)
        self.used: dict[int, int] = {}  # ordinal -> bytes
        self.plain: set[int] = set()  # starts of memory outside the stream-ordered pool
        self.next = BASE_ADDRESS  # above every address handed out
        self.spans: dict[int, int] = {}  # start -> the aligned bytes it occupies
        # freed ranges (start, aligned bytes) by address: the driver hands a freed address to
        # the next allocation that fits at once (ranges are not merged: a block freed is taken
        # again by the next one of its size, whatever was freed around it)
        self.holes: list[tuple[int, int]] = []
        self.reuse = True  # False: every allocation gets a new address (SimBackend.reuse_addresses)
        # starts of graph memory (mem_alloc nodes): the graph keeps its addresses while it lives,
        # freed or not, as the driver reserves them (see release_graph)
        self.graph: set[int] = set()

    def kind(self, ptr: int) -> str | None:
        """``"plain"`` or ``"pool"`` for the allocation holding ``ptr`` (None: no live one)."""
        with self.lock:
            i = bisect.bisect_right(self.starts, ptr) - 1
            if i < 0 or ptr - self.starts[i] >= max(self.buffers[self.starts[i]].nbytes, 1):
                return None
            return "plain" if self.starts[i] in self.plain else "pool"

    def alloc(self, ordinal: int, nbytes: int, limit: int) -> int:
        """``nbytes`` of poisoned memory of device ``ordinal`` (``limit``: its size); the address."""
        with self.lock:
            used = self.used.get(ordinal, 0)
            if used + nbytes > limit:
                raise error(
                    CUDA_ERROR_OUT_OF_MEMORY,
                    "cuMemAllocFromPoolAsync",
                    f"{nbytes} B requested, {limit - used} B free on sim device {ordinal}",
                )
            span = max(ALIGN, -(-nbytes // ALIGN) * ALIGN)
            start = self._take(span)
            buf = np.empty(max(nbytes, 1), dtype=np.uint8)
            buf.fill(POISON)
            bisect.insort(self.starts, start)
            self.buffers[start] = buf
            self.owner[start] = (ordinal, nbytes)
            self.spans[start] = span
            self.used[ordinal] = used + nbytes
            return start

    def _take(self, span: int) -> int:
        """The lowest freed address with ``span`` bytes free, else a new one (holding the lock)."""
        if self.reuse:
            for i, (start, size) in enumerate(self.holes):
                if size >= span:
                    if size == span:
                        del self.holes[i]
                    else:
                        self.holes[i] = (start + span, size - span)
                    return start
        start = self.next
        self.next += span
        return start

    def _give(self, start: int, span: int) -> None:
        """Return ``[start, start + span)`` to the free ranges (holding the lock)."""
        if self.reuse and start + span == self.next:  # the top of the used addresses: they end lower
            self.next = start
        else:
            bisect.insort(self.holes, (start, span))

    def free(self, ptr: int) -> None:
        """Free the allocation starting at ``ptr`` (its address is kept while a graph owns it)."""
        with self.lock:
            if self.buffers.pop(ptr, None) is None:
                raise error(
                    CUDA_ERROR_INVALID_VALUE,
                    "cuMemFreeAsync",
                    f"0x{ptr:x} is not the start of a live allocation",
                )
            self.starts.pop(bisect.bisect_left(self.starts, ptr))
            self.plain.discard(ptr)
            ordinal, nbytes = self.owner.pop(ptr)
            self.used[ordinal] -= nbytes
            if ptr not in self.graph:
                self._give(ptr, self.spans.pop(ptr))

    def release_graph(self, ptr: int) -> None:
        """A graph that allocated ``ptr`` is destroyed: its memory and address go back."""
        with self.lock:
            self.graph.discard(ptr)
            live = ptr in self.buffers
            if not live:  # freed while the graph lived: only its address was kept
                self._give(ptr, self.spans.pop(ptr))
        if live:
            self.free(ptr)

    def range_of(self, ptr: int) -> tuple[int, int] | None:
        """``(start, end)`` of the live allocation holding ``ptr`` (None: none does)."""
        with self.lock:
            i = bisect.bisect_right(self.starts, ptr) - 1
            if i >= 0:
                start = self.starts[i]
                end = start + max(self.buffers[start].nbytes, 1)
                if ptr < end:
                    return start, end
            return None

    def owner_of(self, ptr: int) -> int | None:
        """The device whose live allocation holds ``ptr`` (None: none does)."""
        i = bisect.bisect_right(self.starts, ptr) - 1
        if i >= 0:
            start = self.starts[i]
            if ptr < start + self.buffers[start].nbytes:
                return self.owner[start][0]
        return None

    def resolve(self, ptr: int, nbytes: int, call: str) -> tuple[np.ndarray, int]:
        """Return (buffer, offset) holding ``[ptr, ptr + nbytes)``."""
        i = bisect.bisect_right(self.starts, ptr) - 1
        if i >= 0:
            start = self.starts[i]
            buf = self.buffers[start]
            off = ptr - start
            if off + nbytes <= buf.nbytes:
                return buf, off
        raise error(
            CUDA_ERROR_ILLEGAL_ADDRESS,
            call,
            f"[0x{ptr:x}, +{nbytes}) is not inside a live sim allocation "
            "(freed memory or an out-of-bounds pointer)",
        )


def host_bytes(address: int, nbytes: int) -> np.ndarray:
    """Host memory at ``address`` as a uint8 array (the caller keeps it alive)."""
    if not nbytes:
        return np.empty(0, np.uint8)
    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address))
