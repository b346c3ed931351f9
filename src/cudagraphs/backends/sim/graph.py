"""The graph DAG of the simulated device: nodes, graphs and executable graphs.

A :class:`SimGraph` is what a capture (or explicit node calls) records: its
nodes in creation order, which is a valid order to run them in, each with
the nodes it depends on. A :class:`SimExec` is an instantiated graph with
its own node list, which node and whole-graph updates patch; the driver's
conditions on such updates are :func:`updatable`'s. Running them is
:mod:`.executor`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ..._errors import UpdateError
from ..base import KernelLaunch, move_words, words
from .conditions import Conditions

__all__ = [
    "PLAIN_NODES",
    "SimExec",
    "SimGraph",
    "SimNode",
    "addresses",
    "ancestors",
    "condition_handles",
    "edges",
    "nothing",
    "repointed",
    "updatable",
]

PLAIN_NODES = frozenset(("empty", "host", "event_record", "event_wait", "mem_alloc", "mem_free"))
"""Node kinds whose parameters hold no device address (``graph_repoint`` skips them)."""


class Origin(Protocol):
    """The stream whose capture records a graph (a :class:`~.streams.SimStream`)."""

    mode: str
    thread: int


class SimNode:
    """One node; immutable once recorded (executables patch copies of the work)."""

    __slots__ = ("bodies", "call", "cond", "deps", "kind", "label", "params", "work")

    def __init__(self, kind: str, label: str, work: Callable[[], Any] | None, deps: list[SimNode]) -> None:
        self.kind, self.label, self.work, self.deps = kind, label, work, deps
        self.call = ""  # the driver call that recorded it (a copy's: which memory it joins)
        # what the driver keeps of the node: a KernelLaunch, or the addresses (first, last)
        # a copy or memset touches
        self.params: Any = None
        self.bodies: tuple[SimGraph, ...] = ()
        self.cond: tuple[str, int, int] | None = None  # (kind, size, handle)

    def __int__(self) -> int:
        return id(self)

    def __index__(self) -> int:
        return id(self)


class SimGraph:
    """A recorded graph: nodes in creation order, a valid order to run them in."""

    __slots__ = ("alive", "allocations", "conditions", "freed", "nodes", "origin")

    def __init__(self) -> None:
        self.nodes: list[SimNode] = []
        self.origin: Origin | None = None  # the stream whose capture records it (while it does)
        self.allocations: list[int] = []  # graph-owned memory (mem_alloc nodes)
        self.freed: list[int] = []  # those a mem_free node of the graph frees
        self.conditions: list[tuple[int, int]] = []  # (handle, default) created in it
        self.alive = True

    def copy(self, table: Conditions) -> SimGraph:
        """What the driver does to a graph added as a child node: a copy (owning its handles)."""
        other = SimGraph()
        other.nodes = list(self.nodes)
        other.conditions = list(self.conditions)
        table.own(other.conditions)
        return other


def ancestors(nodes: Sequence[SimNode]) -> set[int]:
    """The ids of ``nodes`` and of every node they depend on."""
    seen: set[int] = set()
    todo = list(nodes)
    while todo:
        node = todo.pop()
        if id(node) not in seen:
            seen.add(id(node))
            todo.extend(node.deps)
    return seen


def edges(nodes: Sequence[SimNode]) -> set[tuple[int, int]]:
    """The dependencies among ``nodes`` as (from, to) indices."""
    index = {id(n): i for i, n in enumerate(nodes)}
    return {(index[id(d)], i) for i, n in enumerate(nodes) for d in n.deps if id(d) in index}


def updatable(old: Sequence[SimNode], new: Sequence[SimNode]) -> bool:
    """Whether cuGraphExecUpdate takes the nodes ``new`` for an executable of ``old``.

    The driver's conditions on the topology: the same nodes (types, in
    order) with the same edges, child and conditional bodies alike, and
    copies between the same kinds of memory (a host-to-device copy cannot
    become a device-to-host one).
    """
    if len(old) != len(new) or edges(old) != edges(new):
        return False
    for a, b in zip(old, new):
        if a.kind != b.kind or (a.cond or ())[:2] != (b.cond or ())[:2]:  # (kind, bodies)
            return False
        if a.kind == "memcpy" and a.call != b.call:
            return False
        if len(a.bodies) != len(b.bodies) or not all(
            updatable(x.nodes, y.nodes) for x, y in zip(a.bodies, b.bodies)
        ):
            return False
    return True


class SimExec:
    """An instantiated graph: its own node list, patched by node updates."""

    __slots__ = (
        "alive",
        "auto_free",
        "conditions",
        "nodes",
        "off",
        "outstanding",
        "position",
        "unfreed",
        "works",
    )

    def __init__(self, graph: SimGraph, table: Conditions, auto_free: bool = False) -> None:
        self.nodes = list(graph.nodes)
        # graph memory no node of the graph frees: it outlives a launch, and a
        # relaunch needs it freed first (by the user, or by auto_free)
        self.unfreed = [p for p in graph.allocations if p not in graph.freed]
        self.auto_free = auto_free
        self.outstanding = False
        self.position = {id(n): i for i, n in enumerate(graph.nodes)}  # instantiated-from nodes
        self.works: dict[int, Callable[[], None]] = {}
        self.off: dict[int, Callable[[], None] | None] = {}  # switched-off nodes: their work
        self.conditions = list(graph.conditions)
        table.own(self.conditions)
        self.alive = True

    def __int__(self) -> int:
        """A handle's address, as a driver handle converts (what a fast launch would be given)."""
        return id(self)

    def take(self, graph: SimGraph, table: Conditions) -> None:
        """A whole-graph update from ``graph`` (already found updatable): its nodes and handles."""
        self.nodes = list(graph.nodes)
        self.works.clear()
        for i in self.off:  # (switched-off nodes stay off, with the new graph's work)
            self.off[i] = None
            self.works[i] = nothing
        table.own(graph.conditions)
        table.disown(self.conditions)
        self.conditions = list(graph.conditions)

    def switch(self, i: int, enabled: bool) -> None:
        """Switch node ``i`` on or off (its work kept, for switching it on again)."""
        if not enabled and i not in self.off:
            self.off[i] = self.works.get(i)
            self.works[i] = nothing
        elif enabled and i in self.off:
            work = self.off.pop(i)
            if work is None:
                self.works.pop(i, None)
            else:
                self.works[i] = work


