"""Devices, streams and events.

:class:`Device` is the one canonical client of a GPU (or simulated GPU):
``Device(0)`` returns the same object every time, from any thread. It owns a
compute stream, a copy stream, the caching allocator, a pinned-host staging
cache and the compiled-kernel cache.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any

from . import backends
from ._config import settings
from .backends.base import Backend, DeviceProperties

if TYPE_CHECKING:
    from ._allocator import CachingAllocator
    from ._host import PinnedCache

__all__ = ["Device", "Event", "Stream", "current_device"]


class Stream:
    """A stream of a device: work on it runs in order.

    Streams made by :meth:`Device.create_stream` are owned and destroyed by
    :meth:`close` (or when garbage collected); a device's built-in compute and
    copy streams live as long as the process.

    Attributes
    ----------
    device : Device
        The device the stream belongs to.
    handle : int
        The driver's ``CUstream`` value (a fake address on ``sim``), for
        third-party libraries; also exposed through ``__cuda_stream__``.
    """

    __slots__ = ("device", "_raw", "handle", "_finalizer", "__weakref__")

    def __init__(self, device: Device, raw: Any, owned: bool) -> None:
        self.device = device
        self._raw = raw
        self.handle = device.backend.stream_address(raw)
        self._finalizer = (
            weakref.finalize(self, _destroy_stream, device.backend, raw) if owned else None
        )

    def __cuda_stream__(self) -> tuple[int, int]:
        """The CUDA stream protocol (version 0, handle)."""
        return (0, self.handle)

    def synchronize(self) -> None:
        """Block the host until all work queued on the stream has finished.

        Raises
        ------
        CaptureError
            While this stream is captured, or a capture it would break is active.
        """
        if self.device.captures:
            _forbid(self.device, self, "Stream.synchronize()")
        self.device.backend.stream_synchronize(self._live())

    def query(self) -> bool:
        """Whether all work queued on the stream has finished (never blocks).

        Raises
        ------
        CaptureError
            While this stream is being captured.
        """
        if self.device.captures:
            _forbid(self.device, self, "Stream.query()", synchronizes=False)
        return self.device.backend.stream_query(self._live())

    def wait(self, other: Event | Stream) -> None:
        """Make later work on this stream wait for ``other``.

        ``other`` is an :class:`Event` (waits for the work it recorded) or a
        :class:`Stream` (waits for the work queued on it so far).
        """
        if isinstance(other, Stream):
            other = other.record()
        if not isinstance(other, Event):
            raise TypeError(f"Stream.wait takes an Event or a Stream, got {type(other).__name__}")
        self.device.backend.stream_wait_event(self._live(), other._raw)

    def record(self, event: Event | None = None) -> Event:
        """Record ``event`` (a new one by default) at this point of the stream."""
        event = event if event is not None else Event(self.device)
        event.record(self)
        return event

    def close(self) -> None:
        """Wait for an owned stream's work, then destroy it.

        Idempotent; built-in streams ignore it.
        """
        if self._finalizer is not None:
            self._finalizer()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` destroyed the stream."""
        return self._finalizer is not None and not self._finalizer.alive

    def _live(self) -> Any:
        if self.closed:
            raise ValueError("this stream was closed; create a new one with Device.create_stream()")
        return self._raw

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = " closed" if self.closed else ""
        return f"<cudagraphs.Stream 0x{self.handle:x} on {self.device}{state}>"


def _destroy_stream(backend: Backend, raw: Any) -> None:
    # finish the stream's work first: the allocator keys cached blocks by
    # stream handle, and the driver may hand the same handle to a new stream
    backend.stream_synchronize(raw)
    backend.stream_destroy(raw)


class Event:
    """A marker in a stream's work, for ordering and timing.

    Parameters
    ----------
    device : Device, optional
        Default: the current device.
    timing : bool
        Whether :meth:`elapsed_ms` may be used (timing events cost more).
    """

    __slots__ = ("device", "_raw", "timing", "_finalizer", "__weakref__")

    def __init__(self, device: Device | None = None, timing: bool = False) -> None:
        self.device = device if device is not None else current_device()
        self.timing = bool(timing)
        self._raw = self.device.backend.event_create(self.device.index, self.timing)
        self._finalizer = weakref.finalize(self, self.device.backend.event_destroy, self._raw)

    def record(self, stream: Stream | None = None) -> Event:
        """Record the event on ``stream`` (default: the device's compute stream)."""
        stream = stream if stream is not None else self.device.stream
        self.device.backend.event_record(self._raw, stream._live())
        return self

    def synchronize(self) -> None:
        """Block the host until the recorded work has finished."""
        if self.device.captures:
            _forbid(self.device, None, "Event.synchronize()")
        self.device.backend.event_synchronize(self._raw)

    def query(self) -> bool:
        """Whether the recorded work has finished (never blocks)."""
        if self.device.captures:
            _forbid(self.device, None, "Event.query()", synchronizes=False)
        return self.device.backend.event_query(self._raw)

    def elapsed_ms(self, end: Event) -> float:
        """Milliseconds between this event and ``end`` (both timing events)."""
        if not (self.timing and end.timing):
            raise ValueError("elapsed_ms needs two events created with timing=True")
        return self.device.backend.event_elapsed_ms(self._raw, end._raw)

    def close(self) -> None:
        """Destroy the event. Idempotent."""
        self._finalizer()


