"""Whole-graph update: a ready graph takes over the parameters of a topology-identical one.

:func:`update` compares the two graphs' nodes (type and kernel of each),
asks the driver to update the executable, finds where the graphs differ
when the driver refuses without saying, and moves what the source's
parameters use into the executable's
:class:`~cudagraphs._executable.Resources`, releasing what the previous
parameters used at the next safe point. :meth:`cudagraphs.Graph.update`
checks its arguments and moves the graphs' states around this.

This module is compiled by Cython from this source where the package is
built (``_update.pxd`` types the comparison of a thousand nodes' records:
docs/architecture.md, "The compiled part"), and runs as plain Python where
not.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Protocol

try:
    import cython
except ImportError:  # (run as Python where Cython is not installed: nothing is compiled)
    cython = SimpleNamespace(compiled=False)

from . import _recording
from ._errors import UpdateError
from ._executable import Resources, release_resources
from ._recording import NodeRecord

if not cython.compiled:  # (compiled, _capi.pxd's C function)
    from ._capi import cg_first_difference, cg_first_not_none

if TYPE_CHECKING:
    import weakref

    from ._device import Device

__all__ = ["Updatable", "update"]

# where a NodeRecord's driver handle and (node type, kernel name) are (compiled: C globals, read
# by position, a C call where a field's name is an attribute lookup)
_HANDLE, _KIND, _NAME = (NodeRecord._fields.index(f) for f in ("handle", "kind", "name"))


class Updatable(Protocol):
    """What :func:`update` reads of a graph (:class:`cudagraphs.Graph`)."""

    @property
    def device(self) -> Device: ...
    @property
    def edges(self) -> list[tuple[int, int]]: ...
    @property
    def _records(self) -> list[NodeRecord]: ...
    @property
    def _traced(self) -> list[tuple[str, str]] | None: ...
    @property
    def _sig(self) -> int | None: ...
    @property
    def _res(self) -> Resources | None: ...
    @property
    def _finalizer(self) -> weakref.finalize[Any, Any] | None: ...
    def _trace(self) -> list[tuple[str, str]]: ...
    def _signature(self) -> list[tuple[str, str]]: ...


def _first_difference(mine: list[Any], theirs: list[Any], kind: int, name: int) -> int:
    """The first index where two graphs' nodes differ, or -1; a list that ends first differs there.

    Each item describes a node: its items ``kind`` and ``name`` are the
    node's type and kernel name (a trace's pairs, a record's fields).
    (Compiled: a C loop over a thousand records without a reference taken.)
    """
    return cg_first_difference(mine, theirs, kind, name)


def _difference(mine: list[tuple[str, str]], theirs: list[tuple[str, str]]) -> tuple[str, int] | None:
    """Why two traces of (node type, kernel name) are not topology-identical, and where."""
    i = _first_difference(mine, theirs, 0, 1)
    if i < 0:
        return None
    if i == len(mine) or i == len(theirs):
        return (f"the topology changed: this graph recorded {len(mine)} nodes, the source {len(theirs)}"), i
    (kind_a, name_a), (kind_b, name_b) = mine[i], theirs[i]
    if kind_a != kind_b:
        return f"node {i} is a {kind_a} node in this graph and a {kind_b} node in the source", i
    return f"node {i} runs kernel {name_a!r} in this graph and {name_b!r} in the source", i


def _has_handles(records: list[Any]) -> bool:
    """Whether a record carries a driver handle."""
    return cg_first_not_none(records, _HANDLE) >= 0


def _edge_difference(mine: list[tuple[int, int]], theirs: list[tuple[int, int]]) -> tuple[str, int] | None:
    """The first node whose dependencies differ between two graphs' edges, and how."""
    if set(mine) == set(theirs):
        return None
    i = min(b for _, b in set(mine) ^ set(theirs))
    before = sorted(a for a, b in mine if b == i)
    after = sorted(a for a, b in theirs if b == i)
    return (
        f"the topology changed: node {i} depends on nodes {before} in this graph and on {after} in the source"
    ), i


def update(graph: Updatable, exec_: Any, source: Updatable) -> list[NodeRecord]:
    """Give ``graph``'s executable ``exec_`` the parameters of ``source``; its records now.

    The caller checked both graphs (ready, a ready or captured source, the
    same device) and makes the returned records ``graph``'s and ``source``
    consumed. Nothing is changed where this raises.

    Raises
    ------
    UpdateError
        With the reason and the offending node index when the graphs differ
        (node count, node type, kernel, dependencies) or the driver refuses.
    """
    records = source._records
    # two captures that recorded the same kinds and names (the same objects, in order) are not
    # read at all (their signatures: see Recording.signature); else the records compared where
    # they are (a thousand of them in microseconds, no trace built)
    sig = graph._sig
    same = sig is not None and sig == source._sig and len(graph._records) == len(records)
    if not same and _first_difference(graph._records, records, _KIND, _NAME) >= 0:
        why = _difference(graph._trace(), source._trace())
        if why is not None:
            raise UpdateError(*why)
    backend = graph.device.backend
    src = source._res
    assert src is not None
    assert graph._res is not None
    try:
        backend.graph_update(exec_, src.graph)
    except UpdateError as err:
        if err.node is None:  # the driver said no without saying where: find it
            found = _difference(graph._signature(), source._signature()) or _edge_difference(
                graph.edges, source.edges
            )
            if found is not None:
                raise UpdateError(*found) from err
            raise UpdateError(
                f"{err.reason}; the graphs have the same nodes and edges, so a node's "
                "parameters changed in a way it cannot update in place (e.g. a copy "
                "between other kinds of memory: host-to-device become device-to-host): "
                "capture the graph again"
            ) from err
        raise
    # the executable runs the source's parameters now: take over what they use,
    # and release what the previous parameters used
    source._finalizer.detach()  # type: ignore[union-attr]
    res = graph._res
    old = Resources(graph.device, res.params_graph, res.keep, res.pools, list(res.streams))
    # the previous parameters' records go with them (freeing a thousand records is
    # a tenth of a millisecond: at the safe point, not here)
    old.keep.append((graph._records, graph._traced))
    res.params_graph, res.keep, res.pools = src.graph, src.keep, src.pools
    if src.exec is not None:
        _recording.release(graph.device, backend.destroy, src.exec)
    # freed at the next safe point, after the replays queued so far: update()
    # itself never waits for the GPU
    _recording.later(graph.device, release_resources, old)
    res.streams.extend(s for s in src.streams if s not in res.streams)
    # the same nodes, with the source's values; handles are the instantiated
    # graph's, found on first use (records of a finished capture carry none)
    # (a source that was rebound or repointed carries handles of its own graph's
    # nodes: they are not this executable's, so they are found again on first use)
    if _has_handles(records):
        records = [r if r.handle is None else r._replace(handle=None) for r in records]
    return records
