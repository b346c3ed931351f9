"""Per-stream capture state, the capture rules, and the one path for queued work.

Every piece of work that reaches a stream (a kernel, a copy, a memset, a host
callback, an event record or wait, a graph embedded as a child node, another
library's work declared to us) is described by a :class:`Work` and handed to
:func:`submit`. When the stream is not being captured, ``submit`` queues it.
When it is, ``submit`` applies the capture rules once for all:

* work from another thread than the capturing one is refused (it would land
  silently in that thread's graph);
* work that cannot be replayed (``Work.refuse``) is refused, and the capture
  becomes invalid;
* everything the work reads, writes or names in ``keep`` is kept alive by the
  capture (and then by its graph), except memory the capture's own pool or
  graph allocations own;
* the node is recorded with what it takes to patch it later
  (:class:`NodeRecord`); its driver handle is the one the backend call
  returned, or is found once, when first needed, among the graph's nodes by
  type and kernel name (:func:`resolve_handles`): reading the capture point
  back after every node cost 4.6 µs per node on an H100 (measured), more than
  the rest of the capture path.

This module sits below :mod:`cudagraphs._device`: it knows devices and
streams only by duck type (``device.backend``, ``stream._raw``,
``stream.handle``, ``stream.device``, and the ``stream._recording`` slot
where a stream's :class:`Recording` lives while it is captured).

It is compiled by Cython from this source where the package is built
(``_recording.pxd`` declares :class:`Recording` an extension type with typed
fields, so that :func:`submit` and :meth:`Recording.record`, run for every
piece of work, read them as C fields: docs/architecture.md, "The compiled
part"), and runs as plain Python where not.

Deferred release
----------------
Destroying an executable graph, or freeing device or pinned memory, while a
capture is active on the device is illegal for the driver and invalidates
the capture (events and streams are legal to destroy, and wait too, for one
rule: see ``backends/sim/rules.py``'s ``RULES``). Releases therefore go through
:func:`release` (run now when the device has no capture, else queued) or,
from finalizers and garbage collection, :func:`later` (always queued: a
finalizer may run while a lock of ours is held). :func:`drain` runs the queue
at safe points: when a capture ends, before an allocation, on a synchronize.

A release may run in any thread and use streams of other threads (the
collector of one thread frees another's blocks): a stream it finds open
stays alive until it is done (:func:`holding`), even if its thread closes it
meanwhile; the stream's destruction waits for it (:func:`when_unheld`).
"""

from __future__ import annotations

import collections
import contextlib
import threading
import warnings
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any, NamedTuple

import numpy as np

try:
    import cython
except ImportError:  # (run as Python where Cython is not installed: nothing is compiled)
    cython = SimpleNamespace(compiled=False)

from ._config import compiled_part
from ._errors import CaptureError, CaptureInvalidatedError, CudaError
from ._fields import ArrayFields
from ._where import user_line
from .backends.base import (
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
    ERROR_NAMES,
    ArrayArg,
)

if not cython.compiled:  # (compiled, _capi.pxd's C functions)
    from ._capi import (
        cg_api_load,
        cg_first_none,
        cg_issue,
        cg_item,
        cg_launch,
        cg_mix,
        cg_thread_ident,
        cg_tuple6,
        cg_type_in,
        cg_types_in,
    )

__all__ = [
    "EXPIRING",
    "UNFINISHED",
    "NodeRecord",
    "Recording",
    "Work",
    "active",
    "address",
    "array_address",
    "begin",
    "drain",
    "forbid",
    "has_unrecorded",
    "holding",
    "instantiate_blocked",
    "issue_launch",
    "later",
    "launch_refused",
    "mark",
    "quiet",
    "refuse_beside_capture",
    "release",
    "resolve_handles",
    "status",
    "submit",
    "submit_parts",
    "unsafe_blocker",
    "user_line",
    "view_of",
    "when_unheld",
]

BY_VALUE = (int, float, complex, bytes, str, np.generic, type(None))  # passed by value, never kept
_BY_VALUE = BY_VALUE  # (the same, for the hot paths: compiled, a C global, no name lookup)


