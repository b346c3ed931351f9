"""The ``sim`` backend: a CPU simulation of a CUDA device, in numpy.

It is the living spec of the library's behaviour on machines without a GPU:

* device memory is a set of numpy byte buffers at fake aligned addresses; a
  freed address goes to the next allocation that fits, lowest first, as the
  driver's (:attr:`SimBackend.reuse_addresses` turns that off, so a stale
  pointer always fails loudly with ``CUDA_ERROR_ILLEGAL_ADDRESS``);
* fresh allocations are filled with a poison byte, as real device memory
  holds whatever was there before;
* streams are queues: queued work runs only when something forces it (a
  synchronize or query of the stream, device or event, a download into
  pageable memory, a wait on an event of another stream, which first runs
  that stream up to the event, destroying the stream, or more than
  ``_MAX_PENDING`` items pending); a device synchronize runs the streams in
  an interleaving drawn from ``CUDAGRAPHS_SIM_SEED``, so a missing wait
  between two streams gives wrong results instead of passing by luck;
* device addresses are resolved when work runs: touching freed memory (that
  no allocation took again) then raises CUDA_ERROR_ILLEGAL_ADDRESS and, as on
  a GPU, leaves the context unusable until :meth:`SimBackend.reset` (tests
  reset it); a free (``cuMemFreeAsync``) runs in its stream's order, as the
  driver's (at once on an idle stream), and a graph's memory keeps its
  address while the graph lives;
* pageable host memory is staged when an upload is queued, and a download
  into it completes before the call returns (the driver's rules); pinned
  memory is read and written when the copy runs;
* a graph launch runs the executable as it was at launch time (node and
  whole-graph updates apply to later launches);
* kernels run their host implementation on numpy views of device memory;
* while a stream is captured, work is recorded as graph nodes instead of run,
  and the calls the driver refuses during a capture (the table ``RULES``)
  fail with the driver's code and invalidate the captures the driver would;
* what the driver holds by pointer (host callbacks, the events of graph
  nodes, pinned host memory of copy nodes) must still live when it is used;
* an H100's launch limits, and graph memory that outlives a launch, are
  refused as the driver refuses them;
* :meth:`SimBackend.inject` makes the N-th call of a kind (``FAULTS``) fail
  with the driver's code, and :meth:`SimBackend.live_handles` counts driver
  objects made and not destroyed, for fault sweeps;
* errors carry CUDA's result codes (invalid value, out of memory, ...);
* threads may use it at once, as they use the driver: every primitive runs
  holding one re-entrant lock (so work it runs, a host function or a
  kernel's host code, may call the backend again), let go only while the
  host waits for another process.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import ctypes
import dataclasses
import functools
import itertools
import random
import threading
import time
import weakref
from collections.abc import Callable, Generator, Iterator, Sequence
from types import FunctionType, GeneratorType
from typing import Any, TypeVar

import numpy as np

from .._config import settings
from .._errors import BackendUnavailableError, CudaError, UpdateError
from . import base
from .base import (
    CUDA_ERROR_ILLEGAL_ADDRESS,
    CUDA_ERROR_ILLEGAL_STATE,
    CUDA_ERROR_INVALID_DEVICE,
    CUDA_ERROR_INVALID_HANDLE,
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
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
    Capabilities,
    Copy,
    DeviceProperties,
    KernelLaunch,
    NodeInfo,
    move_words,
)

__all__ = ["FAULTS", "RULES", "Rule", "SimBackend", "set_conditional"]

POISON = 0xCD
_PLAIN_NODES = frozenset(("empty", "host", "event_record", "event_wait", "mem_alloc", "mem_free"))
_H = TypeVar("_H")  # a handle type
_R = TypeVar("_R")
_C = TypeVar("_C", bound=type)
_ALIGN = 512
_MAX_PENDING = 4096  # queued items per stream before the simulated device catches up
_BASE_ADDRESS = 0x7F00_0000_0000


@dataclasses.dataclass(frozen=True)
class Rule:
    """One call the driver refuses while a capture is active.

    Attributes
    ----------
    call : str
        The driver call.
    target : str
        What it acts on, relative to the capture (``"the capturing stream"``,
        ``"another stream"``, ...).
    refused_in : tuple of str
        The capture modes, of a capture by the calling thread, in which the
        call is refused (it succeeds in the others).
    code : int
        The error code of a refusal.
    invalidates : bool
        Whether a refusal also invalidates that capture (ending it then fails
        with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED).
    other_refused_in : tuple of str
        The capture modes in which the same call made by *another* thread is
        refused.
    other_invalidates_in : tuple of str
        The capture modes in which that refusal invalidates the capture.
    """

    call: str
    target: str
    refused_in: tuple[str, ...]
    code: int
    invalidates: bool
    other_refused_in: tuple[str, ...] = ()
    other_invalidates_in: tuple[str, ...] = ()


_ALL, _UNSAFE, _GLOBAL = ("global", "thread_local", "relaxed"), ("global", "thread_local"), ("global",)
_NO = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
RULES: tuple[Rule, ...] = (
    Rule("cuStreamSynchronize", "the capturing stream", _ALL, _NO, True, _ALL, _ALL),
    Rule("cuStreamQuery", "the capturing stream", _ALL, _NO, True, _ALL, _ALL),
    Rule("cuCtxSynchronize", "the device", _ALL, _NO, True, _ALL, _ALL),
    Rule("cuStreamSynchronize", "another stream", _UNSAFE, _NO, True, _GLOBAL, _GLOBAL),
    Rule("cuEventSynchronize", "an event recorded before the capture", _UNSAFE, _NO, True, _GLOBAL, _GLOBAL),
    Rule("cuGraphExecDestroy", "another graph's executable", _UNSAFE, _NO, True, _GLOBAL, _GLOBAL),
    Rule("cuEventDestroy", "an event", (), _NO, False),
    Rule("cuStreamDestroy", "another stream", (), _NO, False),
    Rule("cuMemAllocFromPoolAsync", "another stream", _UNSAFE, _NO, True, _GLOBAL, _GLOBAL),
    Rule("cuMemFreeAsync", "another stream", _UNSAFE, _NO, True, _GLOBAL, _GLOBAL),
    Rule("cuMemHostAlloc", "host memory", _UNSAFE, _NO, True, _GLOBAL, _GLOBAL),
    Rule("cuMemFreeHost", "host memory", _UNSAFE, _NO, True, _GLOBAL, _GLOBAL),
    Rule("cuMemcpyHtoDAsync", "the capturing stream, from pageable memory", (), _NO, False),
    Rule("cuMemcpyDtoHAsync", "the capturing stream, to pageable memory", (), _NO, False),
    Rule("cuGraphLaunch", "the capturing stream", _ALL, _NO, True, _ALL, _ALL),
    Rule("cuGraphInstantiate", "another graph", _UNSAFE, _NO, True, _GLOBAL, _GLOBAL),
    Rule("cuModuleLoadData", "a new module (compiling and loading a kernel)", (), _NO, False),
    # measured on two H200s: a copy between devices staged by the driver is refused on a
    # capturing stream (the rows' test needs two devices)
    Rule("cuMemcpyPeerAsync", "the capturing stream", _ALL, _NO, True, _ALL, _ALL),
    # a wait may join two captured streams, never reach outside the capture (measured on an
    # H100: a capturing stream waiting for an event recorded on an uncaptured stream)
    Rule(
        "cuStreamWaitEvent",
        "an event recorded outside the capture",
        _ALL,
        CUDA_ERROR_STREAM_CAPTURE_ISOLATION,
        True,
        _ALL,
        _ALL,
    ),
)
"""What the simulated driver refuses while a capture is active, one row per call.

