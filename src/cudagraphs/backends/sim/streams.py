"""Streams and events of the simulated device, and the scheduler that runs the streams.

Streams are queues: queued work runs only when something forces it (a
synchronize or query of the stream, device or event, a download into
pageable memory, a wait on an event of another stream, which first runs
that stream up to the event, destroying the stream, or more than
``MAX_PENDING`` items pending); a device synchronize runs the streams in an
interleaving drawn from a seed, so a missing wait between two streams gives
wrong results instead of passing by luck. Work that waits at a
:class:`~cudagraphs.backends.base.Rendezvous` stops its stream there while
the others run.
"""

from __future__ import annotations

import collections
import contextlib
import random
import threading
import time
from collections.abc import Callable, Iterator
from types import GeneratorType
from typing import Any

from ..._errors import CudaError
from ..base import CUDA_ERROR_ILLEGAL_ADDRESS, CUDA_ERROR_MISALIGNED_ADDRESS, Rendezvous, Waiting
from .graph import SimGraph, SimNode
from .rules import error

__all__ = ["MAX_PENDING", "Scheduler", "SimEvent", "SimStream"]

MAX_PENDING = 4096  # queued items per stream before the simulated device catches up


class SimStream:
    """A stream: its queue of pending work, and the capture it records into (if any)."""

    __slots__ = (
        "address",
        "alive",
        "capture",
        "current",
        "deps",
        "done",
        "failed",
        "invalidated",
        "issued",
        "mode",
        "ordinal",
        "owned",
        "queue",
        "thread",
        "waiting",
    )

    def __init__(self, address: int, ordinal: int, owned: bool = True) -> None:
        self.address = address
        self.ordinal = ordinal
        self.alive = True
        self.owned = owned
        self.queue: collections.deque[Callable[[], Any]] = collections.deque()  # pending work
        self.issued = 0  # items ever queued
        self.done = 0  # items run
        self.current: Waiting | None = None  # the item that stopped at a rendezvous
        self.waiting: Rendezvous | None = None  # and that rendezvous
        self.failed: BaseException | None = None  # work started early raised it (see start)
        self.capture: SimGraph | None = None  # the graph being recorded
        self.mode = "thread_local"
        self.invalidated = False
        self.thread = 0
        self.deps: list[SimNode] = []  # what the next captured node depends on

    def __int__(self) -> int:
        return self.address

    def record(self, kind: str, label: str, work: Callable[[], Any] | None) -> SimNode:
        """Add a node to the graph being captured, after the current dependencies."""
        graph = self.capture
        assert graph is not None
        node = SimNode(kind, label, work, list(self.deps))
        graph.nodes.append(node)
        self.deps = [node]
        return node


class SimEvent:
    """An event: where it was last recorded (a stream and a count, or a capture's nodes)."""

    __slots__ = (
        "alive",
        "captured",
        "deps",
        "graph",
        "ordinal",
        "recorded",
        "seq",
        "stream",
        "time",
        "timing",
    )

    def __init__(self, ordinal: int, timing: bool) -> None:
        self.ordinal = ordinal
        self.timing = timing
        self.time = 0.0
        self.recorded = False
        self.alive = True
        self.captured = False  # last recorded on a capturing stream (a wait then joins that capture)
        self.stream: SimStream | None = None  # where it was last recorded (uncaptured)
        self.seq = 0  # and after how many of that stream's items it completes
        self.graph: SimGraph | None = None  # the capture it was last recorded in
        self.deps: list[SimNode] = []  # and the nodes a wait on it depends on


