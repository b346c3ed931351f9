"""Node-level changes of an instantiated graph: ``rebind`` and ``set_arg``.

Nodes are found by the handle the driver returned when they were recorded
(:class:`~cudagraphs._recording.NodeRecord`), so other libraries' nodes in
the same graph do not shift anything. Every change is checked before any
node is patched: a refused change leaves the graph as it was. Graphs are
known here by duck type (``graph._records``, ``graph._res``, ``graph.nodes``).

This module is compiled by Cython from this source where the package is
built (``_node_changes.pxd`` types the repeat path of :func:`rebind`: which
nodes use an array, and their new arguments, for a thousand nodes a call;
the kernel nodes' new parameters are packed and set through the C part's
``nodes_*`` trampolines: docs/architecture.md, "The compiled part"), and runs
as plain Python where not.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

try:
    import cython
except ImportError:  # (run as Python where Cython is not installed: nothing is compiled)
    cython = SimpleNamespace(compiled=False)

from ._array import _extent
from ._config import compiled_part
from ._errors import UpdateError
from ._recording import NodeRecord, has_unrecorded, resolve_handles
from .backends.base import ArrayArg, Copy, KernelLaunch

if not cython.compiled:  # (compiled, _capi.pxd's C functions: the C part's kernel node updates)
    from ._capi import (
        cg_api_load,
        cg_item,
        cg_nodes_add,
        cg_nodes_new,
        cg_nodes_set,
        cg_replaced_where,
        cg_tuple6,
    )

_fastcall = compiled_part()
if cython.compiled and _fastcall is not None:
    cg_api_load(_fastcall.api)

__all__ = ["point_copy", "rebind", "repoint", "set_arg"]

# (for the repeat path of rebind: compiled, C globals; a record's and a launch's items read by
# position, a C call where a field's name is an attribute lookup)
_COPY, _KERNEL_LAUNCH, _KERNEL = Copy, KernelLaunch, "kernel"
_HANDLE, _KIND, _VIEWS, _PATCH = (NodeRecord._fields.index(f) for f in ("handle", "kind", "views", "patch"))
_LAUNCH_VALUES, _LAUNCH_VIEWS = (KernelLaunch._fields.index(f) for f in ("values", "views"))


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
    """The indices of the records whose node uses the view ``key``."""
    out = []
    for i in range(len(records)):
        if key in _used(records[i]):
            out.append(i)
    return out


def _unpatchable(records: list[Any], hits: list[int]) -> int:
    """The first hit whose node cannot be changed node by node, or -1."""
    for i in hits:
        r = records[i]
        patch = cg_item(r, _PATCH)
        if patch is None:
            return i
        kind = cg_item(r, _KIND)
        if kind is not _KERNEL and kind == "memcpy" and not isinstance(patch, _COPY):  # (identity first)
            return i
    return -1


def _used(r: Any) -> tuple[Any, ...]:
    """The views a record's node uses (with None for arguments that are not arrays)."""
    patch = cg_item(r, _PATCH)
    if patch is not None and cg_item(r, _KIND) == "kernel":
        return cg_item(patch[1], _LAUNCH_VIEWS)  # type: ignore[no-any-return]
    return cg_item(r, _VIEWS)  # type: ignore[no-any-return]


def _device_name(device: Any) -> str:
    return f"{device.backend.name} device {device.index}"


def _check_pair(op: str, old: Any, new: Any) -> None:
    """TypeError or ValueError unless ``old`` and ``new`` are arrays that match.

    The message names every property that differs (a device by its number).
    """
    for name, a in (("old", old), ("new", new)):
        if getattr(a, "_view_spec", None) is None:
            raise TypeError(f"{op}: {name} must be a DeviceArray, got {type(a).__name__}")
    if (new.shape, new.strides, new.dtype) == (
        old.shape,
        old.strides,
        old.dtype,
    ) and new.device is old.device:
        return
    differ = [
        f"{what} {a} (old) and {b} (new)"
        for what, a, b in (
            ("shape", old.shape, new.shape),
            ("strides", old.strides, new.strides),
            ("dtype", old.dtype, new.dtype),
        )
        if a != b
    ]
    if new.device is not old.device:
        differ.append(
            f"device: new is on {_device_name(new.device)}, old on {_device_name(old.device)} "
            "(copy it to old's device first)"
        )
    raise ValueError(
        f"{op}: new must match old in shape, strides, dtype and device; they differ in " + "; ".join(differ)
    )


