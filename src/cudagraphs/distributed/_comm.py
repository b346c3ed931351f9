"""Communicators: one rank on one device, or every local device of one process.

:class:`Communicator` (one rank), :class:`LocalGroup` (every device of this
process), and the calls that make them: :func:`init`, :func:`local_group`.

Every operation goes through :func:`cudagraphs._recording.submit`, like
any other work: inside a capture it becomes part of the graph (NCCL's
kernels), the graph keeps its arrays and its communicator alive, and the
capture's rules apply (another thread's capture is refused, ...).
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

from .. import _recording
from .._array import DeviceArray, empty, operand
from .._device import Device, Stream, StreamLike, as_device, device_count, resolve_stream
from .._errors import CaptureError, CollectiveTimeoutError, DistributedError
from .._recording import Work, submit
from . import _nccl, _simulated
from ._engine import REDUCTIONS, Engine, Op, disagreement
from ._store import check_store, exchange

__all__ = ["Communicator", "LocalGroup", "engine_for", "group_calls", "init", "local_group"]

Array = Any  # a cudagraphs DeviceArray, or another library's CUDA array (torch, CuPy): used in place
DTYPES = ("int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64", "bfloat16")
DEFAULT_TIMEOUT = 60.0

_ENGINES: dict[str, Engine] = {}
_lock = threading.Lock()


def engine_for(device: Device) -> Engine:
    """The engine of ``device``'s backend (made once per process)."""
    kind = device.backend.capabilities.collectives
    with _lock:
        engine = _ENGINES.get(kind)
        if engine is None:
            engine = _simulated.SimulatedEngine() if kind == "simulated" else _nccl.NcclEngine()
            _ENGINES[kind] = engine
        return engine


class _Plan(NamedTuple):
    """One rank's checked operation: what to queue, what it reads and writes, what to return."""

    op: Op
    reads: tuple[DeviceArray, ...]
    writes: tuple[DeviceArray, ...]
    result: Any  # (what the call returns, as it was given; a send's is its input)


# groups -----------------------------------------------------------------------------------------
_groups = threading.local()  # this thread's open group_calls(): [depth, {id(engine): entry}, joins]


@contextlib.contextmanager
def group_calls() -> Iterator[None]:
    """Issue the operations of the block together (NCCL's group), when it ends.

    Needed where one thread drives several ranks (one process, several
    devices: :class:`LocalGroup` does it for its own calls), and for a send
    and a receive that must happen at once (an exchange between two ranks):
    outside a group, each waits for the other. Groups nest; the outermost
    one issues. One block holds operations of :func:`local_group`
    communicators or of :func:`init` ones, not both (NCCL groups cannot mix
    blocking and non-blocking communicators): that raises
    :class:`~cudagraphs.DistributedError`.
    """
    state = getattr(_groups, "state", None)
    if state is None:
        state = _groups.state = [0, {}, []]
    state[0] += 1
    ok = False
    try:
        yield
        ok = True
    finally:
        state[0] -= 1
        if state[0] == 0:
            opened, state[1] = state[1], {}
            joins, state[2] = state[2], []
            try:
                for engine, handles, timeout, _ in opened.values():
                    if ok:
                        engine.group_end(handles, timeout)
                    else:  # (the group still ends: the engine must not stay in it)
                        with contextlib.suppress(Exception):
                            engine.group_end(handles, timeout)
            finally:
                for origin, side in joins:  # streams forked into a capture join it back
                    origin.wait(side)


def _join_later(origin: Stream, side: Stream) -> None:
    """Join ``side`` back into ``origin``'s capture once the open group has issued."""
    _groups.state[2].append((origin, side))


def _join_group(comm: Communicator) -> bool:
    """Enter ``comm``'s engine into the open group; False when no group is open."""
    state = getattr(_groups, "state", None)
    if state is None or state[0] == 0:
        return False
    entry = state[1].get(id(comm.engine))
    if entry is None:
        comm.engine.group_start()
        entry = state[1][id(comm.engine)] = (comm.engine, [], comm.timeout, comm._blocking)
    if entry[3] != comm._blocking:
        raise DistributedError(
            "one group_calls() block cannot hold operations of a local_group() communicator "
            "and of an init() one (NCCL refuses blocking and non-blocking communicators in "
            "one group): use a block for each"
        )
    if comm._handle not in entry[1]:
        entry[1].append(comm._handle)
    return True


