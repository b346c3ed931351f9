"""A stand-in for another GPU library (PyTorch, CuPy, a custom extension), on either backend.

It has what those libraries have and cudagraphs does not see: its own
caching allocator (freed memory goes to a per-size cache and is handed to the
next allocation of that size at once, as PyTorch's does), its own array type
(``__cuda_array_interface__``), and kernels it launches through the backend
directly, so that a capture records them as nodes cudagraphs did not make.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import cudagraphs as cg
from cudagraphs.backends.base import ArrayArg, KernelLaunch

SCALE = r"""
extern "C" __global__ void foreign_scale(float* out, const float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * x[i];
}
"""


def _scale_host(out: np.ndarray, x: np.ndarray, a: float, n: int) -> None:
    out[:n] = np.float32(a) * x[:n]


class ForeignArray:
    """An array of the stand-in library: float32, one dimension, its memory from the library's cache."""

    def __init__(self, lib: ForeignLib, n: int) -> None:
        self.lib, self.n, self.nbytes = lib, n, 4 * n
        self.ptr = lib._take(self.nbytes)
        self.device_index = lib.device.index

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {
            "shape": (self.n,),
            "typestr": "<f4",
            "data": (self.ptr, False),
            "version": 3,
            "strides": None,
        }

    def spec(self) -> ArrayArg:
        return ArrayArg(self.ptr, (self.n,), (4,), np.dtype("float32"))

    def set(self, host: np.ndarray) -> None:
        """Write ``host`` into the array and wait (the library's copies are synchronous)."""
        cg.asarray(self, device=self.lib.device).set(np.ascontiguousarray(host, np.float32))
        self.lib.device.synchronize()

    def get(self) -> np.ndarray:
        return cg.asarray(self, device=self.lib.device).get()

    def __del__(self) -> None:
        self.lib._give(self.ptr, self.nbytes)


class AddressView:
    """The library's array over another's memory by its address alone (it does not hold that memory)."""

    def __init__(self, a: cg.DeviceArray) -> None:
        self.ptr, self.n = a.ptr, a.size

    def spec(self) -> ArrayArg:
        return ArrayArg(self.ptr, (self.n,), (4,), np.dtype("float32"))


class ForeignLib:
    """The stand-in library on ``device``: its allocator, its arrays, its kernel."""

    name = "foreign"

    def __init__(self, device: cg.Device) -> None:
        self.device = device
        self.cache: dict[int, list[int]] = {}
        self.segments: list[int] = []
        self.kernel = cg.Kernel(SCALE, "foreign_scale", host=_scale_host)

    # its allocator: freed memory is handed to the next request of that size
    def _take(self, nbytes: int) -> int:
        free = self.cache.get(nbytes)
        if free:
            return free.pop()
        ptr = int(self.device.backend.mem_alloc(self.device.index, nbytes, None))
        self.segments.append(ptr)
        return ptr

    def _give(self, ptr: int, nbytes: int) -> None:
        self.cache.setdefault(nbytes, []).append(ptr)

    def close(self) -> None:
        """Give every segment back to the driver (the test's end; its arrays must be gone)."""
        self.device.synchronize()
        for ptr in self.segments:
            self.device.backend.mem_free(ptr, None)
        self.segments.clear()
        self.cache.clear()

    # its arrays and operations
    def array(self, host: np.ndarray) -> ForeignArray:
        a = ForeignArray(self, len(host))
        a.set(host)
        return a

    def scale(self, out: ForeignArray, x: ForeignArray, a: float, stream: cg.Stream) -> None:
        """``out = a * x``, launched through the backend on ``stream`` (a node cudagraphs did not record)."""
        fn = self.kernel.function(self.device)
        n = out.n
        launch = KernelLaunch(
            fn,
            ((n + 127) // 128, 1, 1),
            (128, 1, 1),
            0,
            (out.ptr, x.ptr, float(a), n),
            (out.spec(), x.spec(), None, None),
        )
        self.device.backend.launch(stream._raw, launch)

    # what cudagraphs.interop.register needs
    def array_types(self) -> tuple[type, ...]:
        return (ForeignArray,)

    def memory_of(self, obj: Any) -> tuple[int, int, int, Any] | None:
        if obj.lib is not self:
            return None
        return obj.device_index, obj.ptr, obj.ptr + obj.nbytes, obj