def rebind(graph: Any, exec_: Any, old: Any, new: Any) -> None:
    """See :meth:`cudagraphs.Graph.rebind`."""
    _check_pair("rebind", old, new)
    key, spec = _spec(old), _spec(new)
    records = _records(graph)
    hits = _users(records, key)
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
    bad = _unpatchable(records, hits)
    if bad >= 0:
        r = records[bad]
        where = _index(graph, r.handle)
        raise UpdateError(
            f"node {where} ({r.kind}) uses the array, and only kernel and device-copy "
            "arguments can be changed node by node: capture again and use update()",
            where,
        )
    _move(graph.device.backend, exec_, records, hits, key, spec, new.ptr)
    graph._res.keep.append(new)
    graph._patched = True


def _move(
    backend: Any, exec_: Any, records: list[Any], hits: list[int], key: ArrayArg, spec: ArrayArg, ptr: int
) -> None:
    """Point the arguments of the hits' nodes that use the view ``key`` at ``ptr`` (its view ``spec``).

    Each hit's record is replaced once its node is set. A kernel node whose
    kernel has the C part's Packer (see :meth:`cudagraphs.Kernel._arm`) is
    packed and set by the C part, a batch of nodes to one release of the
    GIL; the others, and every node from one the C part cannot set on, are
    set by the backend's ``graph_update`` (which reports a driver's error).
    """
    batch: Any = None  # the C part's batch of kernel nodes, made for the first such node
    # (a backend whose driver calls are the C part's, until a node the C part cannot set: the
    # backend sets it and the rest; a kernel armed with a Packer on one device is launched on
    # another backend's devices too)
    fast = bool(getattr(backend, "fastcall", False))
    pending: list[Any] = []  # the batch's nodes: index, new record, index, new record...
    last_kernel: Any = None
    last_fn: Any = None
    packer: Any = None
    function = 0
    for i in hits:
        r = records[i]
        patch = cg_item(r, _PATCH)
        if isinstance(patch, _COPY):
            src_view, dst_view = r.views
            copy = patch._replace(
                src=ptr if src_view == key else patch.src, dst=ptr if dst_view == key else patch.dst
            )
            backend.graph_update(exec_, r.handle, copy)
            records[i] = r._replace(patch=copy, views=tuple([spec if v == key else v for v in r.views]))
            continue
        kernel, launch = patch
        # (a record's and a launch's items read by position: see cg_item)
        handle, fn, grid, block, shared = (
            cg_item(r, _HANDLE),
            cg_item(launch, 0),
            cg_item(launch, 1),
            cg_item(launch, 2),
            cg_item(launch, 3),
        )
        views = cg_item(launch, _LAUNCH_VIEWS)
        # (the arguments that are the view moved: compiled, C copies of the two tuples)
        values = cg_replaced_where(cg_item(launch, _LAUNCH_VALUES), views, key, ptr)
        launch = cg_tuple6(
            _KERNEL_LAUNCH, fn, grid, block, shared, values, cg_replaced_where(views, views, key, spec)
        )
        # (handle, kind, name, views, patch, top), the patch replaced
        moved = cg_tuple6(
            type(r), handle, cg_item(r, 1), cg_item(r, 2), cg_item(r, 3), (kernel, launch), cg_item(r, 5)
        )
        if kernel is not last_kernel:
            last_kernel, packer = kernel, kernel.fast
        if packer is not None and fast:
            if batch is None:
                batch = cg_nodes_new(int(exec_), len(hits))
                fast = batch is not None
            if fast:
                if fn is not last_fn:
                    last_fn = fn
                    function = int(fn)  # (the loaded function's address)
                got = cg_nodes_add(batch, packer, int(handle), function, grid, block, shared, values)
                if got >= 0:
                    pending.append(i)  # (the index and the new record, side by side: no pair made)
                    pending.append(moved)
                    if got == 1:  # (full)
                        fast = _set(backend, exec_, records, batch, pending)
                    continue
                fast = False
                _set(backend, exec_, records, batch, pending)  # (the nodes before this one first)
        backend.graph_update(exec_, handle, launch)
        records[i] = moved
    if pending:
        _set(backend, exec_, records, batch, pending)


