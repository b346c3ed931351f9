"""Copies between host and device: blocking get/set and the pipelined D2H.

Below the array layer: functions take anything array-like (see
:mod:`cudagraphs._builtin_kernels`). Inside a capture, host data copied to the
device is first staged into pinned memory the graph keeps (a snapshot: every
replay uploads the data as it was at capture); a copy back to the host is
refused (it would need a wait, and a replay could not re-read it).
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from . import _recording
from ._builtin_kernels import copy_view, scratch
from ._device import resolve_stream
from ._host import hold, stage
from ._recording import Work, submit
from .backends.base import Copy

__all__ = ["PendingCopy", "check_host_data", "to_device", "to_host"]

_HOST_HINT = "read results after replay, or copy into a cg.HostSlot inside the capture"


def to_host(x: Any, stream: Any) -> np.ndarray:
    """Copy ``x`` into a new numpy array after the work queued on ``stream``."""
    device = x.device
    _recording.forbid(device, stream, "DeviceArray.get() (a copy to the host and a wait)", hint=_HOST_HINT)
    out = np.empty(x.shape, x.dtype)
    if x.size:
        src = x if x.is_contiguous else _contiguous(x, stream)
        backend = device.backend
        copy = Copy(out.ctypes.data, src.ptr, out.nbytes, "dtoh")
        submit(stream, Work("memcpy", backend.memcpy, copy, (src,), (out,)))
        backend.synchronize(stream._live())
    return out


def _contiguous(x: Any, stream: Any) -> Any:
    tmp = scratch(x.device, x.shape, x.dtype, stream)
    copy_view(tmp, x, stream)
    return tmp


def check_host_data(value: Any, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """``value`` as host data of ``dtype`` broadcast to ``shape``, or a clear error.

    Raises
    ------
    TypeError
        If the data is not numbers, or its kind cannot become ``dtype``'s.
    ValueError
        If it does not broadcast to ``shape``, or an integer is out of range.
    """
    host = np.asarray(value)
    if host.dtype.kind == "O":
        raise TypeError(f"cannot copy {type(value).__name__} data to the device")
    if host.dtype.kind in "iu" and dtype.kind in "iu" and host.size:
        info = np.iinfo(dtype)
        lo, hi = host.min(), host.max()
        if lo < info.min or hi > info.max:
            bad = lo if lo < info.min else hi
            raise ValueError(f"cannot store {bad} in a {dtype} array: out of range {info.min}..{info.max}")
    elif not np.can_cast(host.dtype, dtype, "same_kind"):
        raise TypeError(
            f"cannot copy {host.dtype} data into a {dtype} array without changing its "
            "kind; convert it first with .astype()"
        )
    try:
        return np.broadcast_to(host.astype(dtype, copy=False), shape)
    except ValueError:
        raise ValueError(
            f"shape mismatch: host data of shape {np.shape(value)} cannot be copied "
            f"into an array of shape {shape}"
        ) from None


def to_device(x: Any, value: Any, stream: Any, refuse: str | None = None) -> None:
    """Copy host data ``value`` into ``x`` (broadcast, cast within its kind).

    ``refuse`` is why the copy may not be captured (None: it may, as a snapshot).
    """
    host = check_host_data(value, x.dtype, x.shape)
    if x.size == 0:
        return
    host = np.ascontiguousarray(host)
    device = x.device
    target = x if x.is_contiguous else scratch(device, x.shape, x.dtype, stream)
    if stream._recording is not None and refuse is None:
        # a graph re-reads its source on every replay: snapshot the data now
        host = stage(device, host)
    # from pageable memory the driver stages the bytes before returning, so
    # ``host`` may be freed as soon as the call is done
    backend = device.backend
    copy = Copy(target.ptr, host.ctypes.data, host.nbytes, "htod")
    submit(stream, Work("memcpy", backend.memcpy, copy, (), (target,), (host,), refuse=refuse))
    if stream._recording is None:  # (pinned memory, a HostSlot's array: read when the copy runs)
        hold(host, stream)
    if target is not x:
        copy_view(x, target, stream)


def _give_back(device: Any, done: Any, buf: np.ndarray) -> None:
    device.backend.synchronize(done._raw)
    device.pinned.give(buf)


class PendingCopy:
    """A device-to-host copy running on the device's copy stream.

    The copy starts after the work queued so far on the array's stream; that
    stream does not wait for it. :meth:`result` waits for this copy only. The
    source memory is kept from reuse until the copy has finished; a handle
    dropped unread gives its pinned buffer back once no capture is active.

    Made by :meth:`DeviceArray.get_async`; ``PendingCopy(x, stream)`` is the same.

    Raises
    ------
    TypeError
        If ``x`` is not a cudagraphs DeviceArray, or ``stream`` not a Stream.
    ValueError
        If ``stream`` is on another device.
    """

    def __init__(self, x: Any, stream: Any = None) -> None:
        if not hasattr(x, "_view_spec") or not hasattr(x, "_block"):
            raise TypeError(f"PendingCopy: x must be a cudagraphs DeviceArray, got {type(x).__name__}")
        device = x.device
        stream = resolve_stream(stream, device)
        _recording.forbid(device, stream, "DeviceArray.get_async() (a copy to the host)", hint=_HOST_HINT)
        src = x if x.is_contiguous else _contiguous(x, stream)
        self.shape = x.shape
        self.dtype = x.dtype
        self._src = src
        self._result: np.ndarray | None = None
        self._buf = device.pinned.take(src.nbytes)
        copy_stream = device.copy_stream
        copy_stream.wait(stream)
        if src.nbytes:
            backend = device.backend
            copy = Copy(self._buf.ctypes.data, src.ptr, src.nbytes, "dtoh")
            submit(copy_stream, Work("memcpy", backend.memcpy, copy, (src,), (self._buf,)))
        src._block.use_on(copy_stream)
        self._done = copy_stream.record()
        self._finalizer = weakref.finalize(
            self, _recording.later, device, _give_back, device, self._done, self._buf
        )

    def done(self) -> bool:
        """Whether the copy has finished (never blocks)."""
        return self._result is not None or self._done.query()

    def result(self) -> np.ndarray:
        """Wait for the copy and return the data as a new numpy array."""
        if self._result is None:
            self._done.synchronize()
            self._result = self._buf[: self._src.nbytes].view(self.dtype).reshape(self.shape).copy()
            self._finalizer.detach()
            self._src._block.device.pinned.give(self._buf)
            self._src = None
        return self._result