A call refused in ``global`` and ``thread_local`` mode only is an *unsafe
call* in CUDA's terms: it fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
and invalidates every capture on the device whose mode forbids it to the
calling thread (``global`` captures from any thread, ``thread_local``
captures from their own thread, ``relaxed`` captures never); a thread whose
capture mode was exchanged to ``relaxed`` may make unsafe calls. Every row is
checked against the driver by ``tests/test_rules.py`` on a GPU (measured on an
H100, driver 580: destroying events and other streams and copying pageable
memory are legal during a capture; the library still defers those releases
and refuses pageable copies in captures, for lifetime reasons of its own; a
device synchronize from any thread invalidates every capture on the device,
whatever its mode, which is why the library refuses it before the driver
sees it).
"""


def _error(code: int, call: str, detail: str) -> CudaError:
    return CudaError(code, base.ERROR_NAMES[code], call, detail)


CONDITIONS: dict[int, int] = {}
"""Current values of the conditional handles of live graphs."""
_COND_REFS: dict[int, int] = {}  # handle -> graphs/executables that own it
_handles = itertools.count(1)
_cond_lock = threading.Lock()


def set_conditional(handle: int, value: int) -> None:
    """``cudaGraphSetConditional`` of the simulated device (for kernels' host code)."""
    CONDITIONS[int(handle)] = int(value) & 0xFFFFFFFF


def _own(conditions: Sequence[tuple[int, int]]) -> None:
    with _cond_lock:
        for handle, _ in conditions:
            _COND_REFS[handle] = _COND_REFS.get(handle, 0) + 1


def _disown(conditions: Sequence[tuple[int, int]]) -> None:
    with _cond_lock:
        for handle, _ in conditions:
            left = _COND_REFS.get(handle, 1) - 1
            if left <= 0:
                _COND_REFS.pop(handle, None)
                CONDITIONS.pop(handle, None)
            else:
                _COND_REFS[handle] = left


class _SimNode:
    """One node; immutable once recorded (executables patch copies of the work)."""

    __slots__ = ("bodies", "call", "cond", "deps", "kind", "label", "params", "work")

    def __init__(self, kind: str, label: str, work: Callable[[], Any] | None, deps: list[_SimNode]) -> None:
        self.kind, self.label, self.work, self.deps = kind, label, work, deps
        self.call = ""  # the driver call that recorded it (a copy's: which memory it joins)
        # what the driver keeps of the node: a KernelLaunch, or the addresses (first, last)
        # a copy or memset touches
        self.params: Any = None
        self.bodies: tuple[_SimGraph, ...] = ()
        self.cond: tuple[str, int, int] | None = None  # (kind, size, handle)

    def __int__(self) -> int:
        return id(self)

    def __index__(self) -> int:
        return id(self)


class _SimGraph:
    """A recorded graph: nodes in creation order, a valid order to run them in."""

    __slots__ = ("alive", "allocations", "conditions", "freed", "nodes", "origin")

    def __init__(self) -> None:
        self.nodes: list[_SimNode] = []
        self.origin: _SimStream | None = None  # the stream whose capture records it (while it does)
        self.allocations: list[int] = []  # graph-owned memory (mem_alloc nodes)
        self.freed: list[int] = []  # those a mem_free node of the graph frees
        self.conditions: list[tuple[int, int]] = []  # (handle, default) created in it
        self.alive = True

    def copy(self) -> _SimGraph:
        """What the driver does to a graph added as a child node: a copy."""
        other = _SimGraph()
        other.nodes = list(self.nodes)
        other.conditions = list(self.conditions)
        _own(other.conditions)
        return other


def _ancestors(nodes: Sequence[_SimNode]) -> set[int]:
    """The ids of ``nodes`` and of every node they depend on."""
    seen: set[int] = set()
    todo = list(nodes)
    while todo:
        node = todo.pop()
        if id(node) not in seen:
            seen.add(id(node))
            todo.extend(node.deps)
    return seen


def _edges(nodes: Sequence[_SimNode]) -> set[tuple[int, int]]:
    """The dependencies among ``nodes`` as (from, to) indices."""
    index = {id(n): i for i, n in enumerate(nodes)}
    return {(index[id(d)], i) for i, n in enumerate(nodes) for d in n.deps if id(d) in index}


def _updatable(old: Sequence[_SimNode], new: Sequence[_SimNode]) -> bool:
    """Whether cuGraphExecUpdate takes the nodes ``new`` for an executable of ``old``.

    The driver's conditions on the topology: the same nodes (types, in
    order) with the same edges, child and conditional bodies alike, and
    copies between the same kinds of memory (a host-to-device copy cannot
    become a device-to-host one).
    """
    if len(old) != len(new) or _edges(old) != _edges(new):
        return False
    for a, b in zip(old, new):
        if a.kind != b.kind or (a.cond or ())[:2] != (b.cond or ())[:2]:  # (kind, bodies)
            return False
        if a.kind == "memcpy" and a.call != b.call:
            return False
        if len(a.bodies) != len(b.bodies) or not all(
            _updatable(x.nodes, y.nodes) for x, y in zip(a.bodies, b.bodies)
        ):
            return False
    return True


class Rendezvous:
    """Work of several streams that completes only together.

    (A collective of ``sim``'s simulated communicator.) A stream whose work
    waits on one stops there, and the other streams run until it is
    :attr:`done` (see :meth:`SimBackend._run`).
    """

    done: bool = False
    #: Set where work of another process can complete it (a collective with
    #: ranks in other processes): how many seconds a wait for the host waits
    #: for that work before it gives up (from when the host starts waiting).
    patience: float | None = None

    def poll(self) -> bool:
        """Whether it is done, taking in what other processes handed in."""
        return self.done

    def describe(self) -> str:
        """What it still waits for (for the error when nothing else can run)."""
        return "work of other streams"

    def stuck(self) -> BaseException:
        """The error raised when no stream can run to complete it (on a GPU: a hang)."""
        return _error(CUDA_ERROR_ILLEGAL_STATE, "cuStreamSynchronize", f"waits forever for {self.describe()}")


class _AnyOf(Rendezvous):
    """Done when any of several rendezvous is (a graph whose branches all stopped)."""

    def __init__(self, parts: list[Rendezvous]) -> None:
        self.parts = parts

    @property
    def done(self) -> bool:  # type: ignore[override]
        return any(rv.done for rv in self.parts)

    @property
    def patience(self) -> float | None:  # type: ignore[override]
        times = [rv.patience for rv in self.parts if rv.patience is not None]
        return max(times) if times else None

    def poll(self) -> bool:
        polled = [rv.poll() for rv in self.parts]  # (each takes in what came)
        return any(polled)

    def describe(self) -> str:
        return " or ".join(rv.describe() for rv in self.parts)

    def stuck(self) -> BaseException:
        return self.parts[0].stuck()


Waiting = Generator[Rendezvous, None, None]  # work that may stop until rendezvous are done


def _run_nodes(
    nodes: Sequence[_SimNode], works: dict[int, Callable[[], Any]], conditions: Sequence[tuple[int, int]]
) -> Waiting:
    """One execution: conditions take their defaults, then the nodes run in order.

    A node whose work waits on a :class:`Rendezvous` lets the nodes that do
    not depend on it run first (a graph with one collective node per device
    completes it by itself); when none can, the execution waits with it.
    """
    for handle, default in conditions:
        CONDITIONS[handle] = default
    here = {id(n) for n in nodes}
    finished: set[int] = set()
    stopped: dict[int, tuple[Waiting, Rendezvous]] = {}  # node index -> its work, where it stopped
    pending = list(range(len(nodes)))
    while pending:
        rest: list[int] = []
        progressed = False
        for i in pending:
            node = nodes[i]
            if any(id(d) in here and id(d) not in finished for d in node.deps):
                rest.append(i)
                continue
            entry = stopped.pop(i, None)
            if entry is not None and not entry[1].done:
                stopped[i] = entry  # still waiting: not resumed
                rest.append(i)
                continue
            run = entry[0] if entry is not None else _run_node(node, works.get(i, node.work))
            if run is not None:
                waiting = next((rv for rv in run if not rv.done), None)
                if waiting is not None:
                    stopped[i] = (run, waiting)
                    rest.append(i)
                    continue
            finished.add(id(node))
            progressed = True
        if rest and not progressed:  # nothing here can run until one of them is done
            parts = [rv for _, rv in stopped.values()]
            yield parts[0] if len(parts) == 1 else _AnyOf(parts)
        pending = rest


def _run_node(node: _SimNode, work: Callable[[], Any] | None) -> Waiting | None:
    if node.kind == "conditional":
        return _run_conditional(node)
    if node.kind == "child":
        child = node.bodies[0]
        return _run_nodes(child.nodes, {}, child.conditions)
    if work is not None:
        out = work()
        if isinstance(out, GeneratorType):
            return out
    return None


def _run_conditional(node: _SimNode) -> Waiting:
    assert node.cond is not None
    kind, size, handle = node.cond
    bodies = node.bodies

    def run(body: _SimGraph) -> Waiting:
        return _run_nodes(body.nodes, {}, ())

    if kind == "while":
        while CONDITIONS.get(handle, 0):
            yield from run(bodies[0])
    elif kind == "if":
        if CONDITIONS.get(handle, 0):
            yield from run(bodies[0])
        elif size == 2:
            yield from run(bodies[1])
    else:
        index = CONDITIONS.get(handle, 0)
        if 0 <= index < size:  # out of range: no branch runs
            yield from run(bodies[index])


class _SimExec:
    """An instantiated graph: its own node list, patched by node updates."""

    __slots__ = (
        "alive",
        "auto_free",
        "conditions",
        "nodes",
        "off",
        "outstanding",
        "position",
        "unfreed",
        "works",
    )

    def __init__(self, graph: _SimGraph, auto_free: bool = False) -> None:
        self.nodes = list(graph.nodes)
        # graph memory no node of the graph frees: it outlives a launch, and a
        # relaunch needs it freed first (by the user, or by auto_free)
        self.unfreed = [p for p in graph.allocations if p not in graph.freed]
        self.auto_free = auto_free
        self.outstanding = False
        self.position = {id(n): i for i, n in enumerate(graph.nodes)}  # instantiated-from nodes
        self.works: dict[int, Callable[[], None]] = {}
        self.off: dict[int, Callable[[], None] | None] = {}  # switched-off nodes: their work
        self.conditions = list(graph.conditions)
        _own(self.conditions)
        self.alive = True


class _SimStream:
    __slots__ = (
        "address",
        "alive",
        "capture",
        "current",
        "deps",
        "done",
        "failed",
        "invalidated",
        "issued",
        "mode",
        "ordinal",
        "owned",
        "queue",
        "thread",
        "waiting",
    )

    def __init__(self, address: int, ordinal: int, owned: bool = True) -> None:
        self.address = address
        self.ordinal = ordinal
        self.alive = True
        self.owned = owned
        self.queue: collections.deque[Callable[[], Any]] = collections.deque()  # pending work
        self.issued = 0  # items ever queued
        self.done = 0  # items run
        self.current: Waiting | None = None  # the item that stopped at a rendezvous
        self.waiting: Rendezvous | None = None  # and that rendezvous
        self.failed: BaseException | None = None  # work started early raised it (see start)
        self.capture: _SimGraph | None = None  # the graph being recorded
        self.mode = "thread_local"
        self.invalidated = False
        self.thread = 0
        self.deps: list[_SimNode] = []  # what the next captured node depends on

    def __int__(self) -> int:
        return self.address

    def record(self, kind: str, label: str, work: Callable[[], Any] | None) -> _SimNode:
        """Add a node to the graph being captured, after the current dependencies."""
        graph = self.capture
        assert graph is not None
        node = _SimNode(kind, label, work, list(self.deps))
        graph.nodes.append(node)
        self.deps = [node]
        return node


class _SimEvent:
    __slots__ = (
        "alive",
        "captured",
        "deps",
        "graph",
        "ordinal",
        "recorded",
        "seq",
        "stream",
        "time",
        "timing",
    )

    def __init__(self, ordinal: int, timing: bool) -> None:
        self.ordinal = ordinal
        self.timing = timing
        self.time = 0.0
        self.recorded = False
        self.alive = True
        self.captured = False  # last recorded on a capturing stream (a wait then joins that capture)
        self.stream: _SimStream | None = None  # where it was last recorded (uncaptured)
        self.seq = 0  # and after how many of that stream's items it completes
        self.graph: _SimGraph | None = None  # the capture it was last recorded in
        self.deps: list[_SimNode] = []  # and the nodes a wait on it depends on


# an H100's launch limits (the driver answers CUDA_ERROR_INVALID_VALUE beyond them)
MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_BLOCK = (1024, 1024, 64)
MAX_THREADS_PER_BLOCK = 1024
MAX_SHARED_MEM = 48 << 10  # per block, without opting in to more


def _check_dims(launch: KernelLaunch) -> None:
    grid, block, shared = launch.grid, launch.block, launch.shared_mem
    why = None
    if any(g > m for g, m in zip(grid, MAX_GRID)):
        why = f"grid {grid} exceeds the device's {MAX_GRID}"
    elif any(b > m for b, m in zip(block, MAX_BLOCK)):
        why = f"block {block} exceeds the device's {MAX_BLOCK}"
    elif block[0] * block[1] * block[2] > MAX_THREADS_PER_BLOCK:
        why = f"block {block} has more than {MAX_THREADS_PER_BLOCK} threads"
    elif shared > MAX_SHARED_MEM:
        why = f"{shared} B of shared memory exceeds the {MAX_SHARED_MEM} B a block gets"
    if why is not None:
        raise _error(CUDA_ERROR_INVALID_VALUE, "cuLaunchKernel", why)


class _HostCallback:
    """What :meth:`SimBackend.launch_host` returns (the driver's C callback)."""

    __slots__ = ("__weakref__", "fn")

    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn = fn


class _SimFunction:
    __slots__ = ("host", "name", "params")

    def __init__(self, name: str, params: Sequence[base.Param], host: Callable[..., object] | None) -> None:
        self.name, self.params, self.host = name, list(params), host


def _nothing() -> None:
    """The work of a switched-off node."""


class _Memory:
    """All simulated device allocations of the process (addresses are global)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.starts: list[int] = []
        self.buffers: dict[int, np.ndarray] = {}
        self.owner: dict[int, tuple[int, int]] = {}  # start -> (device ordinal, bytes)
        self.used: dict[int, int] = {}  # ordinal -> bytes
        self.plain: set[int] = set()  # starts of memory outside the stream-ordered pool
        self.next = _BASE_ADDRESS  # above every address handed out
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
        with self.lock:
            used = self.used.get(ordinal, 0)
            if used + nbytes > limit:
                raise _error(
                    CUDA_ERROR_OUT_OF_MEMORY,
                    "cuMemAllocFromPoolAsync",
                    f"{nbytes} B requested, {limit - used} B free on sim device {ordinal}",
                )
            span = max(_ALIGN, -(-nbytes // _ALIGN) * _ALIGN)
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
        with self.lock:
            if self.buffers.pop(ptr, None) is None:
                raise _error(
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
        raise _error(
            CUDA_ERROR_ILLEGAL_ADDRESS,
            call,
            f"[0x{ptr:x}, +{nbytes}) is not inside a live sim allocation "
            "(freed memory or an out-of-bounds pointer)",
        )


def _host_bytes(address: int, nbytes: int) -> np.ndarray:
    """Host memory at ``address`` as a uint8 array (the caller keeps it alive)."""
    if not nbytes:
        return np.empty(0, np.uint8)
    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address))


FAULTS: dict[str, tuple[str, int]] = {
    "alloc": ("cuMemAllocFromPoolAsync", CUDA_ERROR_OUT_OF_MEMORY),
    "host_alloc": ("cuMemHostAlloc", CUDA_ERROR_OUT_OF_MEMORY),
    "launch": ("cuLaunchKernel", CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES),
    "copy": ("cuMemcpyAsync", CUDA_ERROR_INVALID_VALUE),
    "memset": ("cuMemsetD8Async", CUDA_ERROR_INVALID_VALUE),
    "event": ("cuEventCreate", CUDA_ERROR_OUT_OF_MEMORY),
    "record": ("cuEventRecord", CUDA_ERROR_INVALID_HANDLE),
    "wait": ("cuStreamWaitEvent", CUDA_ERROR_INVALID_HANDLE),
    "stream": ("cuStreamCreate", CUDA_ERROR_OUT_OF_MEMORY),
    "instantiate": ("cuGraphInstantiate", CUDA_ERROR_OUT_OF_MEMORY),
    "update": ("cuGraphExecUpdate", CUDA_ERROR_INVALID_VALUE),
    "upload": ("cuGraphUpload", CUDA_ERROR_OUT_OF_MEMORY),
    "graph_launch": ("cuGraphLaunch", CUDA_ERROR_OUT_OF_MEMORY),
}
"""The calls :meth:`SimBackend.inject` can make fail: kind -> (driver call, its code)."""


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
    """CPU simulation of the CUDA primitives in :class:`~.base.Backend`.

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
        self._memory = _Memory()
        self._host: dict[int, np.ndarray] = {}  # pinned host allocations
        self._addresses = itertools.count(0x5000, 0x10)
        # held by every public primitive (see _serialized): the state below is shared by
        # the threads; re-entrant, as work the scheduler runs may call the backend again
        self._lock = threading.RLock()
        self._idle = threading.Condition(self._lock)  # (waits that let the lock go)
        self._capturing: set[_SimStream] = set()
        # streams whose work runs (up the call stack) -> the thread running it
        self._stepping: dict[_SimStream, int] = {}
        self._query = threading.local()  # .depth > 0 in a query of this thread (see _looking)
        self._thread = threading.local()  # this thread's capture-mode setting
        self._streams: list[_SimStream] = []  # every live stream (for device synchronize)
        self._sticky: CudaError | None = None  # a fault that broke the context (see reset)
        self._faults: dict[str, int] = {}  # kind -> calls left until it fails (inject)
        self._handles: dict[int, Any] = {}  # id -> graphs, executables, events, streams made
        self._peers: set[tuple[int, int]] = set()  # (device, peer whose memory it may reach)
        self.seed = settings().sim_seed
        self._order = random.Random(self.seed)

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

    # the queues -------------------------------------------------------------
    def _queue(self, stream: _SimStream, work: Callable[[], Any]) -> int:
        """Queue ``work`` on ``stream``; returns the count its completion reaches."""
        stream.queue.append(work)
        stream.issued += 1
        if len(stream.queue) > _MAX_PENDING:  # memory pressure: the device catches up
            self._run(stream, wait=False)  # (up to work that waits on other streams' work)
        return stream.issued

    def _run(self, stream: _SimStream, upto: int | None = None, wait: bool = True) -> bool:
        """Run ``stream``'s queued work (up to its ``upto``-th item).

        Work that waits on a :class:`Rendezvous` stops there while the other
        streams run (in a seeded order) until it is done; when none of them
        can run, the rendezvous can never complete: its error is raised (on a
        GPU, the streams would hang). Returns whether it got there: not
        without ``wait``, or in a query, when the work waits on another
        process's.
        """
        self._check_context()
        me = threading.get_ident()
        while self._stepping.get(stream, me) != me:  # another thread runs its work and waits
            self._idle.wait()  # for another process: until it is done with the stream
        if stream.failed is not None:  # (raised where the host next looks at the stream)
            err, stream.failed = stream.failed, None
            raise err
        while (stream.queue or stream.current is not None) and (upto is None or stream.done < upto):
            self._step(stream)
            rv = stream.waiting
            if rv is not None and not rv.done and not (wait and self._progress(rv)):
                return False
        return True

    def _step(self, stream: _SimStream) -> None:
        """Run ``stream``'s next item, or resume the one that stopped, until it stops again."""
        self._stepping[stream] = threading.get_ident()
        try:
            run = stream.current
            if run is None:
                work = stream.queue.popleft()
                out = work()
                if not isinstance(out, GeneratorType):
                    stream.done += 1
                    return
                run = stream.current = out
            elif stream.waiting is not None and not stream.waiting.done:
                return
            stream.waiting = next((rv for rv in run if not rv.done), None)
            if stream.waiting is None:
                stream.current = None
                stream.done += 1
        except BaseException as err:  # the item is consumed (a stopped one abandoned)
            stream.current = stream.waiting = None
            stream.done += 1
            if isinstance(err, CudaError) and err.code in (
                CUDA_ERROR_ILLEGAL_ADDRESS,
                CUDA_ERROR_MISALIGNED_ADDRESS,
            ):
                # a device fault: the context is lost
                self._sticky = _error(
                    err.code,
                    err.call,
                    f"an earlier kernel or copy faulted ({err}); the sim context is "
                    "unusable until it is reset (a GPU's, until the process restarts): "
                    "call device.backend.reset()",
                )
                for st in self._streams:
                    st.queue.clear()
                    st.current = st.waiting = None
            raise
        finally:
            self._stepping.pop(stream, None)
            self._idle.notify_all()

    def _progress(self, rv: Rendezvous) -> bool:
        """Run the other streams' work, one item at a time, until ``rv`` is done.

        When none can run, what other processes hand in may complete a stopped
        one: waited for as long as its patience (in a query, only looked at: False
        if nothing came).
        """
        while not rv.done:
            ready = [
                st
                for st in self._streams
                if st not in self._stepping
                and (st.queue or st.current is not None)
                and (st.waiting is None or st.waiting.done)
            ]
            if ready:
                st = ready[self._order.randrange(len(ready))] if len(ready) > 1 else ready[0]
                self._step(st)
                continue
            outside = [
                st.waiting
                for st in self._streams
                if st.waiting is not None and not st.waiting.done and st.waiting.patience is not None
            ]
            if not outside:
                raise rv.stuck()
            if not self._await_outside(outside):
                if self._querying():
                    return False
                raise rv.stuck()
        return True

    def _await_outside(self, waits: list[Rendezvous]) -> bool:
        """Wait until another process's work completes one of ``waits`` (False: it did not in time)."""
        last = time.monotonic() + max(rv.patience or 0.0 for rv in waits)
        pause = 1e-4
        while True:
            polled = [rv.poll() for rv in waits]  # (each takes in what came)
            if any(polled):
                return True
            if self._querying() or time.monotonic() > last:
                return False
            # the lock is let go meanwhile: the other threads go on (their work may be what
            # the other process waits for before it hands in its part)
            self._idle.wait(pause)
            pause = min(pause * 2, 0.01)

    def _run_device(self, ordinal: int) -> None:
        """Run every stream of the device to its end, in a seeded interleaving."""
        self._check_context()
        while True:
            ready = [
                st for st in self._streams if st.ordinal == ordinal and (st.queue or st.current or st.failed)
            ]
            if not ready:
                return
            st = ready[self._order.randrange(len(ready))] if len(ready) > 1 else ready[0]
            self._run(st, st.done + 1)

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

    def _check_context(self) -> None:
        if self._sticky is not None:
            raise self._sticky

    # fault injection ----------------------------------------------------------
    def inject(self, kind: str, nth: int = 1) -> None:
        """Make the ``nth`` next call of ``kind`` (see :data:`FAULTS`) fail with the driver's code.

        The failing call raises as the driver's would and does nothing else;
        later calls succeed. :meth:`injected` tells whether it fired.

        Raises
        ------
        ValueError
            For an unknown kind or an ``nth`` below 1.
        """
        if kind not in FAULTS:
            raise ValueError(f"unknown fault kind {kind!r}; one of {', '.join(FAULTS)}")
        if type(nth) is not int or nth < 1:
            raise ValueError(f"nth must be an int >= 1, got {nth!r}")
        self._faults[kind] = nth

    def injected(self, kind: str) -> bool:
        """Whether the fault injected for ``kind`` has fired (and is spent)."""
        return kind not in self._faults

    def clear_faults(self) -> None:
        """Forget faults that have not fired."""
        self._faults.clear()

    def _fault(self, kind: str) -> None:
        left = self._faults.get(kind)
        if left is None:
            return
        if left > 1:
            self._faults[kind] = left - 1
            return
        del self._faults[kind]
        call, code = FAULTS[kind]
        raise _error(code, call, f"injected fault ({kind})")

    def reseed(self, seed: int) -> None:
        """Restart the interleaving of stream queues from ``seed`` (to replay an order)."""
        self.seed = seed
        self._order = random.Random(seed)

    def reset(self) -> None:
        """Make a context lost to a device fault usable again (queued work is dropped)."""
        self._sticky = None
        for st in self._streams:
            st.queue.clear()
            st.current = st.waiting = st.failed = None
            st.done = st.issued

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
            raise _error(code, call, f"sim device {ordinal} cannot reach device {peer}'s memory")
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
            raise _error(
                CUDA_ERROR_INVALID_VALUE,
                call,
                f"a copy on sim device {ordinal} joins the memory of devices {sorted(involved)}, "
                f"and peer access {', '.join(f'{a}->{b}' for a, b in missing)} is not enabled",
            )

    # the capture rules ---------------------------------------------------
    def _invalidate(self, streams: Sequence[_SimStream], call: str) -> None:
        for st in streams:
            st.invalidated = True
            if st.capture is not None:  # the whole capture: its forked streams too
                for other in self._capturing:
                    if other.capture is st.capture:
                        other.invalidated = True
        raise _error(
            CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, call, "operation not permitted when stream is capturing"
        )

    def _blocked(self, ordinal: int) -> list[_SimStream]:
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
            raise _error(CUDA_ERROR_INVALID_HANDLE, call, f"{obj!r} is destroyed")
        return obj

    # streams and events -------------------------------------------------
    def stream_create(self, ordinal: int, address: int | None = None) -> _SimStream:
        if address is not None:  # a stream made elsewhere: the same queue as its maker's
            known = next((st for st in self._streams if st.address == address), None)
            if known is not None:
                return known
        if address is None:
            self._fault("stream")
        stream = (
            _SimStream(address, ordinal, owned=False)
            if address is not None
            else _SimStream(next(self._addresses), ordinal)
        )
        self._streams.append(stream)
        return self._track(stream) if stream.owned else stream

    def event_create(self, ordinal: int, timing: bool) -> _SimEvent:
        self._fault("event")
        return self._track(_SimEvent(ordinal, timing))

    def destroy(self, handle: Any) -> None:
        self._destroy(handle)
        self._handles.pop(id(handle), None)

    def _destroy(self, handle: Any) -> None:
        if isinstance(handle, _SimExec):
            self._live(handle, "cuGraphExecDestroy")
            self._unsafe(0, "cuGraphExecDestroy")
            handle.alive = False
            _disown(handle.conditions)
        elif isinstance(handle, _SimGraph):
            self._live(handle, "cuGraphDestroy").alive = False
            _disown(handle.conditions)
            for ptr in handle.allocations:
                self._memory.release_graph(ptr)
            handle.allocations.clear()
        elif isinstance(handle, _SimEvent):  # legal during a capture (see RULES)
            self._live(handle, "cuEventDestroy")
            handle.alive = False
        elif isinstance(handle, _SimStream):
            self._live(handle, "cuStreamDestroy")
            if handle.capture is not None:
                self._invalidate([handle], "cuStreamDestroy")
            self._run(handle)  # the driver lets queued work finish
            handle.alive = False
            if handle in self._streams:
                self._streams.remove(handle)
        else:
            raise _error(CUDA_ERROR_INVALID_HANDLE, "destroy", f"not a sim handle: {handle!r}")

    def synchronize(self, target: Any, block: bool = True) -> bool:
        if isinstance(target, int):  # a device
            if self._capturing and any(st.ordinal == target for st in self._capturing):
                # it would wait for the capturing streams: refused in every mode, from
                # any thread, and every capture on the device is invalidated (measured)
                for st in self._capturing:
                    if st.ordinal == target:
                        st.invalidated = True
                raise _error(
                    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                    "cuCtxSynchronize",
                    "operation not permitted when stream is capturing",
                )
            self._run_device(target)
            return True
        if isinstance(target, _SimStream):
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

    def _forced(self, block: bool, stream: _SimStream, upto: int | None = None) -> bool:
        """Run ``stream`` (to its ``upto``-th item); a query does not wait for other processes."""
        if block:
            return self._run(stream, upto)
        with self._looking():
            return self._run(stream, upto)

    @contextlib.contextmanager
    def _looking(self) -> Iterator[None]:
        """In this thread, until the end: work that waits for other processes is only looked at."""
        self._query.depth = self._querying() + 1
        try:
            yield
        finally:
            self._query.depth -= 1

    def _querying(self) -> int:
        return int(getattr(self._query, "depth", 0))

    def event_record(self, event: _SimEvent, stream: _SimStream, external: bool = False) -> None:
        self._fault("record")
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
            self._check_context()
            event.recorded = False
            event.captured = False
            event.stream, event.seq = stream, self._queue(stream, work)
        else:
            event.captured, event.graph, event.deps = True, stream.capture, list(stream.deps)

    def stream_wait_event(self, stream: _SimStream, event: _SimEvent, external: bool = False) -> None:
        self._fault("wait")
        self._live(event, "cuStreamWaitEvent")
        if stream.capture is not None and external:

            def check() -> None:  # a graph node needs its event alive whenever it runs
                self._live(event, "cuStreamWaitEvent")

            self._submit(stream, "cuStreamWaitEvent", "event_wait", "", check)
            return
        self._live(stream, "cuStreamWaitEvent")
        if stream.capture is not None and event.stream is not None and not event.captured:
            stream.invalidated = True  # (RULES: a dependency on work outside the capture)
            raise _error(
                CUDA_ERROR_STREAM_CAPTURE_ISOLATION,
                "cuStreamWaitEvent",
                "the event was recorded outside the capture: a dependency would cross its boundary",
            )
        if event.captured and event.graph is not None and event.graph.origin is not None:
            self._join(stream, event)
            return
        if stream.capture is not None or event.stream is None:
            return  # (an event of an ended capture, or never recorded: done)
        other, seq, run = event.stream, event.seq, self._run

        def wait() -> Waiting:  # the other stream first runs up to the event
            while not run(other, seq, wait=False):  # (stopped: this stream waits with it)
                assert other.waiting is not None
                yield other.waiting

        self._check_context()
        self._queue(stream, wait)

    def _join(self, stream: _SimStream, event: _SimEvent) -> None:
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
            raise _error(
                CUDA_ERROR_STREAM_CAPTURE_MERGE,
                "cuStreamWaitEvent",
                "the event was recorded in another capture: two captures cannot be merged",
            )
        else:  # a join: the next node depends on both streams' last work
            stream.deps = stream.deps + [n for n in event.deps if n not in stream.deps]

    def _forked(self, graph: _SimGraph) -> list[_SimStream]:
        """The streams forked into the capture of ``graph`` (its origin excluded)."""
        return [st for st in self._capturing if st.capture is graph and st is not graph.origin]

    def event_elapsed_ms(self, start: _SimEvent, end: _SimEvent) -> float:
        call = "cuEventElapsedTime"
        for ev in (start, end):
            self._live(ev, call)
            if not ev.timing or not (ev.recorded or ev.stream is not None):
                raise _error(
                    CUDA_ERROR_INVALID_HANDLE, call, base.ELAPSED_TIME_ERRORS[CUDA_ERROR_INVALID_HANDLE]
                )
        if not (start.recorded and end.recorded):  # recorded, not complete (nothing forced it)
            raise _error(CUDA_ERROR_NOT_READY, call, base.ELAPSED_TIME_ERRORS[CUDA_ERROR_NOT_READY])
        return (end.time - start.time) * 1e3

    def _submit(
        self,
        stream: _SimStream,
        call: str,
        kind: str,
        label: str,
        work: Callable[[], Any] | None,
        params: Any = None,
    ) -> None:
        """Run ``work`` now, or record it as a node (with ``params``) when ``stream`` is capturing."""
        self._live(stream, call)
        if stream.capture is None:
            self._check_context()
            if work is not None:
                self._queue(stream, work)
        elif stream.invalidated:
            raise _error(
                CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
                call,
                "the capture was invalidated by an earlier illegal call",
            )
        else:
            node = stream.record(kind, label, work)
            node.params, node.call = params, call

    # for the simulated communicator (cudagraphs.distributed), not the interface -----------
    def queue_work(self, stream: _SimStream, call: str, label: str, work: Callable[[], Any]) -> None:
        """Queue ``work`` on ``stream`` (a kernel node ``label`` when it is capturing).

        ``work`` may return a generator of :class:`Rendezvous` it waits on.
        """
        self._submit(stream, call, "kernel", label, work)

    def start(self, stream: _SimStream) -> None:
        """Run ``stream``'s queued work now, up to work that waits (a GPU starts it once queued).

        What the work raises is raised where the host next waits for or
        queries the stream, not here.
        """
        with self._looking():
            try:
                self._run(stream, wait=False)
            except Exception as err:  # (kept for later; an interrupt is raised now)
                stream.failed = err

    def device_bytes(self, ptr: int, nbytes: int, call: str) -> np.ndarray:
        """The simulated device memory ``[ptr, ptr + nbytes)`` as a writable uint8 view."""
        buf, off = self._memory.resolve(ptr, nbytes, call)
        return buf[off : off + nbytes]

    # memory -------------------------------------------------------------
    def mem_alloc(self, ordinal: int, nbytes: int, stream: _SimStream | None) -> int:
        self._fault("alloc")
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

    def mem_free(self, ptr: int, stream: _SimStream | None) -> None:
        if stream is None:
            self._unsafe(0, "cuMemFree")
            if ptr not in self._memory.plain:
                raise _error(CUDA_ERROR_INVALID_VALUE, "cuMemFree", f"0x{ptr:x} is not from cuMemAlloc")
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
        self._check_context()
        if stream.done == stream.issued:  # the stream is idle: its free is done at once, and the
            self._memory.free(ptr)  # next allocation that fits gets the address (the driver's)
        else:  # stream-ordered: the work queued before it may still use the memory
            self._queue(stream, lambda: self._memory.free(ptr))

    def mem_pool(
        self, ordinal: int, release_threshold: int | None = None, trim: bool = False
    ) -> tuple[int, int]:
        total = self.device_properties(ordinal).total_memory
        return total - self._memory.used.get(ordinal, 0), total

    def host_alloc(self, nbytes: int) -> int:
        self._fault("host_alloc")
        self._unsafe(0, "cuMemHostAlloc")
        try:
            arr = np.empty(max(nbytes, 1), dtype=np.uint8)
        except (MemoryError, ValueError):  # (the driver fails as the host does: out of memory)
            raise _error(CUDA_ERROR_OUT_OF_MEMORY, "cuMemHostAlloc", f"{nbytes} B of pinned memory") from None
        ptr = arr.ctypes.data
        self._host[ptr] = arr
        return ptr

    def host_free(self, ptr: int) -> None:
        self._unsafe(0, "cuMemFreeHost")
        if self._host.pop(ptr, None) is None:
            raise _error(CUDA_ERROR_INVALID_VALUE, "cuMemFreeHost", f"0x{ptr:x} not pinned")

    def is_pinned(self, address: int, nbytes: int) -> bool:
        """Whether ``[address, address + nbytes)`` lies in live pinned host memory."""
        return self._pinned_at(address, nbytes) is not None

    def _pinned_at(self, address: int, nbytes: int) -> np.ndarray | None:
        """The live pinned allocation holding ``[address, address + nbytes)``, if any."""
        return next(
            (h for p, h in self._host.items() if p <= address and address + nbytes <= p + h.nbytes), None
        )

    def memcpy(self, stream: _SimStream, copy: Copy) -> None:
        self._fault("copy")
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
        staged = _host_bytes(host, nbytes).copy() if pageable and kind == "htod" else None
        pinned_at = self._pinned_at

        def work() -> None:  # device addresses are resolved when the copy runs
            if pinned is not None and pinned_at(host, nbytes) is not pinned:
                # the DMA would touch freed host memory (or whatever reuses its address)
                raise _error(
                    CUDA_ERROR_ILLEGAL_ADDRESS,
                    call,
                    f"pinned host memory at 0x{host:x} was freed before the copy ran",
                )
            buf, off = resolve(device, nbytes, call)
            if kind == "htod":
                buf[off : off + nbytes] = _host_bytes(host, nbytes) if staged is None else staged
            else:
                _host_bytes(host, nbytes)[...] = buf[off : off + nbytes]

        self._submit(stream, call, "memcpy", "", work, (device,))
        if pageable and kind == "dtoh":  # into pageable memory: done when the call returns
            self._run(stream)

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

    def memset(self, dst: int, value: int, nbytes: int, stream: _SimStream) -> None:
        self._fault("memset")
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
            raise _error(
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
        params: Sequence[base.Param],
        host: Callable[..., object] | None,
    ) -> _SimFunction:
        # as cuModuleGetFunction: the compiled image must export the name (a cubin's ELF
        # symbol table holds it between NULs; a C++ kernel's is mangled, _Z<len><name>...)
        if image is not None and b"\0" + name.encode() + b"\0" not in image:
            raise _error(CUDA_ERROR_NOT_FOUND, "cuModuleGetFunction", "named symbol not found")
        return _SimFunction(name, params, host)

    def _kernel_work(self, launch: KernelLaunch) -> Callable[[], None]:
        fn: _SimFunction = launch.function
        host = fn.host
        assert host is not None
        view, resolve = self.view, self._memory.resolve
        args_in = list(zip(launch.views, launch.values, fn.params))

        def work() -> None:
            # views are made when the kernel runs, from the addresses given
            # at launch, as a GPU reads its parameters
            args: list[Any] = []
            for spec, value, p in args_in:
                if not p.pointer:
                    if isinstance(value, bytes):
                        args.append(np.frombuffer(value, dtype=p.dtype)[0])
                    else:
                        args.append(p.dtype.type(value))
                elif spec is not None:
                    args.append(view(*spec))
                elif value:
                    buf, off = resolve(int(value), 0, "kernel access")
                    args.append(buf[off:])
                else:
                    args.append(None)
            host(*args)

        return work

    def launch(self, stream: _SimStream, launch: KernelLaunch) -> None:
        self._fault("launch")
        fn: _SimFunction = launch.function
        if fn.host is None:
            raise BackendUnavailableError(
                f"kernel {fn.name!r} has no host implementation, so it cannot run "
                "on the sim backend: pass host=<numpy function> to cg.Kernel, "
                "or run on the cuda backend"
            )
        _check_dims(launch)
        self._submit(stream, "cuLaunchKernel", "kernel", fn.name, self._kernel_work(launch), launch)

    def launch_host(self, stream: _SimStream, fn: Callable[[], None]) -> object:
        # as the driver, keep only a pointer to the callback: the caller keeps the
        # returned object alive as long as the work (or the graph node) may run
        callback = _HostCallback(fn)
        ref = weakref.ref(callback)

        def work() -> None:
            alive = ref()
            if alive is None:
                raise _error(
                    CUDA_ERROR_ILLEGAL_ADDRESS,
                    "cuLaunchHostFunc",
                    "the host function was freed before it ran: keep the object "
                    "launch_host returned alive while its work or node may run",
                )
            alive.fn()

        self._submit(stream, "cuLaunchHostFunc", "host", "", work)
        return callback

    # stream capture -------------------------------------------------------
    def capture_begin(self, stream: _SimStream, mode: str, graph: Any = None) -> None:
        self._live(stream, "cuStreamBeginCapture")
        if stream.capture is not None:
            raise _error(CUDA_ERROR_ILLEGAL_STATE, "cuStreamBeginCapture", "stream is already capturing")
        stream.capture = graph if graph is not None else self._track(_SimGraph())
        stream.capture.origin = stream
        stream.deps = []
        stream.mode = mode
        stream.invalidated = False
        stream.thread = threading.get_ident()
        self._capturing.add(stream)

    def capture_end(self, stream: _SimStream) -> _SimGraph:
        self._live(stream, "cuStreamEndCapture")
        graph = stream.capture
        if graph is None:
            raise _error(CUDA_ERROR_ILLEGAL_STATE, "cuStreamEndCapture", "stream is not capturing")
        if graph.origin is not stream:
            raise _error(
                CUDA_ERROR_ILLEGAL_STATE,
                "cuStreamEndCapture",
                "the stream was forked into a capture: end it on the stream that began it",
            )
        forked = self._forked(graph)
        unjoined = [st for st in forked if not set(map(id, st.deps)) <= _ancestors(stream.deps)]
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
            raise _error(
                CUDA_ERROR_STREAM_CAPTURE_UNJOINED,
                "cuStreamEndCapture",
                f"{len(unjoined)} stream(s) forked into the capture were not joined back "
                "into the stream that began it",
            )
        if invalidated:
            stream.invalidated = False
            self.destroy(graph)
            raise _error(
                CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
                "cuStreamEndCapture",
                "the capture was invalidated by an earlier illegal call",
            )
        return graph

    def capture_info(self, stream: _SimStream) -> tuple[str, list[_SimNode]]:
        self._live(stream, "cuStreamGetCaptureInfo")
        if stream.capture is None:
            return "none", []
        return ("invalidated" if stream.invalidated else "active"), list(stream.deps)

    def capture_exchange_mode(self, mode: str) -> str:
        old = getattr(self._thread, "mode", "global")
        self._thread.mode = mode
        return old

    def capture_node(self, stream: _SimStream, kind: str, *args: Any) -> Any:
        graph = stream.capture
        if graph is None:
            raise _error(CUDA_ERROR_ILLEGAL_STATE, "cuGraphAddNode", "stream is not capturing")
        if kind == "dependencies":
            (nodes,) = args
            stream.deps = list(nodes)
            return None
        if kind == "condition":
            (default,) = args
            handle = next(_handles)
            graph.conditions.append((handle, default))
            _own([(handle, default)])
            CONDITIONS[handle] = default
            return handle
        if kind == "empty":
            return stream.record("empty", "", None)
        if kind == "child":
            (child,) = args
            self._live(child, "cuGraphAddChildGraphNode")
            node = stream.record("child", "", None)
            node.bodies = (child.copy(),)  # the driver copies the child graph now
            return node
        if kind == "conditional":
            cond_kind, size, handle = args
            node = stream.record("conditional", "", None)
            node.bodies = tuple(_SimGraph() for _ in range(size))
            node.cond = (cond_kind, size, handle)
            return node, list(node.bodies)
        raise _error(CUDA_ERROR_INVALID_VALUE, "cuGraphAddNode", f"unknown node kind {kind!r}")

    # graphs -----------------------------------------------------------------
    def graph_topology(
        self, graph: _SimGraph, details: bool = True
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

    def graph_instantiate(self, graph: _SimGraph, auto_free: bool) -> _SimExec:
        self._fault("instantiate")
        self._live(graph, "cuGraphInstantiate")
        self._unsafe(0, "cuGraphInstantiate")
        made, used = self._conditions(graph)
        if made - used:  # the driver refuses a handle no conditional node uses
            raise _error(
                CUDA_ERROR_INVALID_VALUE,
                "cuGraphInstantiate",
                "a conditional handle is not used by any conditional node",
            )
        return self._track(_SimExec(graph, auto_free))

    def _conditions(self, graph: _SimGraph) -> tuple[set[int], set[int]]:
        """(handles made in ``graph`` and its bodies, handles their conditional nodes use)."""
        made = {h for h, _ in graph.conditions}
        used: set[int] = set()
        for node in graph.nodes:
            if node.cond is not None:
                used.add(node.cond[2])
                for body in node.bodies:
                    m, u = self._conditions(body)
                    made |= m
                    used |= u
        return made, used

    def graph_update(
        self, exec_: _SimExec, target: Any, params: KernelLaunch | Copy | bool | None = None
    ) -> None:
        self._fault("update")
        if type(params) is bool:
            self._switch(exec_, target, params)
            return
        if params is None:  # whole-graph update: CUDA's checks, then the new nodes
            self._live(exec_, "cuGraphExecUpdate")
            self._live(target, "cuGraphExecUpdate")
            new = target.nodes
            if not _updatable(exec_.nodes, new):
                # what the cuda backend raises: cuda.bindings drops the driver's result
                # info when cuGraphExecUpdate fails (Graph.update then finds the difference)
                raise UpdateError(base.UPDATE_REASONS[1])
            exec_.nodes = list(new)
            exec_.works.clear()
            for i in exec_.off:  # (switched-off nodes stay off, with the new graph's work)
                exec_.off[i] = None
                exec_.works[i] = _nothing
            _own(target.conditions)
            _disown(exec_.conditions)
            exec_.conditions = list(target.conditions)
            return
        call = (
            "cuGraphExecKernelNodeSetParams"
            if isinstance(params, KernelLaunch)
            else "cuGraphExecMemcpyNodeSetParams"
        )
        self._live(exec_, call)
        at = exec_.position.get(id(target))
        if at is None:
            raise _error(CUDA_ERROR_INVALID_VALUE, call, "the node is not in the instantiated graph")
        i = at
        kind = exec_.nodes[i].kind
        if isinstance(params, KernelLaunch):
            if kind != "kernel":
                raise _error(CUDA_ERROR_INVALID_VALUE, call, f"node {i} is a {kind} node")
            exec_.works[i] = self._kernel_work(params)
        else:
            if kind != "memcpy":
                raise _error(CUDA_ERROR_INVALID_VALUE, call, f"node {i} is a {kind} node")
            # the memory operands' mappings must not change: pool memory and cuMemAlloc memory
            # cannot replace each other (measured on an H100)
            old = exec_.nodes[i].params
            if old is not None:
                for now, then in ((params.dst, old[0]), (params.src, old[1])):
                    if self._memory.kind(now) != self._memory.kind(then):
                        raise _error(
                            CUDA_ERROR_INVALID_VALUE,
                            call,
                            f"0x{now:x} is {self._memory.kind(now)} memory, the node copied "
                            f"{self._memory.kind(then)} memory at instantiation (the memory "
                            "operands' mappings changed)",
                        )
            if i in exec_.off:
                exec_.off[i] = self._dtod(params.dst, params.src, params.nbytes)
            else:
                exec_.works[i] = self._dtod(params.dst, params.src, params.nbytes)

    def _switch(self, exec_: _SimExec, node: Any, enabled: bool) -> None:
        """Switch ``node`` of ``exec_`` on or off (cuGraphNodeSetEnabled)."""
        call = "cuGraphNodeSetEnabled"
        self._live(exec_, call)
        i = exec_.position.get(id(node))
        if i is None:
            raise _error(CUDA_ERROR_INVALID_VALUE, call, "the node is not in the instantiated graph")
        if exec_.nodes[i].kind not in ("kernel", "memcpy", "memset"):
            raise _error(CUDA_ERROR_INVALID_VALUE, call, f"node {i} is a {exec_.nodes[i].kind} node")
        if not enabled and i not in exec_.off:  # (its work kept, for switching it on again)
            exec_.off[i] = exec_.works.get(i)
            exec_.works[i] = _nothing
        elif enabled and i in exec_.off:
            work = exec_.off.pop(i)
            if work is None:
                exec_.works.pop(i, None)
            else:
                exec_.works[i] = work

    def graph_repoint(
        self,
        exec_: _SimExec,
        graph: _SimGraph,
        moves: Sequence[tuple[int, int, int]],
        skip: set[int],
        patch: bool,
    ) -> list[int]:
        self._live(exec_, "cuGraphExecKernelNodeSetParams")
        self._live(graph, "cuGraphKernelNodeGetParams")

        def moved(value: int) -> int | None:
            out = move_words(int(value).to_bytes(8, "little"), moves)
            return None if out is None else int.from_bytes(out, "little")

        hits: list[int] = []
        changes: list[tuple[int, KernelLaunch]] = []
        for i, node in enumerate(graph.nodes):
            if id(node) in skip or node.kind in _PLAIN_NODES:
                continue
            if node.kind == "kernel":
                launch: KernelLaunch = node.params
                values: list[Any] = []
                views: list[Any] = []
                changed = False
                for value, view, p in zip(launch.values, launch.views, launch.function.params):
                    new: Any = move_words(value, moves) if isinstance(value, bytes) else None
                    if p.pointer and isinstance(value, int):
                        new = moved(value)
                    changed |= new is not None
                    values.append(value if new is None else new)
                    at = None if view is None else moved(view.ptr)
                    views.append(view if view is None or at is None else view._replace(ptr=at))
                if changed:
                    hits.append(i)
                    changes.append((i, launch._replace(values=tuple(values), views=tuple(views))))
            elif node.kind in ("memcpy", "memset"):
                if any(moved(a) is not None for a in node.params):
                    raise UpdateError(f"node {i} ({node.kind}) uses the memory: capture again", i)
            else:
                raise UpdateError(
                    f"node {i} ({node.kind}) may use the memory inside a graph cudagraphs cannot "
                    "see into: capture again",
                    i,
                )
        if patch:
            for i, launch in changes:
                exec_.works[i] = self._kernel_work(launch)
        return hits

    def graph_launch(self, exec_: _SimExec, stream: _SimStream, upload: bool = False) -> None:
        self._fault("upload" if upload else "graph_launch")
        if upload:
            self._live(exec_, "cuGraphUpload")
            self._live(stream, "cuGraphUpload")
            return
        self._live(exec_, "cuGraphLaunch")
        if stream.capture is not None:
            self._invalidate([stream], "cuGraphLaunch")
        if exec_.unfreed:
            if exec_.outstanding and not exec_.auto_free:
                raise _error(
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
        self._submit(stream, "cuGraphLaunch", "child", "", lambda: _run_nodes(nodes, works, conditions))
