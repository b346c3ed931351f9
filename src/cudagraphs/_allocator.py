"""The per-device caching allocator.

Device memory comes from the device's stream-ordered memory pool
(``cuMemAllocFromPoolAsync``); this layer caches freed blocks in size classes
so a hot allocation is a dictionary lookup and costs no driver call.

Rules (the same on every backend):

* a block is tagged with the stream it was allocated on and, when freed,
  returns to that stream's free list, where the next allocation on the same
  stream may reuse it at once (stream order makes that safe);
* a block is reused on *another* stream only after that stream waits on an
  event recorded on the owner stream; a block used on other streams
  (:meth:`Block.use_on`) is reused only after the next user waits on events
  recorded on each of them when it was freed;
* when the driver reports out of memory, the cache is emptied, the pool
  trimmed and the allocation retried once; then :class:`OutOfMemoryError`;
* when the driver fails to create, record or wait on one of those events,
  nothing is lost: an allocation that needed it raises the driver's error and
  leaves the block in the cache; a release (a block, a graph pool's segment)
  raises nothing and sets the memory aside, reserved and cached, until
  :meth:`CachingAllocator.empty_cache` frees it after its device synchronize
  (the one point where no queued work can still use it);
* the driver pool keeps up to ``CUDAGRAPHS_POOL_RELEASE_THRESHOLD_MB`` (512)
  across synchronizations, so blocks the cache returns are cheap to get back.

Notes
-----
A :class:`Block` owns its memory: the block returns to its owner when the
last array referencing it is garbage collected, in its finalizer (compiled,
the ``tp_finalize`` of its extension type). That release may run in the
middle of any allocation, even one holding this allocator's lock: it puts
the block back on its free list only if the lock is free right now, and
otherwise queues it; the queue is emptied at the start of the next
allocator call (a garbage collection never deadlocks the allocator). A
cycle through a block and its owner (a graph pool holding its own arrays) is
collected: the collector runs every finalizer of the cycle before it clears
any object, so the blocks give their memory back to an intact pool.

This module is compiled by Cython from this source where the package is
built (``_allocator.pxd`` declares ``Block`` and ``CachingAllocator`` as
extension types: docs/architecture.md, "The compiled part"), and runs as
plain Python where not.

While a stream is being captured, allocations on it go to the capture's
memory policy (``stream._recording.memory``: the graph's pool, driver graph
memory, or a refusal); this module knows captures only through
:mod:`cudagraphs._recording`, below it.
"""

from __future__ import annotations

import collections
import dataclasses
import operator
import sys
import threading
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

try:
    import cython
except ImportError:  # (run as Python where Cython is not installed: nothing is compiled)
    from types import SimpleNamespace

    cython = SimpleNamespace(compiled=False)

from . import _recording
from ._config import compiled_part
from ._errors import CaptureError, CudaError, OutOfMemoryError
from ._fields import StreamFields
from .backends.base import CUDA_ERROR_OUT_OF_MEMORY, Backend

_QUEUE = _recording._QUEUE  # (the deferred releases a safe point runs: the same deque, read here often)


class Stream(Protocol):
    """What this layer reads of a stream (``_device.Stream``, a layer above)."""

    @property
    def handle(self) -> int: ...
    @property
    def device(self) -> Any: ...
    @property
    def closed(self) -> bool: ...
    @property
    def _raw(self) -> Any: ...
    @property
    def _recording(self) -> Any: ...


class Device(Protocol):
    """What this layer reads of a device (``_device.Device``, a layer above)."""

    @property
    def index(self) -> int: ...
    @property
    def backend(self) -> Any: ...
    @property
    def stream(self) -> Any: ...
    @property
    def copy_stream(self) -> Any: ...
    @property
    def total_memory(self) -> int: ...
    @property
    def allocator(self) -> Any: ...


# the optional C part: a Block's release in its deallocator, cudagraphs.empty's repeat path
_fastcall = compiled_part()

__all__ = [
    "AllocatorStats",
    "Block",
    "BlockOwner",
    "CachingAllocator",
    "device_rule",
    "new_block",
    "release_dead_blocks",
    "round_size",
    "safe_point",
]

_SMALL = 1 << 20  # blocks up to 1 MiB are rounded to 512 B
_SMALL_STEP = 512
_LARGE_STEP = 2 << 20  # larger blocks are rounded to 2 MiB


