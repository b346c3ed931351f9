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
static inputs (kernels compile, libraries set up), then is captured. All of
a callable's graphs share one :class:`~cudagraphs.GraphPool` (and, through
it, one PyTorch ``MemPool``): temporaries of one bucket's graph are reused by
the others, so :meth:`GraphedCallable.capture_all`, which captures the
largest bucket first, costs little more memory than the largest bucket alone.

Replays run on the caller's stream: the ``stream`` given, else the current
stream of the library whose arrays came in (PyTorch's or CuPy's), else this
thread's cudagraphs stream. Calls are serialized by a lock; a call on
another stream than the previous one waits for it first.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any, cast

from . import _recording, interop
from ._argtree import ARRAY_TYPES, LEAF, flatten, in_host_memory, positional_spec, unflatten
from ._array import DeviceArray, _new_array, foreign_view
from ._capture import CaptureSession
from ._device import Device, Stream
from ._errors import StaleOutputError
from ._graph import Graph
from ._kernel import fastcall
from ._options import GraphedOptions
from ._pool import GraphPool
from ._staging import Entry, Input, Staging, array_of, first_rows

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

    def __init__(self, name: str, lock: Any) -> None:
        self.calls = 0
        self.made = 0
        self.name = name
        self.lock = lock


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

    @classmethod
    def _expiring(cls, base: DeviceArray, lease: _Lease) -> GraphOutput:
        b = base  # (its description, copied as it is)
        out = cast(
            GraphOutput,
            _new_array(cls, b._block, b._ptr, b.device, b.shape, b.strides, b.dtype, b.is_contiguous, b.size),
        )
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


_recording.EXPIRING.add(GraphOutput)

_FIXED, _TORCH, _CURRENT = 0, 1, 2  # where an armed call's stream comes from (see _fastcall.c)


# arguments ------------------------------------------------------------------------------
def _describe(obj: Any, device: Device) -> Input:
    if type(obj) is GraphOutput:  # (checked now; the call reads it as plain memory)
        obj = obj._fixed()
    if isinstance(obj, DeviceArray):
        if obj.device is not device:
            raise ValueError(f"graphed: an input array is on {obj.device}, the callable on {device}")
        return Input(obj, None, obj.ptr, obj.shape, obj.dtype, obj.is_contiguous)
    lib = interop.library_of(obj)
    if lib is not None:  # PyTorch, CuPy: described without a view (the repeat path)
        if not lib.owns(obj):  # (the type is the library's: an array in host memory)
            raise in_host_memory(obj)
        ptr, shape, dtype, contiguous, index = lib.describe(obj)
        if index != device.index:
            raise ValueError(
                f"graphed: an input {lib.name} array is on device {index}, the callable on {device}"
            )
        return Input(obj, lib, ptr, shape, dtype, contiguous)
    view = foreign_view(obj, device)
    if view is None:
        raise TypeError(f"graphed: {type(obj).__name__} is not a CUDA device array")
    return Input(view, None, view.ptr, view.shape, view.dtype, view.is_contiguous)