def _set(backend: Any, exec_: Any, records: list[Any], batch: Any, pending: list[Any]) -> bool:
    """Set the nodes of the C part's batch, each record replaced once its node is; whether all were.

    ``pending`` holds each node's index in ``records`` followed by its new
    record. From a node the driver refused on, the backend sets them (it
    raises the driver's error where the driver refuses again).
    """
    done = cg_nodes_set(batch)
    for k in range(0, len(pending), 2):
        i, moved = pending[k], pending[k + 1]
        if k // 2 >= done:
            backend.graph_update(exec_, cg_item(moved, _HANDLE), cg_item(moved, _PATCH)[1])
        records[i] = moved
    refused = done < len(pending) // 2
    pending.clear()
    return not refused


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
    if not has_unrecorded(records, _node_count(graph)):
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
        count = graph._count = graph.device.backend.graph_node_count(graph._res.graph)
    return count  # type: ignore[no-any-return]


_Range = tuple[int, int, int, bool]  # memory [lo, hi), how far it moves, whether its users count


class _Unclear(Exception):
    """Why a node argument's new address cannot be known (an UpdateError once the node is)."""


def _span(a: Any) -> tuple[int, int]:
    """The memory ``[lo, hi)`` an array (or a recorded view) covers."""
    start, end = _extent(a.shape, a.strides, a.dtype.itemsize)
    return a.ptr + start, a.ptr + end


def _shift(ranges: list[_Range], lo: int, hi: int) -> tuple[int, bool] | None:
    """How far an argument that reads ``[lo, hi)`` moves, and whether a counted range holds it.

    None when no range touches it. An argument is read through an array that
    holds all of it (a view lies inside its base), so ranges that hold only a
    part of it are not its array; when none holds it all but a moving one
    overlaps it, or the ranges that hold it move differently, which array it
    is read through cannot be told (:class:`_Unclear`).
    """
    hi = max(hi, lo + 1)  # an empty view, a raw address: the byte it points at
    inside = [(d, counted) for a, b, d, counted in ranges if a <= lo and hi <= b]
    if not inside:
        if any(d and a < hi and lo < b for a, b, d, _ in ranges):
            raise _Unclear("reads memory of which only a part lies in the memory being moved")
        return None
    delta = inside[0][0]
    if any(d != delta for d, _ in inside):
        raise _Unclear(
            "reads memory that several of the arrays share and that they move differently (or "
            "one of them not at all), so which array the node reads cannot be told"
        )
    return delta, any(counted for _, counted in inside)


