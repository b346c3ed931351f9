"""Graphed callables: a Python function run as CUDA graphs, one per input shape bucket.

``cg.graphed(fn)`` returns a :class:`GraphedCallable`. Each call:

1. flattens the arguments (tuples, lists, dicts, named tuples): device arrays
   (cudagraphs, PyTorch, CuPy, anything with ``__cuda_array_interface__`` or
   DLPack) are inputs; every other leaf must be hashable and is part of the
   graph's key (a new value means a new graph) (:mod:`cudagraphs._argtree`);
2. finds the graph for the key: with ``buckets``, the size of dimension
   ``dim`` of the inputs is rounded up to the smallest bucket that holds it;
3. copies the inputs into the graph's static input buffers (and fills the
   padding: :mod:`cudagraphs._staging`), replays the graph, and returns the
   outputs as views of its static outputs cut back to the true size, valid
   until the next call (``copy_outputs=True`` returns copies). Without
   buckets the copies are the graph's own first nodes, pointed at each
   call's inputs when their addresses change: a call with inputs where the
   last ones were queues nothing but the replay.

On a key's first call the function runs ``warmup`` times eagerly on the
static inputs (kernels compile, libraries set up), then is captured. A
capture that is refused (a :class:`~cudagraphs.CaptureError`: cudagraphs'
own refusals, and another library's call that broke the capture) is raised,
or, with ``fallback="eager"``, the key runs the function eagerly from then
on: the refusal is warned once (:class:`~cudagraphs.FallbackWarning`) and
kept in ``stats()["eager"]``; the other keys are still graphed. All of
a callable's graphs share one :class:`~cudagraphs.GraphPool` (and, through
it, one PyTorch ``MemPool``): temporaries of one bucket's graph are reused by
the others, so :meth:`GraphedCallable.capture_all`, which captures the
largest bucket first, costs little more memory than the largest bucket alone.

Replays run on the caller's stream: the ``stream`` given, else the current
stream of the library whose arrays came in (PyTorch's or CuPy's), else this
thread's cudagraphs stream. Calls are serialized by a lock; a call on
another stream than the previous one waits for it first.

A call with the key of the call before it (the same argument types,
shapes, dtypes and devices, on the same stream) skips finding its graph:
:meth:`GraphedCallable._repeat` checks the key and reuses what that call
decided, then stages, replays and wraps as every call does.

This module is compiled by Cython from this source where the package is
built (``_graphed_callable.pxd`` declares :class:`GraphedCallable`,
:class:`GraphOutput` and the call's state extension types with typed
fields, so that a call reads them as C fields and replays through the
compiled :meth:`Graph.replay <cudagraphs.Graph.replay>`: docs/architecture.md,
"The compiled part"), and runs as plain Python where not.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any, cast

try:
    import cython
except ImportError:  # (run as Python where Cython is not installed: nothing is compiled)
    from types import SimpleNamespace

    cython = SimpleNamespace(compiled=False)

from . import _recording, interop
from ._argtree import ARRAY_TYPES, flatten, in_host_memory, positional_spec, unflatten
from ._array import DeviceArray, _new_array, foreign_view
from ._capture import CaptureSession
from ._config import compiled_part
from ._device import Device, Stream, StreamLike, _current_stream_of
from ._errors import CaptureError, FallbackWarning, StaleOutputError
from ._graph import Graph
from ._options import GraphedOptions
from ._pool import GraphPool
from ._staging import Entry, Input, Staging, array_of, first_rows, new_input
from ._training import Trainer, is_module, refuse_untracked
from ._where import warn

__all__ = ["GraphOutput", "GraphedCallable", "graphed"]


# outputs that expire -------------------------------------------------------------------
class _Lease:
    """The call counters of one graphed callable, and its lock.

    ``calls`` counts what changes its static buffers (outputs of older calls
    are stale); ``made`` counts the calls made (its ``stats()["calls"]``).
    ``lock`` is the callable's: a call holds it from counting to queuing its
    replay, and work that uses an output is queued holding it (see
    :data:`cudagraphs._recording.EXPIRING`).
    """

    __slots__ = ("calls", "lock", "made", "name")

    calls: int
    made: int
    name: str
    lock: Any

    def __init__(self, name: str, lock: Any) -> None:
        self.calls = 0
        self.made = 0
        self.name = name
        self.lock = lock

    def count(self) -> None:
        """Count a call: every earlier output is stale from here on."""
        self.calls += 1
        self.made += 1


class GraphOutput(DeviceArray):
    """A view of a graphed callable's static output, valid until its next call.

    Using it (reading it, viewing it, passing it to a kernel, a host slot, a
    graph's ``repoint``, the callable itself or another library) after a
    later call of the callable raises :class:`~cudagraphs.StaleOutputError`:
    the graph has overwritten it. ``.copy()`` it to keep it.

    Notes
    -----
    Every use reads the array's address, :attr:`ptr`, which checks (the one
    place). Work that uses an output is queued holding the callable's lock,
    after checking again under it: a call from another thread comes wholly
    before (the output is stale: the work raises) or after (the call waits
    for the work on the previous call's stream, where outputs are read by
    default). Work on another stream is ordered with the next call by you.
    """

    __slots__ = ("_call", "_lease")

    _lease: _Lease
    _call: int

    @staticmethod
    def _expiring(base: DeviceArray, lease: _Lease) -> GraphOutput:
        """A view of ``base`` (a static output) valid until the lease's next call."""
        b = base  # (its description, copied as it is)
        made = _new_array(
            GraphOutput, b._block, b._ptr, b.device, b.shape, b.strides, b.dtype, b.is_contiguous, b.size
        )
        out: GraphOutput = made  # type: ignore[assignment]  # (compiled: typed, no call of cast)
        out._arg = base._arg
        out._lease, out._call = lease, lease.calls
        return out

    def _check(self) -> None:
        lease = self._lease
        if lease.calls != self._call:
            raise StaleOutputError(
                f"this output of {lease.name} came from call {self._call} and the graph has "
                f"overwritten it since (call {lease.calls}): outputs are views of the graph's "
                "static buffers, valid until the next call; copy them (x.copy(), or "
                "copy_outputs=True) to keep them"
            )

    @property
    def ptr(self) -> int:
        """The address (checked: a stale output raises :class:`~cudagraphs.StaleOutputError`)."""
        self._check()
        return self._ptr

    @property
    def _guard(self) -> Any:
        """The lock work that uses this output is queued under (its callable's)."""
        return self._lease.lock

    def _view(self, ptr: int, shape: tuple[int, ...], strides: tuple[int, ...]) -> DeviceArray:
        out = cast(GraphOutput, GraphOutput._wrap(self._block, ptr, shape, strides, self.dtype))
        out._lease, out._call = self._lease, self._call
        return out

    def _view_spec(self) -> Any:
        self._check()  # (the description is cached: made without reading ptr again)
        return DeviceArray._view_spec(self)

    def _fixed(self) -> DeviceArray:
        """A plain view of the same memory (checked now), for work that is ordered by the caller."""
        return DeviceArray._wrap(self._block, self.ptr, self.shape, self.strides, self.dtype)

    def __repr__(self) -> str:
        state = "stale" if self._lease.calls != self._call else "valid until the next call"
        return f"<cudagraphs.GraphOutput shape={self.shape} dtype={self.dtype} ({state})>"


