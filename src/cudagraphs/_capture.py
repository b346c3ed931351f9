"""Stream capture: ``cg.capture()``, the public face of recording, and capture status.

State machine of one capture (:class:`CaptureSession`): idle -> capturing
(:meth:`~CaptureSession.begin`) -> captured, a ready :class:`Graph`
(:meth:`~CaptureSession.end`), or -> failed, everything undone
(:meth:`~CaptureSession.abort`, or a failed ``end``). While a stream is being
captured, the rules of :mod:`cudagraphs._recording` apply to every piece of
work queued on it:

* every array, scalar, host slot and callback used by captured work is kept
  alive by the graph;
* allocations come from the capture's pool (``alloc="pool"``), from
  driver-managed graph memory (``alloc="graph"``) or are refused
  (``alloc="forbid"``);
* host data copied to the device is staged into pinned memory the graph owns;
* work that cannot be recorded (synchronizing, reading to the host, querying
  the stream) is refused with :class:`CaptureError` naming the call and the
  line of user code that made it; the capture is then invalid
  (``capture_status()`` says ``"invalidated"``), and ends with an error
  whatever happens to the exception;
* compiling kernels is allowed (the driver allows it in every mode);
* another library's call that the driver refuses (PyTorch's ``.item()``, a
  ``torch.cuda.synchronize()``, CuPy's host reads) surfaces as that
  library's error; when it leaves the ``with`` block (or the captured
  function) it becomes a :class:`CaptureError` naming the user's line that
  made it, the library's operation where a frame of it shows it, and what
  to do, chained to the library's error (:meth:`CaptureSession.fail`), as
  does any error raised once the capture is invalidated;
* PyTorch and CuPy, where the program imported them, are routed into the
  capture for the capturing thread (:mod:`cudagraphs.interop`): their current
  stream is the captured one, and their allocations come from memory the
  graph owns.

Whatever ends the ``with`` block, an exception included (KeyboardInterrupt
too), the capture is ended, a partial graph destroyed, the pool released and
the stream left usable.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Literal

from . import _recording, interop
from ._allocator import safe_point
from ._array import empty
from ._device import Device, Event, Stream, StreamLike, as_device, as_stream, current_device, resolve_stream
from ._errors import CaptureError
from ._executable import Resources, release_resources
from ._graph import Graph
from ._pool import ForbidMemory, GraphMemory, GraphPool, PoolMemory
from ._where import raised_at, refused
from .backends.base import CAPTURE_MODES
from .interop import _torch_rng

__all__ = [
    "EAGER_HINT",
    "CaptureSession",
    "breaks_capture",
    "capture",
    "capture_options",
    "capture_status",
    "is_capturing",
]

ALLOC_POLICIES = ("pool", "forbid", "graph")
_MEMORY = {"pool": PoolMemory, "forbid": ForbidMemory, "graph": GraphMemory}

# how other libraries say that a call broke a capture (lower case, in "Type: message"): CUDA's
# cudaErrorStreamCapture*/CUDA_ERROR_STREAM_CAPTURE_* codes, their text, and a call not
# permitted during it (measured, torch 2.11: AcceleratorError "CUDA error: operation not
# permitted when stream is capturing"; CuPy 14: CUDARuntimeError cudaErrorStreamCaptureUnsupported,
# and, measured on an H200, RuntimeError "the current stream is capturing, so D2H transfers are
# disallowed" for a host read)
_BROKEN_CAPTURE = (
    "streamcapture",
    "stream_capture_",
    "stream is capturing",
    "capturing stream",
    "cudaerrornotpermitted",
    "cuda_error_not_permitted",
)
EAGER_HINT = (
    'run that part eagerly (a graphed callable made with fallback="eager" runs the keys whose '
    "capture is refused eagerly)"
)


def breaks_capture(exc: BaseException) -> bool:
    """Whether ``exc``'s type or message says a call broke a stream capture (see ``_BROKEN_CAPTURE``)."""
    text = f"{type(exc).__name__}: {exc}".lower()
    return any(words in text for words in _BROKEN_CAPTURE)


