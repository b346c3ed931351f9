"""The simulator's communicator: collectives in stream order across simulated devices.

Each rank's operation is work on its stream (a kernel node when the stream
is captured). When it runs, it hands in a copy of what it sends and stops
at a :class:`~cudagraphs.backends.base.Rendezvous` until every rank of the
operation has handed in; the last one computes every rank's result (numpy)
and writes it, and the stopped streams go on. The ranks' ``k``-th
collectives meet (and a sender's ``k``-th send to a rank meets that rank's
``k``-th receive from it), counted as they run, as NCCL matches them in the
order they are issued. What NCCL cannot check is checked here:

- ranks that disagree (another operation, size, type, reduction or root)
  raise :class:`~cudagraphs.DistributedError` naming each rank's call;
- an operation some rank never queues, or a send whose receive never comes,
  can never complete: the run that waits for it raises
  :class:`~cudagraphs.CollectiveTimeoutError` at once (on a GPU, the
  streams would hang), and the stream stays stopped until the communicator
  is aborted, as on a GPU.

Operations in one group (``group_start`` .. ``group_end``) are one piece of
work per stream, as NCCL fuses them: a send and a receive between two ranks
in a group meet whatever their order.

Ranks in other processes (:func:`~cudagraphs.distributed.init`, one process
per simulated GPU) hand in their operations through a
:class:`~._mailbox.Mailbox`; a stream that waits for them waits until the
communicator's timeout, then raises :class:`~cudagraphs.CollectiveTimeoutError`
(a query, as ``Communicator.synchronize`` makes, only looks). An eager
operation of such a communicator starts at once (its stream runs up to it),
so the others get this rank's part though its host never waits; work queued
behind an operation that waits runs when the host next looks at a stream.

It reaches the simulator only through
:class:`~cudagraphs.backends.base.SimulatedCollectives`, which a backend
whose ``capabilities.collectives`` is ``"simulated"`` implements.
"""

from __future__ import annotations

import os
import threading
from typing import Any, cast

import numpy as np

from .._errors import CollectiveTimeoutError, DistributedError
from ..backends.base import Rendezvous, SimulatedCollectives, Waiting
from ._engine import Op, disagreement
from ._mailbox import Mailbox

__all__ = ["SimulatedEngine"]

_REDUCE = {
    "sum": np.add.reduce,
    "prod": np.multiply.reduce,
    "max": np.maximum.reduce,
    "min": np.minimum.reduce,
}


class _Rank:
    """A rank's handle: its communicator, its rank, its backend."""

    __slots__ = ("backend", "rank", "world")

    def __init__(self, world: _World, rank: int, backend: Any) -> None:
        # (this engine is chosen where capabilities.collectives == "simulated", which promises it)
        self.world, self.rank = world, rank
        self.backend = cast(SimulatedCollectives, backend)


