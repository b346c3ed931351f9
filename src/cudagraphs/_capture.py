"""Stream capture: ``cg.capture()``, the rules that keep it safe, capture status.

State machine of one capture: idle -> capturing -> captured (a ready
:class:`Graph`) or -> failed (everything undone). While a stream is being
captured, cudagraphs:

* records every array, scalar, host slot and callback used by captured work,
  and hands them to the graph, which keeps them alive;
* serves allocations from the capture's pool (``alloc="pool"``), from
  driver-managed graph memory (``alloc="graph"``) or refuses them
  (``alloc="forbid"``);
* stages host data copied to the device into pinned memory the graph owns;
* refuses work that cannot be recorded (synchronizing, reading to the host,
  querying the stream, compiling a kernel) with :class:`CaptureError` naming
  the call and the line of user code that made it; the capture is then
  invalid, and ends with an error whatever happens to the exception.

Whatever ends the ``with`` block, an exception included (KeyboardInterrupt
too), the capture is ended, a partial graph destroyed, the pool released and
the stream left usable.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from ._device import Device, Stream, current_device
from ._errors import CaptureError, CaptureInvalidatedError, CudaError
from ._graph import Graph
from ._pool import GraphPool
from .backends.base import CAPTURE_MODES, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED

__all__ = ["Capture", "capture", "capture_status", "is_capturing"]

ALLOC_POLICIES = ("pool", "forbid", "graph")
_BY_VALUE = (int, float, complex, bytes, np.generic, type(None))
_PACKAGE = os.path.dirname(os.path.abspath(__file__))


def user_line() -> str:
    """``file:line`` of the innermost caller outside cudagraphs."""
    frame = sys._getframe(1)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith(_PACKAGE):
            return f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return "<unknown>"


class Capture:
    """One capture in progress on one stream (internal; see :func:`capture`)."""

    def __init__(self, device: Device, stream: Stream, mode: str, pool: GraphPool, alloc: str) -> None:
        self.device = device
        self.stream = stream
        self.mode = mode
        self.pool = pool
        self.alloc = alloc
        self.thread = threading.get_ident()
        self.keep: list[Any] = []  # what the graph must keep alive
        self.trace: list[tuple[str, str]] = []  # (node type, kernel name) of our work
        self.uses: list[tuple[tuple, tuple | None]] = []  # per node: array specs, launch
        self.stack: list[Stream] = [stream]  # innermost capturing stream last (bodies)
        self.staged: list[Any] = []  # pinned buffers holding captured host data
        self.graph_memory = _GraphMemory(self)  # owner of alloc="graph" blocks
        self.invalid: str | None = None  # why the capture can no longer succeed

    # memory -------------------------------------------------------------------
    def allocate(self, nbytes: int) -> tuple[int, Any]:
        """(address, owner) of a block allocated while capturing."""
        if self.alloc == "forbid":
            self.fail(
                f"allocation of {nbytes} B during a capture with alloc='forbid'; "
                "allocate before capturing, or use alloc='pool'"
            )
        if self.alloc == "graph":
            return self.allocate_graph_memory(nbytes)
        return self.pool.allocate(nbytes), self.pool

    def allocate_graph_memory(self, nbytes: int) -> tuple[int, Any]:
        """(address, owner) of driver-managed graph memory: an allocation node."""
        ptr = self.device.backend.mem_alloc(self.device.index, nbytes, self.stack[-1]._raw)
        self.graph_memory.live.add(ptr)
        return ptr, self.graph_memory

    def stage(self, host: np.ndarray) -> np.ndarray:
        """A pinned copy of ``host`` owned by the graph (capture-time snapshot)."""
        backend = self.device.backend
        old = backend.capture_exchange_mode("relaxed")  # pinned allocation may synchronize
        try:
            ptr, array = backend.host_alloc(host.nbytes)
        finally:
            backend.capture_exchange_mode(old)
        self.staged.append(ptr)
        array[...] = host.reshape(-1).view(np.uint8)
        return array

    # rules ----------------------------------------------------------------------
    def fail(self, what: str) -> None:
        """Mark the capture invalid and raise CaptureError about ``what``."""
        message = (f"{what} (called at {user_line()}); the capture on stream "
                   f"0x{self.stream.handle:x} is now invalid")
        self.invalid = self.invalid or message
        raise CaptureError(message)


class _GraphMemory:
    """Owner of alloc='graph' blocks: scratch memory of the graph.

    A block freed during the capture records a free node. A block still
    alive when the capture ends would point at memory the driver frees at
    the next launch, so the capture refuses to end that way.
    """

    def __init__(self, capture: Capture) -> None:
        self.capture = capture
        self.live: set[int] = set()

    def release(self, ptr: int, streams: object) -> None:
        cap = self.capture
        self.live.discard(ptr)
        if cap.device.captures.get(cap.stream.handle) is cap:
            cap.device.backend.mem_free(ptr, cap.stream._raw)


def keep(
    device: Device, stream: Stream, objs: Any, kind: str = "kernel", name: str = "",
    launch: tuple | None = None,
) -> None:
    """Record work queued on ``stream`` if it is captured: ``objs`` it uses, its node.

    ``kind`` and ``name`` (node type, kernel name) go into the capture's
    trace, which :meth:`Graph.update` compares before asking the driver;
    the arrays' address specs and, for kernels, ``launch`` = (kernel, grid,
    block, shared_mem, raw arguments) let :meth:`Graph.rebind` patch the node.

    Arrays of the capture's own memory (its pool, its graph allocations)
    are not kept: that memory stays reserved for the graph anyway, and a
    block freed during the capture must be reusable (or freed by a node)
    within the capture.
    """
    capture = device.captures.get(stream.handle)
    if capture is None:
        return
    capture.trace.append((kind, name))
    capture.uses.append((
        tuple(o._view_spec() if hasattr(o, "_view_spec") else None for o in objs), launch,
    ))
    kept, pool, graph_memory = capture.keep, capture.pool, capture.graph_memory
    for o in objs:
        if isinstance(o, _BY_VALUE):
            continue  # numbers and structs are copied into the graph
        block = getattr(o, "_block", None)
        if block is None or (block._ref.owner is not pool and block._ref.owner is not graph_memory):
            kept.append(o)


def capture_for(device: Device, stream: Stream) -> Capture | None:
    """The cudagraphs capture of ``stream``, if any."""
    return device.captures.get(stream.handle) if device.captures else None


def forbid(
    device: Device, stream: Stream | None, what: str, synchronizes: bool = True, hint: str = ""
) -> None:
    """Raise CaptureError if ``what`` would break a capture in progress.

    ``stream`` is the stream the call works on (None: a device-wide call).
    A call on a captured stream always breaks its capture; a synchronizing
    call elsewhere breaks global captures and this thread's thread-local
    ones, as CUDA's capture modes define.
    """
    if not device.captures:
        return
    me = threading.get_ident()
    for capture in list(device.captures.values()):
        on_it = stream is not None and capture.stream is stream
        blocks = synchronizes and (
            capture.mode == "global" or (capture.mode == "thread_local" and capture.thread == me)
        )
        if on_it or blocks:
            capture.fail(f"{what} cannot be recorded in a graph" + (f"; {hint}" if hint else ""))


class _CaptureContext:
    """``with cg.capture() as g:`` — see :func:`capture`."""

    def __init__(
        self, device: Device | None, stream: Stream | None, mode: str,
        pool: GraphPool | None, alloc: str, instantiate: bool = True,
    ) -> None:
        if mode not in CAPTURE_MODES:
            raise ValueError(f"mode must be one of {CAPTURE_MODES}, got {mode!r}")
        if alloc not in ALLOC_POLICIES:
            raise ValueError(f"alloc must be one of {ALLOC_POLICIES}, got {alloc!r}")
        if stream is not None and not isinstance(stream, Stream):
            raise TypeError(f"stream must be a cudagraphs Stream, got {type(stream).__name__}")
        if pool is not None and not isinstance(pool, GraphPool):
            raise TypeError(f"pool must be a cudagraphs GraphPool, got {type(pool).__name__}")
        if device is None:
            device = stream.device if stream is not None else pool.device if pool else current_device()
        if stream is None:
            stream = device.stream
        if stream.device is not device:
            raise ValueError(f"stream {stream} is not on {device}")
        if pool is not None and pool.device is not device:
            raise ValueError(f"pool is on {pool.device}, the capture on {device}")
        self.device, self.stream, self.mode, self.alloc = device, stream, mode, alloc
        self.pool = pool if pool is not None else GraphPool(device)
        self.instantiate = bool(instantiate)
        self.capture: Capture | None = None
        self.graph: Graph | None = None

    def __enter__(self) -> Graph:
        device, stream = self.device, self.stream
        stream._live()
        if stream.handle in device.captures or device.backend.capture_status(stream._raw) != "none":
            raise CaptureError(
                f"stream 0x{stream.handle:x} is already being captured; one capture per "
                "stream at a time: capture on another stream (device.create_stream())"
            )
        cap = Capture(device, stream, self.mode, self.pool, self.alloc)
        self.pool.acquire()
        try:
            device.backend.capture_begin(stream._raw, self.mode)
        except BaseException:
            self.pool.drop([])
            raise
        device.captures[stream.handle] = cap
        self.capture = cap
        self.graph = Graph._capturing(device, stream, self.pool)
        self.graph._capture = cap
        return self.graph

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: object) -> bool:
        cap, graph = self.capture, self.graph
        assert cap is not None and graph is not None
        graph._capture = None
        device, backend = self.device, self.device.backend
        raw_graph, end_error = None, None
        try:
            raw_graph = backend.capture_end(self.stream._raw)
        except CudaError as err:
            end_error = err
        finally:
            device.captures.pop(self.stream.handle, None)
        if exc_type is not None:  # the user's error wins; returning False re-raises it
            _undo(cap, raw_graph)
            graph._fail()
            return False
        try:
            if end_error is not None:
                if end_error.code == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED:
                    raise CaptureInvalidatedError(
                        cap.invalid or f"the driver invalidated the capture on stream "
                        f"0x{self.stream.handle:x}: a call that cannot be recorded (a "
                        "synchronize, a host copy, a query) was made while it was capturing"
                    ) from end_error
                raise end_error
            if cap.invalid is not None:
                raise CaptureInvalidatedError(cap.invalid)
            if cap.graph_memory.live:
                raise CaptureError(
                    f"{len(cap.graph_memory.live)} array(s) allocated under alloc='graph' are "
                    "still alive at the end of the capture: graph memory is scratch memory, "
                    "freed by the graph; delete them inside the capture, or allocate outputs "
                    "before capturing or with alloc='pool'"
                )
            if not backend.graph_node_count(raw_graph):
                raise CaptureError(
                    f"the capture on stream 0x{self.stream.handle:x} recorded nothing: queue "
                    "kernels, copies or memsets on the captured stream inside the block"
                )
            graph._instantiate(raw_graph, cap, cap.alloc == "graph", self.instantiate)
        except BaseException:
            _undo(cap, raw_graph)
            graph._fail()
            raise
        return False


def _undo(cap: Capture, raw_graph: Any) -> None:
    """Release what a failed capture held: graph, pinned staging, pool."""
    backend = cap.device.backend
    if raw_graph is not None:
        backend.graph_destroy(raw_graph)
    # alloc="graph" memory belongs to the graph: destroying it frees that memory
    for ptr in cap.staged:
        backend.host_free(ptr)
    cap.staged.clear()
    cap.keep.clear()
    cap.pool.drop([])


def capture(
    fn: Callable[..., Any] | None = None, *args: Any, device: Device | None = None,
    stream: Stream | None = None, mode: str = "thread_local", pool: GraphPool | None = None,
    alloc: str = "pool", instantiate: bool = True,
) -> Any:
    """Capture work queued on a stream into a :class:`Graph`.

    Two forms::

        with cg.capture() as g:       # g is ready when the block ends
            cg.ops.axpy(a, x, y)
        g = cg.capture(fn, x, y)      # calls fn(x, y); g.output is its result

    Parameters
    ----------
    fn : callable, optional
        Closure form: called with ``args`` inside the capture.
    device : Device, optional
        Default: the stream's, the pool's, or the current device.
    stream : Stream, optional
        The stream to capture (default: the device's compute stream).
    mode : {"thread_local", "global", "relaxed"}
        CUDA's capture mode: which unsafe calls from other code the driver
        refuses while capturing (global: from any thread; thread_local: from
        this thread; relaxed: none).
    pool : GraphPool, optional
        Share memory with graphs captured into the same pool (default: a
        private pool per graph).
    alloc : {"pool", "forbid", "graph"}
        Allocations during capture come from the pool, raise CaptureError,
        or become driver-managed graph memory (allocation and free nodes,
        freed on the next launch): scratch memory that must be deleted
        before the capture ends.
    instantiate : bool
        False leaves the graph in state "captured": not replayable until
        ``g.instantiate()``, but usable as the source of ``other.update(g)``
        without paying for an instantiation.

    Raises
    ------
    CaptureError
        For work that cannot be recorded, a stream already being captured,
        or a capture that recorded nothing.
    CaptureInvalidatedError
        If the capture was invalidated (by such work, or by the driver).
    """
    ctx = _CaptureContext(device, stream, mode, pool, alloc, instantiate)
    if fn is None:
        if args:
            raise TypeError("capture() takes positional arguments only with a function to call")
        return ctx
    if not callable(fn):
        raise TypeError(f"capture(fn, *args) needs a callable, got {type(fn).__name__}")
    with ctx as graph:
        graph.output = fn(*args)
    return graph


def is_capturing(stream: Stream | None = None) -> bool:
    """Whether ``stream`` (default: the current device's compute stream) is being captured."""
    return capture_status(stream) != "none"


def capture_status(stream: Stream | None = None) -> str:
    """``"none"``, ``"active"`` or ``"invalidated"``, as the driver reports it.

    Captures started by other libraries on the stream count too.
    """
    stream = stream if stream is not None else current_device().stream
    return stream.device.backend.capture_status(stream._live())