class Work:
    """A typed description of one piece of work for :func:`submit`.

    Attributes
    ----------
    kind : str
        The node type it records in a capture (``"kernel"``, ``"memcpy"``,
        ``"memset"``, ``"host"``, ``"event_record"``, ``"event_wait"``,
        ``"child"``, ``"conditional"``, ``"empty"``, ``"mem_alloc"``,
        ``"mem_free"``), or ``""`` for work that adds no node (a capture
        join).
    issue : callable
        ``issue(raw_stream, arg)`` queues the work through the backend (a
        backend method such as ``backend.launch``). It may return the node it
        added; otherwise the capture point is read back.
    arg : object
        The second argument of ``issue`` (a ``KernelLaunch``, a ``Copy``, ...).
    reads, writes : tuple
        Arrays (or other libraries' objects) the work reads and writes.
    keep : tuple
        Anything else the work needs alive as long as it may run (host
        callbacks, events, pinned buffers, embedded graphs).
    name : str
        The kernel's name, for traces and pictures.
    patch : object
        What changing the node later takes (``(kernel, KernelLaunch)`` or a
        ``Copy``), or None if it cannot be changed node by node.
    refuse : str or None
        Why the work cannot be recorded in a graph (None: it can).
    """

    # (compiled, an extension type whose fields _recording.pxd declares: submit reads them as C
    # fields; a kernel launch makes none, see submit_parts)
    __slots__ = ("arg", "issue", "keep", "kind", "name", "patch", "reads", "refuse", "writes")

    kind: str
    issue: Callable[[Any, Any], Any]
    arg: Any
    reads: tuple[Any, ...]
    writes: tuple[Any, ...]
    keep: tuple[Any, ...]
    name: str
    patch: Any
    refuse: str | None

    def __init__(
        self,
        kind: str,
        issue: Callable[[Any, Any], Any],
        arg: Any = None,
        reads: tuple[Any, ...] = (),
        writes: tuple[Any, ...] = (),
        keep: tuple[Any, ...] = (),
        name: str = "",
        patch: Any = None,
        refuse: str | None = None,
    ) -> None:
        self.kind, self.issue, self.arg, self.reads, self.writes = kind, issue, arg, reads, writes
        self.keep, self.name, self.patch, self.refuse = keep, name, patch, refuse

    def __repr__(self) -> str:
        return f"Work({self.kind!r}, {self.name!r}, reads={len(self.reads)}, writes={len(self.writes)})"


class NodeRecord(NamedTuple):
    """A node recorded by :func:`submit`: the driver's handle and its description.

    ``views`` are the arrays the node uses (kernel nodes: their pointer
    arguments, in ``patch``), never the arrays themselves.
    """

    handle: Any
    kind: str
    name: str
    views: tuple[ArrayArg, ...]
    patch: Any
    top: bool  # recorded in the graph itself, not in the body of a conditional node


# a kernel record's kind, the one object (compared by identity first), and where a record holds
# its kind (compiled: C globals; a record's item read by position, see cg_item)
_KERNEL, _RECORD_KIND = "kernel", NodeRecord._fields.index("kind")
_NODE_RECORD = NodeRecord  # (the same, for the hot paths: compiled, a C global, no name lookup)


def view_of(a: Any) -> Any:
    """The view of ``a`` a node describes (None: a value passed by value, or no array)."""
    if isinstance(a, ArrayFields):  # (compiled: a C type check; most arguments are arrays)
        arr = a  # (compiled: typed, its fields read as C fields)
        spec = arr._arg  # (made once per array, by _view_spec)
        if spec is None or cg_type_in(a, _EXPIRING):  # (an expiring array's checks that it has not)
            return a._view_spec()  # type: ignore[attr-defined]
        return spec
    spec = None if isinstance(a, _BY_VALUE) else getattr(a, "_view_spec", None)
    return spec if spec is None else spec()


def _views(objs: tuple[Any, ...]) -> tuple[ArrayArg, ...]:
    """The views of those of ``objs`` that are arrays."""
    out = []
    for o in objs:
        view = view_of(o)
        if view is not None:
            out.append(view)
    return tuple(out)


