"""Graph pools and the memory policies of a capture.

During a capture, arrays come from the capture's pool, never from the
device's cache, because the graph bakes their addresses in: the memory must
stay reserved for the graph as long as the graph (or an array of the pool)
lives. Blocks freed during a capture are reused by later allocations of the
same pool (best fit, splitting larger free ranges), which is what makes
the pool cheap: only graphs that replay in the order they were captured, or
whose results are read before another one replays, may share one (like
PyTorch's ``graph_pool_handle``); by default each graph has a private pool.
Other libraries' pools routed into captures (a ``torch.cuda.MemPool``) are
shared the same way (:attr:`GraphPool.foreign`).

When no graph and no array uses the pool any more, its memory goes back to
the driver (after the streams the graphs replayed on are done with it), so
later captures and allocations can use it again.

A capture's memory policy is one of :class:`PoolMemory` (``alloc="pool"``),
:class:`ForbidMemory` (``alloc="forbid"``) and :class:`GraphMemory`
(``alloc="graph"``, driver-managed allocation and free nodes).
"""

from __future__ import annotations

import collections
import threading
import weakref
from typing import TYPE_CHECKING, Any

from . import _recording
from ._allocator import round_size
from ._device import Device, Stream, as_device

if TYPE_CHECKING:
    from ._recording import Recording

__all__ = ["ForbidMemory", "GraphMemory", "GraphPool", "PoolMemory"]

_ALIGN = 512  # pool blocks start on 512-byte boundaries, as the allocator's do


