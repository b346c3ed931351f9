"""A stand-in for another GPU library (PyTorch, CuPy) in the tests of refusals on any backend.

Like PyTorch routed into a cudagraphs capture, it works on the current
stream (cudagraphs' current stream is the captured one) and launches its
kernels there; its host reads and synchronizes call the driver themselves
(the backend, not cudagraphs' checked path), so during a capture the driver
refuses them, and the library raises its own error wrapping the driver's,
as PyTorch's ``AcceleratorError: CUDA error: operation not permitted when
stream is capturing`` does.

It declares itself a library (``__cudagraphs_library__``): its frames are
not the user's line.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import cudagraphs as cg
from cudagraphs.backends.base import Copy

__cudagraphs_library__ = "fakelib"


class FakeLibError(RuntimeError):
    """The library's error for a failed driver call (its message as the CUDA runtime words it)."""


def _stream() -> Any:
    return cg.current_device().current_stream()


def _driver(call: Any, *args: Any) -> Any:
    """A driver call as the library makes it: a refusal becomes the library's own error."""
    try:
        return call(*args)
    except cg.CudaError as err:
        raise FakeLibError(f"CUDA error: {err.detail or err.name}") from err


def scale(x: cg.DeviceArray, alpha: float) -> cg.DeviceArray:
    """``alpha * x``, a kernel on the current stream (recorded when it is captured)."""
    return cg.ops.scale(alpha, x, stream=_stream())


def item(x: cg.DeviceArray) -> float:
    """The value of a one-element array, read on the host (as ``torch.Tensor.item``)."""
    stream = _stream()
    backend = stream.device.backend
    host = np.empty(1, dtype=x.dtype)
    _driver(backend.memcpy, stream._raw, Copy(host.ctypes.data, x.ptr, host.nbytes, "dtoh"))
    _driver(backend.synchronize, stream._raw)
    return float(host[0])


def synchronize() -> None:
    """Wait for the current stream (as ``torch.cuda.synchronize``)."""
    stream = _stream()
    _driver(stream.device.backend.synchronize, stream._raw)


def fails(x: cg.DeviceArray) -> None:
    """An error of the library that has nothing to do with captures."""
    raise FakeLibError(f"fakelib cannot handle an array of shape {x.shape}")
