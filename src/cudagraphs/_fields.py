"""The fields of a Stream, a Device and an array, in the layer below everything that reads them.

:class:`cudagraphs.Stream`, :class:`cudagraphs.Device` (``_device``) and
:class:`cudagraphs.DeviceArray` (``_array``) derive from
:class:`StreamFields`, :class:`DeviceFields` and :class:`ArrayFields`: the
allocator, the array constructors, kernel launches, the capture machinery
and the C part read these fields (a stream's device, driver handle and
capture; a device's default stream, allocator, backend and loaded kernels;
an array's address, device, dtype and layout) on every allocation and
launch. Compiled
(``_fields.pxd``), they are the fields of extension types that compiled code
reads directly and whose offsets the C part is given; as plain Python,
``__slots__``.
"""

from __future__ import annotations

from typing import Any

try:
    import cython
except ImportError:  # (run as Python where Cython is not installed: nothing is compiled)
    from types import SimpleNamespace

    cython = SimpleNamespace(compiled=False)

__all__ = ["ArrayFields", "DeviceFields", "StreamFields"]


class StreamFields:
    """A Stream's fields (see ``_device.Stream``, which sets them)."""

    # (compiled, an extension type whose fields _fields.pxd declares)
    __slots__ = ("__weakref__", "_finalizer", "_raw", "_recording", "_tokens", "device", "handle")

    device: Any  # (a _device.Device, a layer above)
    handle: int
    _raw: Any
    _recording: Any  # (a _recording.Recording while the stream is captured, else None)
    _finalizer: Any
    _tokens: list[Any]


class DeviceFields:
    """The fields of a Device that hot paths read (see ``_device.Device``, which sets them)."""

    # (compiled, an extension type whose fields _fields.pxd declares; a Device keeps the rest
    # in its __dict__)
    __slots__ = ("__dict__", "__weakref__", "allocator", "backend", "kernels", "stream")

    stream: Any  # (a _device.Stream, a layer above)
    allocator: Any  # (a _allocator.CachingAllocator, a layer above)
    backend: Any  # (a backends.base.Backend)
    kernels: dict[Any, Any]  # (a _kernel.Kernel's loaded kernel on the device, by kernel)


class ArrayFields:
    """A DeviceArray's fields (see ``_array.DeviceArray``, whose constructor sets them).

    Its address is read through ``DeviceArray.ptr`` (a graph's output checks
    it is still valid there), never as ``_ptr`` by code outside ``_array``.
    """

    # (compiled, an extension type whose fields _fields.pxd declares)
    __slots__ = (
        "__weakref__",
        "_arg",
        "_block",
        "_ptr",
        "device",
        "dtype",
        "is_contiguous",
        "shape",
        "size",
        "strides",
    )

    _block: Any  # (an _allocator.Block)
    _ptr: int
    _arg: Any  # (its backends.base.ArrayArg, made once)
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: Any  # (a numpy dtype)
    device: Any  # (a _device.Device)
    is_contiguous: bool
    size: int