def _still_valid(leaves: list[Any], lease: _Lease) -> None:
    """Check again, after a call queued its replay, the inputs that are another callable's outputs.

    They were checked when described, outside their callable's lock (holding
    two callables' locks could deadlock two threads that feed each one's
    outputs to the other). A call of theirs counts before it waits for its
    previous call's stream: if none counted by now, it waits for this replay
    where that is the stream the output was made on (this thread's, by default).
    """
    for x in leaves:
        if type(x) is GraphOutput and x._lease is not lease:
            x._check()


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
    """

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
        self._stream = options.stream
        self._capture_stream: Stream | None = None
        self._entries: dict[Any, Entry] = {}
        self._staging = Staging(device, self.buckets, self.dim, self.pad_value)
        # (where the C part is built, an RLock its call takes without a method call)
        self._lock: Any = fastcall.Lock(reentrant=True) if fastcall is not None else threading.RLock()
        self._lease = _Lease(getattr(fn, "__qualname__", "the graphed callable"), self._lock)
        self._last: Stream | None = None
        self._hot: tuple[Any, ...] | None = None  # what the C call may repeat (see _arm)
        self._misses = 0

    # the call ----------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the function's graph for these arguments (capturing it on first use)."""
        if not kwargs and all(map(ARRAY_TYPES.__contains__, map(type, args))):
            leaves: list[Any] = list(args)  # the common case: arrays, positionally
            spec = positional_spec(len(args))
        else:
            leaves = []
            spec = flatten((args, kwargs), leaves)
        device = self.device
        key: tuple[Any, ...]
        with self._lock:  # (inputs that are this callable's outputs are checked under it)
            ins = [_describe(x, device) for x in leaves]
            if self.buckets is None:  # (the common case: keyed by the exact shapes)
                n = bucket = None
                key = (spec, tuple([(i.dtype, i.shape) for i in ins]))
            else:
                n, bucket = self._staging.bucket(ins)
                key = (spec, tuple([(i.dtype, self._staging.shape(i.shape, bucket)) for i in ins]))
            self._hot = None  # (armed again below, for this call's kind)
            # every earlier output is stale from here on; counted before the wait for the
            # previous call's stream, so that work a thread queued there on an output it
            # checked before this count is waited for (see _still_valid)
            self._lease.calls += 1
            self._lease.made += 1
            stream = self._begin_on(self._call_stream(ins))
            if stream._recording is not None:  # inside a capture: graphs without input nodes
                key = (*key, "captured")
            entry = self._entries.get(key)
            if entry is None:
                self._misses += 1
                entry = self._capture(key, spec, ins, n, bucket, stream)
            else:
                entry.hits += 1
                self._staging.stage(entry, ins, n, bucket, stream)
            graph = entry.graph
            if graph is None:  # fn queued no work for this key: what it returns, from an eager run
                with stream, _streams_only(device, stream):
                    return self.fn(*args, **kwargs)
            graph.replay(stream)
            _still_valid(leaves, self._lease)
            result = self._outputs(entry, n, bucket, stream)
            if fastcall is not None and spec == positional_spec(len(leaves)):
                self._arm(entry, leaves, ins, stream)
            return result

    def _arm(self, entry: Entry, leaves: list[Any], ins: list[Input], stream: Stream) -> None:
        """Let the C call (``_fastcall.graphed_method``) repeat this call while it can.

        Armed after a call of positional inputs, each a plain cudagraphs array
        or a CUDA ``torch.Tensor``, that the graph copies itself (dense, no
        buckets), whose outputs are not copied, on a stream no capture
        records. A later call with inputs of the same types, shapes, dtypes
        and devices, on the same stream, with the lock free, is then made in C
        as this method's caller makes it; any other call disarms it (the lock
        held) and comes here. The lock is held.
        """
        n = len(ins)
        if self.buckets is not None or self.copy_outputs or stream._recording is not None or n > 16:
            return
        if not all(i.contiguous and j in entry.copies for j, i in enumerate(ins)):
            return
        spec = entry.out_spec
        many = spec is not LEAF
        if many and (spec[0] is not tuple or not spec[1] or any(s is not LEAF for s in spec[1])):
            return
        if any(type(o) is not DeviceArray and isinstance(o, DeviceArray) for o in entry.outs):
            return  # (a subclass: the Python call wraps it, C would not)
        torch_stream = None
        for x, i in zip(leaves, ins):
            if i.lib is None:
                if type(x) is not DeviceArray:
                    return
                continue
            hot = getattr(i.lib, "hot", None)
            found = hot() if hot is not None else None
            if found is None or type(x) is not found[0]:
                return
            torch_stream = found[1]
        device = self.device
        if self._stream is not None:
            how: tuple[Any, ...] = (_FIXED, stream, None, None, None)
        elif torch_stream is not None:
            how = (_TORCH, stream, torch_stream, device.index, stream.handle)
        else:
            how = (_CURRENT, stream, None, (device, device.stream), None)
        graph = entry.graph
        self._hot = (
            how[0],
            tuple([type(x) for x in leaves]),
            tuple([i.shape for i in ins]),
            tuple([i.dtype if i.lib is None else x.dtype for x, i in zip(leaves, ins)]),
            tuple([device if i.lib is None else device.index for i in ins]),
            *how[1:],
            graph,
            entry,
            entry.sources,
            entry.held,
            tuple(entry.outs),
            many,
            self._lease,
            self._lock,
        )

    def _drop(self, keys: set[Any]) -> None:
        """Close the graphs of ``keys``: their next calls capture again."""
        with self._lock:
            self._hot = None
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
            # (another thread may be capturing `last` now: then what it queued there before)
            event = _recording.mark(last, lambda: None if last.closed else last.record())
            if event is not None:  # (a closed stream finished its work when it was closed)
                stream.wait(event)
        self._last = stream
        return stream

    def _call_stream(self, ins: list[Input]) -> Stream:
        if self._stream is not None:
            return self._stream
        for i in ins:
            if i.lib is not None:
                return self.device.external_stream(i.lib.current_stream(self.device.index))
        return self.device.current_stream()

    # staging (see _staging) ---------------------------------------------------------------
    def _moved(self, entry: Entry, j: int, obj: Any, stream: Stream) -> None:
        """The C call's :meth:`Staging.point`, for input ``j`` (``obj``) at a new address.

        The lock is held.
        """
        i = _describe(obj, self.device)
        staging = self._staging
        if not staging.point(entry, j, i, stream):
            self._hot = None
            staging.copy_in(entry.static[j], i, None, None, stream)

    # capture ------------------------------------------------------------------------------
    def _capture(
        self, key: Any, spec: Any, ins: list[Input], n: int | None, bucket: int | None, stream: Stream
    ) -> Entry:
        entry = Entry(bucket)
        entry.static = self._staging.static_inputs(spec, ins, bucket)
        self._staging.stage(entry, ins, n, bucket, stream)
        args, kwargs = unflatten(spec, iter([self._as_lib(s, i.lib) for s, i in zip(entry.static, ins)]))
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
        session = CaptureSession(self.device, side, self.mode, self.pool, "pool")
        graph = session.begin()
        try:
            if self.buckets is None and eager:
                self._staging.record_copies(entry, ins, side)
            with side:
                out = self.fn(*args, **kwargs)
        except BaseException:
            session.abort()
            raise
        if session.end_or_none() is None:  # nothing to replay (a zero-size batch): calls run fn
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
        result = []
        for o in entry.outs:
            if isinstance(o, DeviceArray):
                if cut and len(o.shape) > d and o.shape[d] == bucket:
                    o = o[first_rows(o.shape, d, n)]  # type: ignore[arg-type]
                if self.copy_outputs:
                    result.append(o.copy(stream=stream))
                else:
                    result.append(GraphOutput._expiring(o, self._lease))
                continue
            if cut:  # (another library's output: its shape is read only when it may be cut)
                shape = tuple(getattr(o, "shape", ()))
                if len(shape) > d and shape[d] == bucket:
                    o = o[first_rows(shape, d, n)]  # type: ignore[arg-type]
            if self.copy_outputs:  # on the replay's stream: the library's current one may be another
                with _streams_only(self.device, stream):
                    o = o.clone() if hasattr(o, "clone") else o.copy()
            result.append(o)
        return unflatten(entry.out_spec, iter(result))

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
        leaves: list[Any] = []
        spec = flatten((args, kwargs), leaves)
        d = self.dim
        with self._lock:
            ins = [_describe(x, self.device) for x in leaves]
            n, _ = self._staging.bucket(ins)
            if n is None:
                raise TypeError("capture_all takes example arguments with at least one device array")
            self._hot = None
            self._lease.calls += 1  # the static buffers change: earlier outputs are stale
            stream = self._begin_on(self._call_stream(ins))
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
                    cut.append(
                        i._replace(obj=part, ptr=part.ptr, shape=part.shape, contiguous=part.is_contiguous)
                    )
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
            name = entry.bucket if entry.bucket is not None else tuple(shape for _, shape in key[1])
            name = name if name not in names else (name, len(out))
            names.add(name)
            out.append((name, entry.graph, entry))
        return out

    def stats(self) -> dict[str, Any]:
        """Calls, hits, misses, captures, memory, and per graph its hits, nodes and memory.

        ``reserved`` is what the callable's pools hold, PyTorch's ``MemPool``
        included; a graph's ``memory`` is what its capture added to the
        cudagraphs pool (other libraries' pools are shared and not split).
        """
        with self._lock:
            per = {
                name: {"hits": e.hits, "memory": e.memory, "nodes": len(g.nodes)}
                for name, g, e in self._named()
            }
            return {
                "calls": self._lease.made,
                "hits": self._lease.made - self._misses,
                "misses": self._misses,
                "captures": len(self._entries),
                "reserved": self._reserved(),
                "graphs": per,
            }

    def close(self) -> None:
        """Free every graph and buffer (after their replays); later calls capture again."""
        with self._lock:
            self._hot = None
            entries, self._entries = self._entries, {}
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