class GraphPool:
    """Memory shared by graphs that replay in the order they were captured.

    Parameters
    ----------
    device : Device or int, optional
        Default: the current device.

    Notes
    -----
    Pass the same pool to several ``cg.capture(pool=...)`` calls to let later
    graphs reuse memory earlier ones freed during their capture. Replaying
    them out of capture order may let one graph overwrite another's
    intermediate results.
    """

    def __init__(self, device: Device | int | None = None) -> None:
        self.device = as_device(device)
        self._lock = threading.Lock()
        self._segments: dict[int, int] = {}  # segment ptr -> bytes
        self._blocks: dict[int, tuple[int, int]] = {}  # live block ptr -> (bytes, segment)
        self._free: dict[int, tuple[int, int]] = {}  # free range start -> (bytes, segment)
        self._free_ends: dict[int, int] = {}  # free range end -> start
        self._live = 0  # blocks held by arrays
        self._users = 0  # captures in progress and open graphs
        self._streams: list[Stream] = []  # where graphs replayed
        # other libraries' pools shared by the captures into this one (interop.route)
        self.foreign: dict[str, Any] = {}
        # they must never die inside a capture: PyTorch aborts the process when a MemPool
        # is destroyed while a capture is underway (seen on a GPU, with `with cg.capture()
        # as g:` in a loop: the previous graph, and its pool, died as the new capture began)
        weakref.finalize(self, _recording.release, self.device, dict.clear, self.foreign).atexit = False

    # used by captures -----------------------------------------------------------
    def allocate(self, nbytes: int) -> int:
        """A block of the pool: the best-fitting free range, split, or a fresh segment.

        Free ranges of one segment merge when their neighbours are freed, so
        a smaller graph captured after a larger one into the same pool reuses
        the larger one's temporaries (what makes shape buckets cheap).
        """
        size = -(-max(nbytes, 1) // _ALIGN) * _ALIGN
        with self._lock:
            fits = [(n, start) for start, (n, _) in self._free.items() if n >= size]
            if fits:
                avail, start = min(fits)
                segment = self._take_free(start)[1]
                self._carve(start, size, avail, segment)
                return start
        segment_size = round_size(size)
        ptr = self.device.allocator.segment(segment_size)
        with self._lock:
            self._segments[ptr] = segment_size
            self._carve(ptr, size, segment_size, ptr)
        return ptr

    def _carve(self, start: int, size: int, avail: int, segment: int) -> None:
        """Make [start, start+size) a live block; what is left of ``avail`` stays free."""
        self._blocks[start] = (size, segment)
        self._live += 1
        if avail > size:
            self._put_free(start + size, avail - size, segment)

    def _take_free(self, start: int) -> tuple[int, int]:
        n, segment = self._free.pop(start)
        del self._free_ends[start + n]
        return n, segment

    def _put_free(self, start: int, n: int, segment: int) -> None:
        after = self._free.get(start + n)
        if after is not None and after[1] == segment:  # merge with the range after
            n += self._take_free(start + n)[0]
        before = self._free_ends.get(start)
        if before is not None and self._free[before][1] == segment:  # and the one before
            n += self._take_free(before)[0]
            start = before
        self._free[start] = (n, segment)
        self._free_ends[start + n] = start

    def release(self, ptr: int, streams: list[Stream] | None) -> None:
        """Take back a block whose last array died (the BlockOwner protocol)."""
        with self._lock:
            size, segment = self._blocks.pop(ptr)
            self._put_free(ptr, size, segment)
            self._live -= 1
            if streams:
                self._streams.extend(s for s in streams if s not in self._streams)
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
            self._free_ends.clear()
            self._streams.clear()
        _recording.release(self.device, _give_back, self.device.allocator, segments, streams)

    # inspection ---------------------------------------------------------------
    def ranges(self) -> list[tuple[int, int]]:
        """``(start, end)`` of each segment the pool holds now."""
        with self._lock:
            return [(ptr, ptr + n) for ptr, n in self._segments.items()]

    @property
    def reserved(self) -> int:
        """Bytes the pool holds (in use by arrays or free for its graphs)."""
        self.device.allocator.stats()  # a safe point: blocks that died come back first
        with self._lock:
            return sum(self._segments.values())

    def __repr__(self) -> str:
        return (
            f"<cudagraphs.GraphPool {self.reserved} B on {self.device}, "
            f"{self._users} users, {self._live} live blocks>"
        )


def _give_back(allocator: Any, segments: list[int], streams: list[Stream]) -> None:
    for ptr in segments:
        allocator.free_segment(ptr, streams)


class PoolMemory:
    """``alloc="pool"``: allocations come from a :class:`GraphPool`."""

    def __init__(self, pool: GraphPool) -> None:
        self.pool = pool
        # a capture that other devices' streams joined allocates on each device from a
        # pool of that device (made on first use, held by the graph like the first)
        self.pools: dict[Any, GraphPool] = {pool.device: pool}
        self.owners: tuple[Any, ...] = (pool,)  # block owners whose memory the capture owns

    def pool_for(self, device: Any) -> GraphPool:
        """The capture's pool on ``device``."""
        pool = self.pools.get(device)
        if pool is None:
            pool = self.pools[device] = GraphPool(device)
            pool.acquire()
            self.owners = (*self.owners, pool)
        return pool

    def allocate(self, rec: Recording, nbytes: int, stream: Stream) -> tuple[int, Any]:
        pool = self.pool_for(stream.device)
        return pool.allocate(nbytes), pool

    def freed(self, ptr: int) -> None:  # pool blocks are reused, never freed in the graph
        return None


class ForbidMemory(PoolMemory):
    """``alloc="forbid"``: any allocation during the capture is a CaptureError."""

    def allocate(self, rec: Recording, nbytes: int, stream: Stream) -> tuple[int, Any]:
        rec.fail(
            f"allocation of {nbytes} B during a capture with alloc='forbid'; "
            "allocate before capturing, or use alloc='pool'"
        )
        raise AssertionError("unreachable")


class GraphMemory(PoolMemory):
    """``alloc="graph"``: driver-managed graph memory, an allocation node per block.

    A block that dies during the capture records a free node (in the
    capturing thread, at the next piece of work or at the end). A block still
    alive when the capture ends would point at memory the driver frees at
    the next launch, so the capture refuses to end that way.
    """

    def __init__(self, pool: GraphPool, rec: Recording | None = None) -> None:
        super().__init__(pool)
        self.owners = (pool, self)
        self.rec = rec
        self.live: set[int] = set()
        self.pending: collections.deque[int] = collections.deque()
        self._streams: dict[int, Stream] = {}  # live block -> the stream that allocated it

    def allocate(self, rec: Recording, nbytes: int, stream: Stream) -> tuple[int, Any]:
        self.rec = rec
        on = rec.streams[-1] if stream.device is rec.device else stream  # (bodies: the innermost)
        ptr = on.device.backend.mem_alloc(on.device.index, nbytes, on._raw)
        self.live.add(ptr)
        self._streams[ptr] = on
        return ptr, self

    def release(self, ptr: int, streams: object) -> None:
        """A graph-memory block died (the BlockOwner protocol)."""
        rec = self.rec
        if rec is not None and rec.active and ptr in self.live:
            rec.free_later(ptr)

    def freed(self, ptr: int) -> None:
        self.live.discard(ptr)
        self._streams.pop(ptr, None)

    def stream_of(self, ptr: int) -> Stream | None:
        """The stream that allocated the live block at ``ptr`` (its free node goes there)."""
        return self._streams.get(ptr)
