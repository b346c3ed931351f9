"""DLPack export and import of device arrays (legacy ``dltensor`` capsules, via ctypes).

On export, the capsule owns a ``DLManagedTensor`` whose ``manager_ctx`` keeps the array
(and so its memory block) alive until the consumer calls the deleter, or until
the capsule is dropped unconsumed.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any, Protocol

import numpy as np

from ._config import compiled_part
from ._dtypes import dlpack_code, from_dlpack_code

__all__ = ["Exported", "Imported", "device_of", "export", "import_"]


class Exported(Protocol):
    """What export reads of an array (a DeviceArray: this module sits below arrays)."""

    @property
    def device(self) -> Any: ...
    @property
    def ptr(self) -> int: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def strides(self) -> tuple[int, ...]: ...
    @property
    def itemsize(self) -> int: ...
    @property
    def ndim(self) -> int: ...
    @property
    def dtype(self) -> np.dtype[Any]: ...


_KDL_CUDA = 2
_KDL_CPU = 1  # what sim arrays would be, were they exportable


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [
    ("dl_tensor", _DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", _Deleter),
]

_lock = threading.Lock()
_alive: dict[int, tuple[Any, ...]] = {}  # tensor address -> what the capsule keeps alive
_NAME = b"dltensor"
_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
# the destructor gets the dying capsule as a bare pointer: wrapping it in a
# py_object would resurrect an object whose reference count is already zero
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
# the same C function, taking the capsule as an object (for capsules we consume)
_pointer_of = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)
_USED = b"used_dltensor"


def _forget(address: int) -> None:
    with _lock:
        _alive.pop(address, None)


def _destroyed(capsule: int) -> None:
    """A capsule of ours dies: an unconsumed one still holds our tensor, which is freed here.

    (A consumer renames the capsule to "used_dltensor" and owns the deleter.)
    """
    if _api.PyCapsule_IsValid(capsule, _NAME):
        _forget(_api.PyCapsule_GetPointer(capsule, _NAME))


def _callbacks() -> tuple[Any, int]:
    """The tensor's deleter and the capsule's destructor, as the C functions other libraries call.

    They may be called while an exception is being raised in the thread that
    drops the other library's last reference; the C part's callbacks set it
    aside around :func:`_forget` and :func:`_destroyed`. Without the C part,
    ctypes callbacks call them (correct, except while such an exception is
    pending: then Python reports a SystemError and that exception is lost).
    """
    fast = compiled_part()
    if fast is not None and hasattr(fast, "dlpack_callbacks"):
        deleter, destructor = fast.dlpack_callbacks(_forget, _destroyed)
        return ctypes.cast(deleter, _Deleter), destructor
    keep = (
        _Deleter(lambda managed: _forget(ctypes.addressof(managed.contents))),
        ctypes.CFUNCTYPE(None, ctypes.c_void_p)(_destroyed),
    )
    _KEEP.extend(keep)
    return keep[0], int(ctypes.cast(keep[1], ctypes.c_void_p).value or 0)


_KEEP: list[Any] = []  # (the ctypes callbacks, alive as long as the module)
_DELETE, _DESTRUCTOR = _callbacks()


def device_of(x: Exported) -> tuple[int, int]:
    """``__dlpack_device__`` of ``x``: (kDLCUDA, index) on the cuda backend."""
    kind = _KDL_CUDA if x.device.backend.capabilities.shares_memory else _KDL_CPU
    return kind, x.device.index


def order_consumer(device: Any, stream: int) -> None:
    """Make the consumer's stream wait for this thread's work queued so far.

    ``stream`` is the consumer's driver stream address; the wait is for the
    work queued on this thread's current stream of ``device``, as the DLPack
    protocol asks of a producer.
    """
    # (the consumer's stream as a Stream of this library, its wait a Work that submit queues: on a
    # stream this thread captures, a recorded dependency)
    device.external_stream(stream).wait(device.current_stream())


def export(x: Exported, *, stream: int | None, dl_device: Any, copy: bool | None) -> object:
    """The DLPack capsule for ``x``; see ``DeviceArray.__dlpack__``.

    Raises
    ------
    BufferError
        On the sim backend, for another ``dl_device``, or for ``copy=True``.
    """
    if not x.device.backend.capabilities.shares_memory:
        raise BufferError(
            "DLPack export needs the cuda backend: sim arrays live in simulated "
            "memory; copy to the host with .get()"
        )
    if dl_device is not None and tuple(dl_device) != device_of(x):
        raise BufferError(f"cannot export to DLPack device {dl_device}; the array is on {device_of(x)}")
    if copy:
        raise BufferError("DLPack export with copy=True is not supported; the export is a view")
    if stream is not None and stream != -1:
        order_consumer(x.device, stream)
    itemsize = x.itemsize
    if any(s % itemsize for s in x.strides):
        raise BufferError("strides are not multiples of the item size; DLPack cannot express them")
    ndim = x.ndim
    shape = (ctypes.c_int64 * max(ndim, 1))(*x.shape)
    strides = (ctypes.c_int64 * max(ndim, 1))(*(s // itemsize for s in x.strides))
    code, bits = dlpack_code(x.dtype)
    managed = _DLManagedTensor()
    t = managed.dl_tensor
    t.data = x.ptr
    t.device = _DLDevice(_KDL_CUDA, x.device.index)
    t.ndim = ndim
    t.dtype = _DLDataType(code, bits, 1)
    t.shape = shape
    t.strides = strides
    t.byte_offset = 0
    managed.manager_ctx = None
    managed.deleter = _DELETE
    with _lock:
        _alive[ctypes.addressof(managed)] = (x, shape, strides, managed)
    return _api.PyCapsule_New(ctypes.addressof(managed), _NAME, _DESTRUCTOR)


class Imported:
    """Another library's tensor taken through DLPack: its description, and its owner.

    Keeps the producer's memory alive until this object dies, then calls the
    producer's deleter (the DLPack contract for a consumed capsule).
    """

    __slots__ = ("device_id", "dtype", "managed", "ptr", "shape", "strides")

    managed: _DLManagedTensor | None

    def __init__(self, capsule: object) -> None:
        try:
            address = _pointer_of(capsule, _NAME)
        except ValueError:  # (the C API raises for a wrong name or a non-capsule)
            address = None
        if not address:
            raise BufferError("not a DLPack capsule, or one already consumed")
        managed = _DLManagedTensor.from_address(address)
        t = managed.dl_tensor
        if t.device.device_type != _KDL_CUDA:
            raise BufferError(f"DLPack device type {t.device.device_type} is not CUDA memory")
        if t.dtype.lanes != 1:
            raise TypeError(f"DLPack tensors with {t.dtype.lanes} lanes are not supported")
        self.dtype = from_dlpack_code(t.dtype.code, t.dtype.bits)
        ndim = t.ndim
        self.shape = tuple(int(t.shape[i]) for i in range(ndim))
        item = self.dtype.itemsize
        if t.strides:
            self.strides = tuple(int(t.strides[i]) * item for i in range(ndim))
        else:  # NULL strides: C order
            strides, step = [], item
            for n in reversed(self.shape):
                strides.append(step)
                step *= max(n, 1)
            self.strides = tuple(reversed(strides))
        self.ptr = int(t.data or 0) + int(t.byte_offset)
        self.device_id = int(t.device.device_id)
        _api.PyCapsule_SetName(capsule, _USED)  # consumed: we call the deleter now
        self.managed = managed

    def __del__(self) -> None:
        managed = getattr(self, "managed", None)
        if managed is not None and managed.deleter:
            self.managed = None
            managed.deleter(ctypes.pointer(managed))


def import_(obj: Any, stream: int | None) -> Imported:
    """Take ``obj`` (which has ``__dlpack__``) as an :class:`Imported` tensor.

    ``stream`` is the consumer's stream address, passed to the producer so it
    orders its work before ours (None: no ordering asked).
    """
    try:
        capsule = obj.__dlpack__(stream=stream) if stream is not None else obj.__dlpack__()
    except TypeError:  # producers without the stream keyword
        capsule = obj.__dlpack__()
    return Imported(capsule)