_recording.EXPIRING.append(GraphOutput)

if not cython.compiled:  # (compiled, _capi.pxd's C versions: no method call for the C Lock)

    def cg_api_load(capsule: Any) -> None:
        """Take the C part's functions from its capsule (compiled only)."""

    def cg_lock_take(lock: Any, blocking: bool) -> bool:
        """``lock.acquire(blocking)``."""
        return bool(lock.acquire(blocking))

    def cg_lock_give(lock: Any) -> None:
        """``lock.release()``."""
        lock.release()


_fastcall = compiled_part()
if cython.compiled and _fastcall is not None:
    cg_api_load(_fastcall.api)

_ARRAY_TYPES = ARRAY_TYPES  # (a module global a call reads: compiled, a C global)


# arguments ------------------------------------------------------------------------------
class _Armed:
    """What a call decided (its key's entry, its inputs, its stream), for the next call of that key.

    See :meth:`GraphedCallable._repeat`.
    """

    __slots__ = ("entry", "ins", "source", "stream")

    def __init__(self, entry: Entry, ins: list[Input], source: Stream | int, stream: Stream) -> None:
        self.entry = entry
        self.ins = ins
        self.source = source  # (what _stream_source gave)
        self.stream = stream


_MISSED = object()  # (what _repeat answers for a call of another key)


def _all_arrays(args: tuple[Any, ...]) -> bool:
    """Whether every argument is of a type seen to be a device array (the common call)."""
    for x in args:  # noqa: SIM110  (compiled, a loop: all() would make a generator)
        if type(x) not in _ARRAY_TYPES:
            return False
    return True


