"""Values that change between replays: DeviceScalar and HostSlot.

A graph bakes in addresses and by-value kernel arguments. To change a value
between replays without re-capturing, keep it in memory the graph reads:

* :class:`DeviceScalar` lives on the device; ``set()`` queues a copy on the
  stream, so it lands before the next replay queued after it;
* :class:`HostSlot` is pinned host memory; a copy from or to it recorded in a
  graph moves its *current* contents on every replay.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._array import DeviceArray, Shape, _prod, _shape, empty
from ._device import Device, Stream, StreamLike, as_device, resolve_stream
from ._dtypes import normalize_dtype
from ._fields import ArrayFields
from ._host import hold, pinned_array
from ._recording import Work, submit
from ._transfer import to_device
from .backends.base import Copy

__all__ = ["DeviceScalar", "HostSlot"]

_MAX_HOST_BYTES = 2**63 - 1  # what a size_t of the driver's cuMemHostAlloc (and numpy) can hold

_FROZEN = (
    "DeviceScalar.set() inside a capture would freeze the value into the graph: "
    "set it outside the capture, before g.replay()"
)


def _check_value(value: Any, dtype: np.dtype, what: str) -> np.ndarray:
    if isinstance(value, (bool, np.bool_)) and dtype.kind != "b":
        raise TypeError(f"{what}: got a bool for a {dtype} scalar")
    if not isinstance(value, (int, float, complex, bool, np.generic)):
        raise TypeError(f"{what} takes a number, got {type(value).__name__}")
    if dtype.kind in "iu" and isinstance(value, (float, np.floating)) and not float(value).is_integer():
        raise TypeError(f"{what}: {value!r} is not an integer but the scalar is {dtype}")
    if dtype.kind in "iu" and not np.iinfo(dtype).min <= int(value) <= np.iinfo(dtype).max:  # type: ignore[arg-type]
        raise ValueError(f"{what}: {value!r} does not fit in {dtype}")
    try:
        return np.array(value, dtype=dtype)
    except (OverflowError, ValueError, TypeError) as exc:
        raise ValueError(f"{what}: {value!r} does not fit in {dtype}: {exc}") from None


class DeviceScalar(DeviceArray):
    """One value in device memory, usable wherever a one-element array is.

    Parameters
    ----------
    value : number
        The initial value.
    dtype : dtype-like
        Default float32.
    device : Device or int, optional

    Notes
    -----
    Pass it to kernels and ops (``cg.ops.axpy(s, x, y)``): captured work
    reads it on every replay, so ``s.set(v)`` before ``g.replay()`` changes
    what the graph computes. ``set`` is stream-ordered and never waits.
    """

    __slots__ = ()

    def __init__(self, value: Any, dtype: Any = "float32", *, device: Device | int | None = None) -> None:
        a = empty((), dtype, device=device)
        for name in ArrayFields.__slots__:  # (its fields, set in place: this is __init__)
            if name != "__weakref__":
                setattr(self, name, getattr(a, name))
        self.set(value)

    def set(self, value: Any, *, stream: Stream | StreamLike | None = None) -> DeviceScalar:
        """Queue an update of the value on ``stream`` (default: the current stream).

        Raises
        ------
        CaptureError
            Inside a capture of that stream: the value would be frozen into
            the graph. Set it before replaying instead.
        TypeError, ValueError
            For a value that is not a number of the scalar's kind and range.
        """
        host = _check_value(value, self.dtype, "DeviceScalar.set")
        to_device(self, host, resolve_stream(stream, self.device), refuse=_FROZEN)
        return self

    def get(self, *, stream: Stream | StreamLike | None = None) -> Any:
        """The value, after the work queued on ``stream``, as a Python number."""
        return DeviceArray.get(self, stream=stream).item()

    def __repr__(self) -> str:
        return f"<cudagraphs.DeviceScalar {self.dtype} on {self.device.backend.name}:{self.device.index}>"


class HostSlot:
    """Pinned host memory that graphs copy from or into on every replay.

    Parameters
    ----------
    shape : int or sequence of int
    dtype : dtype-like
        Default float64.
    device : Device or int, optional

    Attributes
    ----------
    array : numpy.ndarray
        The slot's memory: write inputs here before a replay, read outputs
        after synchronizing. The memory lives as long as this array (or a
        view of it) or a graph that copies from or into the slot does.
    """

    _host_slot = True  # recognised by DeviceArray.set (below this layer)

    def __init__(self, shape: Shape, dtype: Any = "float64", *, device: Device | int | None = None) -> None:
        dims = _shape(shape)
        dt = normalize_dtype(dtype)
        dev = as_device(device)
        self.device = dev
        nbytes = _prod(dims) * dt.itemsize
        if nbytes > _MAX_HOST_BYTES:
            raise ValueError(
                f"HostSlot: shape {dims} of {dt} is {nbytes} bytes, more than any host can pin "
                f"(at most {_MAX_HOST_BYTES})"
            )
        self._bytes: np.ndarray | None = pinned_array(dev, nbytes)
        self._array: np.ndarray | None = self._bytes.view(dt).reshape(dims)
        self._shape, self._dtype = dims, dt

    @property
    def array(self) -> np.ndarray:
        """The slot's memory as a numpy array of its shape and dtype."""
        if self._array is None:
            raise ValueError("this HostSlot was closed")
        return self._array

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._bytes is None

    def _check(self, x: DeviceArray, stream: Stream | StreamLike | None, what: str) -> Stream:
        if not isinstance(x, DeviceArray):
            raise TypeError(f"HostSlot.{what} takes a DeviceArray, got {type(x).__name__}")
        if x.device is not self.device:
            raise ValueError(f"HostSlot.{what}: the array is on {x.device}, the slot on {self.device}")
        if x.shape != self.shape or x.dtype != self.dtype:
            raise ValueError(
                f"HostSlot.{what}: slot is {self.shape} {self.dtype}, array is {x.shape} {x.dtype}"
            )
        if not x.is_contiguous:
            raise ValueError(f"HostSlot.{what} needs a contiguous array; copy the view first")
        if self._bytes is None:
            raise ValueError("this HostSlot was closed")
        return resolve_stream(stream, x.device)

    def copy_to(self, x: DeviceArray, *, stream: Stream | StreamLike | None = None) -> DeviceArray:
        """Queue a copy of the slot's contents (as they are when it runs) into ``x``."""
        stream = self._check(x, stream, "copy_to")
        if x.nbytes:
            buf = self._bytes
            copy = Copy(x.ptr, buf.ctypes.data, x.nbytes, "htod")  # type: ignore[union-attr]
            backend = self.device.backend
            submit(stream, Work("memcpy", backend.memcpy, copy, (), (x,), (buf,)))
            if stream._recording is None:  # the slot may be dropped before the copy runs
                hold(buf, stream)  # type: ignore[arg-type]
        return x

    def copy_from(self, x: DeviceArray, *, stream: Stream | StreamLike | None = None) -> None:
        """Queue a copy of ``x`` into the slot; read ``array`` after synchronizing."""
        stream = self._check(x, stream, "copy_from")
        if x.nbytes:
            buf = self._bytes
            copy = Copy(buf.ctypes.data, x.ptr, x.nbytes, "dtoh")  # type: ignore[union-attr]
            backend = self.device.backend
            submit(stream, Work("memcpy", backend.memcpy, copy, (x,), (), (buf,)))
            if stream._recording is None:
                hold(buf, stream)  # type: ignore[arg-type]

    def close(self) -> None:
        """Give up this slot's hold on its pinned memory. Idempotent.

        The memory is freed once nothing uses it: graphs that copy from or
        into the slot, and views of ``array`` you kept, keep it alive.
        """
        self._bytes = None
        self._array = None

    def __repr__(self) -> str:
        state = " closed" if self.closed else ""
        return f"<cudagraphs.HostSlot shape={self.shape} dtype={self.dtype}{state}>"
