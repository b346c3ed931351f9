"""Fault injection: the calls the simulator can make fail on purpose, and when.

``FAULTS`` is the table of calls :class:`Faults` (and so
:meth:`~.backend.SimBackend.inject`) can make fail, each with the code the
driver fails it with; fault sweeps use it to check that nothing leaks and
everything keeps working after any call fails.
"""

from __future__ import annotations

from ..base import (
    CUDA_ERROR_INVALID_HANDLE,
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
    CUDA_ERROR_OUT_OF_MEMORY,
)
from .rules import error

__all__ = ["FAULTS", "Faults"]

FAULTS: dict[str, tuple[str, int]] = {
    "alloc": ("cuMemAllocFromPoolAsync", CUDA_ERROR_OUT_OF_MEMORY),
    "host_alloc": ("cuMemHostAlloc", CUDA_ERROR_OUT_OF_MEMORY),
    "launch": ("cuLaunchKernel", CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES),
    "copy": ("cuMemcpyAsync", CUDA_ERROR_INVALID_VALUE),
    "memset": ("cuMemsetD8Async", CUDA_ERROR_INVALID_VALUE),
    "event": ("cuEventCreate", CUDA_ERROR_OUT_OF_MEMORY),
    "record": ("cuEventRecord", CUDA_ERROR_INVALID_HANDLE),
    "wait": ("cuStreamWaitEvent", CUDA_ERROR_INVALID_HANDLE),
    "stream": ("cuStreamCreate", CUDA_ERROR_OUT_OF_MEMORY),
    "instantiate": ("cuGraphInstantiate", CUDA_ERROR_OUT_OF_MEMORY),
    "update": ("cuGraphExecUpdate", CUDA_ERROR_INVALID_VALUE),
    "upload": ("cuGraphUpload", CUDA_ERROR_OUT_OF_MEMORY),
    "graph_launch": ("cuGraphLaunch", CUDA_ERROR_OUT_OF_MEMORY),
}
"""The calls :meth:`SimBackend.inject` can make fail: kind -> (driver call, its code)."""


class Faults:
    """The faults injected in one simulated device: kind -> calls left until it fails."""

    __slots__ = ("_left",)

    def __init__(self) -> None:
        self._left: dict[str, int] = {}

    def inject(self, kind: str, nth: int = 1) -> None:
        """Make the ``nth`` next call of ``kind`` (see :data:`FAULTS`) fail with the driver's code.

        Raises
        ------
        ValueError
            For an unknown kind or an ``nth`` below 1.
        """
        if kind not in FAULTS:
            raise ValueError(f"unknown fault kind {kind!r}; one of {', '.join(FAULTS)}")
        if type(nth) is not int or nth < 1:
            raise ValueError(f"nth must be an int >= 1, got {nth!r}")
        self._left[kind] = nth

    def injected(self, kind: str) -> bool:
        """Whether the fault injected for ``kind`` has fired (and is spent)."""
        return kind not in self._left

    def clear(self) -> None:
        """Forget faults that have not fired."""
        self._left.clear()

    def check(self, kind: str) -> None:
        """A call of ``kind`` is made: raise the driver's error if its injected fault is due."""
        left = self._left.get(kind)
        if left is None:
            return
        if left > 1:
            self._left[kind] = left - 1
            return
        del self._left[kind]
        call, code = FAULTS[kind]
        raise error(code, call, f"injected fault ({kind})")
