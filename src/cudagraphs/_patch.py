"""Node-level changes of an instantiated graph: ``rebind`` and ``set_arg``.

Nodes are found by the handle the driver returned when they were recorded
(:class:`~cudagraphs._recording.NodeRecord`), so other libraries' nodes in
the same graph do not shift anything. Every change is checked before any
node is patched: a refused change leaves the graph as it was. Graphs are
known here by duck type (``graph._records``, ``graph._res``, ``graph.nodes``).
"""

from __future__ import annotations

import operator
from typing import Any

from ._array import _extent
from ._errors import UpdateError
from ._kernel import fastcall
from ._recording import resolve_handles
from .backends.base import ArrayArg, Copy, KernelLaunch

__all__ = ["point_copy", "rebind", "repoint", "set_arg"]


def _index(graph: Any, handle: Any) -> int | None:
    """The index in ``graph.nodes`` of the node with ``handle``."""
    backend = graph.device.backend
    found, _ = backend.graph_topology(graph._res.graph)
    key = int(handle)
    return next((i for i, n in enumerate(found) if int(n.handle) == key), None)


def _records(graph: Any) -> list[Any]:
    """The graph's node records, with driver handles (found once, then kept)."""
    records = resolve_handles(graph.device.backend, graph._res.graph, graph._records)
    graph._records = records
    return records


def _spec(a: Any) -> ArrayArg:
    spec: ArrayArg = a._view_spec()
    return spec


def _users(records: list[Any], key: ArrayArg) -> list[int]:
    """The indices of the records whose node uses the view ``key`` (``_fastcall.users``)."""
    return [i for i, r in enumerate(records) if key in _used(r)]


def _unpatchable(records: list[Any], hits: list[int]) -> int:
    """The first hit that cannot be changed node by node, or -1 (``_fastcall.unpatchable``)."""
    for i in hits:
        r = records[i]
        if r.patch is None or (r.kind == "memcpy" and not isinstance(r.patch, Copy)):
            return i
    return -1


def _used(r: Any) -> tuple[Any, ...]:
    """The views a record's node uses (with None for arguments that are not arrays)."""
    if r.kind == "kernel" and r.patch is not None:
        return r.patch[1].views  # type: ignore[no-any-return]
    return r.views  # type: ignore[no-any-return]


_tuple_new = tuple.__new__
_KIND = operator.itemgetter(1)  # a NodeRecord's kind


def rebind(graph: Any, exec_: Any, old: Any, new: Any) -> None:
    """See :meth:`cudagraphs.Graph.rebind`."""
    for name, a in (("old", old), ("new", new)):
        if getattr(a, "_view_spec", None) is None:
            raise TypeError(f"rebind: {name} must be a DeviceArray, got {type(a).__name__}")
    if (new.shape, new.strides, new.dtype, new.device) != (old.shape, old.strides, old.dtype, old.device):
        raise ValueError(
            f"rebind: new must match old, got shape {new.shape} strides {new.strides} "
            f"{new.dtype} for shape {old.shape} strides {old.strides} {old.dtype}"
        )
    key, spec = _spec(old), _spec(new)
    records = _records(graph)
    hits = fastcall.users(records, key) if fastcall is not None else _users(records, key)
    if not hits:
        raise ValueError("rebind: this graph does not use that array")
    _refuse_bodies(graph, lambda r: key in _used(r))
    start, end = _extent(old.shape, old.strides, old.dtype.itemsize)
    unseen = _unrecorded_users(graph, exec_, records, [(old.ptr + start, old.ptr + end, 0)], patch=False)
    if unseen:
        raise UpdateError(
            f"node {unseen[0]} (another library's kernel, not recorded by cudagraphs) uses the "
            "array: use repoint(), which moves it there too",
            unseen[0],
        )
    bad = fastcall.unpatchable(records, hits, Copy) if fastcall is not None else _unpatchable(records, hits)
    if bad >= 0:
        r = records[bad]
        where = _index(graph, r.handle)
        raise UpdateError(
            f"node {where} ({r.kind}) uses the array, and only kernel and device-copy "
            "arguments can be changed node by node: capture again and use update()",
            where,
        )
    backend = graph.device.backend
    if fastcall is not None and getattr(backend, "fastcall", False):
        # kernel nodes with a C launch path, in C; what it leaves (copies, other kernels, from
        # a node the driver refused on) is done here
        hits = fastcall.patch_kernels(exec_, records, hits, key, spec, new.ptr)
    for i in hits:
        r = records[i]
        if isinstance(r.patch, Copy):
            src_view, dst_view = r.views
            copy = r.patch._replace(
                src=new.ptr if src_view == key else r.patch.src,
                dst=new.ptr if dst_view == key else r.patch.dst,
            )
            backend.graph_update(exec_, r.handle, copy)
            records[i] = r._replace(patch=copy, views=tuple(spec if v == key else v for v in r.views))
            continue
        kernel, launch = r.patch
        fn, grid, block, shared_mem, values, views = launch
        values = tuple([new.ptr if v == key else x for x, v in zip(values, views)])
        views = tuple([spec if v == key else v for v in views])
        launch = _tuple_new(KernelLaunch, (fn, grid, block, shared_mem, values, views))
        backend.graph_update(exec_, r.handle, launch)
        records[i] = _tuple_new(type(r), (*r[:4], (kernel, launch), r[5]))  # patch replaced
    graph._res.keep.append(new)
    graph._patched = True


