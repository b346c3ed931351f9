"""Running a graph on the simulated device: its nodes in dependency order.

One execution sets the graph's conditional handles to their defaults, then
runs each node once its dependencies ran; child graphs and the bodies of
conditional nodes run the same way. A node whose work waits at a
:class:`~cudagraphs.backends.base.Rendezvous` lets the nodes that do not
depend on it run first; when none can, the execution waits with it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import GeneratorType
from typing import Any

from ..base import Rendezvous, Waiting
from .conditions import Conditions
from .graph import SimGraph, SimNode

__all__ = ["run_nodes"]


class _AnyOf(Rendezvous):
    """Done when any of several rendezvous is (a graph whose branches all stopped)."""

    def __init__(self, parts: list[Rendezvous]) -> None:
        self.parts = parts

    @property
    def done(self) -> bool:  # type: ignore[override]
        return any(rv.done for rv in self.parts)

    @property
    def patience(self) -> float | None:  # type: ignore[override]
        times = [rv.patience for rv in self.parts if rv.patience is not None]
        return max(times) if times else None

    def poll(self) -> bool:
        polled = [rv.poll() for rv in self.parts]  # (each takes in what came)
        return any(polled)

    def describe(self) -> str:
        return " or ".join(rv.describe() for rv in self.parts)

    def stuck(self) -> BaseException:
        return self.parts[0].stuck()


def run_nodes(
    nodes: Sequence[SimNode],
    works: dict[int, Callable[[], Any]],
    conditions: Sequence[tuple[int, int]],
    table: Conditions,
) -> Waiting:
    """One execution: conditions take their defaults, then the nodes run in order.

    A node whose work waits on a :class:`Rendezvous` lets the nodes that do
    not depend on it run first (a graph with one collective node per device
    completes it by itself); when none can, the execution waits with it.
    """
    table.start(conditions)
    here = {id(n) for n in nodes}
    finished: set[int] = set()
    stopped: dict[int, tuple[Waiting, Rendezvous]] = {}  # node index -> its work, where it stopped
    pending = list(range(len(nodes)))
    while pending:
        rest: list[int] = []
        progressed = False
        for i in pending:
            node = nodes[i]
            if any(id(d) in here and id(d) not in finished for d in node.deps):
                rest.append(i)
                continue
            entry = stopped.pop(i, None)
            if entry is not None and not entry[1].done:
                stopped[i] = entry  # still waiting: not resumed
                rest.append(i)
                continue
            run = entry[0] if entry is not None else _run_node(node, works.get(i, node.work), table)
            if run is not None:
                waiting = next((rv for rv in run if not rv.done), None)
                if waiting is not None:
                    stopped[i] = (run, waiting)
                    rest.append(i)
                    continue
            finished.add(id(node))
            progressed = True
        if rest and not progressed:  # nothing here can run until one of them is done
            parts = [rv for _, rv in stopped.values()]
            yield parts[0] if len(parts) == 1 else _AnyOf(parts)
        pending = rest


def _run_node(node: SimNode, work: Callable[[], Any] | None, table: Conditions) -> Waiting | None:
    if node.kind == "conditional":
        return _run_conditional(node, table)
    if node.kind == "child":
        child = node.bodies[0]
        return run_nodes(child.nodes, {}, child.conditions, table)
    if work is not None:
        out = work()
        if isinstance(out, GeneratorType):
            return out
    return None


def _run_conditional(node: SimNode, table: Conditions) -> Waiting:
    assert node.cond is not None
    kind, size, handle = node.cond
    bodies = node.bodies

    def run(body: SimGraph) -> Waiting:
        return run_nodes(body.nodes, {}, (), table)

    if kind == "while":
        while table.get(handle):
            yield from run(bodies[0])
    elif kind == "if":
        if table.get(handle):
            yield from run(bodies[0])
        elif size == 2:
            yield from run(bodies[1])
    else:
        index = table.get(handle)
        if 0 <= index < size:  # out of range: no branch runs
            yield from run(bodies[index])