class Recording:
    """The capture state of one stream (and of its conditional bodies' streams).

    Attributes
    ----------
    device, stream : object
        The device and the captured stream.
    mode : str
        The capture mode.
    memory : object
        The memory policy: ``allocate(recording, nbytes) -> (ptr, owner)``,
        ``owners`` (the block owners whose memory the capture owns) and
        ``freed(ptr)`` (the capture layer provides it).
    thread : int
        The capturing thread.
    keep : list
        What the graph must keep alive.
    nodes : list of NodeRecord
        The nodes recorded through :func:`submit`, in order.
    plain : bool
        Whether every node is top-level (not in a conditional body) and was
        recorded without a handle.
    invalid : str or None
        Why the capture can no longer succeed.
    """

    # (compiled, an extension type whose fields _recording.pxd declares)
    __slots__ = (
        "__weakref__",
        "active",
        "before",
        "conditions",
        "device",
        "devices",
        "frees",
        "invalid",
        "joined",
        "keep",
        "loops",
        "memory",
        "mode",
        "nodes",
        "plain",
        "signature",
        "stream",
        "streams",
        "thread",
    )

    def __init__(self, device: Any, stream: Any, mode: str, memory: Any) -> None:
        self.device = device
        self.stream = stream
        self.mode = mode
        self.memory = memory
        self.thread = threading.get_ident()
        self.keep: list[Any] = []
        self.nodes: list[NodeRecord] = []
        self.plain = True  # every node is top-level and has no handle yet
        # the nodes' (kind, name) in order, by identity (_capi.cg_mix): what Graph.update compares
        # before it reads any record
        self.signature = 0
        self.streams: list[Any] = [stream]  # innermost capturing stream last (bodies)
        self.joined: list[Any] = []  # streams forked into the capture by a wait (any device)
        self.devices: list[Any] = [device]  # the devices whose streams it records
        self.invalid: str | None = None
        self.active = False
        self.frees: collections.deque[int] = collections.deque()  # graph memory to free
        self.conditions: dict[int, str] = {}  # handles no conditional node uses yet -> where made
        self.before: Any = None  # an event recorded on the stream before the capture began
        self.loops: dict[Any, str] = {}  # while bodies not captured yet -> which, where made

    # the rules ------------------------------------------------------------------
    def fail(self, what: str) -> None:
        """Mark the capture invalid and raise CaptureError about ``what``."""
        message = (
            f"{what} (called at {user_line()}); the capture on stream 0x{self.stream.handle:x} is now invalid"
        )
        self.invalid = self.invalid or message
        raise CaptureError(message)

    def record(
        self,
        stream: Any,
        kind: str,
        issue: Callable[[Any, Any], Any],
        arg: Any,
        reads: tuple[Any, ...],
        writes: tuple[Any, ...],
        kept: tuple[Any, ...],
        name: str,
        patch: Any,
        refuse: str | None,
    ) -> Any:
        """Apply the capture rules to a work, given by its parts (see :class:`Work`), and record it.

        ``stream`` is one of ours; ``kept`` is the work's ``keep``.
        """
        if self.thread != cg_thread_ident():
            raise CaptureError(
                f"{kind or 'work'} {name}".rstrip() + f" queued at {user_line()} on "
                f"stream 0x{stream.handle:x}, which thread {self.thread} is capturing: work "
                "from another thread would land in its graph; use a stream of this thread "
                "(device.create_stream())"
            )
        if self.invalid is not None:
            raise CaptureInvalidatedError(self.invalid)
        if refuse is not None:
            self.fail(refuse)
        if self.frees:
            self.flush_frees()
        try:
            node = _issue(stream, issue, arg)
        except CudaError as err:
            if err.code in (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED):
                what = f"{kind} {name}".strip()
                self.invalid = self.invalid or (
                    f"the driver refused {what} ({err.name}) queued at {user_line()}; the "
                    f"capture on stream 0x{self.stream.handle:x} is now invalid"
                )
                raise CaptureInvalidatedError(self.invalid) from err
            raise
        owners = self.memory.owners
        # (each tuple scanned in place: their concatenation would be one more tuple a launch)
        self._keep_objects(reads, owners)
        self._keep_objects(writes, owners)
        if kept:
            self._keep_objects(kept, owners)
        if kind:  # (the record is built in C)
            views = () if kind == "kernel" else _views(reads + writes)
            top = stream is self.stream or stream in self.joined
            if node is not None or not top:
                self.plain = False
            self.nodes.append(cg_tuple6(_NODE_RECORD, node, kind, name, views, patch, top))
            self.signature = cg_mix(self.signature, kind, name)
        return node

    def _keep_objects(self, objs: tuple[Any, ...], owners: tuple[Any, ...]) -> None:
        """Keep what of ``objs`` the graph needs alive.

        Arrays whose memory the capture does not own, and objects not passed
        by value.
        """
        keep = self.keep
        for o in objs:
            if isinstance(o, ArrayFields):  # (compiled: typed, the field read as a C field)
                arr = o
                block = arr._block
            else:  # (others: another library's array, a scratch buffer, a number)
                t = type(o)
                if t is int or t is float:  # (the common numbers, passed by value: no attribute lookup)
                    continue
                block = getattr(o, "_block", None)
            if block is not None:  # an array: kept unless the capture owns its memory
                if block.owner not in owners:
                    keep.append(o)
            elif not isinstance(o, _BY_VALUE):  # numbers and structs are copied into the graph
                keep.append(o)

    def join(self, stream: Any) -> None:
        """``stream`` waited on an event recorded in the capture: the driver forked it in.

        Its work is recorded (and kept alive) like the captured stream's; its
        device counts as capturing (releases there wait for the end, a device
        synchronize there is refused) until the capture ends, which ends it
        for every joined stream (each must have been joined back, by the
        captured stream waiting on it, or the driver fails the capture).
        """
        stream._recording = self
        self.joined.append(stream)
        device = stream.device
        if device not in self.devices:
            self.devices.append(device)
            with _lock:
                _ACTIVE.setdefault(device, []).append(self)

    # graph memory (alloc="graph") ---------------------------------------------------
    def free_later(self, ptr: int) -> None:
        """A graph-memory block died (maybe in another thread): free it in the graph."""
        self.frees.append(ptr)

    def flush_frees(self, at_end: bool = False) -> None:
        """Record the free nodes of graph-memory blocks that died (capturing thread only).

        During the capture each goes on the stream that allocated it while
        that stream is still in the capture (a stream forked in from another
        device: after its work there); at the end (``at_end``: the forked
        streams have joined back), and otherwise, on the innermost captured
        stream, which the joins ordered after every stream's work.
        """
        stream_of = None if at_end else getattr(self.memory, "stream_of", None)
        while self.frees:
            ptr = self.frees.popleft()
            stream = stream_of(ptr) if stream_of is not None else None
            if stream is None or stream._recording is not self:
                stream = self.streams[-1]
            stream.device.backend.mem_free(ptr, stream._raw)
            self.memory.freed(ptr)

    # bodies of conditional nodes --------------------------------------------------------
    def enter_body(self, stream: Any, body: Any) -> None:
        """Capture ``stream`` into ``body`` (a conditional node's body graph)."""
        if not self.active:
            raise RuntimeError(
                "the capture that made this body has ended; bodies are "
                "captured inside the `with cg.capture()` block that made them"
            )
        if self.thread != threading.get_ident():
            raise CaptureError("a body is captured by the thread that captures its graph")
        self.device.backend.capture_begin(stream._raw, self.mode, body)
        stream._recording = self
        self.streams.append(stream)

    def exit_body(self, stream: Any) -> None:
        """End the capture of a body started by :meth:`enter_body`."""
        self.flush_frees(at_end=True)
        try:
            self.device.backend.capture_end(stream._raw)
        except CudaError as err:  # an invalid body invalidates the whole capture
            self.invalid = self.invalid or f"the capture of a conditional body failed: {err}"
            raise
        finally:
            stream._recording = None
            if self.streams[-1] is stream:
                self.streams.pop()

    # the end ----------------------------------------------------------------------------
    def end(self) -> Any:
        """End the capture and return the driver's graph.

        Raises
        ------
        CaptureInvalidatedError
            If the capture was invalidated (by us or by the driver).
        CudaError
            If the driver could not end it for another reason.
        """
        backend = self.device.backend
        graph, error = None, None
        try:
            self.flush_frees(at_end=True)
            graph = backend.capture_end(self.stream._raw)
        except CudaError as err:
            error = err
        finally:
            self._close()
        if error is not None:
            if error.code == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED:
                raise CaptureInvalidatedError(
                    self.invalid
                    or f"the driver invalidated the capture on stream "
                    f"0x{self.stream.handle:x}: a call that cannot be recorded (a synchronize, "
                    "a host copy, a query) was made while it was capturing"
                ) from error
            raise error
        if self.invalid is not None:
            release(self.device, backend.destroy, graph)
            raise CaptureInvalidatedError(self.invalid)
        return graph

    def abort(self) -> None:
        """End the capture whatever its state, destroying the partial graph."""
        backend = self.device.backend
        for stream in reversed(self.streams):
            try:
                graph = backend.capture_end(stream._raw)
            except CudaError:
                continue  # an invalidated capture ends with an error: nothing to destroy
            finally:
                stream._recording = None
            if stream is self.stream:
                release(self.device, backend.destroy, graph)
        self._close()

    def _close(self) -> None:
        with _lock:
            for device in self.devices:
                recs = _ACTIVE.get(device)
                if recs is not None and self in recs:
                    recs.remove(self)
                    if not recs:
                        del _ACTIVE[device]
        for stream in (*self.streams, *self.joined):
            stream._recording = None
        self.streams = [self.stream]
        self.joined = []
        self.active = False
        drain()