class Device:
    """The canonical client of one device of one backend.

    ``Device(i)`` returns the same object every time for the same index (and
    backend), from any thread.

    Parameters
    ----------
    index : int
        The device ordinal (default 0).
    backend : str, optional
        ``"cuda"`` or ``"sim"``; default: the configured or automatic one.

    Attributes
    ----------
    index : int
    backend : Backend
        The backend's primitives (internal; use the methods of this class).
    stream, copy_stream : Stream
        The compute stream (default for all work) and the stream used for
        pipelined device-to-host copies.
    allocator : CachingAllocator
    """

    _instances: dict[tuple[str, int], Device] = {}
    _lock = threading.Lock()

    index: int
    backend: Backend
    properties: DeviceProperties
    stream: Stream
    copy_stream: Stream
    allocator: CachingAllocator
    pinned: PinnedCache
    kernels: dict[object, object]

    def __new__(cls, index: int = 0, backend: str | None = None) -> Device:
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise ValueError(f"device index must be a non-negative int, got {index!r}")
        name = backends.resolve_name(backend)
        key = (name, index)
        dev = cls._instances.get(key)
        if dev is not None:
            return dev
        with cls._lock:
            dev = cls._instances.get(key)
            if dev is None:
                dev = super().__new__(cls)
                dev._setup(backends.get_backend(name), index)
                cls._instances[key] = dev
        return dev

    def _setup(self, backend: Backend, index: int) -> None:
        from ._allocator import CachingAllocator
        from ._host import PinnedCache

        backend.activate(index)
        self.index = index
        self.backend = backend
        self.properties = backend.device_properties(index)
        self.stream = Stream(self, backend.stream_create(index), owned=False)
        self.copy_stream = Stream(self, backend.stream_create(index), owned=False)
        backend.mem_set_release_threshold(index, settings().pool_release_threshold_mb << 20)
        self.allocator = CachingAllocator(self)
        self.pinned = PinnedCache(backend)
        self.kernels = {}
        self.captures: dict[int, Any] = {}  # stream handle -> Capture in progress
        self._spares: list[Stream] = []

    @property
    def name(self) -> str:
        """The device's product name."""
        return self.properties.name

    @property
    def compute_capability(self) -> tuple[int, int]:
        """(major, minor)."""
        return self.properties.compute_capability

    @property
    def total_memory(self) -> int:
        """Bytes of device memory."""
        return self.properties.total_memory

    @property
    def backend_name(self) -> str:
        """``"cuda"`` or ``"sim"``."""
        return self.backend.name

    def synchronize(self) -> None:
        """Block the host until all work on the device has finished."""
        if self.captures:
            _forbid(self, None, "Device.synchronize()")
        self.backend.device_synchronize(self.index)

    def create_stream(self) -> Stream:
        """A new owned stream (non-blocking with respect to the legacy stream)."""
        return Stream(self, self.backend.stream_create(self.index), owned=True)

    def spare_stream(self) -> Stream:
        """An idle owned stream from a small pool (for capturing graph bodies)."""
        with Device._lock:
            if self._spares:
                return self._spares.pop()
        return self.create_stream()

    def return_spare_stream(self, stream: Stream) -> None:
        """Give back a stream from :meth:`spare_stream`."""
        with Device._lock:
            self._spares.append(stream)

    def create_event(self, timing: bool = False) -> Event:
        """A new event on this device."""
        return Event(self, timing)

    def mem_info(self) -> tuple[int, int]:
        """(free, total) device memory in bytes, as the driver reports it."""
        return self.backend.mem_info(self.index)

    def is_capturing(self, stream: Stream | None = None) -> bool:
        """Whether cudagraphs is capturing ``stream`` (default: compute stream)."""
        stream = stream if stream is not None else self.stream
        return stream.handle in self.captures

    def __reduce__(self) -> tuple[type, tuple[int, str]]:
        return (Device, (self.index, self.backend.name))

    def __repr__(self) -> str:
        return f"<cudagraphs.Device {self.index} ({self.backend.name}: {self.name})>"


def _forbid(device: Device, stream: Stream | None, what: str, synchronizes: bool = True) -> None:
    from ._capture import forbid

    forbid(device, stream, what, synchronizes)


def current_device() -> Device:
    """The device new arrays go to by default: device 0 of the current backend."""
    dev = Device._instances.get((backends.resolve_name(None), 0))
    return dev if dev is not None else Device(0)
