"""How the ranks of one simulated communicator in several processes meet.

On ``sim``, ranks made by :func:`~cudagraphs.distributed.init` in separate
processes (one per simulated GPU, as on a machine with GPUs) hand each other
their operations through files in a directory named after the
communicator's id, on this machine's temporary directory: a file per
operation, sender and receiver, written whole (a rename) so a reader never
sees half of one, and removed by its receiver once read (a long run keeps
only the operations in flight). No file is trusted to be code: a header of
JSON and the raw bytes.

A rank joins by writing its ``joined`` file and waits until every rank
has; it leaves by writing its ``closed`` file (when its communicator is
released, or when its process exits, ``multiprocessing``'s children
included), and the last to leave removes the directory (by then no rank
reads any more). An abort leaves an ``aborted`` file, so the others stop
waiting for that rank's operations. Directories left by processes that
were killed are removed a week later.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing.util
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from .._dtypes import normalize_dtype
from .._errors import CollectiveTimeoutError, DistributedError
from ._engine import Op

__all__ = ["Mailbox"]

_HEADER = 4  # bytes of the header's length, then the header (JSON), then the data
_STALE = 7 * 86400.0  # seconds after which a directory nobody wrote to is a killed run's


def _root() -> Path:
    return Path(tempfile.gettempdir()) / "cudagraphs-sim"


def _sweep() -> None:
    """Remove the directories of runs whose processes were killed (nobody wrote there for a week)."""
    old = time.time() - _STALE
    try:
        stale = [p for p in _root().iterdir() if p.is_dir() and p.stat().st_mtime < old]
    except OSError:
        return
    for p in stale:
        shutil.rmtree(p, ignore_errors=True)


class Mailbox:
    """The shared directory of one communicator's ranks on this machine.

    Parameters
    ----------
    uid : bytes
        The communicator's id (rank 0 made it; the store gave it to the others).
    """

    def __init__(self, uid: bytes) -> None:
        self.path = _root() / uid.hex()
        self._exit: multiprocessing.util.Finalize | None = None

    # joining and leaving ------------------------------------------------------------------
    def join(self, rank: int, nranks: int, timeout: float) -> None:
        """Say ``rank`` is here and wait until all ``nranks`` are.

        Raises
        ------
        DistributedError
            If another process joined as ``rank`` already, or with another world size.
        CollectiveTimeoutError
            If some rank has not joined within ``timeout`` seconds.
        """
        _sweep()
        for attempt in range(3):  # (a rank that gave up may remove the directory meanwhile)
            self.path.mkdir(parents=True, exist_ok=True)
            mine = self.path / f".joined.{rank}.{os.getpid()}"
            try:
                mine.write_text(str(nranks))  # (linked whole: readers never see it empty)
                os.link(mine, self.path / f"joined.{rank}")
                break
            except FileExistsError:
                raise DistributedError(
                    f"sim: rank {rank} joined the communicator twice (another process joined as "
                    f"rank {rank}): give each process its own rank"
                ) from None
            except FileNotFoundError:
                if attempt == 2:
                    raise
            finally:
                mine.unlink(missing_ok=True)
        # a process that ends leaves: at exit, or at the end of a multiprocessing child
        self._exit = multiprocessing.util.Finalize(None, self.leave, (rank,), exitpriority=0)
        deadline = time.monotonic() + timeout
        pause = 1e-3
        while True:
            sizes = {r: self._joined(r) for r in range(nranks)}
            other = {r: n for r, n in sizes.items() if n is not None and n != nranks}
            if other:
                self.leave(rank)  # (its joined file stays: the others see the disagreement too)
                raise DistributedError(
                    f"sim: rank {rank} joins with a world size of {nranks}, but rank(s) "
                    f"{sorted(other)} joined with {sorted(set(other.values()))}: every rank must "
                    "pass the same world size"
                )
            missing = [r for r, n in sizes.items() if n is None]
            if not missing:
                return
            if time.monotonic() > deadline:
                self._withdraw(rank)
                raise CollectiveTimeoutError(
                    f"sim: rank {rank} waited {timeout:g} s for rank(s) {missing} to join the "
                    "communicator: start every rank (the same world size, the same store and name)"
                )
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    def _joined(self, rank: int) -> int | None:
        """The world size ``rank`` joined with, or None if it has not joined."""
        try:
            return int((self.path / f"joined.{rank}").read_text())
        except FileNotFoundError:
            return None

    def leave(self, rank: int) -> None:
        """``rank`` reads nothing more; the last rank to leave removes the directory.

        (The last of those that joined: a rank that never joined reads nothing.)
        """
        self._forget_exit()
        self._mark("closed", rank)
        joined = [p.name.split(".", 1)[1] for p in self.path.glob("joined.*")]
        if all((self.path / f"closed.{r}").exists() for r in joined):
            shutil.rmtree(self.path, ignore_errors=True)

    def _withdraw(self, rank: int) -> None:
        """``rank`` gave up joining: as if it never came (the directory goes if it was alone)."""
        self._forget_exit()
        (self.path / f"joined.{rank}").unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.path.rmdir()  # (only when empty: no other rank came)

    def _forget_exit(self) -> None:
        if self._exit is not None:
            self._exit.cancel()
            self._exit = None

    def abort(self, rank: int) -> None:
        """``rank`` aborted: the others stop waiting for its operations."""
        self._mark("aborted", rank)

    def state(self, rank: int) -> str:
        """``"aborted"``, ``"closed"`` or ``""``: what ``rank`` (of another process) did."""
        for what in ("aborted", "closed"):
            if (self.path / f"{what}.{rank}").exists():
                return what
        return ""

    def _mark(self, what: str, rank: int) -> None:
        if self.path.is_dir():
            (self.path / f"{what}.{rank}").touch()

    # operations -----------------------------------------------------------------------------
    def post(self, key: str, rank: int, op: Op, data: np.ndarray | None, to: list[int]) -> None:
        """Hand ``rank``'s ``op`` of meeting ``key`` (and what it sends) to the ranks ``to``."""
        header = json.dumps(
            {
                "kind": op.kind,
                "n": op.n,
                "dtype": op.dtype.name,
                "reduce": op.reduce,
                "peer": op.peer,
                "data": data is not None,
            }
        ).encode()
        raw = len(header).to_bytes(_HEADER, "little") + header
        raw += b"" if data is None else np.ascontiguousarray(data).tobytes()
        for r in to:
            final = self.path / f"{key}.{rank}-{r}"
            partial = final.with_name(f".{final.name}.{os.getpid()}")
            partial.write_bytes(raw)
            os.replace(partial, final)  # (readers see all of it or nothing)

    def fetch(self, key: str, rank: int, me: int) -> tuple[Op, np.ndarray | None] | None:
        """``rank``'s op of meeting ``key`` and what it sends to ``me``, once handed in (else None)."""
        path = self.path / f"{key}.{rank}-{me}"
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        path.unlink()  # (read once: only this rank reads it)
        size = int.from_bytes(raw[:_HEADER], "little")
        h = json.loads(raw[_HEADER : _HEADER + size])
        dtype = normalize_dtype(h["dtype"])
        op = Op(h["kind"], 0, 0, int(h["n"]), dtype, h["reduce"], int(h["peer"]))
        data = np.frombuffer(raw[_HEADER + size :], dtype=dtype).copy() if h["data"] else None
        return op, data