def _moved(r: Any, ranges: list[_Range]) -> tuple[bool, Any]:
    """Whether record ``r``'s node uses a counted range, and the record with its arguments moved.

    The record is None when no argument moves. :class:`_Unclear` for an
    argument whose move cannot be known, or one that moves in a node that
    cannot be changed node by node.
    """
    if r.kind == "kernel" and r.patch is not None:
        kernel, launch = r.patch
        fn, grid, block, shared_mem, values, views = launch
        used, moved = False, False
        values2, views2 = list(values), list(views)
        for j, (value, view, p) in enumerate(zip(values, views, kernel.params)):
            raw = p.pointer and type(value) is int
            if view is not None:
                hit = _shift(ranges, *_span(view))
            elif raw:
                hit = _shift(ranges, value, value + 1)
            else:
                continue
            if hit is not None:
                delta, counted = hit
                used |= counted
                if delta:
                    moved = True
                    if raw:
                        values2[j] = value + delta
                    if view is not None:
                        views2[j] = view._replace(ptr=view.ptr + delta)
        if not moved:
            return used, None
        launch = cg_tuple6(KernelLaunch, fn, grid, block, shared_mem, tuple(values2), tuple(views2))
        return used, cg_tuple6(type(r), r[0], r[1], r[2], r[3], (kernel, launch), r[5])  # patch replaced
    if isinstance(r.patch, Copy):  # a device-to-device copy (its source view may be unknown)
        copy = r.patch
        hits = [_shift(ranges, a, a + copy.nbytes) for a in (copy.src, copy.dst)]
        used = any(h is not None and h[1] for h in hits)
        src_by, dst_by = (0 if h is None else h[0] for h in hits)
        if not src_by and not dst_by:
            return used, None
        views = tuple(
            v if v is None else v._replace(ptr=v.ptr + d) for v, d in zip(r.views, (src_by, dst_by))
        )
        return used, r._replace(
            patch=copy._replace(src=copy.src + src_by, dst=copy.dst + dst_by), views=views
        )
    used = False
    for v in r.views:
        hit = None if v is None else _shift(ranges, *_span(v))
        if hit is not None:
            used |= hit[1]
            if hit[0]:
                raise _Unclear(
                    "uses the memory, and only kernel and device-copy arguments can be changed node by node"
                )
    return used, None


def _unmoved(lo: int, hi: int, moves: list[tuple[int, int, int]]) -> list[tuple[int, int]]:
    """The parts of ``[lo, hi)`` that no move took away from their captured addresses."""
    rest = [(lo, hi)]
    for a, b, _ in moves:
        rest = [piece for x, y in rest for piece in ((x, min(y, a)), (max(x, b), y)) if piece[0] < piece[1]]
    return rest


