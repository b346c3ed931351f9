"""Graph: a captured graph, ready to replay, and what it owns.

What a graph owns (its driver graph and executable, its pools, everything its
work uses) lives in a :class:`~cudagraphs._executable.Resources` holder that
the graph's finalizer owns; :mod:`cudagraphs._executable` frees it. The
whole-graph update is :mod:`cudagraphs._update`'s; node-level changes are
:mod:`cudagraphs._node_changes`'s. While a capture is active on the device, a
release is deferred until none is.

States (:class:`GraphState`): capturing -> ready (or captured, when not
instantiated) -> closed; failed when the capture failed; consumed when
another graph was updated from it.

This module is compiled by Cython from this source where the package is
built (``_graph.pxd`` declares :class:`Graph` an extension type with typed
fields, so that :meth:`Graph.replay` reads them as C fields and launches
through the C part's ``cuGraphLaunch``: docs/architecture.md, "The compiled
part"), and runs as plain Python where not.
"""

from __future__ import annotations

import collections
import enum
import operator
import os
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

try:
    import cython
except ImportError:  # (run as Python where Cython is not installed: nothing is compiled)
    cython = SimpleNamespace(compiled=False)

from . import _node_changes, _picture, _recording, _update, interop
from ._array import DeviceArray, foreign_view
from ._config import compiled_part
from ._control import Body, Condition, add_conditional, new_condition
from ._device import Device, Stream, StreamLike, _current_stream_of, _live, as_stream
from ._errors import CaptureError, GraphStateError
from ._executable import Resources, ordered_launch, release_resources
from ._recording import NodeRecord, Work, submit

if TYPE_CHECKING:
    from ._pool import GraphPool
    from ._recording import Recording

__all__ = ["Graph", "GraphState", "Node"]


class GraphState(str, enum.Enum):
    """Where a graph is in its life (compares equal to its string value)."""

    CAPTURING = "capturing"
    CAPTURED = "captured"
    READY = "ready"
    CLOSED = "closed"
    FAILED = "failed"
    CONSUMED = "consumed"

    def __str__(self) -> str:
        return self.value


_WHAT_NOW = {  # what a graph in each state that is not ready can still be used for
    GraphState.CAPTURING: "it is still being captured: use it after the capture ends",
    GraphState.CAPTURED: "call g.instantiate() first, or use it as a source for update()",
    GraphState.CLOSED: "close() freed it: capture it again",
    GraphState.FAILED: "its capture failed: capture it again",
    GraphState.CONSUMED: (
        "it was the source of another graph's update(), which took over its parameters: use that graph"
    ),
}


class Node:
    """One node of a graph: its index, type (``"kernel"``, ``"memcpy"``, ...) and name."""

    __slots__ = ("index", "name", "type")

    def __init__(self, index: int, type: str, name: str = "") -> None:
        self.index, self.type, self.name = index, type, name

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Node) and (self.index, self.type, self.name) == (
            other.index,
            other.type,
            other.name,
        )

    def __hash__(self) -> int:
        return hash((self.index, self.type, self.name))

    def __repr__(self) -> str:
        return f"Node(index={self.index}, type={self.type!r}, name={self.name!r})"


def _as_array(a: Any) -> Any:
    """A DeviceArray as is; another library's device array as a zero-copy view."""
    if isinstance(a, DeviceArray):
        return a
    view = foreign_view(a, None)
    return a if view is None else view


_KIND_NAME = operator.itemgetter(1, 2)  # (kind, name) of a NodeRecord

# (module globals replay reads: compiled, C globals, read without a dictionary lookup)
_ACTIVE = _recording._ACTIVE  # the captures in progress, by device (changed in place only)
_get_ident = threading.get_ident
_Stream = Stream

if not cython.compiled:  # (compiled, _capi.pxd's C functions: the C part's cuGraphLaunch)
    from ._capi import cg_api_load, cg_graph_launch