class _World:
    """The ranks of one communicator."""

    def __init__(self, uid: bytes, nranks: int, mailbox: Mailbox | None = None, timeout: float = 0.0) -> None:
        self.uid, self.nranks = uid, nranks
        self.mailbox, self.timeout = mailbox, timeout  # (for ranks in other processes)
        self.devices: dict[int, int] = {}  # rank -> device ordinal, of this process's ranks
        self.collectives = [0] * nranks  # collectives each rank has run
        self.sent: dict[tuple[int, int], int] = {}  # (src, dst) -> sends run
        self.received: dict[tuple[int, int], int] = {}  # (src, dst) -> receives run
        self.meetings: dict[tuple[Any, ...], _Meeting] = {}
        self.aborted = False
        self.error: BaseException | None = None  # why (another process's abort), raised by each operation

    def end(self, error: BaseException | None = None) -> None:
        """Aborted: every pending operation ends, its result unwritten (NCCL's abort).

        With ``error`` (another process aborted), each of them raises it, and
        so does every operation that runs later.
        """
        self.aborted, self.error = True, error
        for meeting in list(self.meetings.values()):
            meeting.done, meeting.error = True, error  # (the stopped streams go on)
        self.meetings.clear()

    def stamp(self, rank: int, op: Op) -> tuple[tuple[Any, ...], tuple[int, ...]]:
        """The meeting ``rank``'s ``op`` belongs to: its key and the ranks it waits for.

        Taken when the operation is issued (queued eagerly) or, for a graph's
        node, each time it runs (a graph's operations are issued by its
        launch, in order).
        """
        if op.kind in ("send", "recv"):
            pair = (rank, op.peer) if op.kind == "send" else (op.peer, rank)
            counts = self.sent if op.kind == "send" else self.received
            k = counts.get(pair, 0)
            counts[pair] = k + 1
            key: tuple[Any, ...] = ("p2p", *pair, k)
            expected: tuple[int, ...] = pair
        else:
            k = self.collectives[rank]
            self.collectives[rank] = k + 1
            key, expected = ("collective", k), tuple(range(self.nranks))
        return key, expected

    def arrive(self, rank: int, op: Op, backend: SimulatedCollectives, stamp: Any = None) -> _Meeting:
        """Hand in ``rank``'s ``op``: the meeting it waits on (done when all have come)."""
        if self.aborted:  # (work queued before the abort ends without its result, as NCCL's)
            aborted = _Meeting(self, ("aborted",), ())
            aborted.done, aborted.error = True, self.error
            return aborted
        if rank not in self.devices:
            raise DistributedError(
                f"sim: rank {rank}'s communicator was destroyed before this {op.describe()} ran "
                "(a graph that uses a communicator keeps it alive)"
            )
        key, expected = stamp if stamp is not None else self.stamp(rank, op)
        meeting = self.meetings.get(key)
        if meeting is None:
            meeting = self.meetings[key] = _Meeting(self, key, expected)
        data = None
        if op.send:
            nbytes = op.n * op.dtype.itemsize * (self.nranks if op.kind == "reduce_scatter" else 1)
            data = backend.device_bytes(op.send, nbytes, _call(op)).copy().view(op.dtype)
        meeting.arrivals[(rank, op.kind)] = (op, data, backend)
        if self.mailbox is not None:
            self.mailbox.post(meeting.name, rank, op, data, meeting.remote)
        meeting.poll()
        return meeting