def begin(device: Any, stream: Any, mode: str, memory: Any, before: Any) -> Recording:
    """Start capturing ``stream`` in ``mode``; allocations go to ``memory``.

    ``before`` (an event) is recorded on the stream first, as
    :attr:`Recording.before`: what another thread queued there before the
    capture began, which it can still wait for (see :func:`mark`).

    Raises
    ------
    CaptureError
        If the stream is already being captured (by us or another library).
    """
    drain()
    backend = device.backend
    if stream._recording is not None or backend.capture_info(stream._raw)[0] != "none":
        raise CaptureError(
            f"stream 0x{stream.handle:x} is already being captured; one capture per "
            "stream at a time: capture on another stream (device.create_stream())"
        )
    rec = Recording(device, stream, mode, memory)
    backend.event_record(before._raw, stream._raw)  # (first: see mark())
    with _lock:  # not while a release that began with no capture active runs (see _acting),
        while _acting[0]:  # and from here on none begins
            _settled.wait()
        _ACTIVE.setdefault(device, []).append(rec)
        # from here mark() answers with ``before`` and the allocator steals nothing from the
        # stream: the work queued on it since ``before`` may be this capture's
        rec.before = before
        stream._recording = rec
    try:  # (the driver called without the lock: work that holds the backend may need it)
        backend.capture_begin(stream._raw, mode)
    except BaseException:
        rec._close()
        raise
    rec.active = True
    return rec