def _captured(moves: list[tuple[int, int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    """The captured addresses (what other libraries' nodes hold) of the memory now at ``[lo, hi)``."""
    now = [(max(a + d, lo) - d, min(b + d, hi) - d) for a, b, d in moves if a + d < hi and lo < b + d]
    return now + _unmoved(lo, hi, moves)


def _compose(
    moves: list[tuple[int, int, int]], moving: list[tuple[int, int, int]]
) -> list[tuple[int, int, int]]:
    """Moves from the captured addresses, after moving each ``(lo, hi, delta)`` of ``moving`` at once."""
    out = []
    for a, b, d in moves:  # memory moved before: cut where ``moving`` starts and ends
        x, y = a + d, b + d
        cuts = sorted({x, y, *(c for lo, hi, _ in moving for c in (lo, hi) if x < c < y)})
        for p, q in itertools.pairwise(cuts):
            by = next((delta for lo, hi, delta in moving if lo <= p and q <= hi), 0)
            out.append((p - d, q - d, d + by))
    for lo, hi, delta in moving:  # memory at its captured address
        out += [(x, y, delta) for x, y in _unmoved(lo, hi, moves)]
    return [m for m in out if m[2]]  # (moved back where it was captured: as if never moved)


def repoint(
    graph: Any, exec_: Any, pairs: Sequence[tuple[Any, Any]], keep: Sequence[Any] = (), required: bool = True
) -> int:
    """See :meth:`cudagraphs.Graph.repoint`; several ``(old, new)`` pairs move at once.

    Every node's new arguments are found from the graph as it is before the
    call, so pairs may exchange memory (``(a, b), (b, a)``). ``keep`` are
    arrays whose memory stays (the ones that overlap a pair's old memory are
    looked at): an argument inside a kept array and inside a moved one
    cannot be told to be read through one or the other, and is refused.
    Returns the number of nodes that use a pair's old memory (a pair whose
    ``new`` is ``old``'s memory changes nothing). With ``required``, a
    ValueError if there is none. Nothing is changed when an error is raised.
    """
    ranges: list[_Range] = []
    for old, new in pairs:
        _check_pair("repoint", old, new)
        ranges.append((*_span(old), new.ptr - old.ptr, True))
    moving = [(lo, hi, d) for lo, hi, d, _ in ranges if d]
    for a in keep:
        lo, hi = _span(a)
        if any(x < hi and lo < y for x, y, _ in moving):
            ranges.append((lo, hi, 0, False))
    records = _records(graph)
    used = 0
    changes: list[tuple[int, Any]] = []
    for i, r in enumerate(records):
        try:
            uses, moved = _moved(r, ranges)
        except _Unclear as why:
            where = _index(graph, r.handle)
            raise UpdateError(f"node {where} ({r.kind}) {why}: capture again", where) from None
        used += uses
        if moved is not None:
            changes.append((i, moved))
    _refuse_bodies(graph, lambda r: _moves_any(r, ranges))
    # other libraries' nodes hold the addresses of the capture (see _compose); refuses what it cannot see
    probe = [
        (x, y, 0) for lo, hi, _, counted in ranges if counted for x, y in _captured(graph._moves, lo, hi)
    ]
    others = _unrecorded_users(graph, exec_, records, probe, patch=False) if probe else []
    if others:
        _refuse_shared(graph, exec_, records, ranges)
    if required and not used and not others:
        raise ValueError("repoint: no node of this graph uses that memory")
    backend = graph.device.backend
    moves = _compose(graph._moves, moving)
    if others and moves != graph._moves:
        _unrecorded_users(graph, exec_, records, moves, patch=True)
    graph._moves = moves
    for i, record in changes:
        backend.graph_update(
            exec_, record.handle, record.patch if isinstance(record.patch, Copy) else record.patch[1]
        )
        records[i] = record
    graph._res.keep.extend(new for _, new in pairs)
    if changes or others:
        graph._patched = True
    return used + len(others)


def _moves_any(r: Any, ranges: list[_Range]) -> bool:
    """Whether a repoint would change record ``r``'s node (or cannot tell)."""
    try:
        return _moved(r, ranges)[1] is not None
    except _Unclear:
        return True


def _refuse_shared(graph: Any, exec_: Any, records: list[Any], ranges: list[_Range]) -> None:
    """UpdateError if another library's node reads memory that two ranges move differently.

    Only its raw addresses are seen, not which array it reads through.
    """
    for i, (a, b, d, _) in enumerate(ranges):
        for x, y, e, _ in ranges[i + 1 :]:
            if d != e and a < y and x < b:
                probe = [(p, q, 0) for p, q in _captured(graph._moves, max(a, x), min(b, y))]
                hit = _unrecorded_users(graph, exec_, records, probe, patch=False)
                if hit:
                    raise UpdateError(
                        f"node {hit[0]} (another library's kernel, not recorded by cudagraphs) reads "
                        "memory that several of the arrays share and that they move differently: "
                        "capture again",
                        hit[0],
                    )


def point_copy(graph: Any, exec_: Any, index: int, src: int | None) -> None:
    """Make the device-copy node of record ``index`` copy from ``src`` (None: switch it off).

    For a graphed call's input copy (see :mod:`cudagraphs._graphed_callable`): the node
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
        if spec is None:
            raise TypeError(
                f"set_arg: parameter {p.name!r} of node {index} was recorded with an array "
                f"(shape {recorded.shape}, {recorded.dtype}); pass a DeviceArray of this "
                f"device like it, got {type(value).__name__}"
            )
        if value.device is not graph.device:
            d, g = value.device, graph.device
            raise ValueError(
                f"set_arg: parameter {p.name!r} of node {index}: the array is on "
                f"{d.backend.name} device {d.index}, the graph on {g.backend.name} device "
                f"{g.index}; pass an array of the graph's device"
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
        raw, view = kernel._convert[j].convert(value, graph.device), None
    values = (*launch.values[:j], raw, *launch.values[j + 1 :])
    views = (*launch.views[:j], view, *launch.views[j + 1 :])
    new_launch = KernelLaunch(launch.function, launch.grid, launch.block, launch.shared_mem, values, views)
    backend.graph_update(exec_, handle, new_launch)
    graph._records[at] = r._replace(patch=(kernel, new_launch))
    if view is not None or getattr(value, "__cuda_array_interface__", None) is not None:
        graph._res.keep.append(value)
    graph._patched = True
