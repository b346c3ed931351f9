"""Devices, streams, events, and the current stream of each thread.

:class:`Device` is the one canonical client of a GPU (or simulated GPU):
``Device(0)`` returns the same object every time, from any thread. It owns a
default compute stream, a copy stream, the caching allocator, a pinned-host
staging cache and the compiled-kernel cache.

The *current stream* is per thread (a context variable): ``with stream:``
makes ``stream`` current for the code inside the block, in this thread only,
as in PyTorch; work that names no stream goes to the current stream of its
device, which is the device's default stream unless a ``with`` says
otherwise. No code swaps a stream for the whole process.
"""

from __future__ import annotations

import contextvars
import operator
import threading
import weakref
from typing import Any, ClassVar, Protocol

try:
    import cython
except ImportError:  # (run as Python where Cython is not installed: nothing is compiled)
    from types import SimpleNamespace

    cython = SimpleNamespace(compiled=False)

from . import _recording, backends
from ._allocator import CachingAllocator, device_rule
from ._config import settings
from ._errors import CaptureError
from ._fields import DeviceFields, StreamFields
from ._host import PinnedCache
from .backends.base import Backend, DeviceProperties

__all__ = [
    "Device",
    "Event",
    "Stream",
    "StreamLike",
    "as_device",
    "as_stream",
    "current_device",
    "current_stream",
    "device_count",
    "enable_peer_access",
    "resolve_stream",
]

_CURRENT: contextvars.ContextVar[tuple[Stream, ...]] = contextvars.ContextVar(
    "cudagraphs_current_streams", default=()
)
_CURRENT_VAR = _CURRENT  # (the same, for the hot path: compiled, a C global, no name lookup)


class StreamLike(Protocol):
    """Another library's stream: any object with ``__cuda_stream__`` (PyTorch's, CuPy's, cuda.core's).

    Every ``stream=`` of cudagraphs takes one (see :func:`as_stream`).
    """

    def __cuda_stream__(self) -> tuple[int, int]:
        """``(0, handle)``: the protocol's version and the driver stream's address."""
        ...


