"""The PyTorch adapter: routing into captures, zero-copy views, the current stream.

PyTorch is never imported here; every function looks it up in
``sys.modules`` (a program that runs PyTorch code has imported it).

This module is compiled by Cython from this source where the package is
built (``torch.pxd``): a graphed call of tensors describes each one and
asks for PyTorch's current stream on every call, through
:meth:`TorchLibrary.describe` and :meth:`TorchLibrary.current_stream`.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from .._dtypes import SUPPORTED

__all__ = ["ADAPTER", "TorchLibrary"]


class TorchLibrary:
    """PyTorch: ``torch.Tensor`` on a CUDA device (see :class:`cudagraphs.interop.Library`)."""

    name = "PyTorch"
    module = "torch"

    def owns(self, obj: object) -> bool:
        """Whether ``obj`` is a CUDA ``torch.Tensor``."""
        torch = sys.modules.get("torch")
        return torch is not None and isinstance(obj, torch.Tensor) and obj.is_cuda

    @contextlib.contextmanager
    def route(
        self,
        device: Any,
        stream_handle: int,
        allocate: Callable[[int], Any] | None,
        keep: list[Any],
        shared: dict[str, Any],
    ) -> Iterator[None]:
        """Make the captured stream PyTorch's current one and its allocations a MemPool's.

        The pool (``torch.cuda.MemPool``, one per GraphPool) is kept by the
        graph: blocks PyTorch frees during the capture are reused within it,
        in stream order, and never by code outside the graph.
        """
        torch = sys.modules["torch"]
        if not torch.cuda.is_available():
            yield
            return
        with contextlib.ExitStack() as stack:
            if stream_handle != self.current_stream(device.index):
                stack.enter_context(torch.cuda.stream(_torch_stream(torch, stream_handle, device.index)))
            if allocate is not None:
                # as torch.cuda.graph does: cuBLAS's workspaces are made again during the
                # capture, from the graph's pool, so none is shared with other code that
                # could free it while the graph still uses it (PyTorch issue #193402)
                clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
                if clear is not None:
                    clear()
                pool = shared.get("torch")
                if pool is None:
                    pool = shared["torch"] = torch.cuda.MemPool()
                keep.append(pool)
                stack.enter_context(torch.cuda.use_mem_pool(pool, device=device.index))
                # a backward runs its CUDA work on autograd's device threads, whose allocations
                # use_mem_pool (this thread's) does not route: inside the capture, it runs on
                # this thread instead (as PyTorch's compiler runs it), every allocation routed and
                # every call the capture forbids refused here
                single = getattr(torch.autograd, "set_multithreading_enabled", None)
                if single is not None:
                    stack.enter_context(single(False))
            yield

    def describe(self, obj: Any) -> tuple[int, tuple[int, ...], Any, bool, int]:
        """(address, shape, numpy dtype, C-contiguous, device index) of a CUDA tensor, cheaply."""
        dtypes = _DTYPES
        if not dtypes:
            _fill_dtypes(sys.modules["torch"])
        dtype = dtypes.get(obj.dtype)
        if dtype is None:
            raise TypeError(f"tensors of {obj.dtype} are not supported by cudagraphs")
        return obj.data_ptr(), tuple(obj.shape), dtype, obj.is_contiguous(), obj.get_device()

    def array_types(self) -> tuple[type, ...]:
        """``torch.Tensor`` (parameters and other subclasses count)."""
        return (sys.modules["torch"].Tensor,)

    def memory_of(self, obj: Any) -> tuple[int, int, int, Any] | None:
        """(device index, start, end, storage) of a CUDA tensor's storage: the storage keeps it."""
        if not obj.is_cuda:
            return None
        storage = obj.untyped_storage()
        start = storage.data_ptr()
        return obj.get_device(), start, start + storage.nbytes(), storage

    def pool_memory(self, obj: Any) -> list[tuple[int, int]] | None:
        """The segments of a ``torch.cuda.MemPool`` (a graph's, from :meth:`route`); None for others."""
        torch = sys.modules["torch"]
        pool_type = getattr(torch.cuda, "MemPool", None)
        if pool_type is None or not isinstance(obj, pool_type):
            return None
        snapshot = getattr(obj, "snapshot", None)
        if snapshot is None:  # (an older PyTorch: its segments are not known, the census decides)
            return []
        # (one snapshot at a time in the process: with torch 2.11, threads that each took their
        # pool's snapshot at every capture's end crashed the interpreter, see _SNAPSHOTS)
        with _SNAPSHOTS:
            segments = snapshot()
        return [(int(s["address"]), int(s["address"]) + int(s["total_size"])) for s in segments]

    def view(self, array: Any) -> Any:
        """``array`` as a ``torch.Tensor`` sharing its memory (DLPack)."""
        torch = sys.modules["torch"]
        return torch.from_dlpack(array)

    def current_stream(self, device_index: int) -> int:
        """The handle of PyTorch's current stream on the device."""
        raw = _RAW[0]
        if raw is None:  # (looked up once: PyTorch's function of this process)
            raw = _RAW[0] = getattr(sys.modules["torch"]._C, "_cuda_getCurrentRawStream", False)
        if raw:  # (no Stream object made: the fast way)
            return int(raw(device_index))
        return int(sys.modules["torch"].cuda.current_stream(device_index).cuda_stream)


def _torch_stream(torch: Any, handle: int, index: int) -> Any:
    """PyTorch's Stream object for a driver handle.

    Handle 0 is the default stream, which ``ExternalStream(0)`` does not give
    (measured, PyTorch 2.11: it makes a new stream each time).
    """
    if handle == 0:
        return torch.cuda.default_stream(index)
    return torch.cuda.ExternalStream(handle, device=torch.device("cuda", index))


_DTYPES: dict[Any, Any] = {}  # torch dtype -> numpy dtype, filled on first use
# PyTorch's allocator snapshots (torch.cuda.MemPool.snapshot), taken one at a time. Measured
# with torch 2.11 (2026-11-27/28): eight threads capturing with PyTorch routed, each taking
# its pool's snapshot at every capture's end, crashed the interpreter in 60% of runs after the
# PyTorch interop tests in the same process; without those snapshots, none. Snapshots are now
# taken only where a graph holds PyTorch's nodes; eight threads doing that ran clean with this
# lock and without it (an H200: 32 and 24 runs), so the lock is insurance, not a proven fix. A
# crash of the same kind remains in a longer mix of tests (issue 28; CHANGELOG).
_SNAPSHOTS = threading.Lock()
_RAW: list[Any] = [None]  # torch._C._cuda_getCurrentRawStream (False: none), found on first use


def _fill_dtypes(torch: Any) -> None:
    for name, dt in SUPPORTED.items():
        found = getattr(torch, name, None)
        if found is not None and isinstance(found, torch.dtype):
            _DTYPES[found] = dt
    _DTYPES.setdefault(torch.bool, np.dtype("bool"))


ADAPTER = TorchLibrary()
