"""GraphBuilder: explicit graphs, node by node, with explicit dependencies.

Each node is made by the same code that runs work eagerly, recorded by a
relaxed stream capture on the builder's own stream: before every node the
capture's dependency set is set to the node's ``after`` list, and the node
the work adds is read back. So every op, kernel, copy and conditional that
works in ``cg.capture()`` works here, on both backends, and the result is
the same :class:`~cudagraphs.Graph`.

A node with no ``after`` is a root: it may run concurrently with every node
it does not depend on, as in any CUDA graph.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from . import ops
from ._allocator import new_block
from ._array import DeviceArray, Shape, _c_strides, _prod, _shape
from ._capture import CaptureSession
from ._control import Body, Condition
from ._device import Device, Event, as_device
from ._dtypes import normalize_dtype
from ._errors import CaptureError
from ._graph import Graph, GraphState
from ._kernel import Kernel
from ._pool import GraphMemory, GraphPool
from ._recording import Work, submit
from ._scalar import HostSlot

__all__ = ["BuilderNode", "GraphBuilder"]


class BuilderNode:
    """A node made by a :class:`GraphBuilder`; pass it in ``after=`` lists."""

    __slots__ = ("builder", "handle", "type")

    def __init__(self, builder: GraphBuilder, handle: Any, type: str) -> None:
        self.builder, self.handle, self.type = builder, handle, type

    def __repr__(self) -> str:
        return f"<cudagraphs.BuilderNode {self.type}>"


def _abandon(session: CaptureSession, device: Device, stream: Any) -> None:
    """End an unfinished builder's capture and release what it held."""
    try:
        session.abort()
    finally:
        device.return_spare_stream(stream)


def _check_event(what: str, event: Any) -> None:
    if not isinstance(event, Event):
        raise TypeError(f"{what}: event must be a cudagraphs Event, got {type(event).__name__}")


class _Released:
    """Owner of graph memory freed by a free node: nothing left to release."""

    @staticmethod
    def release(ptr: int, streams: object) -> None:
        return None


_B = TypeVar("_B")  # what a conditional node gives back: its body or bodies


