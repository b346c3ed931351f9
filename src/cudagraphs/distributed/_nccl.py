"""The NCCL engine: nccl4py's low-level bindings (``nccl.bindings.nccl``).

This is the only module that imports nccl4py, when the first communicator
on a GPU is made (``pip install 'cudagraphs[nccl]'``; the NCCL library
itself comes with the ``nvidia-nccl-cu13`` wheel, which PyTorch also
installs).

Communicators made for one process per GPU are *non-blocking* (NCCL's
``blocking=0`` config): joining returns at once and :meth:`init_rank` polls
``ncclCommGetAsyncError`` until every rank joined or the timeout passed, so
a rank that never comes raises instead of hanging forever. The
communicators of one process (``ncclCommInitAll``) are blocking.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import time
from typing import Any

import numpy as np

from .._errors import CollectiveTimeoutError, DistributedError
from ._engine import Op

__all__ = ["INSTALL_HINT", "NcclEngine", "available"]

INSTALL_HINT = "pip install 'cudagraphs[nccl]' (nccl4py 0.6, with NCCL from the nvidia-nccl-cu13 wheel)"
_UID_BYTES = 128  # sizeof(ncclUniqueId)
_IN_PROGRESS = 7  # ncclInProgress
_DTYPES = {
    "int8": "Int8",
    "uint8": "Uint8",
    "int32": "Int32",
    "uint32": "Uint32",
    "int64": "Int64",
    "uint64": "Uint64",
    "float16": "Float16",
    "float32": "Float32",
    "float64": "Float64",
    "bfloat16": "Bfloat16",
}
_CALLS = {
    "all_reduce": "ncclAllReduce",
    "all_gather": "ncclAllGather",
    "reduce_scatter": "ncclReduceScatter",
    "broadcast": "ncclBroadcast",
    "send": "ncclSend",
    "recv": "ncclRecv",
}
_REDUCE = {"sum": "Sum", "prod": "Prod", "max": "Max", "min": "Min", "avg": "Avg"}


def available() -> bool:
    """Whether nccl4py's bindings can be imported here (the ``nccl`` extra is installed)."""
    try:
        importlib.import_module("nccl.bindings.nccl")
    except ImportError:
        return False
    return True


class NcclEngine:
    """Collectives on GPUs through NCCL."""

    def __init__(self) -> None:
        try:
            self.nc: Any = importlib.import_module("nccl.bindings.nccl")
        except ImportError as exc:
            raise ImportError(f"cudagraphs.distributed on GPUs needs nccl4py: {INSTALL_HINT}") from exc
        nc = self.nc
        self.version: int = nc.get_version()
        self._dtypes = {
            np.dtype(k): int(getattr(nc.DataType, v)) for k, v in _DTYPES.items() if k != "bfloat16"
        }
        self._bf16 = int(nc.DataType.Bfloat16)
        self._reduce = {k: int(getattr(nc.RedOp, v)) for k, v in _REDUCE.items()}

    # communicators ------------------------------------------------------------------------
    def unique_id(self) -> bytes:
        uid = self._check("ncclGetUniqueId", self.nc.get_unique_id)
        return ctypes.string_at(uid.ptr, _UID_BYTES)

    def init_rank(self, uid: bytes, nranks: int, rank: int, device: Any, timeout: float) -> Any:
        nc = self.nc
        device.backend.activate(device.index)  # NCCL uses the current device
        config = nc.Config()
        config.blocking = 0
        comm = self._check(
            "ncclCommInitRankConfig",
            nc.comm_init_rank_config,
            nranks,
            nc.UniqueId.from_buffer(bytearray(uid)),
            rank,
            config,
        )
        self._settle(
            [comm],
            timeout,
            True,
            f"rank {rank} of {nranks} waited {timeout:g} s for the other ranks to join the "
            "communicator: start every rank with the same world size and store",
        )
        return comm

    def init_all(self, devices: list[Any]) -> list[Any]:
        comms: list[Any] = self._check(
            "ncclCommInitAll", self.nc.comm_init_all, len(devices), [d.index for d in devices]
        )
        return comms

    def abort(self, handle: Any) -> None:
        self.nc.comm_abort(handle)

    def destroy(self, handle: Any) -> None:
        self.nc.comm_destroy(handle)

    # operations ----------------------------------------------------------------------------
    def group_start(self) -> None:
        self._check("ncclGroupStart", self.nc.group_start)

    def group_end(self, handles: list[Any], timeout: float) -> None:
        self._check("ncclGroupEnd", self.nc.group_end)
        self._settle(handles, timeout, False, "the group's operations were not issued")

    def enqueue(self, handle: Any, rank: int, op: Op, stream: Any) -> None:
        nc, s, dt = self.nc, int(stream), self._dtype(op.dtype)
        kind = op.kind
        if kind in ("all_reduce", "reduce_scatter"):  # (same arguments)
            fn = nc.all_reduce if kind == "all_reduce" else nc.reduce_scatter
            args: tuple[Any, ...] = (op.send, op.recv, op.n, dt, self._reduce[op.reduce])
        elif kind == "all_gather":
            fn, args = nc.all_gather, (op.send, op.recv, op.n, dt)
        elif kind == "broadcast":
            fn, args = nc.broadcast, (op.send, op.recv, op.n, dt, op.peer)
        elif kind == "send":
            fn, args = nc.send, (op.send, op.n, dt, op.peer)
        else:
            fn, args = nc.recv, (op.recv, op.n, dt, op.peer)
        self._check(_CALLS[kind], fn, *args, handle, s)

    # helpers --------------------------------------------------------------------------------
    def _dtype(self, dtype: np.dtype) -> int:
        if dtype.name == "bfloat16":
            return self._bf16
        return self._dtypes[dtype]

    def _check(self, call: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self.nc.NCCLError as exc:
            raise DistributedError(f"{call} failed: {exc} ({self._last_error()})") from exc

    def _last_error(self) -> str:
        try:
            # (the communicator argument is unused by NCCL: its last error is the process's)
            return str(self.nc.get_last_error(self.nc.Comm(0))) or "NCCL gave no detail"
        except Exception as exc:  # (nccl4py changed its signature?)
            return f"NCCL's last error could not be read: {exc}"

    def _settle(self, handles: list[Any], timeout: float, abort: bool, what: str) -> None:
        """Wait until no communicator of ``handles`` is in progress (non-blocking ones).

        On a timeout, ``abort`` says whether to abort them here (a joining
        rank's, which no Communicator holds yet); otherwise their holders do.
        """
        deadline = None
        start = time.monotonic()
        for comm in handles:
            while True:
                state = int(self.nc.comm_get_async_error(comm))
                if state == 0:
                    break
                if state != _IN_PROGRESS:
                    raise DistributedError(
                        f"NCCL reported {self.nc.Result(state).name} ({state}): {self._last_error()}"
                    )
                if deadline is None:
                    deadline = time.monotonic() + timeout
                elif time.monotonic() > deadline:
                    if abort:
                        for c in handles:
                            with contextlib.suppress(self.nc.NCCLError):  # (the timeout is the news)
                                self.nc.comm_abort(c)
                    raise CollectiveTimeoutError(
                        f"{what} within {timeout:g} s (the communicator was aborted)"
                    )
                # (an eager operation's group settles within microseconds: spin first)
                time.sleep(0.0 if time.monotonic() - start < 0.002 else 0.0005)
