"""The conditional handles of one simulated device: their values and who owns them.

A handle is made in a graph (``cudaGraphConditionalHandleCreate``) with a
default value that every launch of an executable sets again; kernels' host
code sets it as they run (``cudaGraphSetConditional``), and conditional nodes
read it. Its value lives while a graph or executable that holds it does.
Each :class:`~.backend.SimBackend` has its own table, so two simulators never
share a handle's value.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

__all__ = ["Conditions"]


class Conditions:
    """The values of the conditional handles of live graphs, and how many own each.

    It is the :class:`~cudagraphs.backends.base.HostContext` the simulator
    hands to kernels' host code. Used only under the backend's lock (work,
    host code included, runs holding it), so it needs no lock of its own.
    """

    __slots__ = ("_next", "_refs", "values")

    def __init__(self) -> None:
        self.values: dict[int, int] = {}  # handle -> current value
        self._refs: dict[int, int] = {}  # handle -> graphs/executables that own it
        self._next = itertools.count(1)

    def set_conditional(self, handle: int, value: int) -> None:
        """``cudaGraphSetConditional`` of the simulated device (for kernels' host code)."""
        self.values[int(handle)] = int(value) & 0xFFFFFFFF

    def get(self, handle: int) -> int:
        """The value of ``handle`` (0 for one no graph holds)."""
        return self.values.get(handle, 0)

    def create(self, default: int) -> int:
        """A new handle, set to ``default``, owned once (by the graph that makes it)."""
        handle = next(self._next)
        self.own([(handle, default)])
        self.values[handle] = default
        return handle

    def start(self, conditions: Sequence[tuple[int, int]]) -> None:
        """An execution begins: each of ``conditions`` (handle, default) takes its default."""
        for handle, default in conditions:
            self.values[handle] = default

    def own(self, conditions: Sequence[tuple[int, int]]) -> None:
        """A graph or executable holds ``conditions`` (handle, default)."""
        for handle, _ in conditions:
            self._refs[handle] = self._refs.get(handle, 0) + 1

    def disown(self, conditions: Sequence[tuple[int, int]]) -> None:
        """A holder of ``conditions`` is gone: a handle no one holds is forgotten."""
        for handle, _ in conditions:
            left = self._refs.get(handle, 1) - 1
            if left <= 0:
                self._refs.pop(handle, None)
                self.values.pop(handle, None)
            else:
                self._refs[handle] = left
