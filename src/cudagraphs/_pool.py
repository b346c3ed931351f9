"""GraphPool: the device memory that captured graphs allocate from.

During a capture, arrays come from the capture's pool, never from the
device's cache, because the graph bakes their addresses in: the memory must
stay reserved for the graph as long as the graph (or an array of the pool)
lives. Blocks freed during a capture are reused by later allocations of the
same pool, which is what makes the pool cheap: only graphs that replay in
the order they were captured may share one (like PyTorch's
``graph_pool_handle``); by default each graph has a private pool.

When no graph and no array uses the pool any more, its memory returns to the
device's cache, after the streams the graphs replayed on are done with it.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ._allocator import round_size
from ._device import Device, current_device

if TYPE_CHECKING:
    from ._device import Stream

__all__ = ["GraphPool"]


class GraphPool:
    """Memory shared by graphs that replay in the order they were captured.

    Parameters
    ----------
    device : Device, optional
        Default: the current device.

    Notes
    -----
    Pass the same pool to several ``cg.capture(pool=...)`` calls to let later
    graphs reuse memory earlier ones freed during their capture. Replaying
    them out of capture order may let one graph overwrite another's
    intermediate results.
    """

    def __init__(self, device: Device | None = None) -> None:
        self.device = device if device is not None else current_device()
        self._lock = threading.Lock()
        self._segments: dict[int, int] = {}  # ptr -> size class
        self._free: dict[int, list[int]] = {}  # size class -> free ptrs
        self._live = 0  # blocks held by arrays
        self._users = 0  # captures in progress and open graphs
        self._streams: list[Stream] = []  # where graphs replayed

    # used by the capture ------------------------------------------------------
    def allocate(self, nbytes: int) -> int:
        """A block of the pool (a fresh segment when none of its size is free)."""
        size = round_size(nbytes)
        with self._lock:
            free = self._free.get(size)
            if free:
                self._live += 1
                return free.pop()
        ptr = self.device.allocator.segment(size)
        with self._lock:
            self._segments[ptr] = size
            self._live += 1
        return ptr

    def release(self, ptr: int, streams: list[Stream] | None) -> None:
        """Take back a block whose last array died (the BlockOwner protocol)."""
        with self._lock:
            self._free.setdefault(self._segments[ptr], []).append(ptr)
            self._live -= 1
            if streams:
                self._streams.extend(streams)
        self._give_back_if_unused()

    def acquire(self) -> None:
        """A capture or a graph starts using the pool."""
        with self._lock:
            self._users += 1

    def drop(self, streams: list[Stream]) -> None:
        """A capture or graph is done; ``streams`` are where its graph replayed."""
        with self._lock:
            self._users -= 1
            self._streams.extend(s for s in streams if s not in self._streams)
        self._give_back_if_unused()

    def _give_back_if_unused(self) -> None:
        with self._lock:
            if self._users or self._live or not self._segments:
                return
            segments, streams = list(self._segments), list(self._streams)
            self._segments.clear()
            self._free.clear()
            self._streams.clear()
        allocator = self.device.allocator
        for ptr in segments:
            allocator.raw_free(ptr, streams)

    # inspection -----------------------------------------------------------------
    @property
    def reserved(self) -> int:
        """Bytes the pool holds (in use by arrays or free for its graphs)."""
        with self._lock:
            return sum(self._segments.values())

    def __repr__(self) -> str:
        return (f"<cudagraphs.GraphPool {self.reserved} B on {self.device}, "
                f"{self._users} users, {self._live} live blocks>")
