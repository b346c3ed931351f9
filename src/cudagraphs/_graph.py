"""Graph: an instantiated capture, ready to replay.

A graph owns its driver graph and executable graph, the pinned buffers that
hold host data staged during capture, and references to every array, scalar,
host slot and callback its work uses, so replaying never touches freed
memory. ``close()`` (or garbage collection) waits for the graph's replays,
then releases all of it. States: capturing -> ready (or captured, when not
instantiated) -> closed; failed when the capture failed; consumed when
another graph was updated from it.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import shutil
import subprocess
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._device import Device, Stream
from ._errors import UpdateError

if TYPE_CHECKING:
    from ._capture import Capture
    from ._pool import GraphPool
    from .backends.base import Backend

__all__ = ["Body", "Condition", "Graph", "Node"]


class Condition:
    """A graph condition: the value a conditional node tests when it runs.

    Made by ``g.condition(default)`` inside a capture; set on the device with
    :func:`cudagraphs.ops.set_condition` (or ``cudaGraphSetConditional`` in a
    kernel of yours that takes ``handle`` as an ``unsigned long long``). It
    takes ``default`` at the start of every launch of the graph.
    """

    __slots__ = ("handle", "default", "graph")

    def __init__(self, handle: int, default: int, graph: Graph) -> None:
        self.handle = handle
        self.default = default
        self.graph = graph

    def __repr__(self) -> str:
        return f"<cudagraphs.Condition 0x{self.handle:x} default={self.default}>"


class Body:
    """The body of a conditional node, captured by a ``with`` block.

    Inside the block, work queued on ``body.stream`` lands in the body. When
    the capture is on the device's compute stream (the default), that stream
    is redirected to the body for the block, so ops that name no stream land
    there too.
    """

    def __init__(self, graph: Graph, capture: Capture, handle: Any, label: str) -> None:
        self.graph, self._capture, self._handle, self.label = graph, capture, handle, label
        self.stream: Stream | None = None
        self._restore: Stream | None = None
        self._used = False

    def __enter__(self) -> Body:
        if self._used:
            raise RuntimeError(f"{self.label} was already captured; each body is captured once")
        self._used = True
        cap, device = self._capture, self.graph.device
        parent = cap.stack[-1]
        stream = device.spare_stream()
        device.backend.capture_to_body(stream._raw, self._handle, cap.mode)
        device.captures[stream.handle] = cap
        cap.stack.append(stream)
        if device.stream is parent:
            self._restore, device.stream = parent, stream
        self.stream = stream
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: object) -> bool:
        cap, device = self._capture, self.graph.device
        stream = self.stream
        assert stream is not None
        try:
            device.backend.capture_end(stream._raw)
        except Exception as err:  # an invalid body invalidates the whole capture
            cap.invalid = cap.invalid or f"the capture of {self.label} failed: {err}"
            if exc_type is None:
                raise
        finally:
            device.captures.pop(stream.handle, None)
            cap.stack.pop()
            if self._restore is not None:
                device.stream = self._restore
            device.return_spare_stream(stream)
        return False


class _Spec:
    """An array's address spec, standing in for it in a node's arguments."""

    __slots__ = ("spec",)

    def __init__(self, spec: tuple) -> None:
        self.spec = spec

    def _view_spec(self) -> tuple:
        return self.spec


_COLORS = {
    "kernel": "#cfe2ff", "memcpy": "#d1e7dd", "memset": "#fff3cd", "mem_alloc": "#f8d7da",
    "mem_free": "#f8d7da", "host": "#e2d9f3", "child": "#dee2e6", "conditional": "#ffe5d0",
}


@dataclasses.dataclass(frozen=True)
class Node:
    """One node of a graph: its index, type (``"kernel"``, ``"memcpy"``, ...) and name."""

    index: int
    type: str
    name: str = ""


def _wait_for_replays(backend: Backend, device: Device, streams: list[Stream]) -> None:
    for s in streams:
        if not s.closed and s.handle not in device.captures:
            backend.stream_synchronize(s._raw)


def _release(backend: Backend, raw_graph: Any, pool: GraphPool, keep: list[Any],
             staged: list[int], absorbed: list[tuple], streams: list[Stream]) -> None:
    """Free a driver graph and what its nodes use (and of graphs it absorbed)."""
    if raw_graph is not None:
        backend.graph_destroy(raw_graph)
    for ptr in staged:
        backend.host_free(ptr)
    staged.clear()
    keep.clear()
    pool.drop(streams)
    for entry in absorbed:
        _release(backend, *entry, streams)
    absorbed.clear()


def _destroy(
    backend: Backend, device: Device, handles: list[Any], pool: GraphPool,
    keep: list[Any], staged: list[int], streams: list[Stream], absorbed: list[tuple],
) -> None:
    # replays still queued may read everything below: wait for them first
    _wait_for_replays(backend, device, streams)
    if handles[1] is not None:
        backend.graph_exec_destroy(handles[1])
    _release(backend, handles[0], pool, keep, staged, absorbed, streams)


def _signature(nodes: tuple[Node, ...]) -> tuple[tuple[str, str], ...]:
    return tuple((n.type, n.name) for n in nodes)


def _difference(mine: tuple, theirs: tuple) -> tuple[str, int] | None:
    """Why two capture traces are not topology-identical, and where."""
    for i, ((kind_a, name_a), (kind_b, name_b)) in enumerate(zip(mine, theirs)):
        if kind_a != kind_b:
            return f"node {i} is a {kind_a} node in this graph and a {kind_b} node in the source", i
        if name_a != name_b:
            return f"node {i} runs kernel {name_a!r} in this graph and {name_b!r} in the source", i
    if len(mine) != len(theirs):
        return (f"the topology changed: this graph recorded {len(mine)} nodes, "
                f"the source {len(theirs)}"), min(len(mine), len(theirs))
    return None


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
                 "_handles", "_node_graph", "_node_handles", "_trace", "_uses", "_keep",
                 "_auto_free", "_absorbed", "_capture",
                 "_streams",
                 "_launch", "_uploaded", "_finalizer", "__weakref__")

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("Graph objects are made by cg.capture(), not directly")

    @classmethod
    def _capturing(cls, device: Device, stream: Stream, pool: GraphPool) -> Graph:
        g = object.__new__(cls)
        g.device, g.stream, g.pool = device, stream, pool
        g.output, g.replays, g.state = None, 0, "capturing"
        g._nodes: tuple[Node, ...] | None = None  # read from the driver on first use
        g._exec = None
        g._handles = [None, None]  # driver graph, executable graph
        g._node_graph = None  # the driver graph whose nodes the executable runs
        # nodes of the graph the executable was instantiated from: node-level
        # updates name those, whatever graph a later update() took values from
        g._node_handles: list[Any] | None = None
        g._trace: tuple[tuple[str, str], ...] = ()
        g._uses: list[tuple[tuple, tuple | None]] = []  # per node: array specs, kernel launch
        g._keep: list[Any] = []
        g._auto_free = False
        g._absorbed: list[tuple] = []  # graphs this one was updated from
        g._capture = None  # the Capture while capturing
        g._streams = [stream]
        g._launch = device.backend.graph_launch
        g._uploaded = False
        g._finalizer = None
        return g

    def _instantiate(self, raw_graph: Any, cap: Capture, auto_free: bool, instantiate: bool) -> None:
        backend = self.device.backend
        self._handles[0] = self._node_graph = raw_graph
        self._trace = tuple(cap.trace)
        self._uses = list(cap.uses)
        self._auto_free = auto_free
        if instantiate:
            self._handles[1] = self._exec = backend.graph_instantiate(raw_graph, auto_free)
        keep, staged = list(cap.keep), list(cap.staged)
        self._keep = keep
        cap.keep.clear()
        cap.staged.clear()
        self._finalizer = weakref.finalize(
            self, _destroy, backend, self.device, self._handles, self.pool, keep, staged,
            self._streams, self._absorbed,
        )
        self.state = "ready" if instantiate else "captured"

    def instantiate(self) -> Graph:
        """Make a graph captured with ``instantiate=False`` replayable; returns it."""
        if self.state != "captured":
            raise RuntimeError(f"this graph is {self.state}; only a captured graph can be instantiated")
        self._handles[1] = self._exec = self.device.backend.graph_instantiate(
            self._handles[0], self._auto_free
        )
        self.state = "ready"
        return self

    def update(self, source: Graph) -> Graph:
        """Give this graph the parameters of a topology-identical ``source``.

        The driver's whole-graph update: addresses, by-value arguments and
        copy sizes of ``source`` replace this graph's without instantiating
        again. ``source`` is consumed: its memory, inputs and staged host data
        now belong to this graph, and it can no longer be replayed. Capture it
        with ``instantiate=False`` to skip a useless instantiation.

        Raises
        ------
        UpdateError
            With the reason and the offending node index when the graphs
            differ (node count, node type, kernel) or the driver refuses; this
            graph is unchanged and keeps replaying as before.
        """
        exec_ = self._ready()
        if not isinstance(source, Graph):
            raise TypeError(f"update takes a cudagraphs Graph, got {type(source).__name__}")
        if source is self:
            raise ValueError("a graph cannot be updated from itself")
        if source.device is not self.device:
            raise ValueError(f"the source graph is on {source.device}, this one on {self.device}")
        if source.state not in ("ready", "captured"):
            raise RuntimeError(f"the source graph is {source.state}; it cannot be used for an update")
        why = _difference(self._trace, source._trace)
        if why is not None:
            raise UpdateError(*why)
        backend = self.device.backend
        try:
            backend.graph_exec_update(exec_, source._handles[0])
        except UpdateError as err:
            if err.node is None:  # the driver said no without saying where: find it
                why = _difference(_signature(self.nodes), _signature(source.nodes))
                if why is not None:
                    raise UpdateError(*why) from err
            raise
        # the executable now runs the source's parameters: take over what they use
        _, _, args, _ = source._finalizer.detach()  # type: ignore[misc]
        _, _, handles, pool, keep, staged, streams, absorbed = args
        _wait_for_replays(backend, self.device, streams)
        if handles[1] is not None:
            backend.graph_exec_destroy(handles[1])
        self._absorbed.append((handles[0], pool, keep, staged, absorbed))
        self._node_graph, self._nodes, self._trace = handles[0], None, source._trace
        self._uses = source._uses
        source._exec = None
        source._handles = [None, None]
        source.state = "consumed"
        return self

    def _fail(self) -> None:
        self.state = "failed"

    # replay ---------------------------------------------------------------------
    # device-side control flow (while capturing) -------------------------------------
    def _capturing_now(self) -> Capture:
        if self.state != "capturing" or self._capture is None:
            raise RuntimeError(
                "conditions and conditional nodes are added while capturing: call them "
                "inside `with cg.capture() as g:`"
            )
        return self._capture

    def condition(self, default: int = 0) -> Condition:
        """A new condition of this graph, ``default`` at the start of every launch."""
        cap = self._capturing_now()
        if not isinstance(default, int) or not 0 <= default <= 0xFFFFFFFF:
            raise ValueError(f"default must be an int in 0..2**32-1, got {default!r}")
        handle = self.device.backend.capture_condition(cap.stack[-1]._raw, default)
        return Condition(handle, default, self)

    def _conditional(self, kind: str, cond: Condition, size: int) -> list[Body]:
        cap = self._capturing_now()
        if not isinstance(cond, Condition) or cond.graph is not self:
            raise TypeError(f"{kind} needs a Condition made by this graph's condition(), got {cond!r}")
        bodies = self.device.backend.capture_conditional(cap.stack[-1]._raw, kind, size, cond.handle)
        cap.trace.append(("conditional", kind))
        cap.uses.append(((), None))
        return [Body(self, cap, b, f"the {kind} body {i}") for i, b in enumerate(bodies)]

    def while_loop(self, cond: Condition) -> Body:
        """A while node: its body runs again and again while ``cond`` is non-zero.

        ``cond`` is tested before the first run (so a zero condition runs it
        never); the body must set it (``cg.ops.set_condition``) to stop.
        """
        return self._conditional("while", cond, 1)[0]

    def if_then(self, cond: Condition) -> Body:
        """An if node: its body runs once if ``cond`` is non-zero."""
        return self._conditional("if", cond, 1)[0]

    def if_else(self, cond: Condition) -> tuple[Body, Body]:
        """An if node with two bodies: the first if ``cond`` is non-zero, else the second."""
        then, otherwise = self._conditional("if", cond, 2)
        return then, otherwise

    def switch(self, cond: Condition, n: int) -> list[Body]:
        """A switch node with ``n`` bodies: body ``cond`` runs; out of range, none."""
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"switch needs n >= 1 bodies, got {n!r}")
        return self._conditional("switch", cond, n)

    def rebind(self, old: Any, new: Any) -> Graph:
        """Point every kernel and device-copy argument that is ``old`` at ``new``.

        Executable-node updates: no capture, no instantiation. ``new`` must
        have the same shape, strides, dtype and device; arguments that are
        ``old`` itself (same address, shape and strides) are repointed, in
        kernel nodes and device-to-device copy nodes. The graph keeps ``new``
        alive (and still ``old``).

        Raises
        ------
        ValueError
            If the graph does not use ``old``, or ``new`` does not match it.
        UpdateError
            If a node that uses ``old`` cannot be patched (host copies,
            memsets, other libraries' work): capture again and use
            :meth:`update`. Nothing is changed then.
        """
        from ._array import DeviceArray

        exec_ = self._ready()
        for name, a in (("old", old), ("new", new)):
            if not isinstance(a, DeviceArray):
                raise TypeError(f"rebind: {name} must be a DeviceArray, got {type(a).__name__}")
        if (new.shape, new.strides, new.dtype, new.device) != (old.shape, old.strides, old.dtype, old.device):
            raise ValueError(
                f"rebind: new must match old, got shape {new.shape} strides {new.strides} "
                f"{new.dtype} for shape {old.shape} strides {old.strides} {old.dtype}"
            )
        key = old._view_spec()
        hits = [i for i, (specs, _) in enumerate(self._uses) if key in specs]
        if not hits:
            raise ValueError("rebind: this graph does not use that array")
        self._check_patchable(hits, "uses the array")
        for i in hits:
            specs, launch = self._uses[i]
            if launch[0] == "memcpy":
                self._patch_memcpy(exec_, i, key, new)
                continue
            kernel = launch[0]
            updates = {j: new for j, (s, p) in enumerate(zip(specs, kernel.params))
                       if p.pointer and s == key}
            self._patch(exec_, i, updates)
        self._keep.append(new)
        return self

    def set_arg(self, node: int, arg: int | str, value: Any) -> Graph:
        """Change one argument of kernel node ``node`` (by index or parameter name).

        The value is checked and converted like a launch argument (numbers to
        the parameter's C type, arrays to addresses).
        """
        exec_ = self._ready()
        if not isinstance(node, int) or not 0 <= node < len(self._uses):
            raise IndexError(f"set_arg: node {node!r} is not one of this graph's {len(self._uses)} traced nodes")
        self._check_patchable([node], "is not a cudagraphs kernel")
        kernel = self._uses[node][1][0]
        if kernel == "memcpy":
            raise UpdateError(f"node {node} is a {self._trace[node][0]} node, not a kernel", node)
        names = [p.name for p in kernel.params]
        j = names.index(arg) if isinstance(arg, str) and arg in names else arg
        if not isinstance(j, int) or not 0 <= j < len(names):
            raise ValueError(f"set_arg: kernel {kernel.name!r} has parameters {names}, got {arg!r}")
        self._patch(exec_, node, {j: value})
        if hasattr(value, "_view_spec"):
            self._keep.append(value)
        return self

    def _check_patchable(self, nodes: list[int], what: str) -> None:
        count = self.device.backend.graph_node_count(self._node_graph)
        if count != len(self._uses):
            raise UpdateError(
                f"node-level changes need every node recorded by cudagraphs; this graph has "
                f"{count} nodes and {len(self._uses)} recorded (work of other libraries?): "
                "capture again and use update()"
            )
        for i in nodes:
            if self._uses[i][1] is None:
                raise UpdateError(
                    f"node {i} ({self._trace[i][0]}) {what}, and only kernel and device-copy "
                    "arguments can be changed node by node: capture again and use update()", i,
                )

    def _patch_memcpy(self, exec_: Any, index: int, key: tuple, new: Any) -> None:
        """Point device-to-device copy node ``index`` at ``new`` where it used ``key``."""
        specs, launch = self._uses[index]
        specs = tuple(new._view_spec() if s == key else s for s in specs)
        (dst, *_), (src, *_) = specs
        backend = self.device.backend
        if self._node_handles is None:
            self._node_handles = backend.graph_node_handles(self._handles[0])
        backend.graph_exec_memcpy_update(exec_, self._node_handles[index], dst, src, launch[1])
        self._uses[index] = (specs, launch)

    def _patch(self, exec_: Any, index: int, updates: dict[int, Any]) -> None:
        """Give kernel node ``index`` new values for the arguments in ``updates``."""
        specs, (kernel, grid, block, shared_mem, raw) = self._uses[index]
        raw, objs = list(raw), [_Spec(s) if s is not None else None for s in specs]
        for j, value in updates.items():
            raw[j] = kernel._convert[j](value, self.device)
            objs[j] = value if hasattr(value, "_view_spec") else None
        backend = self.device.backend
        if self._node_handles is None:
            self._node_handles = backend.graph_node_handles(self._handles[0])
        backend.graph_exec_kernel_update(
            exec_, self._node_handles[index], kernel.launcher(self.device), grid, block,
            shared_mem, raw, objs,
        )
        new_specs = tuple(o._view_spec() if o is not None else None for o in objs)
        self._uses[index] = (new_specs, (kernel, grid, block, shared_mem, raw))

    def _ready(self) -> Any:
        if self._exec is None or self.state != "ready":
            hint = (": call g.instantiate() first, or use it as a source for update()"
                    if self.state == "captured" else "")
            raise RuntimeError(f"this graph is {self.state}; only a ready graph can be replayed{hint}")
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
            if self.state not in ("ready", "captured"):
                return ()
            found = self.device.backend.graph_nodes(self._node_graph)
            self._nodes = tuple(Node(i, kind, name) for i, (kind, name) in enumerate(found))
        return self._nodes

    @property
    def edges(self) -> list[tuple[int, int]]:
        """Dependencies as (from, to) node indices: ``to`` runs after ``from``."""
        if self.state not in ("ready", "captured"):
            return []
        return self.device.backend.graph_edges(self._node_graph)

    def to_dot(self) -> str:
        """The graph in Graphviz's DOT language.

        Nodes by type and kernel name, dependency edges, and the bodies of
        conditional nodes as clusters (``body 0`` of a while/if, one per
        branch of a switch) linked to their node by dashed edges.
        """
        lines = [
            "digraph cudagraphs {",
            '  rankdir=TB; compound=true; node [shape=box, style="rounded,filled", fontname="Helvetica"];',
            f'  label="{self.summary()}"; labelloc=t; fontname="Helvetica";',
        ]
        if self.state in ("ready", "captured"):
            self._dot_graph(self._node_graph, "n", lines, "  ")
        lines.append("}")
        return "\n".join(lines) + "\n"

    def _dot_graph(self, graph: Any, prefix: str, lines: list[str], indent: str) -> str:
        """Append one driver graph's nodes and edges; return its first node's name."""
        backend = self.device.backend
        nodes = backend.graph_nodes(graph)
        for i, (kind, name) in enumerate(nodes):
            text = f"{i}: {kind}" + (f"\\n{name}" if name else "")
            lines.append(f'{indent}{prefix}{i} [label="{text}", fillcolor="{_COLORS.get(kind, "#eeeeee")}"];')
        lines.extend(f"{indent}{prefix}{a} -> {prefix}{b};" for a, b in backend.graph_edges(graph))
        for i, (kind, _) in enumerate(nodes):
            if kind != "conditional":
                continue
            for k, body in enumerate(backend.graph_bodies(graph, i)):
                sub = f"{prefix}{i}_{k}_"
                lines.append(f"{indent}subgraph cluster_{sub} {{")
                lines.append(f'{indent}  label="body {k} of node {i}"; style=dashed;')
                first = self._dot_graph(body, sub, lines, indent + "  ")
                lines.append(f"{indent}}}")
                if first:
                    lines.append(f"{indent}{prefix}{i} -> {first} [style=dashed, lhead=cluster_{sub}];")
        return f"{prefix}0" if nodes else ""

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the picture to ``path``: ``.dot`` as text, ``.svg``/``.png``/``.pdf`` via Graphviz.

        Raises
        ------
        RuntimeError
            If Graphviz's ``dot`` program is needed but not installed.
        ValueError
            For another file suffix.
        """
        out = Path(path)
        fmt = out.suffix.lower().lstrip(".")
        if fmt == "dot":
            out.write_text(self.to_dot())
            return out
        if fmt not in ("svg", "png", "pdf"):
            raise ValueError(f"save writes .dot, .svg, .png or .pdf files, got {out.name!r}")
        dot = shutil.which("dot")
        if dot is None:
            raise RuntimeError(
                f"saving {out.name!r} needs Graphviz's `dot` program, which is not installed: "
                "install graphviz (e.g. `apt install graphviz` or `conda install graphviz`), "
                "or save as .dot and render it elsewhere"
            )
        subprocess.run([dot, f"-T{fmt}", "-o", str(out)], input=self.to_dot(), text=True,
                       check=True, capture_output=True)
        return out

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
        if self.state in ("ready", "captured"):
            self.state = "closed"

    def __enter__(self) -> Graph:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<cudagraphs.Graph {self.state}, {len(self.nodes)} nodes, {self.replays} replays>"