def capture_options(
    device: Device | int | None, stream: Any, mode: str, pool: GraphPool | None
) -> tuple[Device, Stream | None]:
    """Check a capture's options; return its device and stream.

    The device is the one given, or the stream's, the pool's, the current one.

    ``stream`` is a Stream, another library's stream (see
    ``_device.as_stream``: its Stream is returned) or None.

    Raises
    ------
    TypeError
        For a stream, pool or device that is not cudagraphs' (nor a stream
        with ``__cuda_stream__``).
    ValueError
        For an unknown mode, or a pool on another device.
    """
    if mode not in CAPTURE_MODES:
        raise ValueError(f"mode must be one of {CAPTURE_MODES}, got {mode!r}")
    if stream is not None and type(stream) is not Stream:
        stream = as_stream(stream, device)
    if pool is not None and not isinstance(pool, GraphPool):
        raise TypeError(f"pool must be a cudagraphs GraphPool, got {type(pool).__name__}")
    if device is None:
        device = stream.device if stream is not None else pool.device if pool else current_device()
    else:
        device = as_device(device)
    if pool is not None and pool.device is not device:
        raise ValueError(f"pool is on {pool.device}, the capture on {device}")
    return device, stream


class CaptureSession:
    """One capture of one stream, driven by explicit begin / end / abort.

    ``with cg.capture()`` and :class:`~cudagraphs.GraphBuilder` both drive it.
    """

    def __init__(
        self,
        device: Device | int | None,
        stream: Stream | StreamLike | None,
        mode: str,
        pool: GraphPool | None,
        alloc: str,
        instantiate: bool = True,
        generators: Any = None,
    ) -> None:
        if alloc not in ALLOC_POLICIES:
            raise ValueError(f"alloc must be one of {ALLOC_POLICIES}, got {alloc!r}")
        self.generators = _torch_rng.check_generators(generators)
        device, stream = capture_options(device, stream, mode, pool)
        stream = resolve_stream(stream, device)
        self.device, self.stream, self.mode, self.alloc = device, stream, mode, alloc
        self.pool = pool if pool is not None else GraphPool(device)
        self.instantiate = bool(instantiate)
        self.memory = _MEMORY[alloc](self.pool)
        self.rec: _recording.Recording | None = None
        self.graph: Graph | None = None
        self.routing: interop.Routing | None = None
        self.rng: _torch_rng.Shadow | None = None

    def begin(self) -> Graph:
        """Start capturing; return the graph being captured (state ``capturing``).

        PyTorch's generators are put in capture mode first (see
        :mod:`cudagraphs.interop._torch_rng`): before the driver's capture
        begins, and outside the capture's ``torch.cuda.MemPool``.

        Raises
        ------
        CaptureError
            If the stream is already being captured.
        ValueError
            For a generator of another device.
        """
        self.stream._live()
        before = Event(self.device)  # (see _recording.mark)
        # the releases queued so far run now, before PyTorch's generators enter capture mode:
        # from then on until the shadow ends they wait (one that destroys a MemPool while PyTorch
        # counts the shadow's capture underway aborts the process: see _recording.hold)
        _recording.drain()
        self.rng = _torch_rng.begin(self.device, self.generators)
        self.pool.acquire()
        try:
            rec = _recording.begin(self.device, self.stream, self.mode, self.memory, before)
        except BaseException:
            try:
                self.pool.drop([])
            finally:
                self._end_rng()
            raise
        self.rec = rec
        self.graph = Graph._capturing(self.device, self.stream, self.pool, rec)
        try:
            self.routing = interop.route(self.device, self.stream, self._allocate, self.pool.foreign)
        except BaseException:
            self.abort()
            raise
        return self.graph

    def _allocate(self, nbytes: int) -> Any:
        """Memory of this capture for another library (a uint8 array on the stream)."""
        return empty(nbytes, "uint8", device=self.device, stream=self.stream)

    def _unroute(self) -> list[Any]:
        """End the other libraries' routing; what the graph must keep of it."""
        routing, self.routing = self.routing, None
        if routing is None:
            return []
        routing.close()
        return routing.keep

    def end(self) -> Graph:
        """End the capture and return the ready (or captured) graph.

        Raises
        ------
        CaptureInvalidatedError
            If the capture was invalidated.
        CaptureError
            If graph memory is still alive, or nothing was recorded.
        """
        graph = self._end(allow_empty=False)
        assert graph is not None
        return graph

    def end_or_none(self) -> Graph | None:
        """:meth:`end`, but a capture that recorded nothing is undone and None returned."""
        return self._end(allow_empty=True)

    def _end(self, allow_empty: bool) -> Graph | None:
        """End the capture (see :meth:`end`); None for an empty one if ``allow_empty``."""
        rec, graph = self.rec, self.graph
        assert rec is not None
        assert graph is not None
        try:
            kept = self._unroute()
        except BaseException:
            self._abort_recording(rec)
            raise
        try:
            rec.keep.extend(kept)
            safe_point()  # graph-memory blocks that died during the capture get free nodes
            raw = rec.end()
        except BaseException:
            self._undo(None)
            raise
        try:
            shadow = self.rng
            drew = self._end_rng()
            memory = self.memory
            if isinstance(memory, GraphMemory) and memory.live:
                raise CaptureError(
                    f"{len(memory.live)} array(s) allocated under alloc='graph' are still alive "
                    "at the end of the capture: graph memory is scratch memory, freed by the "
                    "graph; delete them inside the capture, or allocate outputs before "
                    "capturing or with alloc='pool'"
                )
            if rec.conditions:
                where = ", ".join(sorted(set(rec.conditions.values())))
                raise CaptureError(
                    f"{len(rec.conditions)} condition(s) made at {where} drive no conditional "
                    "node, and the driver refuses to instantiate such a graph: use each "
                    "condition in a while_loop/if_then/if_else/switch, or do not make it"
                )
            if rec.loops:
                raise CaptureError(
                    f"{'; '.join(rec.loops.values())}: a while loop whose body is never captured "
                    "(`with body:`) would spin forever on the device; capture its body, or do "
                    "not make the loop"
                )
            if not rec.nodes and not self.device.backend.graph_topology(raw)[0]:
                if allow_empty:
                    self._undo(raw)
                    return None
                raise CaptureError(
                    f"the capture on stream 0x{self.stream.handle:x} recorded nothing: queue "
                    "kernels, copies or memsets on the captured stream inside the block"
                )
            graph._ready_from(raw, rec, self.alloc == "graph", self.instantiate)
            if drew:
                assert shadow is not None
                graph._take_rng(shadow)
        except BaseException:
            self._undo(raw)
            raise
        return graph

    def _end_rng(self) -> bool:
        """End the PyTorch generators' capture mode (idempotent); whether the capture drew numbers.

        A shadow that the graph does not keep is dropped once no capture is
        active: its destruction destroys PyTorch's executable, which a
        capture's mode may refuse (as every release of ours, see
        :func:`cudagraphs._recording.release`).
        """
        shadow, self.rng = self.rng, None
        if shadow is None:
            return False
        drew = False
        try:
            drew = shadow.end()
        finally:
            if not drew:
                _recording.release(self.device, _drop, shadow)
        return drew

    def fail(self, exc: BaseException, hint: str = EAGER_HINT) -> CaptureError | None:
        """Undo the capture that ``exc`` left; return the :class:`CaptureError` to raise instead, if any.

        ``exc`` escaped the captured code. It is a refusal when another
        library's error says the capture was broken by a call (see
        :func:`breaks_capture`), or when any error (an ``Exception``) was
        raised while the capture is invalidated (ours or the driver's
        status, read before the capture is undone). Then the returned error
        names the user's line (:func:`cudagraphs._where.raised_at`), the
        library and its operation where they can be read, and what to do
        (``hint``: the alternative to moving the call out). cudagraphs' own
        CaptureErrors, other errors and BaseExceptions such as
        KeyboardInterrupt are not refusals: None, and the caller re-raises
        ``exc`` unchanged. A random-number call the capture cannot take
        (PyTorch's generator not in capture mode, CuPy's cuRAND) breaks
        nothing and is a refusal by its words alone
        (:func:`cudagraphs.interop._torch_rng.refusal`). Either way the
        capture is undone (:meth:`abort`).
        """
        refusal = None
        if isinstance(exc, Exception) and not isinstance(exc, CaptureError):
            # (a random-number call the capture cannot take: PyTorch's generator not in capture
            # mode, CuPy's cuRAND; it breaks nothing, so it is named by its words alone)
            refusal = _torch_rng.refusal(exc, self.stream.handle)
            if refusal is None:
                try:
                    invalid = _recording.status(self.stream) == "invalidated"
                except Exception:  # (a driver that cannot say: only the error's words count)
                    invalid = False
                if invalid or breaks_capture(exc):
                    refusal = self._refusal(exc, hint)
        self.abort()
        return refusal

    def _refusal(self, exc: BaseException, hint: str) -> CaptureError:
        """The CaptureError for ``exc``, which broke this capture (see :meth:`fail`)."""
        site = raised_at(exc)
        who = site.library or type(exc).__name__
        begins = refused(exc, site, who, site.operation or "a call", self.stream.handle)
        return CaptureError(
            f"{begins}. A graph cannot record a host read (.item(), a copy to the host), a "
            "synchronize or an allocation outside the capture's memory: move that call out of "
            f"the captured code, or {hint}. The capture was undone; the stream and its memory "
            "are usable"
        )

    def abort(self) -> None:
        """End the capture and undo everything it held (for exceptions and abandon)."""
        rec = self.rec
        assert rec is not None
        try:
            self._unroute()
        finally:
            self._abort_recording(rec)

    def _abort_recording(self, rec: _recording.Recording) -> None:
        try:
            rec.abort()
        finally:
            self._undo(None)

    def _undo(self, raw: Any) -> None:
        """Release what a failed capture held: its graph, staged data, pool."""
        rec, graph = self.rec, self.graph
        assert rec is not None
        assert graph is not None
        try:
            # (what broke the capture may have broken the shadow's too, a device-wide synchronize
            # does: its failure to end is a consequence, and the capture's own error is raised)
            with contextlib.suppress(Exception):
                self._end_rng()
        finally:
            self._release_failed(rec, graph, raw)

    def _release_failed(self, rec: _recording.Recording, graph: Graph, raw: Any) -> None:
        """The graph failed; what its capture held is released (see :meth:`_undo`)."""
        graph._failed()
        res = Resources(self.device, raw, list(rec.keep), list(self.memory.pools.values()), [])
        rec.keep.clear()
        _recording.release(self.device, release_resources, res)