def mark(stream: Any, record: Callable[[], Any]) -> Any:
    """An event after the work queued on ``stream`` so far, from any thread.

    ``record()`` records one now, unless the stream is being captured: then
    the event recorded before its capture began (the work queued since then
    is the capture's, which does not run now).
    """
    with _lock:
        rec = stream._recording
        if rec is not None and rec.before is not None:
            return rec.before
        return record()


EXPIRING: list[type] = []
"""Array classes whose instances expire (a graphed callable's outputs); one or two.

(A list: the hot paths ask ``type(a) in EXPIRING`` of each argument, which a
list of one type answers by identity; a set would hash the type.)

Each has ``_check()`` (raises once the array is stale) and ``_guard`` (the
lock of what makes it stale). Work that uses one is queued, outside
captures, holding that lock and after checking under it (:func:`_issue_guarded`):
so the check and the queued read are one step for the thread that makes the
array stale (a call of the callable holds the lock).
"""
_EXPIRING = EXPIRING  # (the same list, for the hot paths: compiled, a C global, no name lookup)


def address(a: Any) -> Any:
    """``a.ptr``, the device address of an array (or of an object with a ``ptr``).

    An array of this library gives its field (compiled: read as a C field,
    where the property is an attribute lookup and a call), except an array
    whose type expires (:data:`EXPIRING`): its property checks that it has not.
    """
    if isinstance(a, ArrayFields):
        return array_address(a)
    return a.ptr


def array_address(arr: ArrayFields) -> Any:
    """:func:`address` of an array of this library (compiled: its field, the array typed)."""
    if cg_type_in(arr, _EXPIRING):
        return arr.ptr  # type: ignore[attr-defined]  # (DeviceArray's property: it checks)
    return arr._ptr


def launch_refused(code: int) -> CudaError:
    """The error of a kernel launch the C part's Packer made and the driver refused (``code``).

    (Raised as the driver's first answer: launching again to have the
    backend report it could answer otherwise, a capture invalidated.)
    """
    return CudaError(code, ERROR_NAMES.get(code, f"CUresult {code}"), "cuLaunchKernel")


def _uses_expiring(objs: Any) -> bool:
    """Whether one of ``objs`` is an array that expires (its type one of :data:`EXPIRING`).

    (Types compared by identity: work uses one to four arrays, and a set would
    hash each one's type.)
    """
    return cg_types_in(objs, _EXPIRING)  # (compiled: a C scan, no reference taken per item)


def _issue(stream: Any, issue: Callable[[Any, Any], Any], arg: Any) -> Any:
    """``issue(stream's driver stream, arg)``: what a Work queues, and what that call returned.

    A kernel's Work (its issue a Packer's) is packed and queued in C; a
    launch the driver refused raises its first answer (:func:`launch_refused`).
    """
    on = stream  # (compiled: typed, its fields read as C fields)
    code = cg_issue(issue, on.handle, arg)
    if code == 0:
        return None
    if code > 0:
        raise launch_refused(code)
    return issue(on._raw, arg)


def submit(stream: Any, work: Work) -> Any:
    """Queue ``work`` on ``stream``: the one path from the library to the backend.

    Returns the node the work added when ``stream`` is captured, else what
    the backend call returned.
    """
    w = work
    return submit_parts(stream, w.kind, w.issue, w.arg, w.reads, w.writes, w.keep, w.name, w.patch, w.refuse)


def submit_parts(
    stream: Any,
    kind: str,
    issue: Callable[[Any, Any], Any],
    arg: Any,
    reads: tuple[Any, ...],
    writes: tuple[Any, ...],
    keep: tuple[Any, ...],
    name: str,
    patch: Any,
    refuse: str | None,
) -> Any:
    """:func:`submit` of a work given by its parts (see :class:`Work`), none made (a kernel launch's path)."""
    on = stream  # (compiled: typed, its fields read as C fields)
    rec = on._recording
    if rec is None:
        if _uses_expiring(reads) or _uses_expiring(writes):
            return _issue_guarded(stream, issue, arg, reads, writes)
        return _issue(stream, issue, arg)
    return rec.record(stream, kind, issue, arg, reads, writes, keep, name, patch, refuse)