def _refuse_bodies(graph: Any, uses: Any) -> None:
    """UpdateError if a node inside a conditional body uses the memory (``uses(record)``)."""
    for r in graph._bodies:
        if uses(r):
            raise UpdateError(
                f"a {r.kind} node {r.name!r} inside a conditional body uses the memory, and nodes "
                "of bodies cannot be changed node by node: capture again and use update()"
            )


def _unrecorded_users(
    graph: Any, exec_: Any, records: list[Any], moves: list[tuple[int, int, int]], patch: bool
) -> list[int]:
    """Indices of the nodes cudagraphs did not record (other libraries') that use ``moves``' ranges.

    With ``patch``, their arguments are moved too (addresses as recorded in
    the graph, moved by ``moves``, which start from the capture's values).
    Child-graph nodes cannot be seen into: the backend refuses them.
    """
    res = graph._res
    # one record per node: every node is ours when the records, children aside, count them
    # all (the common case: no scan, no set of handles)
    if len(records) - operator.countOf(map(_KIND, records), "child") == _node_count(graph):
        return []
    ours = {int(r.handle) for r in records if r.kind != "child"}
    if res.params_graph is not None:
        raise UpdateError(
            "this graph was updated from another (update()), and holds nodes of other libraries "
            "whose new arguments cudagraphs cannot see: capture again"
        )
    return graph.device.backend.graph_repoint(exec_, res.graph, moves, ours, patch)  # type: ignore[no-any-return]


def _node_count(graph: Any) -> int:
    """How many nodes the graph's driver graph has (read once: it never changes)."""
    count = graph._count
    if count is None:
        count = graph._count = len(graph.device.backend.graph_topology(graph._res.graph, details=False)[0])
    return count  # type: ignore[no-any-return]


def _compose(moves: list[tuple[int, int, int]], lo: int, hi: int, delta: int) -> list[tuple[int, int, int]]:
    """Moves from the captured addresses, after moving ``[lo, hi)`` by ``delta``."""
    out = [(a, b, d + delta) if lo <= a + d and b + d <= hi else (a, b, d) for a, b, d in moves]
    if not any(a < hi and lo < b for a, b, _ in moves):  # memory the capture itself used
        out.append((lo, hi, delta))
    return out


def repoint(graph: Any, exec_: Any, old: Any, new: Any) -> int:
    """See :meth:`cudagraphs.Graph.repoint`; returns the number of nodes changed."""
    for name, a in (("old", old), ("new", new)):
        if getattr(a, "_view_spec", None) is None:
            raise TypeError(f"repoint: {name} must be a DeviceArray, got {type(a).__name__}")
    if (new.shape, new.strides, new.dtype, new.device) != (old.shape, old.strides, old.dtype, old.device):
        raise ValueError(
            f"repoint: new must match old, got shape {new.shape} strides {new.strides} "
            f"{new.dtype} for shape {old.shape} strides {old.strides} {old.dtype}"
        )
    start, end = _extent(old.shape, old.strides, old.dtype.itemsize)
    lo, hi = old.ptr + start, old.ptr + end
    delta = new.ptr - old.ptr

    def moved(address: Any) -> Any:
        return address + delta if type(address) is int and lo <= address < hi else address

    records = _records(graph)
    changes: list[tuple[int, Any]] = []
    for i, r in enumerate(records):
        if r.kind == "kernel" and r.patch is not None:
            kernel, launch = r.patch
            fn, grid, block, shared_mem, values, views = launch
            pointers = [p.pointer for p in kernel.params]
            values2 = tuple([moved(v) if ptr else v for v, ptr in zip(values, pointers)])
            if values2 == values:
                continue
            views2 = tuple([v if v is None else v._replace(ptr=moved(v.ptr)) for v in views])
            changes.append(
                (i, (kernel, _tuple_new(KernelLaunch, (fn, grid, block, shared_mem, values2, views2))))
            )
        elif any(lo <= v.ptr < hi for v in r.views):
            if not isinstance(r.patch, Copy):
                where = _index(graph, r.handle)
                raise UpdateError(
                    f"node {where} ({r.kind}) uses the memory, and only kernel and device-copy "
                    "arguments can be changed node by node: capture again",
                    where,
                )
            changes.append((i, r.patch._replace(src=moved(r.patch.src), dst=moved(r.patch.dst))))
    _refuse_bodies(
        graph,
        lambda r: (
            any(v is not None and lo <= v.ptr < hi for v in _used(r))
            or (
                r.kind == "kernel"
                and r.patch is not None
                and any(type(v) is int and lo <= v < hi for v in r.patch[1].values)
            )
        ),
    )
    moves = _compose(graph._moves, lo, hi, delta)
    others = _unrecorded_users(graph, exec_, records, moves, patch=False)  # refuses what it cannot see
    if not changes and not others:
        raise ValueError("repoint: no node of this graph uses that memory")
    backend = graph.device.backend
    if others:
        _unrecorded_users(graph, exec_, records, moves, patch=True)
    graph._moves = moves
    for i, patch in changes:
        r = records[i]
        if isinstance(patch, Copy):
            backend.graph_update(exec_, r.handle, patch)
            views = tuple(v._replace(ptr=moved(v.ptr)) for v in r.views)
            records[i] = r._replace(patch=patch, views=views)
        else:
            backend.graph_update(exec_, r.handle, patch[1])
            records[i] = _tuple_new(type(r), (*r[:4], patch, r[5]))
    graph._res.keep.append(new)
    graph._patched = True
    return len(changes) + len(others)


