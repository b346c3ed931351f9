"""What a communicator asks of its engine: NCCL (:mod:`._nccl`) or the simulator's.

An engine knows nothing of arrays or captures: :mod:`._comm` checks the
arguments, picks the streams and submits the work through
:func:`cudagraphs._recording.submit` (so captures record it and keep its
arrays alive); the engine enqueues one operation on one raw stream.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple, Protocol

import numpy as np

__all__ = ["REDUCTIONS", "Engine", "Op", "disagreement"]

REDUCTIONS = ("sum", "prod", "max", "min", "avg")


class Op(NamedTuple):
    """One operation of one rank, in NCCL's terms.

    Attributes
    ----------
    kind : str
        ``all_reduce``, ``all_gather``, ``reduce_scatter``, ``broadcast``,
        ``send`` or ``recv``.
    send, recv : int
        The device addresses read and written (0 where there is none).
    n : int
        Elements, as NCCL counts them: all_gather's per-rank input,
        reduce_scatter's per-rank output, else the array's.
    dtype : numpy.dtype
    reduce : str
        The reduction (one of :data:`REDUCTIONS`), or ``""``.
    peer : int
        broadcast's root, send/recv's other rank, else -1.
    """

    kind: str
    send: int
    recv: int
    n: int
    dtype: np.dtype
    reduce: str = ""
    peer: int = -1

    def signature(self) -> tuple[Any, ...]:
        """What every rank of a collective must call alike: all but the addresses."""
        return (self.kind, self.n, self.dtype, self.reduce, self.peer)

    def describe(self) -> str:
        """``all_reduce(1024 float32, sum)``: what each rank must call alike."""
        extra = f", {self.reduce}" if self.reduce else ""
        if self.kind == "broadcast":
            extra += f", root {self.peer}"
        elif self.kind in ("send", "recv"):
            extra += f", {'to' if self.kind == 'send' else 'from'} rank {self.peer}"
        return f"{self.kind}({self.n} {self.dtype}{extra})"


def disagreement(ops: Mapping[int, Op]) -> str | None:
    """Each rank's call, when the ranks' ops of one collective differ; else None.

    ``ops`` maps each rank to its op; they differ in the operation, size,
    type, reduction or root. The text is ``rank 0: all_reduce(8 float32,
    sum), rank 1: ...``. NCCL checks none of this: on a GPU such ranks hang
    or corrupt memory.
    """
    first = next(iter(ops.values()))
    if all(op.signature() == first.signature() for op in ops.values()):
        return None
    return ", ".join(f"rank {r}: {ops[r].describe()}" for r in sorted(ops))


class Engine(Protocol):
    """The collectives of one backend."""

    def unique_id(self) -> bytes:
        """A new communicator's id, for rank 0 to share with the others."""

    def init_rank(self, uid: bytes, nranks: int, rank: int, device: Any, timeout: float) -> Any:
        """Join communicator ``uid`` as ``rank`` on ``device`` (waits for every rank)."""

    def init_all(self, devices: list[Any]) -> list[Any]:
        """One communicator over ``devices`` in this process: a handle per device."""

    def group_start(self) -> None:
        """Start a group: operations until :meth:`group_end` are issued together."""

    def group_end(self, handles: list[Any], timeout: float) -> None:
        """Issue the group (``handles``: the communicators it used)."""

    def enqueue(self, handle: Any, rank: int, op: Op, stream: Any) -> None:
        """Queue ``op`` of ``rank`` on the raw ``stream``."""

    def abort(self, handle: Any) -> None:
        """Abandon the communicator at once (its pending operations end)."""

    def destroy(self, handle: Any) -> None:
        """Release the communicator once its operations are done."""