def issue_launch(
    stream: Any,
    packer: Any,
    function: int,
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    shared_mem: int,
    values: Any,
    args: Any,
) -> bool:
    """Queue a kernel launch as :func:`submit` issues it, where nothing records it: True if done.

    What ``submit`` does with a kernel's Work on a stream no capture records,
    without making the Work: the launch's ``values`` (its arguments ``args``,
    checked and converted) packed by the kernel's ``packer`` (the C part's
    ``Packer``) and launched. False, with nothing queued, where that is not
    the case (the stream is captured, an argument is an array that expires,
    the C part is not here or cannot pack a value): the caller then submits
    the Work, which applies the rules or records it. A launch the driver
    refused raises its error (:func:`launch_refused`).
    """
    on = stream  # (compiled: typed, its fields read as C fields)
    if on._recording is not None:
        return False
    if _uses_expiring(args):
        return False
    code = cg_launch(packer, function, grid, block, shared_mem, on.handle, values)
    if code > 0:
        raise launch_refused(code)
    return code == 0


def _issue_guarded(
    stream: Any, issue: Callable[[Any, Any], Any], arg: Any, reads: tuple[Any, ...], writes: tuple[Any, ...]
) -> Any:
    """Issue a work that uses expiring arrays, holding their locks and checking them under those."""
    found = [a for a in (*reads, *writes) if type(a) in EXPIRING]
    # (each lock once, in one order: two threads queuing work on outputs of two callables)
    locks = sorted({id(lock): lock for lock in (a._guard for a in found)}.values(), key=id)
    taken = []
    try:
        for lock in locks:
            lock.acquire()
            taken.append(lock)
        for a in found:
            a._check()
        return _issue(stream, issue, arg)
    finally:
        for lock in reversed(taken):
            lock.release()


def resolve_handles(backend: Any, graph: Any, records: list[NodeRecord]) -> list[NodeRecord]:
    """``records`` (the top-level nodes of ``graph``, in recording order) with driver handles.

    When every node of the graph was recorded, records and nodes correspond
    in order (the driver lists nodes in creation order). Otherwise records
    without a handle are matched, in order, to the graph's nodes of the same
    type (and, for kernels, the same kernel name); nodes that other libraries
    added in between are skipped.

    Raises
    ------
    LookupError
        If a record has no matching node (the graph was not captured from them).
    """
    if cg_first_none(records, 0) < 0:  # (every record has its handle: item 0, read in C)
        return records
    handles = [n.handle for n in backend.graph_topology(graph, details=False)[0]]
    if len(handles) == len(records):  # every node is ours: the driver lists them in order
        return [r if r.handle is not None else r._replace(handle=h) for r, h in zip(records, handles)]
    found, _ = backend.graph_topology(graph)
    out, j = [], 0
    for r in records:
        if r.handle is not None:
            out.append(r)
            continue
        while j < len(found) and not (
            found[j].type == r.kind and (r.kind != "kernel" or found[j].name == r.name)
        ):
            j += 1
        if j == len(found):
            raise LookupError(f"no {r.kind} node {r.name!r} left in the graph to match")
        out.append(r._replace(handle=found[j].handle))
        j += 1
    return out


def has_unrecorded(records: list[NodeRecord], count: int) -> bool:
    """Whether a graph of ``count`` top-level nodes holds nodes ``records`` (its records) do not describe.

    Nodes other libraries queued on a captured stream; child-graph records
    describe no node of their own that could be looked into.
    """
    children = 0
    for r in records:
        kind = cg_item(r, _RECORD_KIND)
        if kind is not _KERNEL and kind == "child":  # (most are kernels: identity first)
            children += 1
    return count != len(records) - children


def active(device: Any) -> list[Recording]:
    """The captures in progress on ``device`` (a snapshot)."""
    recs = _ACTIVE.get(device)
    return list(recs) if recs else []


def instantiate_blocked(device: Any) -> bool:
    """Whether a capture in progress forbids this thread to instantiate a graph on ``device``.

    ``cuGraphInstantiate`` is an unsafe call (``sim.RULES``): a global capture
    refuses it from any thread, a thread-local one from its own thread.
    """
    return unsafe_blocker() is not None


def unsafe_blocker() -> Recording | None:
    """The capture in progress that refuses this thread the driver's unsafe calls, or None.

    A global capture refuses them to every thread, a thread-local one to its
    own thread, on every device (see :func:`_all_active`); relaxed ones to none.
    """
    me = threading.get_ident()
    for r in _all_active():
        if r.mode == "global" or (r.mode == "thread_local" and r.thread == me):
            return r
    return None