def condition_handles(graph: SimGraph) -> tuple[set[int], set[int]]:
    """(handles made in ``graph`` and its bodies, handles their conditional nodes use)."""
    made = {h for h, _ in graph.conditions}
    used: set[int] = set()
    for node in graph.nodes:
        if node.cond is not None:
            used.add(node.cond[2])
            for body in node.bodies:
                m, u = condition_handles(body)
                made |= m
                used |= u
    return made, used


def nothing() -> None:
    """The work of a switched-off node."""


def addresses(graph: SimGraph, skip: set[int]) -> tuple[list[tuple[int, list[int]]], list[tuple[int, str]]]:
    """What the nodes of ``graph`` not in ``skip`` may address (see ``Backend.graph_addresses``).

    A kernel node's pointer parameters, the 8-byte words of its struct
    parameters, and its arrays' addresses; a copy's or memset's addresses.
    """
    found: list[tuple[int, list[int]]] = []
    unseen: list[tuple[int, str]] = []
    for i, node in enumerate(graph.nodes):
        if id(node) in skip or node.kind in PLAIN_NODES:
            continue
        if node.kind == "kernel" and node.params is None:  # (a library's kernel the simulator runs whole)
            unseen.append((i, "a kernel whose arguments the simulator does not keep"))
        elif node.kind == "kernel":
            launch: KernelLaunch = node.params
            used: list[int] = []
            for value, view, p in zip(launch.values, launch.views, launch.function.params):
                if isinstance(value, bytes):
                    used.extend(words(value))
                elif p.pointer and isinstance(value, int):
                    used.append(value)
                if view is not None:
                    used.append(view.ptr)
            found.append((i, used))
        elif node.kind in ("memcpy", "memset"):
            found.append((i, [int(a) for a in node.params]))
        else:
            unseen.append((i, f"a {node.kind} node, inside which cudagraphs cannot see"))
    return found, unseen


def repointed(
    graph: SimGraph, moves: Sequence[tuple[int, int, int]], skip: set[int]
) -> list[tuple[int, KernelLaunch]]:
    """The kernel nodes of ``graph`` (not in ``skip``) whose parameters use a moved range, moved.

    ``moves`` are ``(lo, hi, delta)`` (see ``Backend.graph_repoint``): each
    result is a node's index and its launch with every address in a moved
    range moved.

    Raises
    ------
    UpdateError
        If a copy or memset uses a moved range, or a node's parameters cannot
        be seen (child graphs, conditional nodes).
    """

    def moved(value: int) -> int | None:
        out = move_words(int(value).to_bytes(8, "little"), moves)
        return None if out is None else int.from_bytes(out, "little")

    changes: list[tuple[int, KernelLaunch]] = []
    for i, node in enumerate(graph.nodes):
        if id(node) in skip or node.kind in PLAIN_NODES:
            continue
        if node.kind == "kernel":
            launch: KernelLaunch = node.params
            values: list[Any] = []
            views: list[Any] = []
            changed = False
            for value, view, p in zip(launch.values, launch.views, launch.function.params):
                new: Any = move_words(value, moves) if isinstance(value, bytes) else None
                if p.pointer and isinstance(value, int):
                    new = moved(value)
                changed |= new is not None
                values.append(value if new is None else new)
                at = None if view is None else moved(view.ptr)
                views.append(view if view is None or at is None else view._replace(ptr=at))
            if changed:
                changes.append((i, launch._replace(values=tuple(values), views=tuple(views))))
        elif node.kind in ("memcpy", "memset"):
            if any(moved(a) is not None for a in node.params):
                raise UpdateError(f"node {i} ({node.kind}) uses the memory: capture again", i)
        else:
            raise UpdateError(
                f"node {i} (a {node.kind} node, inside which cudagraphs cannot see) may use the "
                "memory: capture again",
                i,
            )
    return changes
