"""The CuPy adapter: routing into captures, zero-copy views, the current stream.

CuPy is never imported here; every function looks it up in ``sys.modules``.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["ADAPTER", "CupyLibrary"]


class CupyLibrary:
    """CuPy: ``cupy.ndarray`` (see :class:`cudagraphs.interop.Library`)."""

    name = "CuPy"
    module = "cupy"

    def owns(self, obj: object) -> bool:
        """Whether ``obj`` is a ``cupy.ndarray``."""
        cupy = sys.modules.get("cupy")
        return cupy is not None and isinstance(obj, cupy.ndarray)

    @contextlib.contextmanager
    def route(
        self,
        device: Any,
        stream_handle: int,
        allocate: Callable[[int], Any] | None,
        keep: list[Any],
        shared: dict[str, Any],
    ) -> Iterator[None]:
        """Make the captured stream CuPy's current one and its allocations the capture's.

        Each CuPy allocation is a cudagraphs array of the capture's pool
        (``allocate``); when CuPy drops it, the block goes back to that pool,
        which the graph owns.
        """
        cupy = sys.modules["cupy"]
        cuda = cupy.cuda

        def allocator(nbytes: int) -> Any:
            assert allocate is not None
            array = allocate(nbytes)
            memory = cuda.UnownedMemory(array.ptr, nbytes, array, device.index)
            return cuda.MemoryPointer(memory, 0)

        with contextlib.ExitStack() as stack:
            stack.enter_context(cuda.Device(device.index))
            if stream_handle != self.current_stream(device.index):
                stack.enter_context(_external_stream(cuda, stream_handle))
            if allocate is not None:
                stack.enter_context(cuda.using_allocator(allocator))
            yield

    def describe(self, obj: Any) -> tuple[int, tuple[int, ...], Any, bool, int]:
        """(address, shape, numpy dtype, C-contiguous, device index) of an array, cheaply."""
        return obj.data.ptr, obj.shape, obj.dtype, obj.flags.c_contiguous, obj.device.id

    def array_types(self) -> tuple[type, ...]:
        """``cupy.ndarray``."""
        return (sys.modules["cupy"].ndarray,)

    def memory_of(self, obj: Any) -> tuple[int, int, int, Any] | None:
        """(device index, start, end, memory) of an array's allocation: its memory object keeps it."""
        mem = obj.data.mem
        start = int(mem.ptr)
        return int(obj.device.id), start, start + int(mem.size), mem

    def pool_memory(self, obj: Any) -> list[tuple[int, int]] | None:
        """None: CuPy allocates a capture's memory from the graph's own pool (see :meth:`route`)."""
        return None

    def view(self, array: Any) -> Any:
        """``array`` as a ``cupy.ndarray`` sharing its memory."""
        cupy = sys.modules["cupy"]
        return cupy.asarray(array)

    def current_stream(self, device_index: int) -> int:
        """The handle of CuPy's current stream on the device."""
        cupy = sys.modules["cupy"]
        return int(cupy.cuda.get_current_stream(device_index).ptr)


class _Handle:
    """A stream handle speaking the CUDA stream protocol (for ``Stream.from_external``)."""

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


def _external_stream(cuda: Any, handle: int) -> Any:
    """CuPy's Stream object for a stream made elsewhere (``from_external`` where CuPy has it)."""
    if handle == 0:
        return cuda.Stream.null
    from_external = getattr(cuda.Stream, "from_external", None)
    if from_external is not None:
        return from_external(_Handle(handle))
    return cuda.ExternalStream(handle)


ADAPTER = CupyLibrary()