class _Meeting(Rendezvous):
    """One operation of every rank it involves (the collective, or a send and its receive)."""

    def __init__(self, world: _World, key: tuple[Any, ...], expected: tuple[int, ...]) -> None:
        self.world, self.key, self.expected = world, key, expected
        # (rank, kind) -> its op, what it sends, its backend (None: a rank of another process)
        self.arrivals: dict[tuple[int, str], tuple[Op, np.ndarray | None, SimulatedCollectives | None]] = {}
        self.error: BaseException | None = None  # raised by the first of its ranks' work to end
        self.name = "-".join(str(k) for k in key)  # (its files' name in the mailbox)
        self.remote = [r for r in expected if r not in world.devices] if world.mailbox else []
        if self.remote:
            self.patience = world.timeout

    def poll(self) -> bool:
        """Take in what ranks of other processes handed in; complete once every rank came."""
        box = self.world.mailbox
        if not self.done and box is not None:
            came = {r for r, _ in self.arrivals}
            me = next(r for r in self.expected if r in self.world.devices)  # (this process's rank)
            for r in self.remote:
                if r in came:
                    continue
                got = box.fetch(self.name, r, me)
                if got is not None:
                    self.arrivals[(r, got[0].kind)] = (got[0], got[1], None)
                elif box.state(r) == "aborted":
                    self.world.end(
                        DistributedError(
                            f"sim: rank {r} (another process) aborted the communicator: its "
                            "operations end without results (this one waited for "
                            f"{self.describe()}); make a new communicator"
                        )
                    )
                    return True
        if not self.done and len(self.arrivals) == len(self.expected):
            self.world.meetings.pop(self.key, None)
            self.complete()
        return self.done

    def take_error(self) -> BaseException | None:
        """Its error, for the first of its ranks' work that ends; None for the others.

        One operation that failed is reported once: the ranks of this process
        that wait on it end together, and the same error raised again by each
        of their streams would surface in later, unrelated calls.
        """
        error, self.error = self.error, None
        return error

    def describe(self) -> str:
        came = sorted(r for r, _ in self.arrivals)
        missing = [r for r in self.expected if r not in came]
        what = next(iter(self.arrivals.values()))[0].describe() if self.arrivals else "an operation"
        return f"rank(s) {missing} to join {what} that rank(s) {came} queued"

    def stuck(self) -> BaseException:
        if self.remote:
            box = self.world.mailbox
            assert box is not None
            gone = [r for r in self.remote if box.state(r) == "closed"]
            return CollectiveTimeoutError(
                f"sim: a communicator's operation waited {self.world.timeout:g} s for "
                f"{self.describe()} (ranks of other processes"
                + (f"; rank(s) {gone} closed their communicator" if gone else "")
                + "): on a GPU its streams would hang. Every rank must queue the same "
                "collectives in the same order (and every send a receive); abort the "
                "communicator to release the stopped streams"
            )
        return CollectiveTimeoutError(
            f"sim: a communicator's operation waits for {self.describe()}, and no stream "
            "can run to bring them: on a GPU its streams would hang. Every rank must "
            "queue the same collectives in the same order (and every send a receive); "
            "abort the communicator to release the stopped streams"
        )

    def complete(self) -> None:
        """Every rank came: check they agree, compute and write each one's result."""
        self.done = True
        ops = {rank: op for (rank, _), (op, _, _) in self.arrivals.items()}
        if self.key[0] == "collective":
            calls = disagreement(ops)
            if calls is not None:
                self.error = DistributedError(
                    f"sim: the ranks' collective #{self.key[1]} (counting the warm-up's 4) disagree "
                    f"({calls}); every rank must "
                    "call the same collectives in the same order, with the same sizes, types, "
                    "reductions and roots (on a GPU this hangs or corrupts memory)"
                )
                return
            self._collective(ops[0])
        else:
            (_, src, dst, _) = self.key
            send_op, data, _ = self.arrivals[(src, "send")]
            recv_op, _, backend = self.arrivals[(dst, "recv")]
            if (send_op.n, send_op.dtype) != (recv_op.n, recv_op.dtype):
                self.error = DistributedError(
                    f"sim: rank {src} sends {send_op.n} {send_op.dtype} to rank {dst}, which "
                    f"receives {recv_op.n} {recv_op.dtype}: a send and its receive must match"
                )
                return
            assert data is not None
            if backend is not None:  # (the receiver is a rank of this process)
                _write(backend, recv_op, data)

    def _collective(self, op: Op) -> None:
        n = self.world.nranks
        sends: dict[int, np.ndarray] = {}
        for (r, _), (_, d, _) in self.arrivals.items():
            assert d is not None
            sends[r] = d
        kind = op.kind
        result: dict[int, np.ndarray]
        if kind == "broadcast":
            result = dict.fromkeys(sends, sends[op.peer])
        elif kind == "all_gather":
            whole = np.concatenate([sends[r] for r in range(n)])
            result = dict.fromkeys(sends, whole)
        else:
            stacked = np.stack([sends[r] for r in range(n)])
            if op.reduce == "avg":
                total = np.add.reduce(stacked, axis=0, dtype=op.dtype)  # (wraps, as NCCL's sum)
                if total.dtype.kind == "i":  # NCCL divides as C does: toward zero
                    wide = total.astype(np.int64)
                    total = np.sign(wide) * (np.abs(wide) // n)
                elif total.dtype.kind == "u":
                    total = total // n
                else:
                    total = total / np.array(n, total.dtype)
            else:
                total = _REDUCE[op.reduce](stacked, axis=0)
            total = total.astype(op.dtype, copy=False)
            if kind == "all_reduce":
                result = {r: total for r in sends}  # noqa: C420  (typed: one array for each)
            else:  # reduce_scatter: rank r keeps the r-th part
                parts = total.reshape(n, -1)
                result = {r: parts[r] for r in sends}
        for (r, _), (rop, _, backend) in self.arrivals.items():
            if backend is not None:  # (a rank of this process)
                _write(backend, rop, result[r])


def _call(op: Op) -> str:
    return "nccl" + "".join(w.capitalize() for w in op.kind.split("_"))


def _write(backend: SimulatedCollectives, op: Op, data: np.ndarray) -> None:
    out = np.ascontiguousarray(data).view(np.uint8)
    backend.device_bytes(op.recv, out.nbytes, _call(op))[...] = out


class SimulatedEngine:
    """Collectives between the simulated devices of this process."""

    version = 0

    def __init__(self) -> None:
        self._worlds: dict[bytes, _World] = {}
        self._lock = threading.Lock()
        self._group = threading.local()  # this thread's open group: [(backend, stream, ops)]

    # communicators ------------------------------------------------------------------------
    def unique_id(self) -> bytes:
        return os.urandom(16)

    def init_rank(self, uid: bytes, nranks: int, rank: int, device: Any, timeout: float) -> Any:
        """Join as one rank of a communicator whose other ranks are other processes.

        Waits (up to ``timeout``) until every rank has joined, as NCCL's
        ``ncclCommInitRank``: ranks of one communicator in one process
        (threads, or calls one after the other) are refused, as they would
        wait for each other forever here.
        """
        with self._lock:
            world = self._worlds.get(uid)
            if world is not None:
                raise DistributedError(
                    f"sim: rank {rank} joins a communicator that rank(s) {sorted(world.devices)} "
                    "of this process joined already: on sim, init() makes one rank per "
                    "process (start a process per rank); local_group() makes every rank of "
                    "one process"
                )
            mailbox = Mailbox(uid) if nranks > 1 else None
            world = self._worlds[uid] = _World(uid, nranks, mailbox, timeout)
            world.devices[rank] = device.index
        if mailbox is not None:
            try:
                mailbox.join(rank, nranks, timeout)
            except BaseException:
                with self._lock:
                    self._worlds.pop(uid, None)
                raise
        return _Rank(world, rank, device.backend)

    def init_all(self, devices: list[Any]) -> list[Any]:
        uid = self.unique_id()
        world = _World(uid, len(devices))
        with self._lock:
            self._worlds[uid] = world
            world.devices.update((r, d.index) for r, d in enumerate(devices))
        return [_Rank(world, r, d.backend) for r, d in enumerate(devices)]

    def abort(self, handle: Any) -> None:
        world: _World = handle.world
        world.end()  # (every rank's here: NCCL's abort ends the operations of them all)
        if world.mailbox is not None:
            world.mailbox.abort(handle.rank)
        self.destroy(handle)

    def destroy(self, handle: Any) -> None:
        world, rank = handle.world, handle.rank
        with self._lock:
            if world.devices.pop(rank, None) is not None and world.mailbox is not None:
                world.mailbox.leave(rank)
            if not world.devices:
                self._worlds.pop(world.uid, None)

    # operations ----------------------------------------------------------------------------
    def group_start(self) -> None:
        depth = getattr(self._group, "depth", 0)
        if depth == 0:
            self._group.pending = []
        self._group.depth = depth + 1

    def group_end(self, handles: list[Any], timeout: float) -> None:
        depth = getattr(self._group, "depth", 0)
        if depth == 0:
            raise DistributedError("group_end without group_start")
        self._group.depth = depth - 1
        if depth > 1:
            return
        pending: list[tuple[Any, Any, list[tuple[_World, int, Op]]]] = self._group.pending
        self._group.pending = []
        for backend, stream, ops in pending:
            self._queue(backend, stream, ops)

    def enqueue(self, handle: Any, rank: int, op: Op, stream: Any) -> None:
        if handle.world.aborted:
            raise DistributedError(
                f"sim: rank {rank}'s communicator was aborted (by another rank's timeout or "
                "abort): make a new one"
            )
        item = (handle.world, rank, op)
        if getattr(self._group, "depth", 0):
            pending = self._group.pending
            for _, s, ops in pending:
                if s is stream:
                    ops.append(item)
                    return
            pending.append((handle.backend, stream, [item]))
            return
        self._queue(handle.backend, stream, [item])

    def _queue(self, backend: SimulatedCollectives, stream: Any, ops: list[tuple[_World, int, Op]]) -> None:
        label = "ncclDevKernel_" + "_".join(op.kind for _, _, op in ops)

        # matched in the order the ranks issue them: stamped now when queued eagerly, as a
        # graph's node when it runs (each launch issues the graph's operations anew)
        eager = backend.capture_info(stream)[0] == "none"
        stamps = [world.stamp(rank, op) if eager else None for world, rank, op in ops]

        def work() -> Waiting:
            meetings = [w.arrive(r, op, backend, st) for (w, r, op), st in zip(ops, stamps)]
            for meeting in meetings:
                while not meeting.done:
                    yield meeting
                error = meeting.take_error()
                if error is not None:
                    raise error

        backend.queue_work(stream, _call(ops[0][2]), label, work)
        if eager and any(world.mailbox is not None for world, _, _ in ops):
            backend.start(stream)  # (hands in its part now: the other processes wait for it)
