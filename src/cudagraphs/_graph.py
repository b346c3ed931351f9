"""Graph: an instantiated capture, ready to replay.

A graph owns its driver graph and executable graph, the pinned buffers that
hold host data staged during capture, and references to every array, scalar,
host slot and callback its work uses, so replaying never touches freed
memory. ``close()`` (or garbage collection) waits for the graph's replays,
then releases all of it. States: capturing -> ready -> closed (or failed).
"""

from __future__ import annotations

import collections
import dataclasses
import weakref
from typing import TYPE_CHECKING, Any

from ._device import Device, Stream

if TYPE_CHECKING:
    from ._capture import Capture
    from ._pool import GraphPool
    from .backends.base import Backend

__all__ = ["Graph", "Node"]


@dataclasses.dataclass(frozen=True)
class Node:
    """One node of a graph: its index, type (``"kernel"``, ``"memcpy"``, ...) and name."""

    index: int
    type: str
    name: str = ""


def _destroy(
    backend: Backend, device: Device, raw_graph: Any, exec_: Any, pool: GraphPool,
    keep: list[Any], staged: list[int], streams: list[Stream],
) -> None:
    # replays still queued may read everything below: wait for them first
    for s in streams:
        if not s.closed and s.handle not in device.captures:
            backend.stream_synchronize(s._raw)
    backend.graph_exec_destroy(exec_)
    backend.graph_destroy(raw_graph)
    for ptr in staged:
        backend.host_free(ptr)
    staged.clear()
    keep.clear()
    pool.drop(streams)


class Graph:
    """A captured graph. Made by :func:`cudagraphs.capture`, not directly.

    Attributes
    ----------
    device : Device
    stream : Stream
        The captured stream, where :meth:`replay` runs by default.
    output : object
        What the captured function returned (closure form), else None.
    replays : int
        How many times :meth:`replay` was called.
    pool : GraphPool
        The memory the graph's arrays came from.
    """

    __slots__ = ("device", "stream", "output", "replays", "pool", "state", "_nodes", "_exec",
                 "_raw_graph", "_streams", "_launch", "_uploaded", "_finalizer", "__weakref__")

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("Graph objects are made by cg.capture(), not directly")

    @classmethod
    def _capturing(cls, device: Device, stream: Stream, pool: GraphPool) -> Graph:
        g = object.__new__(cls)
        g.device, g.stream, g.pool = device, stream, pool
        g.output, g.replays, g.state = None, 0, "capturing"
        g._nodes: tuple[Node, ...] | None = None  # read from the driver on first use
        g._exec = None
        g._raw_graph = None
        g._streams = [stream]
        g._launch = device.backend.graph_launch
        g._uploaded = False
        g._finalizer = None
        return g

    def _instantiate(self, raw_graph: Any, cap: Capture, auto_free: bool) -> None:
        backend = self.device.backend
        exec_ = backend.graph_instantiate(raw_graph, auto_free)
        self._exec = exec_
        self._raw_graph = raw_graph
        keep, staged = list(cap.keep), list(cap.staged)
        cap.keep.clear()
        cap.staged.clear()
        self._finalizer = weakref.finalize(
            self, _destroy, backend, self.device, raw_graph, exec_, self.pool, keep, staged,
            self._streams,
        )
        self.state = "ready"

    def _fail(self) -> None:
        self.state = "failed"

    # replay ---------------------------------------------------------------------
    def _ready(self) -> Any:
        if self._exec is None or self.state != "ready":
            raise RuntimeError(f"this graph is {self.state}; only a ready graph can be replayed")
        return self._exec

    def upload(self, stream: Stream | None = None) -> Graph:
        """Prepare the graph on the device now, so the first replay is not slower.

        Idempotent; returns the graph.
        """
        exec_ = self._ready()
        if not self._uploaded:
            s = self._check_stream(stream) if stream is not None else self.stream
            self.device.backend.graph_upload(exec_, s._live())
            self._uploaded = True
        return self

    def replay(self, stream: Stream | None = None) -> None:
        """Queue one run of the graph on ``stream`` (default: the captured one).

        Stream-ordered after earlier work on that stream; returns at once.
        """
        exec_ = self._exec
        if exec_ is None:
            self._ready()
        if stream is None:
            stream = self.stream
        elif stream is not self.stream and stream not in self._streams:
            self._streams.append(self._check_stream(stream))
        self._launch(exec_, stream._raw)
        self.replays += 1

    def _check_stream(self, stream: Stream) -> Stream:
        if not isinstance(stream, Stream) or stream.device is not self.device:
            raise ValueError(f"stream must be a cudagraphs Stream of {self.device}, got {stream!r}")
        stream._live()
        return stream

    # inspection -------------------------------------------------------------------
    @property
    def nodes(self) -> tuple[Node, ...]:
        """The graph's nodes with their types (kernel nodes carry the kernel's name).

        Read from the driver on first use (a graph that was closed before
        that has none to show).
        """
        if self._nodes is None:
            if self.state != "ready":
                return ()
            found = self.device.backend.graph_nodes(self._raw_graph)
            self._nodes = tuple(Node(i, kind, name) for i, (kind, name) in enumerate(found))
        return self._nodes

    def summary(self) -> str:
        """One line: state, node counts by type, replays and pool memory."""
        nodes = self.nodes
        counts = collections.Counter(n.type for n in nodes)
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "no nodes"
        return (f"Graph ({self.state}) on {self.device.backend.name}:{self.device.index}: "
                f"{len(nodes)} nodes ({kinds}); {self.replays} replays; "
                f"pool {self.pool.reserved} B")

    def close(self) -> None:
        """Wait for the graph's replays, then free it and everything it kept. Idempotent."""
        if self._finalizer is not None:
            self._finalizer()
        self._exec = None
        self._raw_graph = None
        if self.state == "ready":
            self.state = "closed"

    def __enter__(self) -> Graph:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<cudagraphs.Graph {self.state}, {len(self.nodes)} nodes, {self.replays} replays>"
