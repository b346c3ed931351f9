"""The PyTorch adapter: routing into captures, zero-copy views, the current stream.

PyTorch is never imported here; every function looks it up in
``sys.modules`` (a program that runs PyTorch code has imported it).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

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
        stream = torch.cuda.ExternalStream(stream_handle, device=torch.device("cuda", device.index))
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.cuda.stream(stream))
            if allocate is not None:
                pool = shared.get("torch")
                if pool is None:
                    pool = shared["torch"] = torch.cuda.MemPool()
                keep.append(pool)
                stack.enter_context(torch.cuda.use_mem_pool(pool, device=device.index))
            yield

    def view(self, array: Any) -> Any:
        """``array`` as a ``torch.Tensor`` sharing its memory (DLPack)."""
        torch = sys.modules["torch"]
        return torch.from_dlpack(array)

    def current_stream(self, device_index: int) -> int:
        """The handle of PyTorch's current stream on the device."""
        torch = sys.modules["torch"]
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw is not None:  # (no Stream object made: the fast way)
            return int(raw(device_index))
        return int(torch.cuda.current_stream(device_index).cuda_stream)


ADAPTER = TorchLibrary()