def captures_here() -> bool:
    """Whether this thread has a capture in progress, on any device, in any mode."""
    me = threading.get_ident()
    return any(r.thread == me for r in _all_active())


def _all_active() -> list[Recording]:
    """Every capture in progress, on any device (once each).

    A capture mode is a rule of threads, not of devices: a thread-local
    capture on one device refuses the unsafe calls of its thread on every
    device (measured on two H200s: a graph of device 1 could not be
    instantiated while the thread captured on device 0).
    """
    with _lock:
        out: list[Recording] = []
        for recs in _ACTIVE.values():
            out.extend(r for r in recs if r not in out)
        return out


def refuse_beside_capture(stream: Any, what: str, subject: str) -> None:
    """Raise CaptureError if this thread captures while ``what`` runs on ``stream``, not captured.

    Work queued on a stream outside the capture runs now and is not in the
    graph: where a graph or a graphed callable is replayed, that is never
    what a thread in the middle of a capture means (``subject`` names what
    would run).
    """
    if not _ACTIVE:
        return
    me = cg_thread_ident()
    for r in _all_active():
        if r.thread == me:
            raise CaptureError(
                f"{what} on stream 0x{stream.handle:x}, called at {user_line()}, while this thread "
                f"captures stream 0x{r.stream.handle:x}: {subject} would run now, not in that "
                "capture. Replay on the captured stream (pass stream=, or inside `with stream:`) "
                "to embed it in the capture, or after the capture ends"
            )


def status(stream: Any) -> str:
    """``"none"``, ``"active"`` or ``"invalidated"``: ours first, then the driver's."""
    rec = stream._recording
    if rec is not None and rec.invalid is not None:
        return "invalidated"
    state: str = stream.device.backend.capture_info(stream._raw)[0]
    return state


def forbid(device: Any, stream: Any, what: str, *, device_wide: bool = False, hint: str = "") -> None:
    """Raise CaptureError if ``what`` (a synchronizing call) would break a capture.

    ``stream`` is the stream the call works on (None: not one stream). A
    call on a captured stream always breaks its capture. Otherwise it is an
    unsafe call, which breaks ``global`` captures and this thread's
    ``thread_local`` ones, as CUDA's capture modes define; a device-wide
    synchronize is refused while any capture is active on the device (the
    driver refuses it), and breaks the captures it would break.
    """
    if not _ACTIVE:
        return
    tail = f"; {hint}" if hint else ""
    rec = stream._recording if stream is not None else None
    if rec is not None:
        rec.fail(f"{what} cannot be recorded in a graph{tail}")
    me = threading.get_ident()
    broken = [r for r in _all_active() if r.mode == "global" or (r.mode == "thread_local" and r.thread == me)]
    recs = _ACTIVE.get(device)
    for r in broken[1:]:
        r.invalid = r.invalid or f"{what} was called at {user_line()} during the capture"
    if broken:
        broken[0].fail(f"{what} cannot be recorded in a graph{tail}")
    if device_wide and recs:
        r = recs[0]
        raise CaptureError(
            f"{what} called at {user_line()} while stream 0x{r.stream.handle:x} is being "
            f"captured (by thread {r.thread}): it would wait for a capture; synchronize the "
            f"streams you use instead, or wait until the capture ends{tail}"
        )


# deferred release -----------------------------------------------------------------------
_lock = threading.RLock()
_ACTIVE: dict[Any, list[Recording]] = {}

_QUEUE: collections.deque[tuple[Any, Callable[..., Any], tuple[Any, ...]]] = collections.deque()
_draining = threading.local()
# releases running now that began while no capture was active: a capture begins only once
# none runs (a release synchronizes streams, records events on them: had another thread
# begun capturing one meanwhile, that would break its capture)
_acting = [0]
_settled = threading.Condition(_lock)
# other libraries' captures that cudagraphs began around its own and has not ended (PyTorch's
# shadow graphs, interop._torch_rng): not in _ACTIVE, but releases wait for them too (see hold)
_holds = [0]


def hold() -> None:
    """Another library's capture begins outside ours: releases wait until :func:`unhold`.

    PyTorch's caching allocator counts a capture underway from a
    ``torch.cuda.CUDAGraph``'s ``capture_begin`` to its ``capture_end``, and
    a ``torch.cuda.MemPool`` that dies meanwhile aborts the process (its
    destructor empties the pool's cache, which asserts that no capture is
    underway: ``captures_underway.empty()``, CUDACachingAllocator.cpp, torch
    2.11). The shadow graphs cudagraphs begins before its own capture and
    ends after it (:mod:`cudagraphs.interop._torch_rng`) are such captures,
    and a graph's release may drop a MemPool: releases are queued while one
    is open, as while a capture is active, from every thread. A release
    running now finishes first, as before a capture begins.
    """
    with _lock:
        while _acting[0]:
            _settled.wait()
        _holds[0] += 1