class Stream(StreamFields):
    """A stream of a device: work on it runs in order.

    Streams made by :meth:`Device.create_stream` are owned and destroyed by
    :meth:`close` (or when garbage collected); a device's built-in compute and
    copy streams live as long as the process. ``with stream:`` makes the
    stream the current one of this thread for the block (it does not close it).

    Attributes
    ----------
    device : Device
        The device the stream belongs to.
    handle : int
        The driver's ``CUstream`` value (a fake address on ``sim``), for
        third-party libraries; also exposed through ``__cuda_stream__``.

    Notes
    -----
    Another library's stream (any object with ``__cuda_stream__``) passed as
    ``stream=`` is wrapped once into a Stream that does not own it (see
    :func:`as_stream`): that Stream keeps the other library's object alive,
    so its driver stream outlives every use of the wrapper.
    """

    __slots__ = ("_foreign",)  # (the rest of its fields: StreamFields')
    device: Device

    def __init__(self, device: Device, raw: Any, owned: bool) -> None:
        if not isinstance(device, Device):
            raise TypeError(f"Stream: device must be a cudagraphs Device, got {type(device).__name__}")
        handle = int(raw)
        if not 0 <= handle < 2**64:
            raise ValueError(f"Stream: raw must be a driver stream handle (64 bits), got {handle}")
        if owned and (
            handle in _SPECIAL_STREAMS or any(int(s._raw) == handle for s in _builtin_streams(device))
        ):
            raise ValueError(
                f"Stream: stream 0x{handle:x} is a built-in stream of {device}, which lives as long "
                "as the process: owned=True would destroy it when collected; make new streams with "
                "device.create_stream()"
            )
        self.device = device
        self._raw = raw
        self.handle = handle
        self._recording: _recording.Recording | None = None
        self._tokens: list[contextvars.Token[tuple[Stream, ...]]] = []
        self._foreign: object = None  # (another library's stream object this one wraps)
        self._finalizer = (
            weakref.finalize(self, _recording.later, device, _destroy_stream, device.backend, raw)
            if owned
            else None
        )
        device._streams[handle] = self  # (the Stream of this handle now: as_stream finds it)

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
        _recording.forbid(self.device, self, "Stream.synchronize()")
        self.device.backend.synchronize(self._live())
        _recording.drain()

    def query(self) -> bool:
        """Whether all work queued on the stream has finished (never blocks).

        Raises
        ------
        CaptureError
            While this stream is being captured.
        """
        if self._recording is not None:
            self._recording.fail("Stream.query() cannot be recorded in a graph")
        return self.device.backend.synchronize(self._live(), block=False)

    def wait(self, other: Any) -> None:
        """Make later work on this stream wait for ``other``.

        ``other`` is an :class:`Event` (waits for the work it recorded) or a
        stream (waits for the work queued on it so far): a :class:`Stream`
        or another library's (any object with ``__cuda_stream__``).
        """
        if not isinstance(other, (Event, Stream)) and hasattr(other, "__cuda_stream__"):
            other = as_stream(other, self.device)
        if isinstance(other, Stream):
            other = other.record()
        if not isinstance(other, Event):
            raise TypeError(
                f"Stream.wait takes an Event or a stream (a Stream, or an object with "
                f"__cuda_stream__), got {type(other).__name__}"
            )
        backend, event = self.device.backend, other._raw
        rec = other._rec
        fork = rec if rec is not None and rec.active and self._recording is None else None
        if fork is not None and fork.thread != threading.get_ident():
            raise CaptureError(
                f"Stream.wait at {_recording.user_line()} on an event that thread {fork.thread} "
                "recorded in its capture would fork this stream into that capture; wait from "
                "the capturing thread"
            )
        _recording.submit(
            self._check_open(),
            _recording.Work("", lambda raw, _: backend.stream_wait_event(raw, event), keep=(other,)),
        )
        if fork is not None:  # the driver forked this stream into the capture: recorded there
            fork.join(self)

    def record(self, event: Event | None = None) -> Event:
        """Record ``event`` (a new one by default) at this point of the stream.

        Raises
        ------
        TypeError
            If ``event`` is not an :class:`Event`.
        """
        if event is None:
            event = Event(self.device)
        elif not isinstance(event, Event):
            raise TypeError(f"Stream.record: event must be an Event or None, got {type(event).__name__}")
        event.record(self)
        return event

    def close(self) -> None:
        """Wait for an owned stream's work, then destroy it.

        Idempotent; built-in streams ignore it. While a capture is active on
        the device the destruction is deferred until none is; while a
        release in another thread uses the stream (it found it open), until
        that release is done.

        Raises
        ------
        CaptureError
            If the stream itself is being captured: end the capture first.
        """
        if self._recording is not None:
            raise CaptureError(
                f"Stream.close() called at {_recording.user_line()} on stream "
                f"0x{self.handle:x} while it is being captured: end the capture first"
            )
        finalizer = self._finalizer
        with _recording._lock:  # (one step for _recording.mark: an event recorded before, or none)
            closing = finalizer is not None and finalizer.detach() is not None
            if closing:  # (and for releases: its work is not waited for until it is destroyed)
                _recording.UNFINISHED.add(id(self._raw))
        if closing:
            _recording.release(self.device, _destroy_stream, self.device.backend, self._raw)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` destroyed (or is about to destroy) the stream."""
        return _closed(self)

    def _live(self) -> Any:
        return _live(self)

    def _check_open(self) -> Stream:
        self._live()
        return self

    def __enter__(self) -> Stream:
        self._tokens.append(_CURRENT.set((*_CURRENT.get(), self)))
        return self

    def __exit__(self, *exc: object) -> None:
        _CURRENT.reset(self._tokens.pop())

    def __repr__(self) -> str:
        state = " closed" if self.closed else ""
        return f"<cudagraphs.Stream 0x{self.handle:x} on {self.device}{state}>"


# the NULL, legacy and per-thread default streams: handles no Stream may own
_SPECIAL_STREAMS = frozenset({0, 1, 2})


def _builtin_streams(device: Device) -> list[Stream]:
    """The streams of ``device`` that no Stream may own (empty while the device is being set up).

    (Not other libraries' streams wrapped by ``external_stream``: their owner
    may destroy one, and the driver give its handle to a stream we create.)
    """
    fixed = [getattr(device, "stream", None), getattr(device, "copy_stream", None)]
    return [s for s in fixed if s is not None]


def _destroy_stream(backend: Backend, raw: Any) -> None:
    # finish the stream's work first: the allocator keys cached blocks by
    # stream handle, and the driver may hand the same handle to a new stream.
    # A release that found the stream open (in another thread) may still use
    # it: then it is destroyed when that release is done
    backend.synchronize(raw)
    with _recording._lock:
        _recording.UNFINISHED.discard(id(raw))
    _recording.when_unheld(raw, backend.destroy, raw)


class Event:
    """A marker in a stream's work, for ordering and timing.

    Parameters
    ----------
    device : Device or int, optional
        Default: the current device.
    timing : bool
        Whether :meth:`elapsed_ms` may be used (timing events cost more).
    """

    __slots__ = ("__weakref__", "_finalizer", "_raw", "_rec", "device", "timing")

    def __init__(self, device: Device | int | None = None, timing: bool = False) -> None:
        self.device = as_device(device)
        self.timing = bool(timing)
        self._raw = self.device.backend.event_create(self.device.index, self.timing)
        self._rec: _recording.Recording | None = None  # the capture it was last recorded in
        self._finalizer = weakref.finalize(
            self, _recording.later, self.device, self.device.backend.destroy, self._raw
        )

    def record(self, stream: Stream | None = None) -> Event:
        """Record the event on ``stream`` (default: this thread's current stream)."""
        stream = resolve_stream(stream, self.device)
        backend, raw = self.device.backend, self._raw
        _recording.submit(
            stream._check_open(), _recording.Work("", lambda s, _: backend.event_record(raw, s), keep=(self,))
        )
        self._rec = stream._recording
        return self

    def synchronize(self) -> None:
        """Block the host until the recorded work has finished."""
        _recording.forbid(self.device, None, "Event.synchronize()")
        self.device.backend.synchronize(self._raw)

    def query(self) -> bool:
        """Whether the recorded work has finished (never blocks)."""
        return self.device.backend.synchronize(self._raw, block=False)

    def elapsed_ms(self, end: Event) -> float:
        """Milliseconds between this event and ``end`` (both timing events)."""
        if not isinstance(end, Event):
            raise TypeError(f"elapsed_ms: end must be a cudagraphs Event, got {type(end).__name__}")
        if not (self.timing and end.timing):
            raise ValueError("elapsed_ms needs two events created with timing=True")
        return self.device.backend.event_elapsed_ms(self._raw, end._raw)

    def close(self) -> None:
        """Destroy the event (deferred while a capture is active). Idempotent."""
        if self._finalizer.alive:
            self._finalizer.detach()
            _recording.release(self.device, self.device.backend.destroy, self._raw)


class Device(DeviceFields):
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
    stream : Stream
        The default compute stream (see :func:`current_stream` for the one
        work goes to).
    copy_stream : Stream
        The stream used for pipelined device-to-host copies.
    allocator : CachingAllocator
    """

    _instances: ClassVar[dict[tuple[str, int], Device]] = {}
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
        if type(index) is not int:
            index = _index(index)
        if index < 0:
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

    def __init__(self, index: int = 0, backend: str | None = None) -> None:
        pass  # (``__new__`` returns the one, already set up, object of the device)

    def _setup(self, backend: Backend, index: int) -> None:
        backend.activate(index)
        self.index = index
        self.backend = backend
        self.properties = backend.device_properties(index)
        # every Stream of the device by handle, held weakly (Stream.__init__ enters itself), and
        # the wrappers of bare handles, held for the process's life (no object of theirs to keep)
        self._streams: weakref.WeakValueDictionary[int, Stream] = weakref.WeakValueDictionary()
        self._external: dict[int, Stream] = {}
        self.stream = Stream(self, backend.stream_create(index), owned=False)
        self.copy_stream = Stream(self, backend.stream_create(index), owned=False)
        backend.mem_pool(index, release_threshold=settings().pool_release_threshold_mb << 20)
        self.allocator = CachingAllocator(self)
        self.pinned = PinnedCache(self)
        self.kernels = {}
        self._spares: list[Stream] = []
        self._peers: set[int] = set()  # indices of the devices whose memory this one reaches

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

    @property
    def captures(self) -> list[Any]:
        """The captures in progress on this device."""
        return _recording.active(self)

    def synchronize(self) -> None:
        """Block the host until all work on the device has finished.

        Raises
        ------
        CaptureError
            While any capture is active on the device (the driver refuses).
        """
        _recording.forbid(self, None, "Device.synchronize()", device_wide=True)
        self.backend.synchronize(self.index)
        _recording.drain()

    def create_stream(self) -> Stream:
        """A new owned stream (non-blocking with respect to the legacy stream)."""
        return Stream(self, self.backend.stream_create(self.index), owned=True)

    def external_stream(self, stream: Any) -> Stream:
        """A Stream for a stream another library made (not owned: never destroyed here).

        ``stream`` is the driver handle (an int) or an object with
        ``__cuda_stream__`` (a ``torch.cuda.Stream``, a ``cupy.cuda.Stream``,
        a ``cuda.core`` Stream), as :func:`as_stream` takes it; the same
        handle gives the same Stream object while that object lives. For a
        bare handle the other library must keep its stream alive as long as
        the Stream is used (the Stream is kept for the process's life); for an
        object, the Stream keeps the object alive.

        Raises
        ------
        TypeError
            For anything else, or a broken ``__cuda_stream__``.
        ValueError
            For a stream of another device.
        """
        if type(stream) is not int:
            return resolve_stream(stream, self)
        found = self._external.get(stream)
        if found is not None and not _closed(found):  # (a graphed call of tensors asks each call)
            return found
        if not 0 <= stream < 2**64:
            raise ValueError(f"external_stream: a stream handle is 64 bits, got {stream}")
        return resolve_stream(_of_handle(stream, None, self), self)

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
        return self.backend.mem_pool(self.index)

    def current_stream(self) -> Stream:
        """The current stream of this thread on this device (see :func:`current_stream`)."""
        return _current_stream_of(self)

    # peers ------------------------------------------------------------------
    def _other(self, other: Any, what: str) -> Device:
        if not isinstance(other, Device):
            raise TypeError(f"{what} takes a cudagraphs Device, got {type(other).__name__}")
        if other.backend is not self.backend:
            raise ValueError(f"{what}: {other} is a device of another backend than {self}")
        return other

    def can_access_peer(self, other: Device) -> bool:
        """Whether this device can be given access to ``other``'s memory (a peer path exists).

        False for the device itself (it needs none). Copies between devices
        without a peer path still work eagerly: the driver stages them
        through the host (:func:`cudagraphs.ops.copy`).
        """
        other = self._other(other, "can_access_peer")
        return other.index in self.backend.device_properties(self.index).peers

    def enable_peer_access(self, other: Device) -> None:
        """Let this device's kernels and copies reach ``other``'s memory; idempotent.

        Covers ``other``'s allocations and its memory pool (where cudagraphs
        arrays live). :func:`cudagraphs.ops.copy` between two devices enables
        it both ways by itself; kernels that dereference another device's
        pointers need it explicitly (or :func:`enable_peer_access`).

        Raises
        ------
        TypeError, ValueError
            If ``other`` is not a Device of this backend, is this device, or
            has no peer path from it (:meth:`can_access_peer`).
        CaptureError
            While a capture on either device forbids this thread such a call
            (the driver would invalidate it): enable peer access before
            capturing. The capture is left as it was.
        """
        other = self._other(other, "enable_peer_access")
        if other.index in self._peers:
            return
        if other is self:
            raise ValueError(f"enable_peer_access: {self} reaches its own memory already")
        if not self.can_access_peer(other):
            raise ValueError(
                f"enable_peer_access: {self} has no peer path to {other} (the hardware "
                "offers none); copies between them are staged through the host by "
                "cudagraphs.ops.copy, kernels cannot read across"
            )
        _refuse_during_capture((self, other), "enable_peer_access")
        self.backend.activate(self.index, peer=other.index)
        self._peers.add(other.index)

    def _peer_path(self, other: Device) -> bool:
        """Whether copies between this device and ``other`` go over a peer path.

        Enables peer access both ways on first use where the hardware has a
        path (refused during a capture, as :meth:`enable_peer_access`); the
        repeat is two set lookups, without asking the backend.
        """
        if other.index in self._peers and self.index in other._peers:
            return True
        if not self.can_access_peer(other):
            return False
        self.enable_peer_access(other)
        other.enable_peer_access(self)
        return True

    @property
    def peers(self) -> list[Device]:
        """The devices whose memory this one reaches now (peer access enabled)."""
        return [Device(i, self.backend.name) for i in sorted(self._peers)]

    def is_capturing(self, stream: Stream | None = None) -> bool:
        """Whether ``stream`` (default: the current stream) is being captured."""
        stream = resolve_stream(stream, self)
        return stream._recording is not None

    def __reduce__(self) -> tuple[type, tuple[int, str]]:
        return (Device, (self.index, self.backend.name))

    def __repr__(self) -> str:
        return f"<cudagraphs.Device {self.index} ({self.backend.name}: {self.name})>"


def _refuse_during_capture(devices: tuple[Device, ...], what: str) -> None:
    """Raise CaptureError, before any driver call, if an unsafe call would break a capture.

    Unlike :func:`_recording.forbid` the capture is left valid: cudagraphs
    refuses the call itself instead of letting the driver invalidate it.
    """
    me = threading.get_ident()
    for dev in devices:
        for rec in _recording.active(dev):
            if rec.mode == "global" or (rec.mode == "thread_local" and rec.thread == me):
                raise CaptureError(
                    f"{what} during the capture of stream 0x{rec.stream.handle:x} on {dev}: the "
                    f"driver refuses it while a {rec.mode} capture is active and would "
                    "invalidate the capture; call cg.enable_peer_access() before capturing"
                )


def device_count(backend: str | None = None) -> int:
    """How many devices ``backend`` (default: the configured or automatic one) has.

    On ``sim``, ``CUDAGRAPHS_SIM_DEVICES`` (default 1).
    """
    return int(backends.get_backend(backends.resolve_name(backend)).device_count())


def enable_peer_access(devices: list[Device] | None = None) -> list[tuple[int, int]]:
    """Enable peer access between every pair of ``devices`` that has a peer path.

    Parameters
    ----------
    devices : list of Device, optional
        Default: every device of the current backend.

    Returns
    -------
    list of (int, int)
        The (device, peer) index pairs now enabled; pairs without a peer path
        are left out (copies between them are staged through the host).

    Raises
    ------
    TypeError
        If an entry is not a Device.
    CaptureError
        During a capture that such a call would break (see
        :meth:`Device.enable_peer_access`).
    """
    if devices is None:
        devices = [Device(i) for i in range(device_count())]
    for dev in devices:
        if not isinstance(dev, Device):
            raise TypeError(f"enable_peer_access takes Devices, got {type(dev).__name__}")
    enabled = []
    for dev in devices:
        for other in devices:
            if other is not dev and dev.can_access_peer(other):
                dev.enable_peer_access(other)
                enabled.append((dev.index, other.index))
    return enabled


if not cython.compiled:  # (compiled, _device.pxd's: the C API's, without a method call)

    def _context_get(var: contextvars.ContextVar[tuple[Stream, ...]]) -> tuple[Stream, ...]:
        """``var.get()``."""
        return var.get()


def _closed(stream: Stream) -> bool:
    """``stream.closed`` (compiled, a C function)."""
    finalizer = stream._finalizer
    return finalizer is not None and not finalizer.alive


def _live(stream: Stream) -> Any:
    """``stream``'s driver handle, unless it was closed (``Stream._live``; compiled, a C function)."""
    if _closed(stream):
        raise ValueError("this stream was closed; create a new one with Device.create_stream()")
    return stream._raw


def _current_stream_of(device: Device) -> Stream:
    """The current stream of this thread on ``device`` (``Device.current_stream``)."""
    current = _context_get(_CURRENT_VAR)
    if current:
        for stream in reversed(current):
            if stream.device is device:
                return stream
    return device.stream


def current_device() -> Device:
    """The device new arrays go to by default: device 0 of the current backend."""
    current = settings()
    known = _DEFAULT_DEVICE  # the answer for the settings in force (asked by every op)
    if known[0] is not current:
        dev = Device._instances.get((backends.resolve_name(None), 0)) or Device(0)
        known = _DEFAULT_DEVICE[:] = [current, dev]
    return known[1]  # type: ignore[no-any-return]


_DEFAULT_DEVICE: list[Any] = [None, None]  # [settings, device 0 of their backend]


def _index(index: Any) -> int:
    """``index`` as a device ordinal (an int or a numpy integer, never a bool), else TypeError."""
    if isinstance(index, bool) or not hasattr(type(index), "__index__"):
        raise TypeError(f"a device index is an int, got {type(index).__name__}: {index!r}")
    return operator.index(index)


def as_device(device: Device | int | None, what: str = "device") -> Device:
    """The Device that a ``device=`` argument names: the one rule of every such argument.

    Parameters
    ----------
    device : Device, int or None
        A Device, a device index (``0``; a numpy integer too), or None for
        :func:`current_device`.
    what : str
        The argument's name, for the error.

    Raises
    ------
    TypeError
        For anything else (a bool, a string, a float, ...).
    ValueError
        For a negative index.
    BackendUnavailableError
        For an index the backend has no device for.
    """
    if device is None:
        return current_device()
    if isinstance(device, Device):
        return device
    if isinstance(device, bool) or not hasattr(type(device), "__index__"):
        raise TypeError(
            f"{what} must be a cudagraphs Device, a device index (int) or None, got "
            f"{type(device).__name__}: {device!r}"
        )
    return Device(operator.index(device))


device_rule(as_device)  # (the allocator, a layer below, takes device= by the same rule)


def current_stream(device: Device | int | None = None) -> Stream:
    """The current stream of this thread on ``device`` (default: the current device).

    ``with stream:`` makes a stream current for the block; otherwise it is the
    device's default stream.
    """
    return as_device(device).current_stream()


def resolve_stream(stream: Any, device: Device) -> Stream:
    """``stream`` (see :func:`as_stream`) checked to be a Stream of ``device``, or the current one if None.

    Raises
    ------
    TypeError
        If ``stream`` is neither a cudagraphs Stream nor an object with
        ``__cuda_stream__``, or its ``__cuda_stream__`` is broken.
    ValueError
        If it belongs to another device.
    """
    if stream is None:
        return device.current_stream()
    if type(stream) is not Stream:  # (the hot paths pass a Stream: one comparison)
        stream = _wrap(stream, device)
    if stream.device is not device:
        raise ValueError(f"stream {stream} is on {stream.device}, the work on {device}")
    return stream  # type: ignore[no-any-return]


def as_stream(stream: Any, device: Device | int | None = None) -> Stream | None:
    """The Stream a ``stream=`` argument names: the one rule of every such argument.

    Parameters
    ----------
    stream : Stream, object with ``__cuda_stream__``, or None
        A cudagraphs Stream (returned as it is), None (returned as it is:
        the caller's default), or another library's stream: any object with
        ``__cuda_stream__`` (a ``torch.cuda.Stream``, ``cupy.cuda.Stream``,
        ``cuda.core`` Stream), whose method returns ``(0, handle)``.
    device : Device, int or None
        The device of the work, whose backend is asked which device the
        stream belongs to (default: the current device). The Stream returned
        is of the stream's own device, which may be another one.

    Returns
    -------
    Stream or None
        For another library's stream, the Stream of its handle: a Stream of
        ours for a handle of ours, else a wrapper that does not own the
        driver stream (never destroys it) and keeps ``stream`` alive. The
        same handle gives the same Stream while that Stream lives, so a
        capture begun through the other library's object is seen by work
        issued through it, through the wrapper, or through the Stream itself.

    Raises
    ------
    TypeError
        For anything else, or a ``__cuda_stream__`` that does not return
        ``(0, handle)`` with an int handle.
    CudaError
        If the driver does not know the handle (``CUDA_ERROR_INVALID_HANDLE``
        or ``CUDA_ERROR_INVALID_CONTEXT``).
    """
    if stream is None or type(stream) is Stream:
        return stream
    return _wrap(stream, as_device(device))


def _wrap(stream: Any, device: Device) -> Stream:
    """The Stream of ``stream``, an object that is not a Stream (see :func:`as_stream`)."""
    if isinstance(stream, Stream):  # (a subclass: its handle's Stream, as for any stream object)
        handle = stream.handle
    else:
        handle = _protocol_handle(stream)
        found = device._streams.get(handle)
        if found is not None and found._foreign is stream:  # (this object, wrapped: its device known)
            return found
    return _of_handle(handle, stream, device)


def _of_handle(handle: int, owner: Any, device: Device) -> Stream:
    """The Stream of driver stream ``handle``, of the device the backend says: made once per handle.

    ``owner`` is the other library's object the wrapper keeps alive, or None
    for a bare handle (:meth:`Device.external_stream`), whose wrapper is kept
    for the process's life, there being no object to keep. ``device`` is the
    work's: its backend is asked; the NULL, legacy and per-thread handles
    name a default stream of whichever device is current, so the work's.
    """
    on = device
    if handle not in _SPECIAL_STREAMS:
        ordinal = device.backend.stream_device(handle)
        if ordinal != device.index:
            on = Device(ordinal, device.backend.name)
    with Device._lock:
        found = on._streams.get(handle)
        if found is None or _closed(found):  # (a closed Stream's handle may be the driver's again)
            found = Stream(on, on.backend.stream_create(on.index, address=handle), owned=False)
            found._foreign = owner
        if owner is None:
            on._external[handle] = found
    return found


def _protocol_handle(stream: Any) -> int:
    """The handle an object's ``__cuda_stream__`` gives, checked (TypeError naming what is expected)."""
    protocol = getattr(stream, "__cuda_stream__", None)
    if protocol is None:
        raise TypeError(
            f"stream must be a cudagraphs Stream (device.create_stream()) or a CUDA stream object "
            f"of another library (any object with __cuda_stream__, such as torch.cuda.Stream or "
            f"cupy.cuda.Stream), got {type(stream).__name__}: {stream!r}"
        )
    what = f"{type(stream).__name__}.__cuda_stream__()"
    if not callable(protocol):
        raise TypeError(f"{what} must be a method returning (0, handle), got a {type(protocol).__name__}")
    got = protocol()
    if type(got) is not tuple or len(got) != 2:
        raise TypeError(f"{what} must return a tuple (version 0, handle), got {got!r}")
    version, handle = got
    if isinstance(version, bool) or not isinstance(version, int) or version != 0:
        raise TypeError(f"{what} returned protocol version {version!r}: cudagraphs speaks version 0")
    if isinstance(handle, bool) or not isinstance(handle, int):
        raise TypeError(
            f"{what} must return an int handle (the address of a cudaStream_t), got "
            f"{type(handle).__name__}: {handle!r}"
        )
    if not 0 <= handle < 2**64:
        raise TypeError(f"{what} returned handle {handle}, not a 64-bit address")
    return int(handle)
