"""Copies between host and device: blocking get/set and the pipelined D2H.

Device-to-device copies (including strided ones) are :func:`cudagraphs.ops.copy`.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from ._capture import capture_for, forbid, keep

if TYPE_CHECKING:
    from ._array import DeviceArray
    from ._device import Device, Event, Stream
    from ._host import PinnedBuffer, PinnedCache

__all__ = ["PendingCopy", "to_device", "to_host"]


def _forbid_in_capture(device: Device, stream: Stream, what: str) -> None:
    if device.captures:
        forbid(device, stream, f"{what} (a copy to the host and a wait)",
               hint="read results after replay, or copy into a cg.HostSlot inside the capture")


def to_host(x: DeviceArray, stream: Stream | None) -> np.ndarray:
    """Copy ``x`` into a new numpy array after the work queued on ``stream``."""
    device = x.device
    stream = stream if stream is not None else device.stream
    _forbid_in_capture(device, stream, "DeviceArray.get()")
    out = np.empty(x.shape, x.dtype)
    if x.size:
        src = x if x.is_contiguous else x.copy(stream=stream)
        device.backend.memcpy_dtoh(out, src.ptr, stream._live())
        stream.synchronize()
    return out


def to_device(x: DeviceArray, value: Any, stream: Stream | None) -> None:
    """Copy host data ``value`` into ``x`` (broadcast, cast within its kind)."""
    from . import ops
    from ._array import empty

    host = np.asarray(value)
    if host.dtype.kind == "O":
        raise TypeError(f"cannot copy {type(value).__name__} data to the device")
    if not np.can_cast(host.dtype, x.dtype, "same_kind") and not _ints_fit(host, x.dtype):
        raise TypeError(
            f"cannot copy {host.dtype} data into a {x.dtype} array without changing its "
            "kind; convert it first with .astype()"
        )
    try:
        host = np.broadcast_to(host.astype(x.dtype, copy=False), x.shape)
    except ValueError:
        raise ValueError(
            f"shape mismatch: host data of shape {np.shape(value)} cannot be copied "
            f"into an array of shape {x.shape}"
        ) from None
    if x.size == 0:
        return
    host = np.ascontiguousarray(host)
    device = x.device
    stream = stream if stream is not None else device.stream
    target = x if x.is_contiguous else empty(x.shape, x.dtype, device=device, stream=stream)
    capture = capture_for(device, stream)
    if capture is not None:
        # a graph re-reads its source on every replay: snapshot the data now
        # into pinned memory the graph owns
        host = capture.stage(host)
        keep(device, stream, (target,), "memcpy")
    # from pageable memory the driver stages the bytes before returning, so
    # ``host`` may be freed as soon as this call is done
    device.backend.memcpy_htod(target.ptr, host, stream._live())
    if target is not x:
        ops.copy(x, target, stream=stream)


def _ints_fit(host: np.ndarray, dtype: np.dtype) -> bool:
    """Whether integer data converts to another integer dtype without wrapping."""
    if host.dtype.kind not in "iu" or dtype.kind not in "iu":
        return False
    info = np.iinfo(dtype)
    return host.size == 0 or (info.min <= host.min() and host.max() <= info.max)


def _give_back(done: Event, cache: PinnedCache, buf: PinnedBuffer) -> None:
    done.synchronize()
    cache.give(buf)


class PendingCopy:
    """A device-to-host copy running on the device's copy stream.

    The copy starts after the work queued so far on the compute stream; the
    compute stream does not wait for it. :meth:`result` waits for this copy
    only. The source memory is kept from reuse until the copy has finished.
    """

    def __init__(self, x: DeviceArray) -> None:
        device = x.device
        _forbid_in_capture(device, device.copy_stream, "DeviceArray.get_async()")
        src = x if x.is_contiguous else x.copy()
        self.shape = x.shape
        self.dtype = x.dtype
        self._src = src
        self._result: np.ndarray | None = None
        self._buf = device.pinned.take(src.nbytes)
        copy_stream = device.copy_stream
        copy_stream.wait(device.stream)
        if src.nbytes:
            device.backend.memcpy_dtoh(self._buf.array, src.ptr, copy_stream._live())
        src.record_stream(copy_stream)
        self._done = copy_stream.record()
        self._finalizer = weakref.finalize(self, _give_back, self._done, device.pinned, self._buf)

    def done(self) -> bool:
        """Whether the copy has finished (never blocks)."""
        return self._result is not None or self._done.query()

    def result(self) -> np.ndarray:
        """Wait for the copy and return the data as a new numpy array."""
        if self._result is None:
            self._done.synchronize()
            self._result = self._buf.array.view(self.dtype).reshape(self.shape).copy()
            self._finalizer()
            self._src = None  # type: ignore[assignment]
        return self._result