def unhold() -> None:
    """The capture announced by :func:`hold` has ended: the releases queued meanwhile run (:func:`drain`)."""
    with _lock:
        _holds[0] -= 1
    drain()


def _act() -> bool:
    """Whether no capture is active (nor held, see :func:`hold`); if so, none begins until :func:`_acted`."""
    with _lock:
        if _ACTIVE or _holds[0]:
            return False
        _acting[0] += 1
        return True


def _acted() -> None:
    with _lock:
        _acting[0] -= 1
        if not _acting[0]:
            _settled.notify_all()


@contextlib.contextmanager
def quiet() -> Iterator[bool]:
    """Whether no capture is active; if so, none begins until the block ends.

    For work on other streams than the caller's that a capture begun
    meanwhile would take into its graph (an event the allocator records on
    the stream a cached block came from).
    """
    if _ACTIVE or not _act():
        yield False
        return
    try:
        yield True
    finally:
        _acted()


def release(device: Any, fn: Callable[..., Any], *args: Any) -> None:
    """Run ``fn(*args)`` now if no capture is active, else once none is.

    (Any device's: freeing is an unsafe call, refused by a capture's mode on
    every device, see :func:`_all_active`; ``device`` names whose it is.)
    """
    if _ACTIVE or not _act():
        _QUEUE.append((device, fn, args))
        return
    try:
        fn(*args)
    finally:
        _acted()


def later(device: Any, fn: Callable[..., Any], *args: Any) -> None:
    """Queue ``fn(*args)`` for the next safe point (from finalizers: never blocks)."""
    _QUEUE.append((device, fn, args))


# streams in use by a release now (id of the driver's handle -> holders) and the destruction
# each waits for (see holding)
_held: dict[int, int] = {}
_after: dict[int, tuple[Callable[..., Any], tuple[Any, ...]]] = {}
# streams closed whose work nothing has waited for yet (id of the driver's handle): their
# destruction, which waits for it first, may be deferred (a capture is active) behind a
# release that must still order after their work (see holding); changed under _lock
UNFINISHED: set[int] = set()


@contextlib.contextmanager
def holding(streams: Any) -> Iterator[list[Any]]:
    """The open streams of ``streams``, kept from destruction until the block ends.

    Checking ``stream.closed`` and then using the stream's handle races
    with another thread's ``Stream.close``: the driver call would find the
    stream destroyed (``CUDA_ERROR_INVALID_HANDLE``) and the release fail.
    A stream found open here (checked under the lock ``Stream.close`` takes
    to close it) is destroyed only after the block (see :func:`when_unheld`).
    A closed stream whose work was not waited for yet (``UNFINISHED``: its
    destruction is deferred) counts as open: its handle is still valid, and
    the release must still order after that work.
    """
    with _lock:
        live = [s for s in streams if not s.closed or id(s._raw) in UNFINISHED]
        for s in live:
            _held[id(s._raw)] = _held.get(id(s._raw), 0) + 1
    try:
        yield live
    finally:
        done = []
        with _lock:
            for s in live:
                key = id(s._raw)
                _held[key] -= 1
                if not _held[key]:
                    del _held[key]
                    if key in _after:
                        done.append(_after.pop(key))
        for fn, args in done:  # (a driver call: never under the lock)
            fn(*args)


def when_unheld(raw: Any, fn: Callable[..., Any], *args: Any) -> None:
    """Run ``fn(*args)`` (the destruction of stream ``raw``) now, or when no :func:`holding` holds it."""
    with _lock:
        if id(raw) in _held:
            _after[id(raw)] = (fn, args)
            return
    fn(*args)


def drain() -> None:
    """Run the queued releases once no capture is in progress."""
    if not _QUEUE or getattr(_draining, "on", False):
        return
    _draining.on = True
    held = []
    try:
        while _QUEUE:
            try:
                device, fn, args = _QUEUE.popleft()
            except IndexError:  # another thread took the last one
                break
            if _ACTIVE or not _act():
                held.append((device, fn, args))
                continue
            try:
                fn(*args)
            except Exception as exc:  # a release must not break the caller
                warnings.warn(f"cudagraphs: a deferred release failed: {exc!r}", RuntimeWarning, stacklevel=2)
            finally:
                _acted()
    finally:
        _QUEUE.extend(held)
        _draining.on = False


_fastcall = compiled_part()
if cython.compiled and _fastcall is not None:  # (the C part's functions: _capi.pxd)
    cg_api_load(_fastcall.api)