# the rule of every device= argument, _device.as_device (a layer above: it names it on import),
# so that CachingAllocator(0) means CachingAllocator(Device(0)), as device=0 does everywhere
_AS_DEVICE: list[Callable[..., Device]] = []


def device_rule(as_device: Callable[..., Device]) -> None:
    """Name the function that turns a ``device=`` argument into a Device (``_device.as_device``)."""
    _AS_DEVICE[:] = [as_device]


def round_size(nbytes: int) -> int:
    """The size class of a request of ``nbytes`` bytes."""
    if nbytes <= _SMALL:
        return max(_SMALL_STEP, -(-nbytes // _SMALL_STEP) * _SMALL_STEP)
    return -(-nbytes // _LARGE_STEP) * _LARGE_STEP


@dataclasses.dataclass(frozen=True)
class AllocatorStats:
    """A snapshot of one device's allocator.

    Attributes
    ----------
    in_use : int
        Bytes in blocks held by live arrays (size classes, not requests).
    reserved : int
        Bytes the allocator holds from the driver: in use plus cached.
    cached : int
        Bytes in freed blocks kept for reuse.
    peak : int
        The most bytes in use at once since creation or :meth:`reset_peak`.
    hits, misses : int
        Allocations served from the cache / from the driver.
    oom_retries : int
        Times an out-of-memory from the driver emptied the cache and retried.
    """

    in_use: int
    reserved: int
    cached: int
    peak: int
    hits: int
    misses: int
    oom_retries: int


class Block:
    """A device allocation; arrays and views referencing it keep it alive.

    Attributes
    ----------
    ptr : int
        Device address of the first byte.
    nbytes : int
        Bytes requested (the size class may be larger).
    device : Device
    owner : BlockOwner
        Where the memory goes back when the block dies: the device's
        allocator, or the graph pool it came from during a capture.
    extra : list of Stream or None
        Other streams that used the block (:meth:`use_on`).
    """

    # (compiled, an extension type whose fields _allocator.pxd declares)
    __slots__ = ("__weakref__", "device", "extra", "nbytes", "owner", "ptr")

    ptr: int
    nbytes: int
    device: Any  # (a _device.Device, a layer above)
    owner: BlockOwner
    extra: list[Stream] | None

    def __del__(self) -> None:
        # the memory back to its owner, as soon as the block dies (a finalizer: compiled, of the
        # extension type; else of the Python class)
        self._release()

    def _release(self) -> None:
        """Give the dying block's memory back (its finalizer), never waiting for a lock.

        It may run inside any allocation, locks held: a block of the cache goes
        back at once when the allocator's lock is free right now (a
        non-blocking acquire cannot deadlock); anything else is queued for the
        next allocator call. (A method, not a module function: at interpreter
        shutdown a class outlives the module's globals.)
        """
        owner: BlockOwner | None = self.owner  # (set last by new_block, the one maker of blocks)
        if owner is None:  # (compiled: never filled in)
            return
        ptr, extra = self.ptr, self.extra
        if extra is None and type(owner) is CachingAllocator:
            allocator = owner  # (compiled: typed, its methods called directly)
            if allocator._try_cache(ptr):
                return
        try:  # noqa: SIM105  (not contextlib.suppress: at shutdown the module may be gone)
            _DEAD.append(_DeadBlock(owner, ptr, extra))
        except (AttributeError, TypeError):  # interpreter shutdown: module globals are gone
            pass

    def use_on(self, stream: Stream) -> None:
        """Declare that work on ``stream`` uses this block.

        When the block is freed, events are recorded on each such stream and
        the next user of the memory waits on them (like PyTorch's
        ``record_stream``).

        Raises
        ------
        TypeError
            If ``stream`` is not a cudagraphs Stream.
        """
        if not hasattr(stream, "_recording"):  # (a Stream: _device is above this layer)
            raise TypeError(f"use_on takes a cudagraphs Stream, got {type(stream).__name__}")
        if self.extra is None:
            self.extra = []
        if stream not in self.extra:
            self.extra.append(stream)

    def __repr__(self) -> str:
        return f"<cudagraphs.Block 0x{self.ptr:x} {self.nbytes} B on {self.device}>"


class _DeadBlock(NamedTuple):
    """A dead block's memory, queued for its owner (the C release, when the lock is busy)."""

    owner: BlockOwner
    ptr: int
    extra: list[Stream] | None


class BlockOwner(Protocol):
    """Where a block's memory goes back to when the block dies."""

    def release(self, ptr: int, streams: list[Stream] | None) -> None: ...


_dead: collections.deque[_DeadBlock] = collections.deque()  # dead blocks' memory to give back
_DEAD = _dead  # (the same, for the hot paths: compiled, a C global, no name lookup)


def release_dead_blocks() -> None:
    """Give the blocks that died since the last call back to their owners."""
    if sys.is_finalizing():  # the driver may already be gone
        return
    while _dead:
        try:
            ref = _dead.popleft()
        except IndexError:  # another thread took the last one
            return
        ref.owner.release(ref.ptr, ref.extra)


def safe_point() -> None:
    """Run what finalizers queued: dead blocks, deferred releases, and what they freed."""
    if _dead:
        release_dead_blocks()
    _recording.drain()
    if _dead:
        release_dead_blocks()


def new_block(device: Device, ptr: int, nbytes: int, owner: BlockOwner) -> Block:
    """A Block for memory at ``ptr`` that goes back to ``owner`` when it dies."""
    block = Block.__new__(Block)
    block.ptr = ptr
    block.nbytes = nbytes
    block.device = device
    block.extra = None
    block.owner = owner  # (from here, its death gives the memory back)
    return block


if not cython.compiled:  # (compiled, _capi.pxd's C versions: no method call for the C Lock)
    from ._capi import cg_api_load, cg_lock_give, cg_lock_take, cg_pop

if cython.compiled and _fastcall is not None:
    cg_api_load(_fastcall.api)


def _size(nbytes: Any) -> int:
    """``nbytes`` given to malloc as an int (a numpy integer too), or TypeError/ValueError."""
    if isinstance(nbytes, bool) or not hasattr(type(nbytes), "__index__"):
        raise TypeError(f"malloc: nbytes must be an int, got {type(nbytes).__name__}: {nbytes!r}")
    size = operator.index(nbytes)
    if size < 0:
        raise ValueError(f"malloc: nbytes must be >= 0, got {size}")
    return size


def _bad_stream(stream: Any, device: Device, what: str) -> Exception:
    if not hasattr(stream, "_recording"):
        return TypeError(f"{what}: stream must be a cudagraphs Stream or None, got {type(stream).__name__}")
    return ValueError(f"{what}: stream {stream} is on {stream.device}, this allocator on {device}")


def _check_free(live: dict[int, Any], ptr: Any, streams: Any) -> None:
    """Raise if ``ptr`` given to raw_free is no block in use, or ``streams`` not Streams."""
    if streams and (
        not isinstance(streams, (list, tuple)) or not all(hasattr(s, "_recording") for s in streams)
    ):
        raise TypeError(f"raw_free: streams must be a list of cudagraphs Streams or None, got {streams!r}")
    if isinstance(ptr, bool) or not isinstance(ptr, int) or ptr not in live:
        raise ValueError(
            f"raw_free: {ptr!r} is not an address this allocator gave (raw_malloc) and that is in use"
        )


def _refuse_outside(size: int, stream: Stream) -> None:
    """Raise CaptureError if a capture of another device refuses this thread a new allocation."""
    rec = _recording.unsafe_blocker()
    if rec is None:
        return
    raise CaptureError(
        f"allocation of {size} B at {_recording.user_line()} on stream 0x{stream.handle:x} of "
        f"{stream.device}, during the {rec.mode} capture of stream 0x{rec.stream.handle:x} on "
        f"{rec.device}, which does not include that stream: the driver refuses new memory "
        "then (and would invalidate the capture). To record this work in the graph, fork that "
        "stream into the capture: inside it, other.wait(captured) (a wait on an event recorded "
        "in the capture), queue the work with stream=other, and join back with "
        "captured.wait(other) before the capture ends; or allocate before capturing. The "
        "capture is left as it was."
    )


class CachingAllocator:
    """The caching allocator of one device (``device.allocator``).

    Parameters
    ----------
    device : Device or int
        Its device (every device has one already: ``cg.Device(i).allocator``).
    """

    # (compiled, an extension type whose fields _allocator.pxd declares, the counters C integers)
    __slots__ = (
        "__weakref__",
        "_backend",
        "_device",
        "_free",
        "_hits",
        "_in_use",
        "_last_free",
        "_last_handle",
        "_last_key",
        "_last_size",
        "_live",
        "_lock",
        "_misses",
        "_oom_retries",
        "_ordinal",
        "_peak",
        "_reserved",
        "_streams",
        "_unordered",
        "_waits",
    )

    def __init__(self, device: Device | int) -> None:
        if device is None:  # (None is the current device elsewhere; an allocator names its own)
            raise TypeError("CachingAllocator: device must be a cudagraphs Device or an index, got None")
        device = _AS_DEVICE[0](device, "CachingAllocator: device")
        self._device = device
        self._backend: Backend = device.backend
        self._ordinal = device.index
        # (where the C part is built, a lock compiled code takes without a method call)
        self._lock = _fastcall.Lock() if _fastcall is not None else threading.Lock()
        # (stream key, size) -> addresses; the same tuple is each live block's record, and the
        # last one made serves the next allocation of that size on that stream (no new tuple);
        # its size and stream are kept beside it (compiled, comparing those fields instead of
        # the tuple's items was measured 7% faster on the raw pair)
        self._free: dict[tuple[int, int], list[int]] = {}
        self._last_key: tuple[int, int] = (0, 0)
        self._last_handle: int | None = None
        self._last_size = 0
        # the free list of _last_key where it has one (the list _free holds for that key, found
        # without hashing the key; None until looked up, and again whenever _free is emptied)
        self._last_free: list[int] | None = None
        self._waits: dict[int, list[Any]] = {}  # ptr -> raw events to wait for
        self._live: dict[int, tuple[int, int]] = {}  # ptr -> (stream key, size)
        self._streams: dict[int, Stream] = {}  # stream key -> Stream
        # ptr -> size: freed memory the next user could not be ordered after (an event the
        # driver refused), reused by no one until empty_cache's device synchronize frees it
        self._unordered: dict[int, int] = {}
        self._in_use = 0
        self._reserved = 0
        self._peak = 0
        self._hits = 0
        self._misses = 0
        self._oom_retries = 0

    # blocks ---------------------------------------------------------------
    def malloc(self, nbytes: int, stream: Stream | None = None) -> Block:
        """A block of at least ``nbytes`` bytes, usable in order on ``stream``.

        While ``stream`` is being captured, the block comes from the
        capture's memory policy instead (its graph pool, a graph-owned
        allocation, or a :class:`CaptureError` under ``alloc="forbid"``).

        Parameters
        ----------
        nbytes : int
            Bytes wanted (0 gives a minimal block).
        stream : Stream, optional
            Default: the device's default stream.

        Raises
        ------
        TypeError, ValueError
            For ``nbytes`` that is not a non-negative int, or ``stream`` that is
            not a Stream of this device.
        OutOfMemoryError
            If the device cannot hold the block even after emptying the cache.
        CaptureError
            If the capture forbids allocations, or another thread captures ``stream``.
        """
        if _DEAD:
            release_dead_blocks()
        if _QUEUE:
            safe_point()
        if type(nbytes) is not int or nbytes < 0:
            nbytes = _size(nbytes)
        if stream is None:
            stream = self._device.stream
        fields = stream if isinstance(stream, StreamFields) else None  # (compiled: typed)
        if fields is None or fields.device is not self._device:
            raise _bad_stream(stream, self._device, "malloc")
        rec = fields._recording
        if rec is None:
            return new_block(self._device, self.raw_malloc(nbytes, stream), nbytes, self)
        if rec.thread != threading.get_ident():
            raise CaptureError(
                f"allocation of {nbytes} B at {_recording.user_line()} on stream "
                f"0x{stream.handle:x}, which thread {rec.thread} is capturing: allocate on a "
                "stream of this thread"
            )
        ptr, owner = rec.memory.allocate(rec, nbytes, stream)
        return new_block(self._device, ptr, nbytes, owner)

    def release(self, ptr: int, streams: list[Stream] | None) -> None:
        """Take back a block's memory (the :class:`BlockOwner` protocol)."""
        if streams and _recording.active(self._device):
            # events must be recorded on those streams, which may be capturing
            _recording.release(self._device, self.raw_free, ptr, streams)
        else:
            self.raw_free(ptr, streams)

    # raw addresses --------------------------------------------------------
    def raw_malloc(self, nbytes: int, stream: Stream | None = None) -> int:
        """Like :meth:`malloc`, returning a bare address to give to :meth:`raw_free`."""
        if stream is None:
            stream = self._device.stream
        fields = stream  # (compiled: typed, its fields read directly)
        handle = fields.handle
        # (round_size, inlined for the common small sizes: this is a hot path)
        if 0 < nbytes <= _SMALL:
            small = nbytes  # (compiled: a C integer)
            size = -(-small // _SMALL_STEP) * _SMALL_STEP
        else:
            whole = round_size(nbytes)
            if whole > sys.maxsize:  # (no device holds it: what the driver would answer)
                raise self._out_of_memory(whole)
            size = whole
        lock = self._lock
        cg_lock_take(lock, True)
        try:
            key = self._last_key
            if self._last_size != size or self._last_handle is not handle:
                key = self._last_key = (handle, size)
                self._last_size = size
                self._last_handle = handle
                self._last_free = None
            cached = self._last_free
            if cached is None:
                cached = self._last_free = self._free.get(key)
            if cached:
                if self._waits:  # (a failed wait leaves the block where it was)
                    self._wait_for(cached[-1], stream)
                ptr: int = cg_pop(cached)  # (compiled: the list's storage kept for the next free)
                self._hits += 1
            else:
                ptr = self._miss(size, stream)
            self._live[ptr] = key
            self._in_use += size
            if self._in_use > self._peak:
                self._peak = self._in_use
        finally:
            cg_lock_give(lock)
        return ptr

    def raw_free(self, ptr: int, streams: list[Stream] | None = None) -> None:
        """Return ``ptr`` (from :meth:`raw_malloc`) to the cache.

        ``streams`` are other streams that used the memory: the next user
        will wait for the work queued on them so far. No capture may be
        active on the device when ``streams`` are given (see :meth:`release`).

        Raises
        ------
        ValueError
            If ``ptr`` is not a block of this allocator in use (from :meth:`raw_malloc`).
        TypeError
            If ``streams`` is not a list of Streams.

        Notes
        -----
        Never raises for the driver's events: when one cannot be created or
        recorded on ``streams``, the memory is set aside until
        :meth:`empty_cache` (it stays reserved, counted as cached).
        """
        if streams or ptr not in self._live:  # (checked before an event is recorded)
            _check_free(self._live, ptr, streams)
        lock = self._lock
        if not streams:
            cg_lock_take(lock, True)
            try:
                self._cache_locked(ptr)
            finally:
                cg_lock_give(lock)
            return
        events: list[Any] = []
        try:
            with _recording.holding(streams) as live:  # (another thread may close one)
                for s in live:
                    events.append(self._record(s))
        except CudaError:  # (a release must not fail its caller: often a collection)
            for event in events:
                self._backend.destroy(event)
            with lock:
                self._set_aside_locked(ptr)
            return
        with lock:
            self._cache_locked(ptr)
            if events:
                self._waits[ptr] = events

    def _try_cache(self, ptr: int) -> bool:
        """Put ``ptr`` on its free list if the lock is free right now (a block's death)."""
        lock = self._lock
        if not cg_lock_take(lock, False):  # (never waits: the lock may be this thread's own)
            return False
        try:
            self._cache_locked(ptr)
        finally:
            cg_lock_give(lock)
        return True

    def _cache_locked(self, ptr: int) -> None:
        """Put ``ptr`` on its stream's free list (the caller holds the lock)."""
        key = self._live.pop(ptr)  # (stream key, size): its free list's key
        size = key[1]
        self._in_use -= size
        cached = self._last_free if key is self._last_key else None  # (the same list, unhashed)
        if cached is None:
            cached = self._free.get(key)
        if cached is None:
            self._free[key] = [ptr]
        else:
            cached.append(ptr)

    def _set_aside_locked(self, ptr: int) -> None:
        """Take back ``ptr`` for :meth:`empty_cache` only (the caller holds the lock).

        For memory the next user could not be ordered after: reserved and
        cached, reused by no allocation, freed after the device synchronize.
        """
        _, size = self._live.pop(ptr)
        self._in_use -= size
        self._unordered[ptr] = size

    def _record(self, stream: Stream) -> Any:
        """A new event recorded on ``stream`` now (destroyed once waited for)."""
        backend = self._backend
        event = backend.event_create(self._ordinal, False)
        try:
            backend.event_record(event, stream._raw)
        except BaseException:
            backend.destroy(event)
            raise
        return event

    def _follow(self, stream: Stream, other: Stream) -> None:
        """Make later work on ``stream`` wait for the work queued on ``other`` so far."""
        event = self._record(other)
        try:
            self._backend.stream_wait_event(stream._raw, event)
        finally:
            self._backend.destroy(event)

    def segment(self, nbytes: int) -> int:
        """Fresh device memory for a graph pool, taken outside any capture.

        The thread's capture mode is exchanged to relaxed for the call and the
        memory is allocated and completed on the copy stream, so the capture
        in progress records nothing. The memory counts as in use until the
        pool gives it back with :meth:`free_segment`.

        Raises
        ------
        OutOfMemoryError
            If the driver has no memory left; the cache cannot be emptied
            during a capture, so the message says how much it holds.
        """
        size = round_size(nbytes)
        side = self._device.copy_stream
        backend = self._backend
        old = backend.capture_exchange_mode("relaxed")
        try:
            try:
                ptr = backend.mem_alloc(self._ordinal, size, side._raw)
            except CudaError as exc:
                if exc.code != CUDA_ERROR_OUT_OF_MEMORY:
                    raise
                cached = self._reserved - self._in_use
                raise self._out_of_memory(
                    size,
                    note=f"This was a graph pool's allocation during a capture, when cached "
                    f"blocks cannot be given back to the driver; the cache holds "
                    f"{cached} B: call device.allocator.empty_cache() before capturing, "
                    "or free arrays you no longer need.",
                ) from None
            backend.synchronize(side._raw)
        finally:
            backend.capture_exchange_mode(old)
        with self._lock:
            self._misses += 1
            self._reserved += size
            self._live[ptr] = (self._device.stream.handle, size)
            self._in_use += size
            if self._in_use > self._peak:
                self._peak = self._in_use
        return ptr

    def free_segment(self, ptr: int, streams: list[Stream]) -> None:
        """Give a pool's segment back to the driver after the work of ``streams``.

        No capture may be active on the device (pools release through
        :func:`cudagraphs._recording.release`). When the driver fails an
        event that orders the free after ``streams``, or the free itself, the
        segment is set aside for :meth:`empty_cache` instead (no error: a
        release must not fail the unrelated call that ran it).
        """
        # (the streams are held: one that another thread closes meanwhile is destroyed after)
        with _recording.holding(streams) as live:
            first, *others = live or [self._device.stream]
            try:
                for other in others:
                    self._follow(first, other)  # the free is queued on first: after them all
            except CudaError:
                with self._lock:
                    self._set_aside_locked(ptr)
                return
            # the free and the record's removal are one step under the lock: from the free on,
            # the driver may give this address to another thread's allocation, whose record the
            # pop would take instead (that block's release then found no record: a KeyError)
            with self._lock:
                try:
                    self._backend.mem_free(ptr, first._raw)
                except CudaError:  # (the memory stays accounted, freed after a device synchronize)
                    self._set_aside_locked(ptr)
                    return
                _, size = self._live.pop(ptr)
                self._in_use -= size
                self._reserved -= size

    def _wait_for(self, ptr: int, stream: Stream) -> None:
        """Order ``stream`` after the events ``ptr``'s release recorded (the lock is held).

        The events are dropped only once every wait is queued: after a
        failed wait, the next user of ``ptr`` still waits on them all.
        """
        events = self._waits.get(ptr)
        if not events:
            return
        backend = self._backend
        for event in events:
            backend.stream_wait_event(stream._raw, event)
        del self._waits[ptr]
        for event in events:
            _recording.release(self._device, backend.destroy, event)

    def _miss(self, size: int, stream: Stream) -> int:
        self._misses += 1
        self._streams[stream.handle] = stream
        # stealing needs an event on the owner stream: only while no capture is active, and
        # none begins meanwhile (another thread's, on the owner stream, would take the event)
        with _recording.quiet() as quiet:
            for (owner, other_size), cached in self._free.items() if quiet else ():
                if other_size == size and cached and owner != stream.handle:
                    owner_stream = self._streams.get(owner)
                    # another stream's block: order our stream after its last use (holding
                    # leaves out only closed streams whose work was waited for); taken once
                    # ordered, so that a failed event leaves it in the cache
                    with _recording.holding([owner_stream] if owner_stream is not None else []) as live:
                        for other in live:  # (open: held until ordered, if its thread closes it)
                            self._follow(stream, other)
                    self._wait_for(cached[-1], stream)
                    return cached.pop()
        try:
            ptr = self._driver_alloc(size, stream)
        except CudaError as exc:
            if exc.code != CUDA_ERROR_OUT_OF_MEMORY:
                raise
            self._oom_retries += 1
            if _recording.active(self._device):
                raise self._out_of_memory(
                    size,
                    note="A capture is active on the device, so the cache could not be "
                    "emptied: free arrays you no longer need, or empty the cache "
                    "before capturing.",
                ) from None
            self._empty_cache_locked()
            try:
                ptr = self._driver_alloc(size, stream)
            except CudaError as again:
                if again.code != CUDA_ERROR_OUT_OF_MEMORY:
                    raise
                raise self._out_of_memory(size) from None
        self._reserved += size
        return ptr

    def _out_of_memory(self, size: int, note: str | None = None) -> OutOfMemoryError:
        """The error for ``size`` bytes the driver would not give (``note``: what to do)."""
        counts = (self._ordinal, size, self._in_use, self._reserved, self._device.total_memory)
        return OutOfMemoryError(*counts) if note is None else OutOfMemoryError(*counts, note=note)

    def _driver_alloc(self, size: int, stream: Stream) -> int:
        """``cuMemAllocFromPoolAsync`` on a stream that is not captured.

        While another stream of the device is being captured this is an unsafe
        call for the driver, so the thread's capture mode is relaxed around it.
        A capture of another device that refuses this thread such calls refuses
        it (the driver would invalidate that capture): the work belongs in it.
        """
        backend = self._backend
        if not _recording.active(self._device):
            if _recording._ACTIVE:
                _refuse_outside(size, stream)
            return backend.mem_alloc(self._ordinal, size, stream._raw)
        old = backend.capture_exchange_mode("relaxed")
        try:
            return backend.mem_alloc(self._ordinal, size, stream._raw)
        finally:
            backend.capture_exchange_mode(old)

    # maintenance ----------------------------------------------------------
    def empty_cache(self) -> None:
        """Give every cached block back to the driver and trim the pool.

        Synchronizes the device first, so no queued work still uses them.

        Raises
        ------
        CaptureError
            While a capture is active on the device.
        """
        safe_point()
        _recording.forbid(self._device, None, "empty_cache()", device_wide=True)
        with self._lock:
            self._empty_cache_locked()

    def _empty_cache_locked(self) -> None:
        backend = self._backend
        backend.synchronize(self._ordinal)
        raw = self._device.stream._raw
        for (_, size), cached in self._free.items():
            for ptr in cached:
                backend.mem_free(ptr, raw)
                self._reserved -= size
            cached.clear()
        self._free.clear()
        self._last_free = None  # (a list no longer in _free)
        unordered = self._unordered
        while unordered:  # (after the synchronize above: no queued work uses them)
            ptr, size = unordered.popitem()
            backend.mem_free(ptr, raw)
            self._reserved -= size
        for events in self._waits.values():
            for event in events:
                backend.destroy(event)
        self._waits.clear()
        backend.synchronize(self._ordinal)
        backend.mem_pool(self._ordinal, trim=True)

    def stats(self) -> AllocatorStats:
        """A snapshot of the allocator's counters."""
        safe_point()
        with self._lock:
            return AllocatorStats(
                in_use=self._in_use,
                reserved=self._reserved,
                cached=self._reserved - self._in_use,
                peak=self._peak,
                hits=self._hits,
                misses=self._misses,
                oom_retries=self._oom_retries,
            )

    def is_capturing(self, stream: Stream | None = None) -> bool:
        """Whether ``stream`` (default: the device's default stream) is being captured."""
        if stream is None:
            stream = self._device.stream
        elif getattr(stream, "device", None) is not self._device:
            raise _bad_stream(stream, self._device, "is_capturing")
        return stream._recording is not None

    def reset_peak(self) -> None:
        """Restart peak tracking from the bytes in use now."""
        with self._lock:
            self._peak = self._in_use
