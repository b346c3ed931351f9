"""The ``sim`` backend's primitives: :class:`SimBackend`, on the simulated device's parts.

Each primitive of :class:`~cudagraphs.backends.base.Backend` is here, made of
the parts the package's other modules hold: the streams and their scheduler
(:mod:`.streams`), device memory (:mod:`.memory`), the graph DAG and its
executor (:mod:`.graph`, :mod:`.executor`), conditional handles
(:mod:`.conditions`), kernels and host functions (:mod:`.kernels`), the
rules of captures (:mod:`.rules`) and fault injection (:mod:`.faults`).
This module applies the driver's rules during captures (which call is
refused, which captures it invalidates) as it makes the calls.
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from types import FunctionType
from typing import Any, TypeVar

import numpy as np

from ..._config import settings
from ..._errors import BackendUnavailableError, UpdateError
from ..base import (
    CUDA_ERROR_ILLEGAL_ADDRESS,
    CUDA_ERROR_ILLEGAL_STATE,
    CUDA_ERROR_INVALID_DEVICE,
    CUDA_ERROR_INVALID_HANDLE,
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_MISALIGNED_ADDRESS,
    CUDA_ERROR_NOT_FOUND,
    CUDA_ERROR_NOT_READY,
    CUDA_ERROR_OUT_OF_MEMORY,
    CUDA_ERROR_PEER_ACCESS_UNSUPPORTED,
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
    CUDA_ERROR_STREAM_CAPTURE_ISOLATION,
    CUDA_ERROR_STREAM_CAPTURE_MERGE,
    CUDA_ERROR_STREAM_CAPTURE_UNJOINED,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
    ELAPSED_TIME_ERRORS,
    UPDATE_REASONS,
    Capabilities,
    Copy,
    DeviceProperties,
    KernelLaunch,
    NodeInfo,
    Param,
    Waiting,
)
from .conditions import Conditions
from .executor import run_nodes
from .faults import Faults
from .graph import SimExec, SimGraph, SimNode, addresses, ancestors, condition_handles, repointed, updatable
from .kernels import HostCallback, SimFunction, check_dims, kernel_work
from .memory import POISON, DeviceMemory, host_bytes
from .rules import error
from .streams import Scheduler, SimEvent, SimStream

__all__ = ["SimBackend"]

_H = TypeVar("_H")  # a handle type
_R = TypeVar("_R")
_C = TypeVar("_C", bound=type)


def _holding_lock(method: Callable[..., _R]) -> Callable[..., _R]:
    @functools.wraps(method)
    def locked(self: Any, *args: Any, **kwargs: Any) -> _R:
        with self._lock:
            return method(self, *args, **kwargs)

    return locked


def _serialized(cls: _C) -> _C:
    """Make every public method of ``cls`` run holding its instance's ``_lock``.

    All of them, so that a primitive added later cannot be forgotten: the
    simulated device is one shared state that threads use as they use the
    driver (as on a GPU, each call is atomic; the order of two threads' calls
    is theirs to make).
    """
    for name, attr in list(vars(cls).items()):
        if not name.startswith("_") and isinstance(attr, FunctionType):
            setattr(cls, name, _holding_lock(attr))
    return cls


@_serialized
class SimBackend:
    """CPU simulation of the CUDA primitives in :class:`~cudagraphs.backends.base.Backend`.

    Thread-safe: every public method holds one re-entrant lock while it runs
    (work the scheduler runs may call the backend again); a host that waits
    for another process's work lets it go meanwhile.
    """

    name = "sim"
    capabilities = Capabilities(
        shares_memory=False, runs_host_code=True, needs_compiled_code=False, collectives="simulated"
    )
    fastcall = False  # kernels run on the host, in stream order: every launch goes through launch()

    def __init__(self) -> None:
        self._memory = DeviceMemory()
        self._host: dict[int, np.ndarray] = {}  # pinned host allocations
        self._addresses = itertools.count(0x5000, 0x10)
        # held by every public primitive (see _serialized): the state below is shared by
        # the threads; re-entrant, as work the scheduler runs may call the backend again
        self._lock = threading.RLock()
        self.seed = settings().sim_seed
        self._scheduler = Scheduler(self._lock, self.seed)
        self._capturing: set[SimStream] = set()
        self._thread = threading.local()  # this thread's capture-mode setting
        self._conditions = Conditions()  # this device's conditional handles (kernels' HostContext)
        self._faults = Faults()
        self._handles: dict[int, Any] = {}  # id -> graphs, executables, events, streams made
        self._peers: set[tuple[int, int]] = set()  # (device, peer whose memory it may reach)

    @property
    def reuse_addresses(self) -> bool:
        """Whether a freed device address goes to later allocations (default True).

        The driver hands a freed range to the next allocation that fits at
        once, and so does the simulator: the lowest freed address with room.
        A stale pointer into memory given
        out again then reads and writes its new owner's bytes, as on a GPU;
        only an address no live allocation holds raises
        CUDA_ERROR_ILLEGAL_ADDRESS. Set it False (a test that checks a
        use-after-free is caught) to give every allocation a new address.
        """
        return self._memory.reuse

    @reuse_addresses.setter
    def reuse_addresses(self, on: bool) -> None:
        with self._memory.lock:
            self._memory.reuse = bool(on)

    def _track(self, handle: _H) -> _H:
        """Count ``handle`` as live until it is destroyed (see :meth:`live_handles`)."""
        self._handles[id(handle)] = handle
        return handle

    def live_handles(self) -> dict[str, int]:
        """How many graphs, executables, events and streams were made and not destroyed.

        A handle the library forgets to destroy stays here (the driver would
        leak it), even after its Python wrapper is collected.
        """
        counts: dict[str, int] = {}
        for h in self._handles.values():
            name = type(h).__name__.lstrip("_").replace("Sim", "").lower()
            counts[name] = counts.get(name, 0) + 1
        return counts

    # fault injection ----------------------------------------------------------
    def inject(self, kind: str, nth: int = 1) -> None:
        """Make the ``nth`` next call of ``kind`` (see :data:`~.faults.FAULTS`) fail with the driver's code.

        The failing call raises as the driver's would and does nothing else;
        later calls succeed. :meth:`injected` tells whether it fired.

        Raises
        ------
        ValueError
            For an unknown kind or an ``nth`` below 1.
        """
        self._faults.inject(kind, nth)

    def injected(self, kind: str) -> bool:
        """Whether the fault injected for ``kind`` has fired (and is spent)."""
        return self._faults.injected(kind)

    def clear_faults(self) -> None:
        """Forget faults that have not fired."""
        self._faults.clear()

    def reseed(self, seed: int) -> None:
        """Restart the interleaving of stream queues from ``seed`` (to replay an order)."""
        self.seed = seed
        self._scheduler.reseed(seed)

    def reset(self) -> None:
        """Make a context lost to a device fault usable again (queued work is dropped)."""
        self._scheduler.reset()

    # devices ------------------------------------------------------------
    def device_count(self) -> int:
        return settings().sim_devices

    def device_properties(self, ordinal: int) -> DeviceProperties:
        return DeviceProperties(
            name="cudagraphs sim device",
            compute_capability=(9, 0),
            total_memory=settings().sim_memory_mb << 20,
            multiprocessors=132,
            peers=tuple(i for i in range(self.device_count()) if i != ordinal) if settings().sim_peer else (),
        )

    def activate(self, ordinal: int, peer: int | None = None) -> None:
        if peer is not None:
            self._enable_peer_access(ordinal, peer)
            return
        if not 0 <= ordinal < self.device_count():
            raise BackendUnavailableError(
                f"sim device {ordinal} does not exist; there are "
                f"{self.device_count()} (set CUDAGRAPHS_SIM_DEVICES for more)"
            )

    def _enable_peer_access(self, ordinal: int, peer: int) -> None:
        call = "cuCtxEnablePeerAccess"
        self.activate(ordinal)
        if peer not in self.device_properties(ordinal).peers:
            code = CUDA_ERROR_INVALID_DEVICE if ordinal == peer else CUDA_ERROR_PEER_ACCESS_UNSUPPORTED
            raise error(code, call, f"sim device {ordinal} cannot reach device {peer}'s memory")
        self._peers.add((ordinal, peer))

    def _check_peers(self, ordinal: int, dst: int, src: int, call: str) -> None:
        """Refuse a copy on device ``ordinal`` that joins devices without peer access.

        As on the GPU (two H200s): a plain device-to-device copy between two
        devices' memory pools fails with CUDA_ERROR_INVALID_VALUE until peer
        access is enabled between them (here: every device involved, both
        ways, which is what made it work there).
        """
        involved = {ordinal} | {o for o in map(self._memory.owner_of, (dst, src)) if o is not None}
        if len(involved) == 1:
            return
        missing = sorted((a, b) for a in involved for b in involved if a != b and (a, b) not in self._peers)
        if missing:
            raise error(
                CUDA_ERROR_INVALID_VALUE,
                call,
                f"a copy on sim device {ordinal} joins the memory of devices {sorted(involved)}, "
                f"and peer access {', '.join(f'{a}->{b}' for a, b in missing)} is not enabled",
            )

    # the capture rules ---------------------------------------------------
    def _invalidate(self, streams: Sequence[SimStream], call: str) -> None:
        for st in streams:
            st.invalidated = True
            if st.capture is not None:  # the whole capture: its forked streams too
                for other in self._capturing:
                    if other.capture is st.capture:
                        other.invalidated = True
        raise error(
            CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, call, "operation not permitted when stream is capturing"
        )

    def _blocked(self, ordinal: int) -> list[SimStream]:
        """Captures on the device that an unsafe call from this thread would break."""
        if getattr(self._thread, "mode", "global") == "relaxed":
            return []
        me = threading.get_ident()  # (a mode is a rule of threads: captures on every device)
        return [
            st
            for st in self._capturing
            if st.mode == "global" or (st.mode == "thread_local" and st.thread == me)
        ]

    def _unsafe(self, ordinal: int, call: str) -> None:
        """An unsafe call (see RULES): refused where a capture forbids it."""
        if self._capturing:
            blocked = self._blocked(ordinal)
            if blocked:
                self._invalidate(blocked, call)

    @staticmethod
    def _live(obj: Any, call: str) -> Any:
        if not getattr(obj, "alive", False):
            raise error(CUDA_ERROR_INVALID_HANDLE, call, f"{obj!r} is destroyed")
        return obj

    # streams and events -------------------------------------------------
    def stream_create(self, ordinal: int, address: int | None = None) -> SimStream:
        if address is not None:  # a stream made elsewhere: the same queue as its maker's
            known = next((st for st in self._scheduler.streams if st.address == address), None)
            if known is not None:
                return known
        if address is None:
            self._faults.check("stream")
        stream = (
            SimStream(address, ordinal, owned=False)
            if address is not None
            else SimStream(next(self._addresses), ordinal)
        )
        self._scheduler.streams.append(stream)
        return self._track(stream) if stream.owned else stream

    def stream_device(self, address: int) -> int:
        known = next((st for st in self._scheduler.streams if st.address == address), None)
        if known is None:  # (destroyed, or never made: the driver knows no such stream either)
            raise error(CUDA_ERROR_INVALID_HANDLE, "cuStreamGetCtx", f"no stream at 0x{address:x}")
        return known.ordinal

    def event_create(self, ordinal: int, timing: bool) -> SimEvent:
        self._faults.check("event")
        return self._track(SimEvent(ordinal, timing))

    def destroy(self, handle: Any) -> None:
        self._destroy(handle)
        self._handles.pop(id(handle), None)

    def _destroy(self, handle: Any) -> None:
        if isinstance(handle, SimExec):
            self._live(handle, "cuGraphExecDestroy")
            self._unsafe(0, "cuGraphExecDestroy")
            handle.alive = False
            self._conditions.disown(handle.conditions)
        elif isinstance(handle, SimGraph):
            self._live(handle, "cuGraphDestroy").alive = False
            self._conditions.disown(handle.conditions)
            for ptr in handle.allocations:
                self._memory.release_graph(ptr)
            handle.allocations.clear()
        elif isinstance(handle, SimEvent):  # legal during a capture (see RULES)
            self._live(handle, "cuEventDestroy")
            handle.alive = False
        elif isinstance(handle, SimStream):
            self._live(handle, "cuStreamDestroy")
            if handle.capture is not None:
                self._invalidate([handle], "cuStreamDestroy")
            self._scheduler.run(handle)  # the driver lets queued work finish
            handle.alive = False
            if handle in self._scheduler.streams:
                self._scheduler.streams.remove(handle)
        else:
            raise error(CUDA_ERROR_INVALID_HANDLE, "destroy", f"not a sim handle: {handle!r}")

    def synchronize(self, target: Any, block: bool = True) -> bool:
        if isinstance(target, int):  # a device
            if self._capturing and any(st.ordinal == target for st in self._capturing):
                # it would wait for the capturing streams: refused in every mode, from
                # any thread, and every capture on the device is invalidated (measured)
                for st in self._capturing:
                    if st.ordinal == target:
                        st.invalidated = True
                raise error(
                    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                    "cuCtxSynchronize",
                    "operation not permitted when stream is capturing",
                )
            self._scheduler.run_device(target)
            return True
        if isinstance(target, SimStream):
            call = "cuStreamSynchronize" if block else "cuStreamQuery"
            self._live(target, call)
            if target.capture is not None:
                self._invalidate([target], call)
            if block:
                self._unsafe(target.ordinal, call)
            return self._forced(block, target)  # a query forces the work too (the device makes progress)
        call = "cuEventSynchronize" if block else "cuEventQuery"
        self._live(target, call)
        if block:
            self._unsafe(target.ordinal, call)
        return target.stream is None or self._forced(block, target.stream, target.seq)

    def _forced(self, block: bool, stream: SimStream, upto: int | None = None) -> bool:
        """Run ``stream`` (to its ``upto``-th item); a query does not wait for other processes."""
        if block:
            return self._scheduler.run(stream, upto)
        with self._scheduler.looking():
            return self._scheduler.run(stream, upto)

    def event_record(self, event: SimEvent, stream: SimStream, external: bool = False) -> None:
        self._faults.check("record")
        self._live(event, "cuEventRecord")

        def work() -> None:  # (an event destroyed after its record completes when it runs)
            event.recorded = True
            event.time = time.perf_counter()

        def node() -> None:  # a graph node needs its event alive whenever it runs
            self._live(event, "cuEventRecord")
            work()

        if stream.capture is not None and external:
            self._submit(stream, "cuEventRecordWithFlags", "event_record", "", node)
        elif stream.capture is None:
            self._live(stream, "cuEventRecord")
            self._scheduler.check_context()
            event.recorded = False
            event.captured = False
            event.stream, event.seq = stream, self._scheduler.queue(stream, work)
        else:
            event.captured, event.graph, event.deps = True, stream.capture, list(stream.deps)

    def stream_wait_event(self, stream: SimStream, event: SimEvent, external: bool = False) -> None:
        self._faults.check("wait")
        self._live(event, "cuStreamWaitEvent")
        if stream.capture is not None and external:

            def check() -> None:  # a graph node needs its event alive whenever it runs
                self._live(event, "cuStreamWaitEvent")

            self._submit(stream, "cuStreamWaitEvent", "event_wait", "", check)
            return
        self._live(stream, "cuStreamWaitEvent")
        if stream.capture is not None and event.stream is not None and not event.captured:
            stream.invalidated = True  # (RULES: a dependency on work outside the capture)
            raise error(
                CUDA_ERROR_STREAM_CAPTURE_ISOLATION,
                "cuStreamWaitEvent",
                "the event was recorded outside the capture: a dependency would cross its boundary",
            )
        if event.captured and event.graph is not None and event.graph.origin is not None:
            self._join(stream, event)
            return
        if stream.capture is not None or event.stream is None:
            return  # (an event of an ended capture, or never recorded: done)
        other, seq, run = event.stream, event.seq, self._scheduler.run

        def wait() -> Waiting:  # the other stream first runs up to the event
            while not run(other, seq, wait=False):  # (stopped: this stream waits with it)
                assert other.waiting is not None
                yield other.waiting

        self._scheduler.check_context()
        self._scheduler.queue(stream, wait)

    def _join(self, stream: SimStream, event: SimEvent) -> None:
        """A wait on an event recorded in a capture: fork ``stream`` into it, or merge deps."""
        graph = event.graph
        assert graph is not None
        origin = graph.origin
        assert origin is not None
        if stream.capture is None:  # the fork: the stream captures into the same graph
            stream.capture, stream.deps = graph, list(event.deps)
            stream.mode, stream.thread, stream.invalidated = origin.mode, origin.thread, False
            self._capturing.add(stream)
        elif stream.capture is not graph:
            stream.invalidated = True
            raise error(
                CUDA_ERROR_STREAM_CAPTURE_MERGE,
                "cuStreamWaitEvent",
                "the event was recorded in another capture: two captures cannot be merged",
            )
        else:  # a join: the next node depends on both streams' last work
            stream.deps = stream.deps + [n for n in event.deps if n not in stream.deps]

    def _forked(self, graph: SimGraph) -> list[SimStream]:
        """The streams forked into the capture of ``graph`` (its origin excluded)."""
        return [st for st in self._capturing if st.capture is graph and st is not graph.origin]

    def event_elapsed_ms(self, start: SimEvent, end: SimEvent) -> float:
        call = "cuEventElapsedTime"
        for ev in (start, end):
            self._live(ev, call)
            if not ev.timing or not (ev.recorded or ev.stream is not None):
                raise error(CUDA_ERROR_INVALID_HANDLE, call, ELAPSED_TIME_ERRORS[CUDA_ERROR_INVALID_HANDLE])
        if not (start.recorded and end.recorded):  # recorded, not complete (nothing forced it)
            raise error(CUDA_ERROR_NOT_READY, call, ELAPSED_TIME_ERRORS[CUDA_ERROR_NOT_READY])
        return (end.time - start.time) * 1e3

    def _submit(
        self,
        stream: SimStream,
        call: str,
        kind: str,
        label: str,
        work: Callable[[], Any] | None,
        params: Any = None,
    ) -> None:
        """Run ``work`` now, or record it as a node (with ``params``) when ``stream`` is capturing."""
        self._live(stream, call)
        if stream.capture is None:
            self._scheduler.check_context()
            if work is not None:
                self._scheduler.queue(stream, work)
        elif stream.invalidated:
            raise error(
                CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
                call,
                "the capture was invalidated by an earlier illegal call",
            )
        else:
            node = stream.record(kind, label, work)
            node.params, node.call = params, call

    # for the simulated communicator (base.SimulatedCollectives), not the interface -------
    def queue_work(self, stream: SimStream, call: str, label: str, work: Callable[[], Any]) -> None:
        """Queue ``work`` on ``stream`` (a kernel node ``label`` when it is capturing).

        ``work`` may return a generator of :class:`~cudagraphs.backends.base.Rendezvous` it waits on.
        """
        self._submit(stream, call, "kernel", label, work)

    def start(self, stream: SimStream) -> None:
        """Run ``stream``'s queued work now, up to work that waits (a GPU starts it once queued).

        What the work raises is raised where the host next waits for or
        queries the stream, not here.
        """
        with self._scheduler.looking():
            try:
                self._scheduler.run(stream, wait=False)
            except Exception as err:  # (kept for later; an interrupt is raised now)
                stream.failed = err

    def device_bytes(self, ptr: int, nbytes: int, call: str) -> np.ndarray:
        """The simulated device memory ``[ptr, ptr + nbytes)`` as a writable uint8 view."""
        buf, off = self._memory.resolve(ptr, nbytes, call)
        return buf[off : off + nbytes]

    # memory -------------------------------------------------------------
    def mem_alloc(self, ordinal: int, nbytes: int, stream: SimStream | None) -> int:
        self._faults.check("alloc")
        if stream is None:  # outside the pool: cuMemAlloc
            self._unsafe(ordinal, "cuMemAlloc")
            ptr = self._memory.alloc(ordinal, nbytes, self.device_properties(ordinal).total_memory)
            with self._memory.lock:
                self._memory.plain.add(ptr)
            return ptr
        self._live(stream, "cuMemAllocFromPoolAsync")
        if stream.capture is None:
            self._unsafe(ordinal, "cuMemAllocFromPoolAsync")
        limit = self.device_properties(ordinal).total_memory
        ptr = self._memory.alloc(ordinal, nbytes, limit)
        if stream.capture is not None:  # a mem_alloc node: the graph owns the memory
            stream.capture.allocations.append(ptr)
            with self._memory.lock:
                self._memory.graph.add(ptr)
            stream.record("mem_alloc", "", None)
        return ptr

    def mem_free(self, ptr: int, stream: SimStream | None) -> None:
        if stream is None:
            self._unsafe(0, "cuMemFree")
            if ptr not in self._memory.plain:
                raise error(CUDA_ERROR_INVALID_VALUE, "cuMemFree", f"0x{ptr:x} is not from cuMemAlloc")
            self._memory.free(ptr)
            return
        graph = stream.capture
        if graph is not None and ptr in graph.allocations:
            stream.record("mem_free", "", None)  # freed with the graph
            graph.freed.append(ptr)
            return
        self._unsafe(stream.ordinal, "cuMemFreeAsync")
        self._live(stream, "cuMemFreeAsync")
        if ptr not in self._memory.buffers:
            self._memory.free(ptr)  # (raises the driver's error at the call)
        self._scheduler.check_context()
        if stream.done == stream.issued:  # the stream is idle: its free is done at once, and the
            self._memory.free(ptr)  # next allocation that fits gets the address (the driver's)
        else:  # stream-ordered: the work queued before it may still use the memory
            self._scheduler.queue(stream, lambda: self._memory.free(ptr))

    def mem_pool(
        self, ordinal: int, release_threshold: int | None = None, trim: bool = False
    ) -> tuple[int, int]:
        total = self.device_properties(ordinal).total_memory
        return total - self._memory.used.get(ordinal, 0), total

    def host_alloc(self, nbytes: int) -> int:
        self._faults.check("host_alloc")
        self._unsafe(0, "cuMemHostAlloc")
        try:
            arr = np.empty(max(nbytes, 1), dtype=np.uint8)
        except (MemoryError, ValueError):  # (the driver fails as the host does: out of memory)
            raise error(CUDA_ERROR_OUT_OF_MEMORY, "cuMemHostAlloc", f"{nbytes} B of pinned memory") from None
        ptr = arr.ctypes.data
        self._host[ptr] = arr
        return ptr

    def host_free(self, ptr: int) -> None:
        self._unsafe(0, "cuMemFreeHost")
        if self._host.pop(ptr, None) is None:
            raise error(CUDA_ERROR_INVALID_VALUE, "cuMemFreeHost", f"0x{ptr:x} not pinned")

    def is_pinned(self, address: int, nbytes: int) -> bool:
        """Whether ``[address, address + nbytes)`` lies in live pinned host memory."""
        return self._pinned_at(address, nbytes) is not None

    def _pinned_at(self, address: int, nbytes: int) -> np.ndarray | None:
        """The live pinned allocation holding ``[address, address + nbytes)``, if any."""
        return next(
            (h for p, h in self._host.items() if p <= address and address + nbytes <= p + h.nbytes), None
        )

    def memcpy(self, stream: SimStream, copy: Copy) -> None:
        self._faults.check("copy")
        dst, src, nbytes, kind = copy
        if kind == "peer":  # staged by the driver: no peer access needed, never captured
            if stream.capture is not None:
                self._invalidate([stream], "cuMemcpyPeerAsync")
            self._submit(stream, "cuMemcpyPeerAsync", "memcpy", "", self._dtod(dst, src, nbytes), (dst, src))
            return
        if kind == "dtod":
            self._check_peers(stream.ordinal, dst, src, "cuMemcpyDtoDAsync")
            copy_work = self._dtod(dst, src, nbytes)
            self._submit(stream, "cuMemcpyDtoDAsync", "memcpy", "", copy_work, (dst, src))
            return
        call = "cuMemcpyHtoDAsync" if kind == "htod" else "cuMemcpyDtoHAsync"
        host = src if kind == "htod" else dst
        device = dst if kind == "htod" else src
        resolve = self._memory.resolve
        pinned = self._pinned_at(host, nbytes)  # the allocation, not just its address
        pageable = stream.capture is None and pinned is None
        # the driver stages pageable memory: an upload reads it before returning
        staged = host_bytes(host, nbytes).copy() if pageable and kind == "htod" else None
        pinned_at = self._pinned_at

        def work() -> None:  # device addresses are resolved when the copy runs
            if pinned is not None and pinned_at(host, nbytes) is not pinned:
                # the DMA would touch freed host memory (or whatever reuses its address)
                raise error(
                    CUDA_ERROR_ILLEGAL_ADDRESS,
                    call,
                    f"pinned host memory at 0x{host:x} was freed before the copy ran",
                )
            buf, off = resolve(device, nbytes, call)
            if kind == "htod":
                buf[off : off + nbytes] = host_bytes(host, nbytes) if staged is None else staged
            else:
                host_bytes(host, nbytes)[...] = buf[off : off + nbytes]

        self._submit(stream, call, "memcpy", "", work, (device,))
        if pageable and kind == "dtoh":  # into pageable memory: done when the call returns
            self._scheduler.run(stream)

    def _dtod(self, dst: int, src: int, nbytes: int) -> Callable[[], None]:
        call = "cuMemcpyDtoDAsync"
        resolve = self._memory.resolve  # addresses are resolved when the copy runs

        def work() -> None:
            sbuf, soff = resolve(src, nbytes, call)
            dbuf, doff = resolve(dst, nbytes, call)
            # through a temporary: CUDA's memcpy on overlapping ranges is
            # undefined, the simulation picks memmove semantics
            dbuf[doff : doff + nbytes] = sbuf[soff : soff + nbytes].copy()

        return work

    def memset(self, dst: int, value: int, nbytes: int, stream: SimStream) -> None:
        self._faults.check("memset")
        call = "cuMemsetD8Async"
        resolve = self._memory.resolve  # the address is resolved when the memset runs

        def work() -> None:
            buf, off = resolve(dst, nbytes, call)
            buf[off : off + nbytes] = value

        self._submit(stream, call, "memset", "", work, (dst,))

    def view(self, ptr: int, shape: tuple[int, ...], strides: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """A writable numpy view of simulated device memory.

        A kernel reads elements at their natural alignment: a misaligned
        address (or stride) fails with CUDA_ERROR_MISALIGNED_ADDRESS, a
        device fault, as on a GPU.
        """
        align = dtype.itemsize if dtype.itemsize in (2, 4, 8, 16) else 1
        if align > 1 and (ptr % align or any(st % align for st in strides)):
            raise error(
                CUDA_ERROR_MISALIGNED_ADDRESS,
                "kernel access",
                f"0x{ptr:x} (strides {strides}) is not {align}-byte aligned for {dtype}",
            )
        if not shape or 0 not in shape:
            lo = sum(s * (n - 1) for s, n in zip(strides, shape) if s < 0)
            hi = sum(s * (n - 1) for s, n in zip(strides, shape) if s > 0) + dtype.itemsize
        else:
            lo, hi = 0, 0
        buf, off = self._memory.resolve(ptr + lo, hi - lo, "kernel access")
        view: np.ndarray = np.ndarray(shape, dtype, buffer=buf, offset=off - lo, strides=strides)
        return view

    # kernels --------------------------------------------------------------
    def load_kernel(
        self,
        ordinal: int,
        image: bytes | None,
        name: str,
        params: Sequence[Param],
        host: Callable[..., object] | None,
    ) -> SimFunction:
        # as cuModuleGetFunction: the compiled image must export the name (a cubin's ELF
        # symbol table holds it between NULs; a C++ kernel's is mangled, _Z<len><name>...)
        if image is not None and b"\0" + name.encode() + b"\0" not in image:
            raise error(CUDA_ERROR_NOT_FOUND, "cuModuleGetFunction", "named symbol not found")
        return SimFunction(name, params, host)

    def _kernel_work(self, launch: KernelLaunch) -> Callable[[], None]:
        return kernel_work(launch, self.view, self._memory.resolve, self._conditions)

    def launch(self, stream: SimStream, launch: KernelLaunch) -> None:
        self._faults.check("launch")
        fn: SimFunction = launch.function
        if fn.host is None:
            raise BackendUnavailableError(
                f"kernel {fn.name!r} has no host implementation, so it cannot run "
                "on the sim backend: pass host=<numpy function> to cg.Kernel, "
                "or run on the cuda backend"
            )
        check_dims(launch)
        self._submit(stream, "cuLaunchKernel", "kernel", fn.name, self._kernel_work(launch), launch)

    def launch_host(self, stream: SimStream, fn: Callable[[], None]) -> object:
        # as the driver, keep only a pointer to the callback: the caller keeps the
        # returned object alive as long as the work (or the graph node) may run
        callback = HostCallback(fn)
        ref = weakref.ref(callback)

        def work() -> None:
            alive = ref()
            if alive is None:
                raise error(
                    CUDA_ERROR_ILLEGAL_ADDRESS,
                    "cuLaunchHostFunc",
                    "the host function was freed before it ran: keep the object "
                    "launch_host returned alive while its work or node may run",
                )
            alive.fn()

        self._submit(stream, "cuLaunchHostFunc", "host", "", work)
        return callback

    # stream capture -------------------------------------------------------
    def capture_begin(self, stream: SimStream, mode: str, graph: Any = None) -> None:
        self._live(stream, "cuStreamBeginCapture")
        if stream.capture is not None:
            raise error(CUDA_ERROR_ILLEGAL_STATE, "cuStreamBeginCapture", "stream is already capturing")
        stream.capture = graph if graph is not None else self._track(SimGraph())
        stream.capture.origin = stream
        stream.deps = []
        stream.mode = mode
        stream.invalidated = False
        stream.thread = threading.get_ident()
        self._capturing.add(stream)

    def capture_end(self, stream: SimStream) -> SimGraph:
        self._live(stream, "cuStreamEndCapture")
        graph = stream.capture
        if graph is None:
            raise error(CUDA_ERROR_ILLEGAL_STATE, "cuStreamEndCapture", "stream is not capturing")
        if graph.origin is not stream:
            raise error(
                CUDA_ERROR_ILLEGAL_STATE,
                "cuStreamEndCapture",
                "the stream was forked into a capture: end it on the stream that began it",
            )
        forked = self._forked(graph)
        unjoined = [st for st in forked if not set(map(id, st.deps)) <= ancestors(stream.deps)]
        for st in [*forked, stream]:  # every stream of the capture leaves it
            st.capture, st.deps = None, []
            self._capturing.discard(st)
        graph.origin = None
        invalidated = any(st.invalidated for st in forked) or stream.invalidated
        for st in forked:
            st.invalidated = False
        if unjoined and not invalidated:
            stream.invalidated = False
            self.destroy(graph)
            raise error(
                CUDA_ERROR_STREAM_CAPTURE_UNJOINED,
                "cuStreamEndCapture",
                f"{len(unjoined)} stream(s) forked into the capture were not joined back "
                "into the stream that began it",
            )
        if invalidated:
            stream.invalidated = False
            self.destroy(graph)
            raise error(
                CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
                "cuStreamEndCapture",
                "the capture was invalidated by an earlier illegal call",
            )
        return graph

    def capture_info(self, stream: SimStream) -> tuple[str, list[SimNode]]:
        self._live(stream, "cuStreamGetCaptureInfo")
        if stream.capture is None:
            return "none", []
        return ("invalidated" if stream.invalidated else "active"), list(stream.deps)

    def capture_exchange_mode(self, mode: str) -> str:
        old = getattr(self._thread, "mode", "global")
        self._thread.mode = mode
        return old

    def capture_node(self, stream: SimStream, kind: str, *args: Any) -> Any:
        graph = stream.capture
        if graph is None:
            raise error(CUDA_ERROR_ILLEGAL_STATE, "cuGraphAddNode", "stream is not capturing")
        if kind == "dependencies":
            (nodes,) = args
            stream.deps = list(nodes)
            return None
        if kind == "condition":
            (default,) = args
            handle = self._conditions.create(default)
            graph.conditions.append((handle, default))
            return handle
        if kind == "empty":
            return stream.record("empty", "", None)
        if kind == "child":
            (child,) = args
            self._live(child, "cuGraphAddChildGraphNode")
            node = stream.record("child", "", None)
            node.bodies = (child.copy(self._conditions),)  # the driver copies the child graph now
            return node
        if kind == "conditional":
            cond_kind, size, handle = args
            node = stream.record("conditional", "", None)
            node.bodies = tuple(SimGraph() for _ in range(size))
            node.cond = (cond_kind, size, handle)
            return node, list(node.bodies)
        raise error(CUDA_ERROR_INVALID_VALUE, "cuGraphAddNode", f"unknown node kind {kind!r}")

    # graphs -----------------------------------------------------------------
    def graph_node_count(self, graph: SimGraph) -> int:
        self._live(graph, "cuGraphGetNodes")
        return len(graph.nodes)

    def graph_topology(
        self, graph: SimGraph, details: bool = True
    ) -> tuple[list[NodeInfo], list[tuple[int, int]]]:
        self._live(graph, "cuGraphGetNodes")
        if not details:
            return [NodeInfo(n, "", "", ()) for n in graph.nodes], []
        index = {id(n): i for i, n in enumerate(graph.nodes)}
        nodes = [
            NodeInfo(n, n.kind, n.label, n.bodies if n.kind == "conditional" else ()) for n in graph.nodes
        ]
        edges = [(index[id(d)], i) for i, n in enumerate(graph.nodes) for d in n.deps if id(d) in index]
        return nodes, edges

    def graph_instantiate(self, graph: SimGraph, auto_free: bool) -> SimExec:
        self._faults.check("instantiate")
        self._live(graph, "cuGraphInstantiate")
        self._unsafe(0, "cuGraphInstantiate")
        made, used = condition_handles(graph)
        if made - used:  # the driver refuses a handle no conditional node uses
            raise error(
                CUDA_ERROR_INVALID_VALUE,
                "cuGraphInstantiate",
                "a conditional handle is not used by any conditional node",
            )
        return self._track(SimExec(graph, self._conditions, auto_free))

    def graph_update(
        self, exec_: SimExec, target: Any, params: KernelLaunch | Copy | bool | None = None
    ) -> None:
        self._faults.check("update")
        if type(params) is bool:
            self._switch(exec_, target, params)
            return
        if params is None:  # whole-graph update: CUDA's checks, then the new nodes
            self._live(exec_, "cuGraphExecUpdate")
            self._live(target, "cuGraphExecUpdate")
            new = target.nodes
            if not updatable(exec_.nodes, new):
                # what the cuda backend raises: cuda.bindings drops the driver's result
                # info when cuGraphExecUpdate fails (Graph.update then finds the difference)
                raise UpdateError(UPDATE_REASONS[1])
            exec_.take(target, self._conditions)
            return
        call = (
            "cuGraphExecKernelNodeSetParams"
            if isinstance(params, KernelLaunch)
            else "cuGraphExecMemcpyNodeSetParams"
        )
        self._live(exec_, call)
        at = exec_.position.get(id(target))
        if at is None:
            raise error(CUDA_ERROR_INVALID_VALUE, call, "the node is not in the instantiated graph")
        i = at
        kind = exec_.nodes[i].kind
        if isinstance(params, KernelLaunch):
            if kind != "kernel":
                raise error(CUDA_ERROR_INVALID_VALUE, call, f"node {i} is a {kind} node")
            work = self._kernel_work(params)
        else:
            if kind != "memcpy":
                raise error(CUDA_ERROR_INVALID_VALUE, call, f"node {i} is a {kind} node")
            # the memory operands' mappings must not change: pool memory and cuMemAlloc memory
            # cannot replace each other (measured on an H100)
            old = exec_.nodes[i].params
            if old is not None:
                for now, then in ((params.dst, old[0]), (params.src, old[1])):
                    if self._memory.kind(now) != self._memory.kind(then):
                        raise error(
                            CUDA_ERROR_INVALID_VALUE,
                            call,
                            f"0x{now:x} is {self._memory.kind(now)} memory, the node copied "
                            f"{self._memory.kind(then)} memory at instantiation (the memory "
                            "operands' mappings changed)",
                        )
            work = self._dtod(params.dst, params.src, params.nbytes)
        if i in exec_.off:  # (a switched-off node stays off: its new parameters run once it is on)
            exec_.off[i] = work
        else:
            exec_.works[i] = work

    def _switch(self, exec_: SimExec, node: Any, enabled: bool) -> None:
        """Switch ``node`` of ``exec_`` on or off (cuGraphNodeSetEnabled)."""
        call = "cuGraphNodeSetEnabled"
        self._live(exec_, call)
        i = exec_.position.get(id(node))
        if i is None:
            raise error(CUDA_ERROR_INVALID_VALUE, call, "the node is not in the instantiated graph")
        if exec_.nodes[i].kind not in ("kernel", "memcpy", "memset"):
            raise error(CUDA_ERROR_INVALID_VALUE, call, f"node {i} is a {exec_.nodes[i].kind} node")
        exec_.switch(i, enabled)

    def graph_repoint(
        self,
        exec_: SimExec,
        graph: SimGraph,
        moves: Sequence[tuple[int, int, int]],
        skip: set[int],
        patch: bool,
    ) -> list[int]:
        self._live(exec_, "cuGraphExecKernelNodeSetParams")
        self._live(graph, "cuGraphKernelNodeGetParams")
        changes = repointed(graph, moves, skip)
        if patch:
            for i, launch in changes:
                exec_.works[i] = self._kernel_work(launch)
        return [i for i, _ in changes]

    def graph_addresses(
        self, graph: SimGraph, skip: set[int]
    ) -> tuple[list[tuple[int, list[int]]], list[tuple[int, str]]]:
        self._live(graph, "cuGraphKernelNodeGetParams")
        return addresses(graph, skip)

    def memory_range(self, ptr: int) -> tuple[int, int] | None:
        return self._memory.range_of(ptr)

    def graph_launch(self, exec_: SimExec, stream: SimStream, upload: bool = False) -> None:
        self._faults.check("upload" if upload else "graph_launch")
        if upload:
            self._live(exec_, "cuGraphUpload")
            self._live(stream, "cuGraphUpload")
            return
        self._live(exec_, "cuGraphLaunch")
        if stream.capture is not None:
            self._invalidate([stream], "cuGraphLaunch")
        if exec_.unfreed:
            if exec_.outstanding and not exec_.auto_free:
                raise error(
                    CUDA_ERROR_INVALID_VALUE,
                    "cuGraphLaunch",
                    "the graph's memory from its last launch was not freed: free it, "
                    "or instantiate with auto-free on launch",
                )
            if exec_.outstanding:  # auto-free: freed, then allocated anew (contents lost)
                for ptr in exec_.unfreed:
                    buf = self._memory.buffers.get(ptr)
                    if buf is not None:
                        buf.fill(POISON)
            exec_.outstanding = True
        # the launch runs the executable as it is now: later node updates and
        # whole-graph updates apply to later launches only, as on the driver
        nodes, works, conditions = list(exec_.nodes), dict(exec_.works), list(exec_.conditions)
        table = self._conditions
        self._submit(stream, "cuGraphLaunch", "child", "", lambda: run_nodes(nodes, works, conditions, table))
