"""A graph's executable and what it owns: :class:`Resources`, their release, the launch.

A graph owns its driver graph and executable graph, the pinned buffers that
hold host data staged during capture, its pool, and references to every
array, scalar, host slot and callback its work uses, so replaying never
touches freed memory. All of that lives in a :class:`Resources` holder that
the graph's finalizer owns (never the Graph itself); :func:`release_resources`
is the one function that frees it, after waiting for the graph's replays, for
a closed graph, a collected one, a failed capture and the parameters an
update replaced alike. :func:`ordered_launch` is the launch of an executable
with work on other devices too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import _recording
from ._device import Device, Event, Stream
from ._errors import CaptureError

if TYPE_CHECKING:
    from ._pool import GraphPool

__all__ = ["Resources", "ordered_launch", "release_resources"]


class Resources:
    """What a graph owns (held by its finalizer, never referencing the Graph).

    Attributes
    ----------
    graph : handle or None
        The driver graph the executable was instantiated from: node-level
        updates name its nodes.
    params_graph : handle or None
        After an update, the source's driver graph, whose parameters the
        executable now runs.
    """

    __slots__ = ("device", "exec", "graph", "keep", "params_graph", "pools", "streams")

    def __init__(
        self, device: Device, graph: Any, keep: list[Any], pools: list[GraphPool], streams: list[Stream]
    ) -> None:
        self.device = device
        self.exec: Any = None
        self.graph = graph
        self.params_graph: Any = None
        self.keep = keep
        self.pools = pools
        self.streams = streams


def release_resources(res: Resources) -> None:
    """Free a graph's resources after the work queued on its replay streams."""
    backend = res.device.backend
    with _recording.holding(res.streams) as live:  # (another thread may close one meanwhile)
        for s in live:
            if s._recording is None:
                backend.synchronize(s._raw)
    if res.exec is not None:
        backend.destroy(res.exec)
        res.exec = None
    for g in (res.graph, res.params_graph):
        if g is not None:
            backend.destroy(g)
    res.graph = res.params_graph = None
    res.keep.clear()
    pools, res.pools = res.pools, []
    for pool in pools:  # (the streams were synchronized: only each pool's own device's count)
        pool.drop([s for s in res.streams if s.device is pool.device])


def ordered_launch(device: Device, others: list[Device]) -> Callable[..., None]:
    """A launch of a graph that records work on ``others`` too.

    Its work on another device starts after the work queued so far on that
    device's current stream, and work queued there later waits for it, as
    if the graph's nodes of that device were queued on that stream (what
    :func:`cudagraphs.ops.copy` between devices does too).
    """
    backend = device.backend
    done = Event(device)  # (events are reused: a wait takes the state the record left)
    before = [(d, Event(d)) for d in others]

    def launch(exec_: Any, raw: Any, upload: bool = False) -> None:
        if upload:
            backend.graph_launch(exec_, raw, upload=True)
            return
        current = [d.current_stream() for d, _ in before]
        for (d, ev), s in zip(before, current):
            if s._recording is not None:
                raise CaptureError(
                    f"a graph with work on {d} replayed while {d}'s current stream is being "
                    "captured: replay it inside that capture's stream instead"
                )
            backend.event_record(ev._raw, s._raw)
            backend.stream_wait_event(raw, ev._raw)
        backend.graph_launch(exec_, raw)
        backend.event_record(done._raw, raw)
        for s in current:
            backend.stream_wait_event(s._raw, done._raw)

    return launch