def _describe(obj: Any, device: Device) -> Input:
    if type(obj) is GraphOutput:  # (checked now; the call reads it as plain memory)
        obj = obj._fixed()
    if isinstance(obj, DeviceArray):
        a = obj  # (compiled: typed, its fields read as C fields)
        if a.device is not device:
            raise ValueError(f"graphed: an input array is on {a.device}, the callable on {device}")
        ptr = a._ptr if type(a) is DeviceArray else a.ptr  # (a subclass's through its property)
        return new_input(a, None, ptr, a.shape, a.dtype, a.is_contiguous)
    lib = interop.library_of(obj)
    if lib is not None:  # PyTorch, CuPy: described without a view
        if not lib.owns(obj):  # (the type is the library's: an array in host memory)
            raise in_host_memory(obj)
        ptr, shape, dtype, contiguous, index = lib.describe(obj)
        if index != device.index:
            raise ValueError(
                f"graphed: an input {lib.name} array is on device {index}, the callable on {device}"
            )
        return new_input(obj, lib, ptr, shape, dtype, contiguous)
    view = foreign_view(obj, device)
    if view is None:
        raise TypeError(f"graphed: {type(obj).__name__} is not a CUDA device array")
    return new_input(view, None, view.ptr, view.shape, view.dtype, view.is_contiguous)


def _wait_for(last: Stream, stream: Stream) -> None:
    """Make ``stream`` wait for the work queued on ``last`` so far."""
    # (another thread may be capturing `last` now: then what it queued there before)
    event = _recording.mark(last, lambda: None if last.closed else last.record())
    if event is not None:  # (a closed stream finished its work when it was closed)
        stream.wait(event)


def _still_valid(leaves: Sequence[Any], lease: _Lease) -> None:
    """Check again, after a call queued its replay, the inputs that are another callable's outputs.

    They were checked when described, outside their callable's lock (holding
    two callables' locks could deadlock two threads that feed each one's
    outputs to the other). A call of theirs counts before it waits for its
    previous call's stream: if none counted by now, it waits for this replay
    where that is the stream the output was made on (this thread's, by default).
    """
    for x in leaves:
        if type(x) is GraphOutput:
            out = x  # (compiled: typed)
            if out._lease is not lease:
                out._check()