def _torch_pool_bytes(pool: Any) -> int:
    """Bytes a ``torch.cuda.MemPool`` holds (0 where PyTorch cannot say)."""
    try:
        return sum(int(seg["total_size"]) for seg in pool.snapshot())
    except Exception:  # (an older PyTorch without MemPool.snapshot)
        return 0


def graphed(
    fn: Callable[..., Any] | None = None,
    *,
    buckets: Sequence[int] | None = None,
    dim: int = 0,
    warmup: int = 1,
    pool: GraphPool | None = None,
    stream: Stream | None = None,
    mode: str = "thread_local",
    copy_outputs: bool = False,
    pad_value: Any = 0,
    device: Device | int | None = None,
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
    stream : Stream, optional
        Where calls replay (default: the caller's current stream of the
        inputs' library, or cudagraphs').
    mode : {"thread_local", "global", "relaxed"}
        The capture mode.
    copy_outputs : bool
        Return copies instead of views of the static outputs.
    pad_value : number or None
        What the padding rows of the inputs are filled with on each call
        (None: left as they are, which saves a kernel per input).
    device : Device, optional
        Default: the stream's, the pool's or the current device.

    Returns
    -------
    GraphedCallable

    Raises
    ------
    TypeError, ValueError
        For bad arguments, here or at the call (unhashable non-array
        arguments, sizes larger than the largest bucket).
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


PYTHON_CALL = GraphedCallable.__call__  # the reference call (tests compare the C call with it)

if (
    fastcall is not None
):  # the repeat call in C (see GraphedCallable._arm); the method above stays the reference
    setattr(  # noqa: B010
        GraphedCallable,
        "__call__",
        fastcall.graphed_method(GraphedCallable, PYTHON_CALL, _Lease, Entry, GraphOutput, _recording._ACTIVE),
    )