_fastcall = compiled_part()
if cython.compiled and _fastcall is not None:
    cg_api_load(_fastcall.api)


class Graph:
    """A captured graph. Made by :func:`cudagraphs.capture`, not directly.

    Attributes
    ----------
    device : Device
    stream : Stream
        The captured stream, where :meth:`replay` runs by default outside captures.
    output : object
        What the captured function returned (closure form), else None.
    replays : int
        How many times :meth:`replay` was called.
    pool : GraphPool
        The memory the graph's arrays came from.
    state : GraphState
    """

    __slots__ = (
        "__weakref__",
        "_auto_free",
        "_bodies",
        "_broken",
        "_count",
        "_exec",
        "_fast_exec",
        "_finalizer",
        "_holders",
        "_later",
        "_launch",
        "_moves",
        "_nodes",
        "_patched",
        "_rec",
        "_records",
        "_res",
        "_rng",
        "_sig",
        "_traced",
        "_uploaded",
        "device",
        "output",
        "pool",
        "replays",
        "state",
        "stream",
    )

    device: Device
    stream: Stream
    pool: GraphPool
    output: Any
    replays: int
    state: GraphState
    _res: Resources | None
    _records: list[NodeRecord]
    _nodes: tuple[Node, ...] | None
    _exec: Any
    _fast_exec: int  # the executable's address where the C part's cuGraphLaunch launches it, else 0
    _launch: Callable[..., None]
    _uploaded: bool
    _finalizer: weakref.finalize[Any, Graph] | None
    _rec: Recording | None
    _auto_free: bool
    _patched: bool
    _traced: list[tuple[str, str]] | None  # (node type, kernel name) per node
    _sig: int | None  # the capture's signature of its records (Recording.signature), where plain
    _bodies: list[NodeRecord]  # the records of nodes inside conditional bodies
    _count: int | None  # nodes of the driver graph, read on first use
    _later: bool  # captured inside another capture: instantiated on first use
    _moves: list[tuple[int, int, int]]  # repoint()s of other libraries' nodes, from the captured values
    _broken: Callable[[], BaseException] | None  # what replays raise once the graph is unusable
    _holders: weakref.WeakSet[Graph] | None  # graphs that embed this one (see _unusable)
    _rng: Callable[[int], None] | None  # PyTorch's generators advanced before each launch, or None

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("Graph objects are made by cg.capture(), not directly")

    @classmethod
    def _capturing(cls, device: Device, stream: Stream, pool: GraphPool, rec: Recording) -> Graph:
        g = cls.__new__(cls)  # (compiled, an extension type: its own __new__, no __init__)
        g.device, g.stream, g.pool = device, stream, pool
        g.output, g.replays, g.state = None, 0, GraphState.CAPTURING
        g._res = None
        g._records = []
        g._nodes = None  # read from the driver on first use
        g._exec = None
        g._fast_exec = 0
        g._broken = g._holders = g._rng = None
        g._launch = device.backend.graph_launch
        g._uploaded = False
        g._finalizer = None
        g._rec = rec  # the Recording while capturing
        g._auto_free = False
        g._patched = False
        g._traced = None
        g._sig = None
        g._bodies = []
        g._moves = []
        g._count = None
        g._later = False
        return g

    def _ready_from(self, raw_graph: Any, rec: Recording, auto_free: bool, instantiate: bool) -> None:
        """Take over a finished capture's driver graph and what it kept.

        Inside another capture that forbids instantiating (an enclosing
        capture of this thread, a global one), the graph is instantiated on
        its first use instead, once that capture has ended.
        """
        if instantiate and _recording.instantiate_blocked(self.device):
            instantiate, self._later = False, True
        exec_ = self.device.backend.graph_instantiate(raw_graph, auto_free) if instantiate else None
        res = Resources(
            self.device, raw_graph, list(rec.keep), list(rec.memory.pools.values()), [self.stream]
        )
        rec.keep.clear()
        # handles are found on first use (see _recording.resolve_handles)
        self._records = (
            rec.nodes
            if rec.plain
            else [r if r.handle is None else r._replace(handle=None) for r in rec.nodes if r.top]
        )
        # the memory other libraries' kernels in the graph use (PyTorch's, CuPy's, ...), kept
        # as the graph keeps the arrays of cudagraphs' own work
        res.keep.extend(interop.keep_foreign(self.device, raw_graph, self._records, res.keep, res.pools))
        self._traced = None  # made from the records when an update compares graphs
        self._sig = rec.signature if rec.plain else None  # (the records as recorded, all of them)
        self._bodies = [] if rec.plain else [r for r in rec.nodes if not r.top]
        self._auto_free = auto_free
        others = [d for d in rec.devices if d is not self.device]
        if others:  # replays keep order with the other devices' current streams
            self._launch = ordered_launch(self.device, others)
        self._res = res
        found: dict[type, Any] = {}  # (each class asked once: the same array is kept per node using it)
        for obj in res.keep:  # what must know its graphs (a communicator, an embedded graph)
            cls = type(obj)
            held_by = found.get(cls, found)
            if held_by is found:  # (the class's: no instance __getattr__)
                held_by = found[cls] = getattr(cls, "_held_by", None)
            if held_by is not None:
                held_by(obj, self)
        self._finalizer = weakref.finalize(self, _recording.later, self.device, release_resources, res)
        self._rec = None
        if exec_ is not None:
            res.exec = exec_
            self._set_exec(exec_)
            self.state = GraphState.READY
        else:
            self.state = GraphState.CAPTURED

    def _take_rng(self, shadow: Callable[[int], None]) -> None:
        """The capture drew PyTorch's random numbers: ``shadow(stream handle)`` runs before each launch.

        It advances the generators as eager calls would (see
        :mod:`cudagraphs.interop._torch_rng`); the graph keeps it as long as
        its executable, whose kernels read the device tensors it registered.
        """
        assert self._res is not None
        self._res.keep.append(shadow)
        self._rng = shadow

    def _set_exec(self, exec_: Any) -> None:
        """Take ``exec_`` (None: none) as the executable replays launch.

        Where the backend's driver calls are the C part's (``backend.fastcall``)
        and the graph launches through the backend's own ``graph_launch`` (not
        a launch across devices), its address is kept too: the compiled
        :meth:`replay` then launches it through the C part's ``cuGraphLaunch``
        without a Python call.
        """
        self._exec = exec_
        backend = self.device.backend
        fast = getattr(backend, "fastcall", False) and self._launch is backend.graph_launch
        self._fast_exec = int(exec_) if fast and exec_ is not None else 0

    def _failed(self) -> None:
        self.state = GraphState.FAILED
        self._rec = None

    def _held_by(self, graph: Graph) -> None:
        """``graph`` embeds this one (a child node): it becomes unusable with this one."""
        if self._holders is None:
            self._holders = weakref.WeakSet()
        self._holders.add(graph)

    def _unusable(self, error: Callable[[], BaseException]) -> None:
        """What the graph's nodes use is gone (an aborted communicator): replays raise ``error()``.

        So do those of the graphs that embed it. Its memory is freed as usual.
        """
        self._broken = error
        self._set_exec(None)  # (no executable: replays take the checked path)
        for holder in list(self._holders or ()):
            holder._unusable(error)

    def instantiate(self) -> Graph:
        """Make a graph captured with ``instantiate=False`` replayable; returns it."""
        if self._broken is not None:
            raise self._broken()
        if self.state != GraphState.CAPTURED:
            raise GraphStateError(
                f"Graph.instantiate(): this graph is {self.state}; only a captured graph can be "
                "instantiated (one made with instantiate=False)"
            )
        if _recording.instantiate_blocked(self.device):
            raise CaptureError(
                f"a capture in progress on {self.device} forbids instantiating a graph now (the "
                "driver refuses it and would invalidate that capture): replay this graph inside "
                "that capture (it becomes a child node), or instantiate it after the capture ends"
            )
        res = self._res
        assert res is not None
        res.exec = self.device.backend.graph_instantiate(res.graph, self._auto_free)
        self._set_exec(res.exec)
        self.state = GraphState.READY
        self._later = False
        return self

    def keep(self, *objects: Any) -> Graph:
        """Keep ``objects`` alive as long as this graph (e.g. another library's arrays)."""
        if self._res is None:
            if self._rec is None:
                raise GraphStateError(
                    f"Graph.keep(): this graph is {self.state}; nothing can be kept with it"
                )
            self._rec.keep.extend(objects)
        else:
            self._res.keep.extend(objects)
        return self

    def update(self, source: Graph) -> Graph:
        """Give this graph the parameters of a topology-identical ``source``.

        The driver's whole-graph update: addresses, by-value arguments and
        copy sizes of ``source`` replace this graph's without instantiating
        again. ``source`` is consumed: its memory, inputs and staged host data
        now belong to this graph, and it can no longer be replayed; what this
        graph held for its previous parameters is released (after the replays
        queued so far, at the next safe point). Capture the source with ``instantiate=False`` to skip
        a useless instantiation.

        Raises
        ------
        UpdateError
            With the reason and the offending node index when the graphs
            differ (node count, node type, kernel) or the driver refuses; this
            graph is unchanged and keeps replaying as before.
        """
        exec_ = self._ready("Graph.update()")
        if not isinstance(source, Graph):
            raise TypeError(f"update takes a cudagraphs Graph, got {type(source).__name__}")
        if source is self:
            raise ValueError("a graph cannot be updated from itself")
        if source.device is not self.device:
            raise ValueError(f"the source graph is on {source.device}, this one on {self.device}")
        if source.state not in (GraphState.READY, GraphState.CAPTURED):
            raise GraphStateError(
                f"Graph.update(): the source graph is {source.state}; it cannot be used for an "
                f"update ({_WHAT_NOW.get(source.state, '')})"
            )
        self._records, source._records = _update.update(self, exec_, source), []
        self._bodies, self._moves, self._count = source._bodies, [], None
        source._res, source.state = None, GraphState.CONSUMED
        self._rng, source._rng = source._rng, None  # (its kept shadow came with its resources)
        source._set_exec(None)
        self._traced = source._traced
        self._sig = source._sig
        self._nodes = None
        return self

    def _trace(self) -> list[tuple[str, str]]:
        """(node type, kernel name) of each recorded node (made once, on first use)."""
        traced = self._traced
        if traced is None:
            traced = self._traced = list(map(_KIND_NAME, self._records))
        return traced

    def _signature(self) -> list[tuple[str, str]]:
        return [(n.type, n.name) for n in self.nodes]

    # device-side control flow (while capturing) ---------------------------------------
    def _capturing_now(self) -> Recording:
        if self.state != GraphState.CAPTURING or self._rec is None:
            raise RuntimeError(
                "conditions and conditional nodes are added while capturing: call them "
                "inside `with cg.capture() as g:`"
            )
        return self._rec

    def condition(self, default: int = 0) -> Condition:
        """A new condition of this graph, ``default`` at the start of every launch."""
        return new_condition(self._capturing_now(), self, default)

    def while_loop(self, cond: Condition, *, max_iterations: int | None = None) -> Body:
        """A while node: its body runs again and again while ``cond`` is non-zero.

        ``cond`` is tested before the first run (so a zero condition runs it
        never); the body must set it (``cg.ops.set_condition``) to stop, or
        the loop spins on the device forever. ``max_iterations`` ends the loop
        after that many runs of the body at the latest; ``body.iterations``
        then holds the count of the last launch.
        """
        return add_conditional(self._capturing_now(), self, "while", cond, 1, max_iterations)[0]

    def if_then(self, cond: Condition) -> Body:
        """An if node: its body runs once if ``cond`` is non-zero."""
        return add_conditional(self._capturing_now(), self, "if", cond, 1)[0]

    def if_else(self, cond: Condition) -> tuple[Body, Body]:
        """An if node with two bodies: the first if ``cond`` is non-zero, else the second."""
        then, otherwise = add_conditional(self._capturing_now(), self, "if", cond, 2)
        return then, otherwise

    def switch(self, cond: Condition, n: int) -> list[Body]:
        """A switch node with ``n`` bodies (at most 4096): body ``cond`` runs; out of range, none."""
        if type(n) is not int or n < 1:
            raise ValueError(f"switch needs n >= 1 bodies, got {n!r}")
        return add_conditional(self._capturing_now(), self, "switch", cond, n)

    # node-level changes -------------------------------------------------------------------
    def rebind(self, old: Any, new: Any) -> Graph:
        """Point every kernel and device-copy argument that is ``old`` at ``new``.

        Executable-node updates: no capture, no instantiation. ``new`` must
        have the same shape, strides, dtype and device; arguments that are
        ``old`` itself (same address, shape and strides) are repointed, in
        kernel nodes and device-to-device copy nodes. The graph keeps ``new``
        alive (and still ``old``).

        Raises
        ------
        TypeError
            If ``old`` or ``new`` is not a DeviceArray.
        ValueError
            If the graph does not use ``old``, or ``new`` does not match it
            (the message names what differs, a device by its number).
        UpdateError
            If a node that uses ``old`` cannot be patched (host copies,
            memsets, nodes inside conditional bodies): capture again and use
            :meth:`update`. Nothing is changed then.
        """
        _node_changes.rebind(self, self._ready("Graph.rebind()"), old, new)
        return self

    def repoint(self, old: Any, new: Any) -> int:
        """Point every argument inside ``old``'s memory at the same place in ``new``'s.

        Like :meth:`rebind`, but by memory range: arguments that are views
        or parts of ``old`` (``old[2:]``, ``old.T``, raw addresses inside it)
        move too. For replacing memory a graph reads (new weights) without
        capturing again. ``new`` must match ``old`` (shape, strides, dtype,
        device); another library's array is taken as a zero-copy view. The
        graph keeps ``new`` alive. Returns the number of nodes that use
        ``old``'s memory, all of them changed; when ``new`` is ``old``'s
        memory (``g.repoint(x, x)``) nothing changes and the count is the same.

        Each call moves what the graph reads at that moment: to exchange two
        arrays, ``repoint(a, b)`` then ``repoint(b, a)`` leaves every node
        that read either reading ``a``; capture again (or use
        :class:`~cudagraphs.GraphModule`, whose ``refresh`` moves all its
        parameters at once).

        Raises
        ------
        TypeError
            If ``old`` or ``new`` is not an array.
        ValueError
            If no node of the graph uses that memory, or ``new`` does not
            match ``old`` (the message names what differs, a device by its
            number).
        UpdateError
            If a node that uses it cannot be changed node by node (memsets, host
            copies), reads memory only part of which lies in ``old``'s, or the
            graph has nodes cudagraphs did not record (other libraries' kernels,
            conditional nodes), whose arguments it cannot see: capture again.
            Nothing is changed then.
        """
        return _node_changes.repoint(self, self._ready("Graph.repoint()"), [(_as_array(old), _as_array(new))])

    def _repoint(self, pairs: list[tuple[Any, Any]], keep: list[Any]) -> int:
        """:meth:`repoint` of several ``(old, new)`` pairs at once, ``keep``'s memory staying."""
        return _node_changes.repoint(self, self._ready("Graph.repoint()"), pairs, keep, required=False)

    def set_arg(self, node: int | Node, arg: int | str, value: Any) -> Graph:
        """Change one argument of kernel node ``node`` (by index or parameter name).

        The value is checked like a launch argument (numbers converted to the
        parameter's C type); an array argument must match the array the node
        was recorded with (shape, strides, dtype, device), and sizes of
        built-in ops (``n``, ``layout``) are fixed by their arrays.

        Raises
        ------
        IndexError
            If ``node`` is not a node of the graph.
        ValueError, TypeError
            If ``arg`` is not a parameter or ``value`` does not fit it.
        UpdateError
            If the node is not a kernel recorded by cudagraphs.
        """
        _node_changes.set_arg(self, self._ready("Graph.set_arg()"), node, arg, value)
        return self

    def _point_copy(self, index: int, src: int | None) -> None:
        """Point the device copy of record ``index`` at ``src``, or switch it off (graphed inputs)."""
        _node_changes.point_copy(self, self._ready("a graphed call"), index, src)

    # replay ---------------------------------------------------------------------------------
    def _ready(self, op: str) -> Any:
        """The executable, for ``op`` (named in the error when the graph is not ready)."""
        if self._broken is not None:
            raise self._broken()
        if self._later and self.state == GraphState.CAPTURED:
            self.instantiate()  # captured inside another capture: instantiated on first use
        if self._exec is None or self.state != GraphState.READY:
            raise GraphStateError(
                f"{op}: this graph is {self.state}; only a ready graph can be used "
                f"({_WHAT_NOW.get(self.state, 'it is not ready')})"
            )
        return self._exec

    def upload(self, stream: Stream | StreamLike | None = None) -> Graph:
        """Prepare the graph on the device now, so the first replay is not slower.

        Idempotent; returns the graph.
        """
        exec_ = self._ready("Graph.upload()")
        if not self._uploaded:
            s = self._check_stream(stream) if stream is not None else self.stream
            self.device.backend.graph_launch(exec_, s._live(), upload=True)
            self._uploaded = True
        return self

    def replay(self, stream: Stream | StreamLike | None = None) -> None:
        """Queue one run of the graph on ``stream`` (default: see below).

        Stream-ordered after earlier work on that stream; returns at once.
        On a stream being captured, the graph is embedded in that capture as
        a child-graph node instead, and that graph keeps this one alive.

        The default stream is this thread's current stream while this thread
        captures it (inside ``with cg.capture():`` or a graphed function: the
        graph is embedded there), else the stream the graph was captured on
        (:attr:`stream`). ``stream`` may be another library's
        (``__cuda_stream__``: PyTorch, CuPy, cuda.core).

        Raises
        ------
        CaptureError
            If ``stream`` is not being captured but this thread is capturing
            another stream: the replay would run now instead of being
            recorded. Replay on the captured stream (``stream=``, or inside
            ``with captured_stream:``) to embed it, or after the capture.
        GraphStateError
            If the graph is not ready (closed, not instantiated, consumed).
        """
        exec_ = self._exec
        if exec_ is None and not self._later:
            self._ready("Graph.replay()")  # (raises: the graph is not ready)
        if stream is None:  # (a capture of this thread's current stream, else the graph's own stream)
            current = _current_stream_of(self.device)
            rec = current._recording
            stream = current if rec is not None and rec.thread == _get_ident() else self.stream
        if stream is not self.stream:
            stream = self._check_stream(stream)
            streams = self._res.streams  # type: ignore[union-attr]
            if streams[-1] is not stream and stream not in streams:  # (mostly the last one)
                streams.append(stream)
        on = stream  # (compiled: typed, its fields read as C fields)
        if on._recording is not None:
            self._embed(stream)
            return
        if _ACTIVE:  # (no capture anywhere: nothing to refuse, and no call to ask)
            _recording.refuse_beside_capture(stream, "Graph.replay()", "the graph")
        if exec_ is None:
            exec_ = self._ready("Graph.replay()")
        elif self._rng is None and self._fast_exec and cg_graph_launch(self._fast_exec, on.handle) == 0:
            self.replays += 1  # (launched by the C part's cuGraphLaunch, no Python call)
            return
        if self._rng is not None:  # (PyTorch's generators advance first, on the same stream)
            self._rng(on.handle)
        # (else the backend's launch; after a refusal of the C part's it launches again and raises)
        self._launch(exec_, on._raw)
        self.replays += 1

    def _embed(self, stream: Stream) -> None:
        if self._rng is not None:
            raise CaptureError(
                "this graph draws PyTorch random numbers, whose generators advance on the host "
                "before each launch: embedded in another capture it would replay the same numbers "
                "every time; replay it outside captures, or draw the numbers in the enclosing "
                "capture itself"
            )
        if self._patched:
            raise CaptureError(
                "this graph was changed node by node (rebind/set_arg), which changes its "
                "executable only: it cannot be embedded in another capture as it replays; "
                "capture it again (or use update()) first"
            )
        res = self._res
        assert res is not None
        child = res.params_graph if res.params_graph is not None else res.graph
        backend = self.device.backend
        submit(stream, Work("child", lambda raw, _: backend.capture_node(raw, "child", child), keep=(self,)))

    def _check_stream(self, stream: Any) -> Stream:
        if type(stream) is not _Stream:  # (another library's stream: its Stream; else TypeError)
            stream = as_stream(stream, self.device)
        s = stream  # (compiled: typed, its fields read as C fields)
        if s.device is not self.device:
            raise ValueError(f"stream {stream} is not on {self.device}")
        _live(s)
        return stream  # type: ignore[no-any-return]

    # inspection -------------------------------------------------------------------------------
    @property
    def nodes(self) -> tuple[Node, ...]:
        """The graph's nodes with their types (kernel nodes carry the kernel's name).

        Read from the driver on first use (a closed graph has none to show).
        """
        if self._nodes is None:
            if self._res is None or self._res.graph is None:
                return ()
            found, _ = self.device.backend.graph_topology(self._res.graph)
            self._nodes = tuple(Node(i, n.type, n.name) for i, n in enumerate(found))
        return self._nodes

    @property
    def edges(self) -> list[tuple[int, int]]:
        """Dependencies as (from, to) node indices: ``to`` runs after ``from``."""
        if self._res is None or self._res.graph is None:
            return []
        return self.device.backend.graph_topology(self._res.graph)[1]

    def to_dot(self) -> str:
        """The graph in Graphviz's DOT language (see :mod:`cudagraphs._picture`)."""
        graph = self._res.graph if self._res is not None else None
        return _picture.to_dot(self.device.backend, graph, self.summary())

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the picture to ``path``: ``.dot`` as text, ``.svg``/``.png``/``.pdf`` via Graphviz.

        Raises
        ------
        RuntimeError
            If Graphviz's ``dot`` program is needed but not installed.
        ValueError
            For another file suffix, a directory, or a folder that does not exist.
        """
        return _picture.save(self.to_dot(), path)

    def summary(self) -> str:
        """One line: state, node counts by type, replays and pool memory."""
        nodes = self.nodes
        counts = collections.Counter(n.type for n in nodes)
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "no nodes"
        return (
            f"Graph ({self.state}) on {self.device.backend.name}:{self.device.index}: "
            f"{len(nodes)} nodes ({kinds}); {self.replays} replays; "
            f"pool {self.pool.reserved} B"
        )

    def close(self) -> None:
        """Wait for the graph's replays, then free it and everything it kept. Idempotent.

        While a capture is active on the device, the release waits until none is.
        """
        finalizer = self._finalizer
        if finalizer is not None and finalizer.alive:
            finalizer.detach()
            _recording.release(self.device, release_resources, self._res)
        self._set_exec(None)
        self._res = None
        self._rng = None
        self._later = False
        self._nodes = ()
        if self.state in (GraphState.READY, GraphState.CAPTURED):
            self.state = GraphState.CLOSED

    def __enter__(self) -> Graph:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<cudagraphs.Graph {self.state}, {len(self.nodes)} nodes, {self.replays} replays>"