def _drop(obj: object) -> None:
    """Release the last reference to ``obj`` (an argument of a deferred release)."""


class _CaptureContext:
    """``with cg.capture() as g:`` — see :func:`capture`."""

    def __init__(self, session: CaptureSession) -> None:
        self.session = session

    def __enter__(self) -> Graph:
        return self.session.begin()

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: object) -> Literal[False]:
        if exc is not None:  # the user's error wins (returning False re-raises it), unless it
            refusal = self.session.fail(exc)  # is a refusal: then the refusal, chained to it
            if refusal is not None:
                raise refusal from exc
            return False
        self.session.end()
        return False


def capture(
    fn: Callable[..., Any] | None = None,
    *args: Any,
    device: Device | int | None = None,
    stream: Stream | StreamLike | None = None,
    mode: str = "thread_local",
    pool: GraphPool | None = None,
    alloc: str = "pool",
    instantiate: bool = True,
    generators: Any = None,
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
    device : Device or int, optional
        Default: the stream's, the pool's, or the current device.
    stream : Stream or StreamLike, optional
        The stream to capture (default: this thread's current stream); another
        library's stream (``__cuda_stream__``: PyTorch, CuPy, cuda.core) too.
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
    generators : True or list of torch.Generator, optional
        PyTorch's random numbers in the capture: True puts the device's
        default generator in capture mode, a list of ``torch.Generator(device=
        "cuda")`` objects those too; each replay then draws new numbers from
        them, as eager calls would (see docs/interop.md). Default None: PyTorch's
        generators are left alone (no cost; a random-number call is refused,
        naming this option). Accepted and unused where PyTorch is not routed
        (the sim backend).

    Raises
    ------
    CaptureError
        For work that cannot be recorded, a stream already being captured,
        or a capture that recorded nothing; for another library's call that
        broke the capture (chained to that library's error), and for random
        numbers the capture cannot take (PyTorch's without ``generators``, or
        from a generator not named there; CuPy's ``cupy.random``).
    TypeError
        For ``generators`` that are not True or a list or tuple of CUDA ``torch.Generator`` objects.
    CaptureInvalidatedError
        If the capture was invalidated (by such work, or by the driver).
    """
    ctx = _CaptureContext(CaptureSession(device, stream, mode, pool, alloc, instantiate, generators))
    if fn is None:
        if args:
            raise TypeError("capture() takes positional arguments only with a function to call")
        return ctx
    if not callable(fn):
        raise TypeError(f"capture(fn, *args) needs a callable, got {type(fn).__name__}")
    with ctx as graph:
        graph.output = fn(*args)
    return graph


def is_capturing(stream: Stream | StreamLike | None = None) -> bool:
    """Whether a capture of ``stream`` (default: the current stream) is active.

    False once the capture was invalidated (see :func:`capture_status`).
    """
    return capture_status(stream) == "active"


def capture_status(stream: Stream | StreamLike | None = None) -> str:
    """``"none"``, ``"active"`` or ``"invalidated"`` for ``stream`` (default: current).

    ``"invalidated"`` once a call was refused during the capture, until it
    ends. Captures started by other libraries on the stream count too.

    Raises
    ------
    TypeError
        If ``stream`` is neither a cudagraphs Stream nor an object with ``__cuda_stream__``.
    """
    if stream is not None and type(stream) is not Stream:
        stream = as_stream(stream)
    stream = stream if stream is not None else current_device().current_stream()
    stream._live()
    return _recording.status(stream)