# one rank ---------------------------------------------------------------------------------------
class Communicator:
    """One rank of a communicator, on one device.

    Made by :func:`init` (one process per GPU) or :func:`local_group` (every
    device of this process). Each operation takes arrays of this rank's
    device and queues on ``stream`` (default: the device's current stream),
    eagerly or inside a capture; every rank must call the same collectives
    in the same order with the same sizes. An array is a cudagraphs
    ``DeviceArray`` or another library's CUDA array (a torch tensor, a CuPy
    array), used in place without a copy and returned as it was given; the
    library's own work on it must be ordered with ``stream`` (as for any
    cudagraphs operation on another library's memory).

    Attributes
    ----------
    rank, size : int
        This rank and how many there are.
    device : Device
    timeout : float
        Seconds :meth:`synchronize` (and joining) waits before raising
        :class:`~cudagraphs.CollectiveTimeoutError`.
    """

    def __init__(
        self,
        device: Device,
        rank: int,
        size: int,
        engine: Engine,
        handle: Any,
        timeout: float,
        blocking: bool = True,
    ) -> None:
        self.device, self.rank, self.size = device, rank, size
        self._blocking = blocking  # (init's are not: NCCL groups cannot mix the two)
        self.engine, self._handle, self.timeout = engine, handle, timeout
        self._closed = False
        self._graphs: weakref.WeakSet[Any] = weakref.WeakSet()  # graphs that use it (see abort)
        # NCCL's resources go once nothing holds the communicator (a graph that uses it does)
        self._finalizer = weakref.finalize(self, _recording.later, device, engine.destroy, handle)

    # the operations --------------------------------------------------------------------------
    def all_reduce(
        self,
        x: Array,
        out: Array | None = None,
        *,
        op: str = "sum",
        stream: Stream | StreamLike | None = None,
    ) -> Array:
        """Reduce ``x`` over the ranks into ``out`` on every rank (default: in place); returns ``out``."""
        return self._run(self._plan_all_reduce(x, out, op, stream), stream)

    def all_gather(
        self, x: Array, out: Array | None = None, *, stream: Stream | StreamLike | None = None
    ) -> Array:
        """Every rank's ``x``, in rank order along a new first axis: ``out.shape == (size, *x.shape)``."""
        return self._run(self._plan_all_gather(x, out, stream), stream)

    def reduce_scatter(
        self,
        x: Array,
        out: Array | None = None,
        *,
        op: str = "sum",
        stream: Stream | StreamLike | None = None,
    ) -> Array:
        """Reduce ``x`` (shape ``(size, *rest)``) over the ranks; rank ``r`` gets part ``r`` in ``out``."""
        return self._run(self._plan_reduce_scatter(x, out, op, stream), stream)

    def broadcast(
        self, x: Array, out: Array | None = None, *, root: int = 0, stream: Stream | StreamLike | None = None
    ) -> Array:
        """``root``'s ``x`` into ``out`` on every rank (default: ``x``, in place); returns ``out``."""
        return self._run(self._plan_broadcast(x, out, root, stream), stream)

    def send(self, x: Array, peer: int, *, stream: Stream | StreamLike | None = None) -> None:
        """Send ``x`` to rank ``peer`` (which calls :meth:`recv` with the same size and type)."""
        self._run(self._plan_p2p("send", x, peer), stream)

    def recv(self, out: Array, peer: int, *, stream: Stream | StreamLike | None = None) -> Array:
        """Receive into ``out`` what rank ``peer`` sends; returns ``out``."""
        return self._run(self._plan_p2p("recv", out, peer), stream)

    def synchronize(self, stream: Stream | StreamLike | None = None, *, timeout: float | None = None) -> None:
        """Wait for the work queued so far on ``stream``, at most ``timeout`` seconds.

        Raises
        ------
        CollectiveTimeoutError
            If it has not finished by then (a rank that never joined an
            operation): the communicator is aborted first, so the streams
            can finish; make a new one to go on.
        """
        s = resolve_stream(stream, self.device)
        limit = self.timeout if timeout is None else _timeout(timeout)
        event = s.record()
        deadline = time.monotonic() + limit
        try:
            while not event.query():
                if time.monotonic() > deadline:
                    raise CollectiveTimeoutError(
                        f"rank {self.rank}'s work on {s} did not finish within {limit:g} s: a rank "
                        "never joined one of its operations, or they disagree (another "
                        "operation, size or order); the communicator was aborted"
                    )
                time.sleep(0.0002)
        except CollectiveTimeoutError:
            self.abort()
            raise

    def abort(self) -> None:
        """Abandon the communicator now: its pending operations end without results.

        The graphs that use it can no longer be replayed (NCCL freed what their
        nodes use): a replay raises :class:`~cudagraphs.DistributedError`.
        """
        self._closed = True
        if self._finalizer.detach() is not None:
            self.engine.abort(self._handle)
            what = f"rank {self.rank} of {self.size} on {self.device}"

            def error() -> DistributedError:
                return DistributedError(
                    f"this graph uses a communicator ({what}) that was aborted: its collectives "
                    "cannot run any more; capture the work again with a new communicator"
                )

            for graph in list(self._graphs):
                graph._unusable(error)

    def _held_by(self, graph: Any) -> None:
        """A graph's captured work uses this communicator (it keeps it alive)."""
        self._graphs.add(graph)

    def close(self) -> None:
        """No more operations on this communicator. Idempotent.

        Its NCCL resources are released once nothing holds it: at once when
        you drop it, after the last graph that uses it otherwise.
        """
        self._closed = True

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` or :meth:`abort` was called."""
        return self._closed

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = " closed" if self.closed else ""
        return (
            f"<cudagraphs.distributed.Communicator rank {self.rank} of {self.size} on {self.device}{state}>"
        )

    # checks -----------------------------------------------------------------------------------
    def _array(self, name: str, given: Any) -> DeviceArray:
        a = operand(given, name)
        if a.device is not self.device:
            raise ValueError(
                f"{name} is on {a.device}, but rank {self.rank}'s communicator is on {self.device}: "
                "each rank reads and writes its own device's arrays"
            )
        if not a.is_contiguous:
            raise ValueError(f"{name} must be contiguous (NCCL reads dense memory); pass a copy")
        if a.dtype.name not in DTYPES:
            raise TypeError(f"{name} is {a.dtype}; collectives take {', '.join(DTYPES)}")
        return a

    def _out(
        self,
        name: str,
        out: Any,
        like: DeviceArray,
        shape: tuple[int, ...],
        stream: Stream | StreamLike | None,
    ) -> DeviceArray:
        if out is None:
            return empty(shape, like.dtype, device=self.device, stream=self._stream(stream))
        checked = self._array(name, out)
        if checked.dtype != like.dtype:
            raise TypeError(f"{name} is {checked.dtype} but the input is {like.dtype}")
        if checked.shape != shape:
            raise ValueError(f"{name} has shape {checked.shape}; this operation writes {shape}")
        return checked

    def _peer(self, what: str, peer: Any) -> int:
        if not isinstance(peer, int) or isinstance(peer, bool):
            raise TypeError(f"{what} must be an int rank, got {type(peer).__name__}")
        if not 0 <= peer < self.size:
            raise IndexError(f"{what} {peer} is not a rank of this communicator (0..{self.size - 1})")
        return peer

    def _stream(self, stream: Stream | StreamLike | None) -> Stream:
        return resolve_stream(stream, self.device)

    # plans ------------------------------------------------------------------------------------
    def _plan_all_reduce(self, x: Any, out: Any, op: str, stream: Stream | StreamLike | None) -> _Plan:
        xa = self._array("x", x)
        oa = xa if out is None else self._out("out", out, xa, xa.shape, stream)
        red = _reduction(op)
        return _Plan(Op("all_reduce", xa.ptr, oa.ptr, xa.size, xa.dtype, red), (xa,), (oa,), _given(out, x))

    def _plan_all_gather(self, x: Any, out: Any, stream: Stream | StreamLike | None) -> _Plan:
        xa = self._array("x", x)
        oa = self._out("out", out, xa, (self.size, *xa.shape), stream)
        return _Plan(Op("all_gather", xa.ptr, oa.ptr, xa.size, xa.dtype), (xa,), (oa,), _given(out, oa))

    def _plan_reduce_scatter(self, x: Any, out: Any, op: str, stream: Stream | StreamLike | None) -> _Plan:
        xa = self._array("x", x)
        if xa.ndim == 0 or xa.shape[0] != self.size:
            raise ValueError(
                f"reduce_scatter takes x of shape (size, ...) = ({self.size}, ...), one part per "
                f"rank; got {xa.shape}"
            )
        oa = self._out("out", out, xa, xa.shape[1:], stream)
        op_ = Op("reduce_scatter", xa.ptr, oa.ptr, oa.size, xa.dtype, _reduction(op))
        return _Plan(op_, (xa,), (oa,), _given(out, oa))

    def _plan_broadcast(self, x: Any, out: Any, root: Any, stream: Stream | StreamLike | None) -> _Plan:
        xa = self._array("x", x)
        root = self._peer("root", root)
        oa = xa if out is None else self._out("out", out, xa, xa.shape, stream)
        op = Op("broadcast", xa.ptr, oa.ptr, xa.size, xa.dtype, "", root)
        return _Plan(op, (xa,), (oa,), _given(out, x))

    def _plan_p2p(self, kind: str, a: Any, peer: Any) -> _Plan:
        aa = self._array("x" if kind == "send" else "out", a)
        peer = self._peer("peer", peer)
        if peer == self.rank:
            raise ValueError(f"rank {self.rank} cannot {kind} to itself: copy the array instead")
        if kind == "send":
            return _Plan(Op("send", aa.ptr, 0, aa.size, aa.dtype, "", peer), (aa,), (), a)
        return _Plan(Op("recv", 0, aa.ptr, aa.size, aa.dtype, "", peer), (), (aa,), a)

    # queueing ---------------------------------------------------------------------------------
    def _submit(self, plan: _Plan, stream: Stream) -> None:
        engine, handle, rank, op = self.engine, self._handle, self.rank, plan.op

        def issue(raw: Any, _: Any) -> None:
            engine.enqueue(handle, rank, op, raw)

        submit(stream, Work("", issue, None, plan.reads, plan.writes, (self,), _call_name(op)))

    def _run(self, plan: _Plan, stream: Stream | StreamLike | None) -> Array:
        if self.closed:
            raise ValueError(f"{self!r} is closed: make a new communicator")
        s = self._stream(stream)
        if _join_group(self):
            self._submit(plan, s)
            return plan.result
        self.engine.group_start()
        try:
            self._submit(plan, s)
        finally:
            try:
                self.engine.group_end([self._handle], self.timeout)
            except CollectiveTimeoutError:
                self.abort()
                raise
        return plan.result


def _given(out: Any, default: Any) -> Any:
    """What an operation returns: ``out`` as given (a torch tensor stays one), else ``default``."""
    return default if out is None else out


def _call_name(op: Op) -> str:
    return "nccl" + "".join(w.capitalize() for w in op.kind.split("_"))


def _reduction(op: Any) -> str:
    if op not in REDUCTIONS:
        raise ValueError(f"op must be one of {REDUCTIONS}, got {op!r}")
    return str(op)


def _agree(ops: list[Op]) -> None:
    """Refuse, before anything is issued, ranks of one process whose calls differ.

    (NCCL checks nothing: on a GPU they would hang or corrupt memory; the
    simulator would raise only when the streams run.)
    """
    calls = disagreement(dict(enumerate(ops)))
    if calls is None:
        return
    error = TypeError if len({op.dtype for op in ops}) > 1 else ValueError
    raise error(
        f"{ops[0].kind}: the ranks' arrays differ ({calls}); every rank's array must have "
        "the same size and dtype. Nothing was issued"
    )


def _timeout(timeout: Any) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return float(timeout)


# every device of this process -----------------------------------------------------------------
class LocalGroup(Sequence[Communicator]):
    """One communicator over several devices of this process: rank ``i`` on ``devices[i]``.

    Its operations take one array per rank (in rank order) and issue them
    together. Eagerly, rank ``i``'s work queues on its device's current
    stream (or ``streams[i]``). Inside a capture (one of the streams is
    captured), the ranks whose stream is not part of that capture run on a
    stream forked into it and joined back, so the one graph holds every
    device's part, and one replay runs them all.
    """

    def __init__(self, comms: list[Communicator]) -> None:
        self.comms = comms
        self.devices = [c.device for c in comms]
        self._side: dict[int, Stream] = {}  # rank -> its stream forked into captures

    def __len__(self) -> int:
        return len(self.comms)

    def __getitem__(self, i: Any) -> Any:
        return self.comms[i]

    def __iter__(self) -> Iterator[Communicator]:
        return iter(self.comms)

    def all_reduce(
        self,
        xs: Sequence[Array],
        outs: Sequence[Array] | None = None,
        *,
        op: str = "sum",
        streams: Sequence[Stream | None] | None = None,
    ) -> list[Array]:
        """:meth:`Communicator.all_reduce` on every rank; returns the outputs."""
        return self._each(lambda c, x, o, s: c._plan_all_reduce(x, o, op, s), xs, outs, streams)

    def all_gather(
        self,
        xs: Sequence[Array],
        outs: Sequence[Array] | None = None,
        *,
        streams: Sequence[Stream | None] | None = None,
    ) -> list[Array]:
        """:meth:`Communicator.all_gather` on every rank; returns the outputs."""
        return self._each(lambda c, x, o, s: c._plan_all_gather(x, o, s), xs, outs, streams)

    def reduce_scatter(
        self,
        xs: Sequence[Array],
        outs: Sequence[Array] | None = None,
        *,
        op: str = "sum",
        streams: Sequence[Stream | None] | None = None,
    ) -> list[Array]:
        """:meth:`Communicator.reduce_scatter` on every rank; returns the outputs."""
        return self._each(lambda c, x, o, s: c._plan_reduce_scatter(x, o, op, s), xs, outs, streams)

    def broadcast(
        self,
        xs: Sequence[Array],
        outs: Sequence[Array] | None = None,
        *,
        root: int = 0,
        streams: Sequence[Stream | None] | None = None,
    ) -> list[Array]:
        """:meth:`Communicator.broadcast` on every rank; returns the outputs."""
        return self._each(lambda c, x, o, s: c._plan_broadcast(x, o, root, s), xs, outs, streams)

    def synchronize(self, *, timeout: float | None = None) -> None:
        """:meth:`Communicator.synchronize` of every rank's current stream.

        On a timeout every rank's communicator is aborted (the others' streams
        wait for the same operations).
        """
        try:
            for c in self.comms:
                c.synchronize(timeout=timeout)
        except CollectiveTimeoutError:
            self.abort()
            raise

    def abort(self) -> None:
        """Abort every rank's communicator."""
        for c in self.comms:
            c.abort()

    def close(self) -> None:
        """Close every rank's communicator."""
        for c in self.comms:
            c.close()

    def __enter__(self) -> LocalGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<cudagraphs.distributed.LocalGroup of {len(self)} ranks on {self.devices}>"

    # helpers --------------------------------------------------------------------------------
    def _per(self, name: str, seq: Any) -> list[Any]:
        if isinstance(seq, DeviceArray) or not isinstance(seq, Sequence):
            raise TypeError(f"{name} must be a list of arrays, one per rank ({len(self)})")
        if len(seq) != len(self):
            raise ValueError(f"{name} has {len(seq)} entries; the group has {len(self)} ranks")
        return list(seq)

    def _outs(self, outs: Any) -> list[Any]:
        return [None] * len(self) if outs is None else self._per("outs", outs)

    def _streams(self, streams: Any) -> list[Stream]:
        given = [None] * len(self) if streams is None else self._per("streams", streams)
        return [c._stream(s) for c, s in zip(self.comms, given)]

    def _each(
        self,
        plan: Callable[[Communicator, Any, Any, Stream], _Plan],
        xs: Any,
        outs: Any,
        streams: Any,
    ) -> list[Array]:
        """Check every rank's arguments (``plan``), then issue them together.

        Inside a capture, the ranks outside it fork into it first, so that
        what a plan allocates (an output) comes from the capture's pool of
        its device, on the stream it is used on.
        """
        st, xs, outs = self._streams(streams), self._per("xs", xs), self._outs(outs)
        if any(c.closed for c in self.comms):
            raise ValueError(f"{self!r} has closed communicators: make a new group")
        with group_calls():  # (joins the forked streams back when the outermost group ends)
            st = self._fork(st)
            plans = [plan(c, x, o, s) for c, x, o, s in zip(self.comms, xs, outs, st)]
            _agree([p.op for p in plans])
            try:
                for c, p, s in zip(self.comms, plans, st):
                    _join_group(c)
                    c._submit(p, s)
            except CollectiveTimeoutError:
                self.abort()
                raise
        return [p.result for p in plans]

    def _fork(self, streams: list[Stream]) -> list[Stream]:
        """Each rank's stream: inside a capture, those outside every capture fork into it.

        (Streams that are all captured, each by a capture of its own device,
        are used as they are: a graph per device.) A forked rank runs on a
        stream of the group's own, which joins the capture back when the
        group has issued.
        """
        rec = next((s._recording for s in streams if s._recording is not None), None)
        if rec is None or all(s._recording is not None for s in streams):
            return streams
        origin = next(s for s in streams if s._recording is rec)
        out = list(streams)
        for i, s in enumerate(streams):
            if s._recording is not None:
                if s._recording is not rec:
                    raise CaptureError(
                        f"the ranks' streams belong to two captures ({origin} and {s}) and some "
                        "to none: capture every rank's stream, or one stream (the others join it)"
                    )
                continue
            side = self._side.get(i)
            if side is None or side._recording not in (None, rec):  # (busy in another capture)
                side = self._side[i] = self.devices[i].create_stream()
            side.wait(origin)  # forks it into the capture (or orders it there again)
            _join_later(origin, side)
            out[i] = side
        return out


# making them ---------------------------------------------------------------------------------------
def local_group(devices: Sequence[Device] | None = None, *, timeout: float = DEFAULT_TIMEOUT) -> LocalGroup:
    """One communicator over ``devices`` (default: every device) of this process.

    Warmed up before it is returned (each kind of collective once), so its
    first use inside a capture needs no connection setup.
    """
    if devices is None:
        devices = [Device(i) for i in range(device_count())]
    devs = list(devices)
    if not devs or not all(isinstance(d, Device) for d in devs):
        raise TypeError("devices must be a non-empty list of cudagraphs Devices")
    if len({id(d) for d in devs}) != len(devs):
        raise ValueError(f"devices must be distinct, got {devs}")
    if len({d.backend_name for d in devs}) != 1:
        raise ValueError(f"devices must be of one backend, got {devs}")
    limit = _timeout(timeout)
    engine = engine_for(devs[0])
    handles = engine.init_all(devs)
    group = LocalGroup(
        [Communicator(d, r, len(devs), engine, h, limit) for r, (d, h) in enumerate(zip(devs, handles))]
    )
    _warm_up(group.comms)
    return group


def init(
    rank: int,
    world_size: int,
    *,
    store: Any,
    device: Device | int | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    name: str = "default",
) -> Communicator:
    """Join a communicator as ``rank`` of ``world_size`` (one process per device).

    Rank 0 makes the communicator's id and puts it in ``store``; the other
    ranks read it there (a :class:`~cudagraphs.distributed.FileStore`, a
    :func:`~cudagraphs.distributed.TCPStore`, or a PyTorch store). Every
    rank must call it; it returns once all have joined (warmed up, as
    :func:`local_group`), or raises
    :class:`~cudagraphs.CollectiveTimeoutError` after ``timeout`` seconds.

    Parameters
    ----------
    rank, world_size : int
    store : object
        With ``set(key, value)`` and ``get(key)``, shared by every rank.
    device : Device or int, optional
        This rank's device. Default: device ``rank % device_count()``.
    timeout : float
    name : str
        Tells apart several communicators made through one store.
    """
    for what, v in (("rank", rank), ("world_size", world_size)):
        if not isinstance(v, int) or isinstance(v, bool):
            raise TypeError(f"{what} must be an int, got {type(v).__name__}")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise IndexError(f"rank {rank} is not in 0..{world_size - 1}")
    check_store(store)  # (every argument checked before the engine, which may be missing, is loaded)
    device = as_device(device) if device is not None else Device(rank % device_count())
    limit = _timeout(timeout)
    engine = engine_for(device)
    key = f"cudagraphs.distributed/{name}/unique_id"
    uid = exchange(
        store,
        key,
        engine.unique_id() if rank == 0 else None,
        f"rank {rank} waited for rank 0's communicator id",
    )
    handle = engine.init_rank(uid, world_size, rank, device, limit)
    comm = Communicator(device, rank, world_size, engine, handle, limit, blocking=False)
    _warm_up([comm])
    return comm


def _warm_up(comms: list[Communicator]) -> None:
    """Issue each kind of operation once (NCCL connects the ranks on first use).

    A connection made inside a capture would allocate memory there, which
    the driver refuses; after this, captures only record kernels. Nothing
    waits here: each rank's warm-up meets the others' on their streams.
    """
    n = comms[0].size
    with group_calls():
        for c in comms:
            _join_group(c)
            s = c.device.current_stream()
            x = empty((n, 1), "float32", device=c.device, stream=s)
            c._submit(c._plan_all_reduce(x, None, "sum", s), s)
            c._submit(c._plan_all_gather(x[0], None, s), s)
            c._submit(c._plan_reduce_scatter(x, None, "sum", s), s)
            c._submit(c._plan_broadcast(x, None, 0, s), s)
            if n > 1:  # a ring of sends (each rank's neighbours)
                c._submit(c._plan_p2p("send", x[0], (c.rank + 1) % n), s)
                c._submit(c._plan_p2p("recv", x[1], (c.rank - 1) % n), s)