class Scheduler:
    """Runs the streams of one simulated backend in stream order, in a seeded interleaving.

    Its caller holds ``lock`` (the backend's re-entrant lock) whenever it
    calls in; it lets the lock go only while the host waits for another
    process's work.
    """

    def __init__(self, lock: threading.RLock, seed: int) -> None:
        self.idle = threading.Condition(lock)  # (waits that let the lock go)
        self.streams: list[SimStream] = []  # every live stream (for device synchronize)
        # streams whose work runs (up the call stack) -> the thread running it
        self.stepping: dict[SimStream, int] = {}
        self.query = threading.local()  # .depth > 0 in a query of this thread (see looking)
        self.sticky: CudaError | None = None  # a fault that broke the context (see reset)
        self.order = random.Random(seed)

    def check_context(self) -> None:
        """Raise the device fault that broke the context, if one did (see :meth:`reset`)."""
        if self.sticky is not None:
            raise self.sticky

    def reseed(self, seed: int) -> None:
        """Restart the interleaving of stream queues from ``seed``."""
        self.order = random.Random(seed)

    def reset(self) -> None:
        """Forget the fault that broke the context; every stream's queued work is dropped."""
        self.sticky = None
        for st in self.streams:
            st.queue.clear()
            st.current = st.waiting = st.failed = None
            st.done = st.issued

    def queue(self, stream: SimStream, work: Callable[[], Any]) -> int:
        """Queue ``work`` on ``stream``; returns the count its completion reaches."""
        stream.queue.append(work)
        stream.issued += 1
        if len(stream.queue) > MAX_PENDING:  # memory pressure: the device catches up
            self.run(stream, wait=False)  # (up to work that waits on other streams' work)
        return stream.issued

    def run(self, stream: SimStream, upto: int | None = None, wait: bool = True) -> bool:
        """Run ``stream``'s queued work (up to its ``upto``-th item).

        Work that waits on a :class:`Rendezvous` stops there while the other
        streams run (in a seeded order) until it is done; when none of them
        can run, the rendezvous can never complete: its error is raised (on a
        GPU, the streams would hang). Returns whether it got there: not
        without ``wait``, or in a query, when the work waits on another
        process's.
        """
        self.check_context()
        me = threading.get_ident()
        while self.stepping.get(stream, me) != me:  # another thread runs its work and waits
            self.idle.wait()  # for another process: until it is done with the stream
        if stream.failed is not None:  # (raised where the host next looks at the stream)
            err, stream.failed = stream.failed, None
            raise err
        while (stream.queue or stream.current is not None) and (upto is None or stream.done < upto):
            self._step(stream)
            rv = stream.waiting
            if rv is not None and not rv.done and not (wait and self._progress(rv)):
                return False
        return True

    def _step(self, stream: SimStream) -> None:
        """Run ``stream``'s next item, or resume the one that stopped, until it stops again."""
        self.stepping[stream] = threading.get_ident()
        try:
            run = stream.current
            if run is None:
                work = stream.queue.popleft()
                out = work()
                if not isinstance(out, GeneratorType):
                    stream.done += 1
                    return
                run = stream.current = out
            elif stream.waiting is not None and not stream.waiting.done:
                return
            stream.waiting = next((rv for rv in run if not rv.done), None)
            if stream.waiting is None:
                stream.current = None
                stream.done += 1
        except BaseException as err:  # the item is consumed (a stopped one abandoned)
            stream.current = stream.waiting = None
            stream.done += 1
            if isinstance(err, CudaError) and err.code in (
                CUDA_ERROR_ILLEGAL_ADDRESS,
                CUDA_ERROR_MISALIGNED_ADDRESS,
            ):
                # a device fault: the context is lost
                self.sticky = error(
                    err.code,
                    err.call,
                    f"an earlier kernel or copy faulted ({err}); the sim context is "
                    "unusable until it is reset (a GPU's, until the process restarts): "
                    "call device.backend.reset()",
                )
                for st in self.streams:
                    st.queue.clear()
                    st.current = st.waiting = None
            raise
        finally:
            self.stepping.pop(stream, None)
            self.idle.notify_all()

    def _progress(self, rv: Rendezvous) -> bool:
        """Run the other streams' work, one item at a time, until ``rv`` is done.

        When none can run, what other processes hand in may complete a stopped
        one: waited for as long as its patience (in a query, only looked at: False
        if nothing came).
        """
        while not rv.done:
            ready = [
                st
                for st in self.streams
                if st not in self.stepping
                and (st.queue or st.current is not None)
                and (st.waiting is None or st.waiting.done)
            ]
            if ready:
                st = ready[self.order.randrange(len(ready))] if len(ready) > 1 else ready[0]
                self._step(st)
                continue
            outside = [
                st.waiting
                for st in self.streams
                if st.waiting is not None and not st.waiting.done and st.waiting.patience is not None
            ]
            if not outside:
                raise rv.stuck()
            if not self._await_outside(outside):
                if self.querying():
                    return False
                raise rv.stuck()
        return True

    def _await_outside(self, waits: list[Rendezvous]) -> bool:
        """Wait until another process's work completes one of ``waits`` (False: it did not in time)."""
        last = time.monotonic() + max(rv.patience or 0.0 for rv in waits)
        pause = 1e-4
        while True:
            polled = [rv.poll() for rv in waits]  # (each takes in what came)
            if any(polled):
                return True
            if self.querying() or time.monotonic() > last:
                return False
            # the lock is let go meanwhile: the other threads go on (their work may be what
            # the other process waits for before it hands in its part)
            self.idle.wait(pause)
            pause = min(pause * 2, 0.01)

    def run_device(self, ordinal: int) -> None:
        """Run every stream of the device to its end, in a seeded interleaving."""
        self.check_context()
        while True:
            ready = [
                st for st in self.streams if st.ordinal == ordinal and (st.queue or st.current or st.failed)
            ]
            if not ready:
                return
            st = ready[self.order.randrange(len(ready))] if len(ready) > 1 else ready[0]
            self.run(st, st.done + 1)

    @contextlib.contextmanager
    def looking(self) -> Iterator[None]:
        """In this thread, until the end: work that waits for other processes is only looked at."""
        self.query.depth = self.querying() + 1
        try:
            yield
        finally:
            self.query.depth -= 1

    def querying(self) -> int:
        """How many queries of this thread are running (0: none; see :meth:`looking`)."""
        return int(getattr(self.query, "depth", 0))