class GraphedCallable:
    """A function run as CUDA graphs (made by :func:`graphed`).

    Parameters
    ----------
    fn : callable
    options : GraphedOptions
        The options, checked (:meth:`cudagraphs._options.GraphedOptions.checked`).

    Attributes
    ----------
    fn : callable
        The function.
    pool : GraphPool
        The pool every graph of the callable allocates from.
    buckets : tuple of int or None
    dim : int
    fallback : str
        ``"raise"`` or ``"eager"`` (see :func:`graphed`).
    """

    __slots__ = (
        "__weakref__",
        "_armed",
        "_capture_stream",
        "_entries",
        "_last",
        "_lease",
        "_lock",
        "_misses",
        "_repeats",
        "_staging",
        "_stream",
        "_trainer",
        "buckets",
        "copy_outputs",
        "device",
        "dim",
        "fallback",
        "fn",
        "generators",
        "mode",
        "pad_value",
        "pool",
        "warmup",
    )

    fn: Callable[..., Any]
    buckets: tuple[int, ...] | None
    dim: int
    warmup: int
    device: Device
    pool: GraphPool
    mode: str
    copy_outputs: bool
    pad_value: Any
    fallback: str
    generators: tuple[Any, ...] | None  # PyTorch generators put in capture mode (None: none)
    _stream: Stream | None
    _capture_stream: Stream | None
    _entries: dict[Any, Entry]
    _armed: _Armed | None  # what the last call decided, while a call of its key may repeat it
    _staging: Staging
    _lock: Any
    _lease: _Lease
    _last: Stream | None
    _misses: int
    _repeats: int  # calls made by _repeat (for tests)
    _trainer: Trainer | None  # the differentiable calls (grad=True), None without

    def __init__(self, fn: Callable[..., Any], options: GraphedOptions) -> None:
        self.fn = _function(fn)
        self.buckets = options.buckets
        self.dim = options.dim
        self.warmup = options.warmup
        self.device = device = options.device
        self.pool = options.pool if options.pool is not None else GraphPool(device)
        self.mode = options.mode
        self.copy_outputs = options.copy_outputs
        self.pad_value = options.pad_value
        self.fallback = options.fallback
        self.generators = options.generators
        self._stream = options.stream
        self._capture_stream = None
        self._entries = {}
        self._armed = None
        self._staging = Staging(device, self.buckets, self.dim, self.pad_value)
        # (where the C part is built, an RLock compiled code takes without a method call)
        self._lock = _fastcall.Lock(reentrant=True) if _fastcall is not None else threading.RLock()
        self._lease = _Lease(getattr(fn, "__qualname__", "the graphed callable"), self._lock)
        self._last = None
        self._misses = 0
        self._repeats = 0
        self._trainer = None
        if options.grad:
            if options.params is not None and is_module(fn):
                raise ValueError(
                    "graphed: params= is for a plain function; a torch.nn.Module's gradients "
                    "are taken for its own parameters"
                )
            self._trainer = Trainer(self, options.params, _describe, _streams_only)

    # the call ----------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the function's graph for these arguments (capturing it on first use)."""
        lock = self._lock
        cg_lock_take(lock, True)  # (inputs that are this callable's outputs are checked under it)
        try:
            if self._trainer is not None:  # grad=True: its own path (_training)
                return self._trainer.call(args, kwargs)
            armed = self._armed
            if armed is not None and not kwargs:
                self._armed = None  # (until this call is made: a call that raises leaves it so)
                out = self._repeat(armed, args)
                if out is not _MISSED:
                    self._armed = armed
                    return out
            return self._call(args, kwargs)
        finally:
            cg_lock_give(lock)

    def _call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The call: its arguments described, its key's graph found (or captured) and replayed.

        The lock is held. A call that :meth:`_repeat` can make again arms it.
        """
        leaves: Sequence[Any]
        if not kwargs and _all_arrays(args):
            leaves = args  # the common case: arrays, positionally
            spec = positional_spec(len(args))
        else:
            leaves = []
            spec = flatten((args, kwargs), leaves)
        device = self.device
        staging = self._staging
        ins = [_describe(x, device) for x in leaves]
        key: tuple[Any, ...]
        if self.buckets is None:  # (the common case: keyed by the exact shapes)
            n = bucket = None
            key = (spec, tuple([(i.dtype, i.shape) for i in ins]))
        else:
            n, bucket = staging.bucket(ins)
            key = (spec, tuple([(i.dtype, staging.shape(i.shape, bucket)) for i in ins]))
        # every earlier output is stale from here on; counted before the wait for the
        # previous call's stream, so that work a thread queued there on an output it
        # checked before this count is waited for (see _still_valid)
        self._lease.count()
        source = self._stream_source(ins)
        stream = self._begin_on(self._stream_of(source))
        entry = self._entry(key, spec, ins, n, bucket, stream)
        out = self._replayed(entry, args, kwargs, leaves, n, bucket, stream)
        if leaves is args or spec == positional_spec(len(args)):
            self._arm(entry, args, ins, source, stream)
        return out

    def _arm(
        self, entry: Entry, args: tuple[Any, ...], ins: list[Input], source: Stream | int, stream: Stream
    ) -> None:
        """Let the next call repeat this one (see :meth:`_repeat`) while it has the same key.

        This call's arguments were arrays, positionally, each a cudagraphs
        array (not of a subclass, whose address is read through its property)
        or one of another library's types (not a view made of another
        object); no buckets, no enclosing capture. The lock is held.
        """
        if self.buckets is not None or stream._recording is not None or entry.eager is not None:
            return
        for j in range(len(ins)):
            if ins[j].lib is None and type(args[j]) is not DeviceArray:
                return  # (a subclass, a view of another library's array: described by each call)
        self._armed = _Armed(entry, ins, source, stream)

    def _repeat(self, armed: _Armed, args: tuple[Any, ...]) -> Any:
        """The call again, when it has the key of the call that armed it; else ``_MISSED``.

        The key is compared with that call's: as many arrays, of the same
        types, then (each described) of the same shapes, dtypes and devices,
        on the same stream (from the same :meth:`_stream_source`), not captured.
        The entry that call found is then this call's, and the rest is what
        :meth:`_call` does (counting, :meth:`Staging.stage`, the replay, the
        outputs). An input that is the same array as last time, unchanged,
        keeps its description. The lock is held.
        """
        ins = armed.ins
        if len(args) != len(ins):
            return _MISSED
        device = self.device
        now = ins  # (this call's inputs: the armed ones while each is the same, unchanged)
        for j in range(len(ins)):
            i = ins[j]
            x = args[j]
            if type(x) is not type(i.obj):
                return _MISSED
            if i.lib is None:  # a cudagraphs array, read as _describe reads it
                a = x  # (compiled: typed, its fields read as C fields)
                if a.device is not device:
                    return _MISSED
                ptr, shape, dtype, contiguous, lib = a._ptr, a.shape, a.dtype, a.is_contiguous, None
            else:  # another library's (its type is the library's: armed for it)
                lib = i.lib
                ptr, shape, dtype, contiguous, index = lib.describe(x)
                if index != device.index:
                    return _MISSED
            if (shape is not i.shape and shape != i.shape) or (dtype is not i.dtype and dtype != i.dtype):
                return _MISSED
            if x is not i.obj or (ptr is not i.ptr and ptr != i.ptr) or contiguous != i.contiguous:
                if now is ins:  # (another array of this key, or this one changed: described anew)
                    now = ins[:j]
                now.append(new_input(x, lib, ptr, shape, dtype, contiguous))
            elif now is not ins:
                now.append(i)
        source = self._stream_source(now)
        stream = armed.stream
        if (source is not armed.source and source != armed.source) or stream._recording is not None:
            return _MISSED
        if now is not ins:
            armed.ins = now
        entry = armed.entry
        self._repeats += 1
        self._lease.count()
        self._begin_on(stream)
        entry.hits += 1
        self._staging.stage(entry, now, None, None, stream)
        return self._replayed(entry, args, None, args, None, None, stream)

    def _entry(
        self,
        key: tuple[Any, ...],
        spec: Any,
        ins: list[Input],
        n: int | None,
        bucket: int | None,
        stream: Stream,
    ) -> Entry:
        """The entry of ``key`` (captured on its first call), its inputs staged on ``stream``."""
        if stream._recording is not None:  # inside a capture: graphs without input nodes
            key = (*key, "captured")
        entry = self._entries.get(key)
        if entry is None:
            self._misses += 1
            return self._capture(key, spec, ins, n, bucket, stream)
        entry.hits += 1
        if entry.eager is None:  # (a key run eagerly takes the inputs as they are)
            self._staging.stage(entry, ins, n, bucket, stream)
        return entry

    def _replayed(
        self,
        entry: Entry,
        args: tuple[Any, ...],
        kwargs: dict[str, Any] | None,
        leaves: Sequence[Any],
        n: int | None,
        bucket: int | None,
        stream: Stream,
    ) -> Any:
        """The end of a call, its inputs staged: the replay and its outputs (the lock is held)."""
        graph = entry.graph
        if graph is None:  # fn queued no work for this key, or its capture was refused
            # (fallback="eager"): what it returns, from an eager run
            with stream, _streams_only(self.device, stream):
                return self.fn(*args, **(kwargs or {}))
        graph.replay(stream)
        _still_valid(leaves, self._lease)
        return self._outputs(entry, n, bucket, stream)

    def _drop(self, keys: set[Any]) -> None:
        """Close the graphs of ``keys``: their next calls capture again."""
        with self._lock:
            self._armed = None  # (it may be one of them)
            for key in keys:
                entry = self._entries.pop(key)
                if entry.graph is not None:
                    entry.graph.close()

    def _begin_on(self, stream: Stream) -> Stream:
        """Order work on ``stream`` after the previous call's (the lock is held); return it.

        The static buffers were last used on that stream: this call's copies
        into them must not overtake its replay.
        """
        if stream._recording is not None:
            # inside a capture: its graph (keyed apart, with buffers of its own) is ordered
            # by that capture, and a wait for work outside it is refused by the driver
            # (CUDA_ERROR_STREAM_CAPTURE_ISOLATION)
            return stream
        last = self._last
        if last is not None and last is not stream:
            _wait_for(last, stream)
        self._last = stream
        return stream

    def _stream_source(self, ins: list[Input]) -> Stream | int:
        """Where the call's stream comes from (see the module's docstring).

        The callable's ``stream``, else the handle of the current stream of
        the library whose arrays came in, else this thread's current stream.
        """
        if self._stream is not None:
            return self._stream
        for i in ins:
            if i.lib is not None:
                return i.lib.current_stream(self.device.index)  # type: ignore[no-any-return]
        return _current_stream_of(self.device)

    def _stream_of(self, source: Stream | int) -> Stream:
        """The stream of a :meth:`_stream_source` (another library's, by its handle)."""
        return self.device.external_stream(source) if type(source) is int else source  # type: ignore[return-value]

    # capture ------------------------------------------------------------------------------
    def _capture(
        self, key: Any, spec: Any, ins: list[Input], n: int | None, bucket: int | None, stream: Stream
    ) -> Entry:
        if self._trainer is None:  # (grad mode with inputs or parameters requiring grad: refused)
            refuse_untracked(self.fn, ins)
        entry = Entry(bucket, len(ins))
        entry.static = self._staging.static_inputs(spec, ins, bucket)
        self._staging.stage(entry, ins, n, bucket, stream)
        args, kwargs = unflatten(spec, [self._as_lib(s, i.lib) for s, i in zip(entry.static, ins)])
        eager = stream._recording is None
        # eagerly, on the call stream, every library routed to it (inside another capture
        # nothing runs eagerly: no warmup, whose work that capture would record)
        for _ in range(self.warmup if eager else 0):
            with stream, _streams_only(self.device, stream):
                self.fn(*args, **kwargs)
        side = self._capture_stream
        if side is None:
            side = self._capture_stream = self.device.create_stream()
        if eager:  # (capturing runs nothing; the wait orders the side stream's own uses)
            side.wait(stream)  # (inside a capture it would join the side stream to it)
        before = self.pool.reserved
        session = CaptureSession(self.device, side, self.mode, self.pool, "pool", generators=self.generators)
        graph = session.begin()
        try:
            try:
                if self.buckets is None and eager:
                    self._staging.record_copies(entry, ins, side)
                with side:
                    out = self.fn(*args, **kwargs)
            except BaseException as exc:
                refusal = session.fail(exc, _HINT[self.fallback])
                if refusal is None:
                    raise
                raise refusal from exc
            captured = session.end_or_none()
        except CaptureError as err:
            if self.fallback != "eager" or not eager:  # (inside a capture nothing runs eagerly)
                raise
            return self._refused(key, bucket, len(ins), err)
        if captured is None:  # nothing to replay (a zero-size batch): calls run fn
            self._entries[key] = entry
            return entry
        graph.output = None
        outs: list[Any] = []
        entry.out_spec = flatten(out, outs)
        entry.outs = outs
        entry.out_libs = [None if isinstance(o, DeviceArray) else interop.library_of(o) for o in outs]
        graph.keep(*entry.static)
        entry.graph = graph
        entry.memory = self.pool.reserved - before
        self._entries[key] = entry
        return entry

    def _refused(self, key: Any, bucket: int | None, inputs: int, err: CaptureError) -> Entry:
        """Let ``key``, whose capture ``err`` refused, run the function eagerly from now on (warned once).

        The lock is held: a call of the same key from another thread waits,
        then finds this entry.
        """
        entry = Entry(bucket, inputs)
        entry.eager = str(err)
        self._entries[key] = entry
        warn(
            f"cudagraphs: the capture of {self._lease.name} for {self._name(key, entry)!r} was "
            f"refused; that key runs eagerly from now on (fallback='eager'): {err}",
            FallbackWarning,
        )
        return entry

    def _as_lib(self, array: DeviceArray, lib: Any) -> Any:
        return array if lib is None else lib.view(array)

    def _reserved(self) -> int:
        total = self.pool.reserved
        torch_pool = self.pool.foreign.get("torch")
        if torch_pool is not None:
            total += _torch_pool_bytes(torch_pool)
        return total

    # outputs ------------------------------------------------------------------------------
    def _outputs(self, entry: Entry, n: int | None, bucket: int | None, stream: Stream) -> Any:
        cut = n is not None and n != bucket
        d = self.dim
        lease = self._lease
        result = []  # (compiled, the list is read by index)
        for o in entry.outs:
            if isinstance(o, DeviceArray):
                if cut and len(o.shape) > d and o.shape[d] == bucket:
                    o = o[first_rows(o.shape, d, n)]  # type: ignore[arg-type]
                if self.copy_outputs:
                    result.append(o.copy(stream=stream))
                else:
                    result.append(GraphOutput._expiring(o, lease))
                continue
            if cut:  # (another library's output: its shape is read only when it may be cut)
                shape = tuple(getattr(o, "shape", ()))
                if len(shape) > d and shape[d] == bucket:
                    o = o[first_rows(shape, d, n)]  # type: ignore[arg-type]
            if self.copy_outputs:  # on the replay's stream: the library's current one may be another
                with _streams_only(self.device, stream):
                    o = o.clone() if hasattr(o, "clone") else o.copy()
            result.append(o)
        return unflatten(entry.out_spec, result)

    # the rest of the API --------------------------------------------------------------------
    def capture_all(self, *args: Any, **kwargs: Any) -> GraphedCallable:
        """Capture the graph of every bucket now, largest first, for arguments like these.

        ``args`` are example arguments (any size along ``dim`` up to the
        largest bucket); each bucket's graph is warmed up and captured on
        them, padded. Capturing the largest bucket first lets the smaller
        ones reuse its temporaries. Returns the callable.
        """
        if self.buckets is None:
            raise ValueError("capture_all needs buckets: without them, graphs are keyed by exact shape")
        if self._trainer is not None:  # grad=True: differentiable keys get both graphs
            with self._lock:
                self._trainer.capture_all(args, kwargs)
            return self
        leaves: list[Any] = []
        spec = flatten((args, kwargs), leaves)
        d = self.dim
        with self._lock:
            ins = [_describe(x, self.device) for x in leaves]
            n, _ = self._staging.bucket(ins)
            if n is None:
                raise TypeError("capture_all takes example arguments with at least one device array")
            self._lease.calls += 1  # the static buffers change: earlier outputs are stale
            stream = self._begin_on(self._stream_of(self._stream_source(ins)))
            for b in reversed(self.buckets):
                key = (spec, tuple([(i.dtype, self._staging.shape(i.shape, b)) for i in ins]))
                if key in self._entries:
                    continue
                if n <= b:
                    self._capture(key, spec, ins, n, b, stream)
                    continue
                cut = []  # the examples' first b rows
                for i in ins:
                    part = array_of(i, self.device)[first_rows(i.shape, d, b)]
                    cut.append(new_input(part, i.lib, part.ptr, part.shape, i.dtype, part.is_contiguous))
                self._capture(key, spec, cut, b, b, stream)
        return self

    @property
    def graphs(self) -> dict[Any, Graph]:
        """The captured graphs by bucket (or by input shapes without buckets), for inspection."""
        return {name: graph for name, graph, _ in self._named()}

    def _named(self) -> list[tuple[Any, Graph, Entry]]:
        """(name, graph, entry) of the keys with a graph (not those whose function queued no work)."""
        out: list[tuple[Any, Graph, Entry]] = []
        names: set[Any] = set()
        for key, entry in self._entries.items():
            if entry.graph is None:
                continue
            name = self._name(key, entry)
            name = name if name not in names else (name, len(out))
            names.add(name)
            out.append((name, entry.graph, entry))
        if self._trainer is not None:  # (a differentiable key's forward and backward graphs)
            for key, graph, entry in self._trainer.named():
                kind = "backward" if key[-1] == "backward" else "forward"
                name = (self._name(key, entry), kind)
                name = name if name not in names else (name, len(out))
                names.add(name)
                out.append((name, graph, entry))
        return out

    def _name(self, key: Any, entry: Entry) -> Any:
        """A key's name in stats() and graphs: its bucket, or its inputs' shapes."""
        return entry.bucket if entry.bucket is not None else tuple(shape for _, shape in key[1])

    def stats(self) -> dict[str, Any]:
        """Calls, hits, misses, captures, memory, per graph its hits, nodes and memory, and keys run eagerly.

        ``reserved`` is what the callable's pools hold, PyTorch's ``MemPool``
        included; a graph's ``memory`` is what its capture added to the
        cudagraphs pool (other libraries' pools are shared and not split).
        ``eager`` has, per key whose capture was refused under
        ``fallback="eager"`` (named as in ``graphs``), its ``hits`` (calls
        after the refused one, each an eager run) and the refusal's message
        as ``reason``; ``captures`` counts the keys captured, not those.
        """
        with self._lock:
            per = {
                name: {"hits": e.hits, "memory": e.memory, "nodes": len(g.nodes)}
                for name, g, e in self._named()
            }
            eager = {
                self._name(key, e): {"hits": e.hits, "reason": e.eager}
                for key, e in self._entries.items()
                if e.eager is not None
            }
            return {
                "calls": self._lease.made,
                "hits": self._lease.made - self._misses,
                "misses": self._misses,
                "captures": len(self._entries) - len(eager) + self._steps(),
                "reserved": self._reserved(),
                "graphs": per,
                "eager": eager,
            }

    def _steps(self) -> int:
        """The differentiable keys captured (grad=True; those refused are counted as eager)."""
        if self._trainer is None:
            return 0
        return sum(1 for step in self._trainer.steps.values() if step.entry.graph is not None)

    def close(self) -> None:
        """Free every graph and buffer (after their replays); later calls capture again.

        Keys run eagerly after a refused capture (``fallback="eager"``) are
        forgotten too: their next calls try to capture again.
        """
        with self._lock:
            self._armed = None
            entries, self._entries = self._entries, {}
            if self._trainer is not None:
                self._trainer.close()
            self._staging.buffers.clear()
            self._lease.calls += 1
            for e in entries.values():
                if e.graph is not None:
                    e.graph.close()

    def __repr__(self) -> str:
        return (
            f"<cudagraphs.GraphedCallable {self._lease.name}: {len(self._entries)} graphs, "
            f"buckets {self.buckets}>"
        )


class _streams_only:
    """Route the other libraries' current streams to ``stream`` (eager runs: no pools)."""

    def __init__(self, device: Device, stream: Stream) -> None:
        self.routing = interop.route(device, stream, None)

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        self.routing.close()


_HINT = {  # what a refusal in a key's capture says to do, besides moving the call out
    "raise": 'let this callable run such keys eagerly: cg.graphed(fn, fallback="eager") (GraphModule too)',
    "eager": "run that part eagerly",
}


def _torch_pool_bytes(pool: Any) -> int:
    """Bytes a ``torch.cuda.MemPool`` holds (0 where PyTorch cannot say)."""
    try:
        segments = interop.torch.ADAPTER.pool_memory(pool)  # (its snapshot, one at a time)
    except Exception:  # (a PyTorch whose snapshot fails: as one without it)
        return 0
    return sum(end - start for start, end in segments or ())


def graphed(
    fn: Callable[..., Any] | None = None,
    *,
    buckets: Sequence[int] | None = None,
    dim: int = 0,
    warmup: int = 1,
    pool: GraphPool | None = None,
    stream: Stream | StreamLike | None = None,
    mode: str = "thread_local",
    copy_outputs: bool = False,
    pad_value: Any = 0,
    device: Device | int | None = None,
    fallback: str = "raise",
    grad: bool = False,
    params: Any = None,
    generators: bool | Sequence[Any] | None = None,
) -> Any:
    """Run ``fn`` as CUDA graphs: one per input shape (or bucket), captured on first use.

    Usable as ``f = cg.graphed(fn, ...)`` or as a decorator
    (``@cg.graphed(buckets=[1, 2, 4, 8])``).

    Parameters
    ----------
    fn : callable
        Takes device arrays (cudagraphs, PyTorch, CuPy, or any with
        ``__cuda_array_interface__``/DLPack), possibly nested in tuples,
        lists and dicts, and hashable other arguments; returns arrays (nested
        likewise). It must queue its work on the current stream (cudagraphs',
        PyTorch's or CuPy's: all three are the captured stream while it is
        captured) and must not synchronize or read results on the host.
    buckets : sequence of int, optional
        Sizes for dimension ``dim`` of every array input: a call is padded up
        to the smallest bucket that holds it, and outputs that have the
        bucket's size along ``dim`` are cut back to the true size. ``fn`` must
        treat the rows along ``dim`` independently. Without buckets, each new
        input shape is a new graph.
    dim : int
        The padded dimension (default: the leading one).
    warmup : int
        Eager runs of ``fn`` on a new key's inputs before capturing it (they
        compile kernels and let libraries set up). Functions that update
        state in place see those runs too: use 0 for them, after compiling.
        At most 1000.
    pool : GraphPool, optional
        The pool the graphs share (default: a new one for this callable).
    stream : Stream or StreamLike, optional
        Where calls replay (default: the caller's current stream of the
        inputs' library, or cudagraphs'); another library's stream
        (``__cuda_stream__``) too.
    mode : {"thread_local", "global", "relaxed"}
        The capture mode.
    copy_outputs : bool
        Return copies instead of views of the static outputs.
    pad_value : number or None
        What the padding rows of the inputs are filled with on each call
        (None: left as they are, which saves a kernel per input).
    device : Device, optional
        Default: the stream's, the pool's or the current device.
    fallback : {"raise", "eager"}
        What a key whose capture is refused does (a
        :class:`~cudagraphs.CaptureError`: a host read, a synchronize, an
        allocation the capture forbids, in cudagraphs' code or another
        library's): ``"raise"`` it (the default; the next call of the key
        tries again), or run ``fn`` ``"eager"``-ly for that key from then on:
        the refusal is warned once per key
        (:class:`~cudagraphs.FallbackWarning`) and kept in
        ``stats()["eager"]``, and the key's outputs are what ``fn`` returns
        (plain arrays, not views that expire). The other keys are still
        graphed. Inside another capture a refusal is always raised.
    grad : bool
        Train through the callable (PyTorch): a call in PyTorch's grad mode
        whose inputs or parameters require grad replays a forward graph and
        returns tensors that autograd tracks; their backward replays a
        backward graph captured with ``torch.autograd.grad``, and the
        parameters' ``.grad`` accumulate as eagerly (as
        ``torch.cuda.make_graphed_callables``; docs/graphed.md, "Training").
        Without it (the default), such a call is refused with a
        ``ValueError`` when its key is captured: the graph would carry no
        gradient.
    params : iterable of tensors, optional
        With ``grad=True`` and a plain function: the tensors (weights it
        reads from a closure) gradients are taken for. A
        ``torch.nn.Module`` passed as ``fn`` uses its own parameters.
    generators : True or list of torch.Generator, optional
        PyTorch's random numbers in ``fn``: True puts the device's default
        generator in capture mode, a list of ``torch.Generator(device="cuda")``
        objects those too; each call then draws new numbers, as eager calls
        would (see :func:`cudagraphs.capture`). Default None: a random-number
        call of PyTorch's is refused, naming this option.

    Returns
    -------
    GraphedCallable

    Raises
    ------
    TypeError, ValueError
        For bad arguments, here or at the call (unhashable non-array
        arguments, sizes larger than the largest bucket, a ``requires_grad``
        that changed between differentiable calls).
    CaptureError
        At a call whose key's capture is refused, unless ``fallback="eager"``.
    """
    options = functools.partial(
        GraphedOptions.checked,
        buckets=buckets,
        dim=dim,
        warmup=warmup,
        pool=pool,
        stream=stream,
        mode=mode,
        copy_outputs=copy_outputs,
        pad_value=pad_value,
        device=device,
        fallback=fallback,
        grad=grad,
        params=params,
        generators=generators,
    )

    def make(f: Callable[..., Any]) -> GraphedCallable:
        # (the function is checked before the options, the options when it is given)
        return GraphedCallable(_function(f), options())

    return make if fn is None else make(fn)


def _function(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, checked to be callable."""
    if not callable(fn):
        raise TypeError(f"graphed takes a callable, got {type(fn).__name__}")
    return fn