def point_copy(graph: Any, exec_: Any, index: int, src: int | None) -> None:
    """Make the device-copy node of record ``index`` copy from ``src`` (None: switch it off).

    For a graphed call's input copy (see :mod:`cudagraphs._graphed`): the node
    copies the same bytes to the same place, from the new input; switched
    off, the input is copied eagerly instead. The node's handle is found
    once, on first use; the record's patch follows (its source view is no
    longer known: None).

    Raises
    ------
    ValueError
        If record ``index`` is not a device copy recorded by cudagraphs.
    """
    records = graph._records
    if records[index].handle is None:
        records = _records(graph)
    r = records[index]
    if r.kind != "memcpy" or not isinstance(r.patch, Copy) or r.patch.kind != "dtod":
        raise ValueError(f"record {index} is not a device-to-device copy recorded by cudagraphs")
    copy = r.patch._replace(src=src) if src is not None else None
    graph.device.backend.graph_update(exec_, r.handle, copy if copy is not None else False)
    records[index] = r._replace(patch=copy, views=(None, r.views[1]))
    graph._patched = True


def set_arg(graph: Any, exec_: Any, node: Any, arg: int | str, value: Any) -> None:
    """See :meth:`cudagraphs.Graph.set_arg`."""
    nodes = graph.nodes
    index = getattr(node, "index", node)
    if type(index) is not int or not 0 <= index < len(nodes):
        raise IndexError(f"set_arg: node {node!r} is not one of this graph's {len(nodes)} nodes")
    backend = graph.device.backend
    handle = backend.graph_topology(graph._res.graph, details=False)[0][index].handle
    key = int(handle)
    at = next((i for i, r in enumerate(_records(graph)) if int(r.handle) == key), None)
    if at is None:
        raise UpdateError(
            f"node {index} ({nodes[index].type}) was not recorded by cudagraphs (another "
            "library's work, or inside a conditional body): capture again and use update()",
            index,
        )
    r = graph._records[at]
    if r.kind != "kernel":
        raise UpdateError(f"node {index} is a {r.kind} node, not a kernel", index)
    kernel, launch = r.patch
    params = kernel.params
    names = [p.name for p in params]
    j = names.index(arg) if isinstance(arg, str) and arg in names else arg
    if type(j) is not int or not 0 <= j < len(names):
        raise ValueError(f"set_arg: kernel {kernel.name!r} has parameters {names}, got {arg!r}")
    p = params[j]
    if p.name in kernel.fixed:
        raise ValueError(
            f"set_arg: parameter {p.name!r} of {kernel.name!r} is fixed by the shapes of the "
            "node's arrays; capture again to change it"
        )
    recorded = launch.views[j]
    if recorded is not None:
        spec = getattr(value, "_view_spec", None)
        if spec is None or value.device is not graph.device:
            raise TypeError(
                f"set_arg: parameter {p.name!r} of node {index} was recorded with an array "
                f"(shape {recorded.shape}, {recorded.dtype}); pass a DeviceArray of this "
                f"device like it, got {type(value).__name__}"
            )
        view = _spec(value)
        if (view.shape, view.strides, view.dtype) != (recorded.shape, recorded.strides, recorded.dtype):
            raise ValueError(
                f"set_arg: parameter {p.name!r} of node {index} was recorded with an array of "
                f"shape {recorded.shape}, strides {recorded.strides}, {recorded.dtype}; got "
                f"shape {view.shape}, strides {view.strides}, {view.dtype}: the kernel would "
                "read or write out of bounds"
            )
        raw: Any = value.ptr
    else:
        raw, view = kernel._convert[j](value, graph.device), None
    values = (*launch.values[:j], raw, *launch.values[j + 1 :])
    views = (*launch.views[:j], view, *launch.views[j + 1 :])
    new_launch = KernelLaunch(launch.function, launch.grid, launch.block, launch.shared_mem, values, views)
    backend.graph_update(exec_, handle, new_launch)
    graph._records[at] = r._replace(patch=(kernel, new_launch))
    if view is not None or getattr(value, "__cuda_array_interface__", None) is not None:
        graph._res.keep.append(value)
    graph._patched = True