class GraphBuilder:
    """Build a graph node by node; ``instantiate()`` returns a :class:`Graph`.

    Parameters
    ----------
    device : Device or int, optional
    pool : GraphPool, optional
        Memory for arrays allocated while building (default: a private pool).

    Examples
    --------
    >>> b = cg.GraphBuilder()
    >>> n1 = b.launch(kernel, grid, block, x, n)
    >>> n2 = b.fill(y, 0.0)                   # a root: may run beside n1
    >>> b.launch(other, grid, block, x, y, after=[n1, n2])
    >>> g = b.instantiate()
    """

    def __init__(self, *, device: Device | int | None = None, pool: GraphPool | None = None) -> None:
        self.device = as_device(device)
        self.stream = self.device.spare_stream()
        self._session = CaptureSession(self.device, self.stream, "relaxed", pool, "pool")
        try:
            self._graph = self._session.begin()
        except BaseException:
            self.device.return_spare_stream(self.stream)
            raise
        self._rec = self._session.rec
        self._graph_memory = GraphMemory(self._session.pool)
        self._backend = self.device.backend
        self.nodes: list[BuilderNode] = []
        self.state = "building"
        # a builder dropped unfinished must not leave its stream capturing
        self._finalizer = weakref.finalize(self, _abandon, self._session, self.device, self.stream)

    # the mechanism -------------------------------------------------------------------
    def _check_open(self) -> None:
        if self.state != "building":
            raise RuntimeError(f"this builder is {self.state}; make a new GraphBuilder")

    def _node(self, kind: str, after: Iterable[BuilderNode] | None, issue: Callable[[], Any]) -> BuilderNode:
        """Record what ``issue`` queues as one node after the nodes in ``after``."""
        self._check_open()
        deps = []
        for n in after or ():
            if not isinstance(n, BuilderNode) or n.builder is not self:
                raise TypeError(f"after= takes nodes of this builder, got {n!r}")
            deps.append(n.handle)
        raw = self.stream._raw
        self._backend.capture_node(raw, "dependencies", deps)
        issue()
        current = self._backend.capture_info(raw)[1]
        if [int(h) for h in current] == [int(h) for h in deps]:
            raise ValueError(f"{kind} recorded no node (nothing to do, e.g. an empty array)")
        node = BuilderNode(self, current[-1], kind)
        self.nodes.append(node)
        return node

    # nodes -------------------------------------------------------------------------------
    def launch(
        self,
        kernel: Kernel,
        grid: Any,
        block: Any,
        *args: Any,
        after: Sequence[BuilderNode] | None = None,
        shared_mem: int = 0,
    ) -> BuilderNode:
        """A kernel node (arguments checked as for :meth:`Kernel.launch`)."""
        if not isinstance(kernel, Kernel):
            raise TypeError(f"launch: kernel must be a cudagraphs Kernel, got {type(kernel).__name__}")
        return self._node(
            "kernel",
            after,
            lambda: kernel.launch(grid, block, *args, stream=self.stream, shared_mem=shared_mem),
        )

    def memcpy(self, dst: Any, src: Any, *, after: Sequence[BuilderNode] | None = None) -> BuilderNode:
        """A copy node: device to device, from host data (snapshotted), or to/from a HostSlot."""
        s = self.stream
        if isinstance(dst, HostSlot):
            return self._node("memcpy", after, lambda: dst.copy_from(src, stream=s))
        if not isinstance(dst, DeviceArray):
            raise TypeError(f"memcpy: dst must be a DeviceArray or HostSlot, got {type(dst).__name__}")
        if isinstance(src, DeviceArray):
            return self._node("memcpy", after, lambda: ops.copy(dst, src, stream=s))
        return self._node("memcpy", after, lambda: dst.set(src, stream=s))

    def memset(
        self, dst: DeviceArray, value: int, *, after: Sequence[BuilderNode] | None = None
    ) -> BuilderNode:
        """A memset node: every byte of the contiguous array ``dst`` set to ``value``."""
        if not isinstance(dst, DeviceArray) or not dst.is_contiguous:
            raise TypeError("memset takes a contiguous DeviceArray; use fill() for views")
        if not isinstance(value, int) or not 0 <= value <= 255:
            raise ValueError(f"memset sets bytes: value must be in 0..255, got {value!r}")

        backend, ptr, nbytes = self._backend, dst.ptr, dst.nbytes
        return self._node(
            "memset",
            after,
            lambda: submit(
                self.stream,
                Work("memset", lambda raw, _: backend.memset(ptr, value, nbytes, raw), None, (), (dst,)),
            ),
        )

    def fill(self, x: DeviceArray, value: Any, *, after: Sequence[BuilderNode] | None = None) -> BuilderNode:
        """A node setting every element of ``x`` (any layout) to ``value``."""
        return self._node("kernel", after, lambda: ops.fill(x, value, stream=self.stream))

    def host(
        self, fn: Callable[..., object], *args: Any, after: Sequence[BuilderNode] | None = None
    ) -> BuilderNode:
        """A host node: ``fn(*args)`` runs on a driver thread when the node runs.

        It must not call CUDA; the graph keeps ``fn`` and ``args`` alive.
        """
        if not callable(fn):
            raise TypeError(f"host needs a callable, got {type(fn).__name__}")

        backend = self._backend
        callbacks: list[object] = []

        def issue(raw: Any, _: Any) -> None:
            def call() -> None:
                fn(*args)

            callbacks.append(backend.launch_host(raw, call))

        return self._node(
            "host", after, lambda: submit(self.stream, Work("host", issue, keep=(callbacks, fn, *args)))
        )

    def child(self, graph: Graph, *, after: Sequence[BuilderNode] | None = None) -> BuilderNode:
        """A child-graph node running a copy of ``graph``'s nodes.

        The driver copies the graph into the node, so ``graph`` may be closed
        or updated later; what its nodes use now (its arrays) stays alive
        with this graph.
        """
        if not isinstance(graph, Graph) or graph.state not in (GraphState.READY, GraphState.CAPTURED):
            raise TypeError(f"child takes a ready or captured Graph, got {graph!r}")
        res = graph._res
        assert res is not None
        child = res.params_graph if res.params_graph is not None else res.graph
        backend, used = self._backend, tuple(res.keep)  # what the copied nodes use, as of now
        return self._node(
            "child",
            after,
            lambda: submit(
                self.stream,
                Work("child", lambda raw, _: backend.capture_node(raw, "child", child), keep=(graph, *used)),
            ),
        )

    def event_record(self, event: Event, *, after: Sequence[BuilderNode] | None = None) -> BuilderNode:
        """An event-record node: ``event`` completes when the node runs."""
        backend = self._backend
        _check_event("event_record", event)
        return self._node(
            "event_record",
            after,
            lambda: submit(
                self.stream,
                Work(
                    "event_record",
                    lambda raw, _: backend.event_record(event._raw, raw, external=True),
                    keep=(event,),
                ),
            ),
        )

    def event_wait(self, event: Event, *, after: Sequence[BuilderNode] | None = None) -> BuilderNode:
        """An event-wait node: later nodes wait for ``event``'s recorded work."""
        backend = self._backend
        _check_event("event_wait", event)
        return self._node(
            "event_wait",
            after,
            lambda: submit(
                self.stream,
                Work(
                    "event_wait",
                    lambda raw, _: backend.stream_wait_event(raw, event._raw, external=True),
                    keep=(event,),
                ),
            ),
        )

    def alloc(
        self, shape: Shape, dtype: Any = "float64", *, after: Sequence[BuilderNode] | None = None
    ) -> tuple[DeviceArray, BuilderNode]:
        """An allocation node: graph memory for scratch work, freed by :meth:`free`."""
        dims, dt = _shape(shape), normalize_dtype(dtype)
        size = _prod(dims)
        out: list[DeviceArray] = []

        def issue() -> None:
            ptr, owner = self._graph_memory.allocate(self._rec, size * dt.itemsize, self._rec.stream)  # type: ignore[arg-type, union-attr]
            block = new_block(self.device, ptr, size * dt.itemsize, owner)
            out.append(DeviceArray._wrap(block, ptr, dims, _c_strides(dims, dt.itemsize), dt, size))

        node = self._node("mem_alloc", after, issue)
        return out[0], node

    def free(self, array: DeviceArray, *, after: Sequence[BuilderNode] | None = None) -> BuilderNode:
        """A free node for an array from :meth:`alloc` (do not use it after this node)."""
        memory = self._graph_memory
        if not isinstance(array, DeviceArray) or array._block.owner is not memory:
            raise ValueError("free takes an array made by this builder's alloc()")
        backend, ptr = self._backend, array._block.ptr

        def issue(raw: Any, _: Any) -> None:
            backend.mem_free(ptr, raw)
            memory.freed(ptr)
            array._block.owner = _Released

        return self._node("mem_free", after, lambda: submit(self.stream, Work("mem_free", issue)))

    def empty(self, *, after: Sequence[BuilderNode] | None = None) -> BuilderNode:
        """An empty node: a point in the graph to depend on."""
        backend = self._backend
        return self._node(
            "empty",
            after,
            lambda: submit(self.stream, Work("empty", lambda raw, _: backend.capture_node(raw, "empty"))),
        )

    def join(self, *nodes: BuilderNode) -> BuilderNode:
        """An empty node after all of ``nodes``."""
        return self.empty(after=nodes)

    # control flow ---------------------------------------------------------------------
    def condition(self, default: int = 0) -> Condition:
        """A condition of the graph being built (see :meth:`Graph.condition`)."""
        self._check_open()
        return self._graph.condition(default)

    def _conditional(self, make: Callable[[], _B], after: Sequence[BuilderNode] | None) -> _B:
        result: list[_B] = []
        node = self._node("conditional", after, lambda: result.append(make()))
        made: Any = result[0]
        for body in made if isinstance(made, (list, tuple)) else [made]:
            body.node = node
            body.redirect = True  # ops with no stream= in its block land in it (not run now)
        return result[0]

    def while_loop(self, cond: Condition, *, after: Sequence[BuilderNode] | None = None) -> Body:
        """A while node; capture its body with ``with`` and queue work on ``body.stream``."""
        return self._conditional(lambda: self._graph.while_loop(cond), after)

    def if_then(self, cond: Condition, *, after: Sequence[BuilderNode] | None = None) -> Body:
        """An if node; capture its body with ``with`` and queue work on ``body.stream``."""
        return self._conditional(lambda: self._graph.if_then(cond), after)

    def if_else(self, cond: Condition, *, after: Sequence[BuilderNode] | None = None) -> tuple[Body, Body]:
        """An if node with an else body."""
        return self._conditional(lambda: self._graph.if_else(cond), after)

    def switch(self, cond: Condition, n: int, *, after: Sequence[BuilderNode] | None = None) -> list[Body]:
        """A switch node with ``n`` bodies."""
        return self._conditional(lambda: self._graph.switch(cond, n), after)

    # the end -----------------------------------------------------------------------------
    def instantiate(self) -> Graph:
        """The finished, replayable graph (it replays on the compute stream by default)."""
        self._check_open()
        self.state = "instantiated"
        self._finalizer.detach()
        try:
            if self._graph_memory.live:
                self._session.abort()
                raise CaptureError(
                    f"{len(self._graph_memory.live)} array(s) made by alloc() are still alive "
                    "at the end of the capture and were never freed: add a free() node for each"
                )
            graph = self._session.end()
        finally:
            self.device.return_spare_stream(self.stream)
        graph.stream = self.device.stream
        res = graph._res
        assert res is not None
        res.streams[0] = self.device.stream
        return graph

    def close(self) -> None:
        """Abandon the graph being built (idempotent); everything it held is released."""
        if self.state == "building":
            self.state = "closed"
            self._finalizer()

    def __enter__(self) -> GraphBuilder:
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: object) -> None:
        if exc_type is not None:
            self.close()
