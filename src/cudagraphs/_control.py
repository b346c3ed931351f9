"""Device-side control flow in captures: conditions, and bodies of conditional nodes.

A :class:`Condition` is a value the graph tests when a conditional node runs;
kernels set it on the device (``cg.ops.set_condition``). A conditional node
(while, if, if/else, switch) is recorded through the one submission path;
each of its bodies is captured by a ``with`` block (:class:`Body`), on a
stream of its own that becomes this thread's current stream for the block
when the graph's stream was, so ops that name no stream land in the body.
Nothing is swapped for other threads.

A while loop runs until its condition is cleared; one whose body never
clears it spins forever on the device. A while body that records no work
(never captured, or its work went elsewhere) could never clear it: it is
refused with :class:`~cudagraphs.CaptureError`. ``max_iterations`` bounds
a loop: a guard
kernel at the end of the body counts the runs (in a counter zeroed before
the loop at every launch) and ends the loop at the cap; ``body.iterations``
is that counter.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from ._array import DeviceArray, zeros
from ._builtin_kernels import condition_kernel
from ._errors import CudaError
from ._recording import Recording, Work, submit, user_line

__all__ = ["MAX_SWITCH", "Body", "Condition", "add_conditional", "new_condition"]

MAX_SWITCH = 4096  # bodies of a switch node (each is a graph: n = 2**70 would never end)


class Condition:
    """A graph condition: the value a conditional node tests when it runs.

    Made by ``g.condition(default)`` inside a capture; set on the device with
    :func:`cudagraphs.ops.set_condition` (or ``cudaGraphSetConditional`` in a
    kernel of yours that takes ``handle`` as an ``unsigned long long``). It
    takes ``default`` at the start of every launch of the graph.
    """

    __slots__ = ("default", "graph", "handle")

    def __init__(self, handle: int, default: int, graph: Any) -> None:
        self.handle = handle
        self.default = default
        self.graph = graph

    def __repr__(self) -> str:
        return f"<cudagraphs.Condition 0x{self.handle:x} default={self.default}>"


def new_condition(rec: Recording, graph: Any, default: int) -> Condition:
    """A condition of the graph ``rec`` is capturing."""
    if type(default) is not int or not 0 <= default <= 0xFFFFFFFF:
        raise ValueError(f"default must be an int in 0..2**32-1, got {default!r}")
    backend = rec.device.backend
    handle = int(
        submit(rec.streams[-1], Work("", lambda raw, _: backend.capture_node(raw, "condition", default)))
    )
    rec.conditions[handle] = user_line()
    return Condition(handle, default, graph)


class Body:
    """The body of a conditional node, captured by a ``with`` block.

    Inside the block, work queued on ``body.stream`` lands in the body; when
    the graph's stream is this thread's current stream (or ``redirect`` is
    set, as a :class:`~cudagraphs.GraphBuilder` sets it), ``body.stream`` is
    current inside the block, so ops that name no stream land there too.

    Attributes
    ----------
    stream : Stream or None
        The body's stream, while the block runs.
    redirect : bool
        Make ``body.stream`` current inside the block even when the graph's
        stream is not current (a builder's stream never is).
    iterations : DeviceArray or None
        For a while loop with ``max_iterations``: a one-element int64 array
        holding how many times the body ran in the last launch.
    """

    def __init__(
        self,
        graph: Any,
        rec: Recording,
        handle: Any,
        label: str,
        guard: tuple[Condition, DeviceArray, int] | None = None,
        loop: bool = False,
    ) -> None:
        self.graph, self._rec, self._handle, self.label = graph, rec, handle, label
        self.stream: Any = None
        self.iterations = guard[1] if guard is not None else None
        self.redirect = False
        self._guard = guard
        self._loop = loop  # a while body: one that records nothing would spin forever
        self._current = False
        self._used = False
        if loop:
            rec.loops[self] = f"{label} made at {user_line()}"

    def __enter__(self) -> Body:
        if self._used:
            raise RuntimeError(f"{self.label} was already captured; each body is captured once")
        rec = self._rec
        device = rec.device
        parent = rec.streams[-1]
        stream = device.spare_stream()
        try:
            rec.enter_body(stream, self._handle)
        except BaseException:
            device.return_spare_stream(stream)
            raise
        self._used = True
        self.stream = stream
        if self.redirect or device.current_stream() is parent:
            stream.__enter__()
            self._current = True
        return self

    def _recorded_nothing(self, failing: bool) -> bool:
        """Whether the body's capture holds no node yet (no node for later work to depend on)."""
        try:
            return not self._rec.device.backend.capture_info(self.stream._raw)[1]
        except CudaError:
            if failing:  # (the user's error is the one to see)
                return False
            raise

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: object) -> Literal[False]:
        rec, stream = self._rec, self.stream
        empty = False
        try:
            if self._loop:
                empty = self._recorded_nothing(exc_type is not None)
            if exc_type is None and self._guard is not None and not empty:
                cond, counter, cap = self._guard
                kernel = condition_kernel("cg_loop_guard", np.dtype("int64"))
                kernel.launch(1, 1, cond.handle, counter, cap, stream=stream)
            try:
                rec.exit_body(stream)
            except Exception:
                if exc_type is None:
                    raise
        finally:
            if self._current:
                stream.__exit__(None, None, None)
                self._current = False
            rec.device.return_spare_stream(stream)
        if empty and exc_type is None:  # (else the user's error wins; the capture's end refuses it)
            rec.fail(
                f"{self.label} recorded no work, so nothing in it could clear the loop's condition "
                "and the loop would spin forever on the device; queue the body's work on "
                "body.stream, or with no stream= inside the `with` block"
            )
        if self._loop and not empty:
            del rec.loops[self]
        return False


def add_conditional(
    rec: Recording, graph: Any, kind: str, cond: Condition, size: int, max_iterations: int | None = None
) -> list[Body]:
    """Record a conditional node at the current point of the capture; return its bodies."""
    if not isinstance(cond, Condition) or cond.graph is not graph:
        raise TypeError(f"{kind} needs a Condition made by this graph's condition(), got {cond!r}")
    if cond.handle not in rec.conditions:
        raise ValueError(
            f"{cond!r} already drives a conditional node; each condition drives "
            "one node: make another with g.condition()"
        )
    if kind == "switch" and size > MAX_SWITCH:
        raise ValueError(f"a switch takes at most {MAX_SWITCH} bodies, got {size}")
    guard = None
    stream = rec.streams[-1]
    if max_iterations is not None:
        if type(max_iterations) is not int or max_iterations < 1:
            raise ValueError(f"max_iterations must be a positive int or None, got {max_iterations!r}")
        counter = zeros(1, "int64", device=rec.device, stream=stream)  # zeroed at every launch
        guard = (cond, counter, max_iterations)
    backend = rec.device.backend
    made: list[list[Any]] = []

    def issue(raw: Any, _: Any) -> Any:
        node, bodies = backend.capture_node(raw, "conditional", kind, size, cond.handle)
        made.append(bodies)
        return node

    submit(stream, Work("conditional", issue, keep=(cond,), name=kind))
    del rec.conditions[cond.handle]
    return [
        Body(graph, rec, b, f"the {kind} body {i}", guard, kind == "while") for i, b in enumerate(made[0])
    ]
