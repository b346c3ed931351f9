"""DeviceArray: an n-dimensional view of device memory, and its constructors.

An array is a view (pointer, shape, byte strides, dtype) of a :class:`Block`
from the device's caching allocator. Slicing, ``.T``, ``transpose`` and
``reshape`` (of contiguous arrays) make views that share the block; the block
returns to the cache when the last view is gone.

This module is compiled by Cython from this source where the package is
built (``_array.pxd`` declares ``DeviceArray`` as an extension type and types
:func:`empty`'s path: docs/architecture.md, "The compiled part"), and runs
as plain Python where not. Compiled methods read a typed array's fields
directly; the address is read through :attr:`DeviceArray.ptr`, a property a
graph's output overrides to check that it is still valid.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

try:
    import cython
except ImportError:  # (run as Python where Cython is not installed: nothing is compiled)
    from types import SimpleNamespace

    cython = SimpleNamespace(compiled=False)

from . import _dlpack
from ._allocator import Block, new_block
from ._builtin_kernels import c_strides, check_same, copy_view, fill_view
from ._builtin_kernels import fill_value as _fill_value
from ._device import Device, Stream, StreamLike, _current_stream_of, as_device, as_stream, resolve_stream
from ._dtypes import normalize_dtype
from ._fields import ArrayFields
from ._recording import Work, release, submit
from ._transfer import PendingCopy, to_device, to_host
from .backends.base import ArrayArg

__all__ = [
    "Borrowed",
    "DeviceArray",
    "as_strided",
    "asarray",
    "empty",
    "empty_like",
    "foreign_view",
    "full",
    "full_like",
    "ones",
    "operand",
    "zeros",
    "zeros_like",
]

Shape = int | Sequence[int]
MAX_DIMS = 64  # numpy's limit (NPY_MAXDIMS): more could not come back to the host


def _shape(shape: Any) -> tuple[int, ...]:
    global _LAST_DIMS
    if type(shape) is int and shape >= 0:  # the common cases, checked cheaply
        dims = _LAST_DIMS  # (the last one made serves again: tuples are immutable)
        if dims[0] != shape:
            dims = _LAST_DIMS = (shape,)  # (returned from the local: another thread may set it)
        return dims
    if type(shape) is tuple and len(shape) <= MAX_DIMS:
        for d in shape:
            if type(d) is not int or d < 0:
                break
        else:
            return shape
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (shape,)
    try:
        dims = tuple([operator.index(d) for d in shape])
    except TypeError:
        raise TypeError(f"shape must be an int or a sequence of ints, got {shape!r}") from None
    for d in dims:
        if d < 0:
            raise ValueError(f"negative dimension {d} in shape {dims}")
    _check_ndim(len(dims))
    return dims


_LAST_DIMS: tuple[int, ...] = (0,)  # the last 1-D shape _shape made
_STRIDES_1D: list[tuple[int]] = [(n,) for n in range(17)]  # a 1-D array's strides, by item size


def _strides_1d(itemsize: int) -> tuple[int]:
    """``(itemsize,)``, the same tuple each time for the item sizes of dtypes (up to 16 bytes)."""
    if 0 <= itemsize < len(_STRIDES_1D):  # (compiled: a C index into a list, no int object made)
        return _STRIDES_1D[itemsize]
    return (itemsize,)


def _check_ndim(ndim: int) -> None:
    if ndim > MAX_DIMS:
        raise ValueError(f"an array has at most {MAX_DIMS} dimensions (as in numpy), got {ndim}")


_c_strides = c_strides


def _is_contiguous(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> bool:
    step = itemsize
    for n, s in zip(reversed(shape), reversed(strides)):
        if n == 0:
            return True
        if n != 1 and s != step:
            return False
        step *= n
    return True


def _extent(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> tuple[int, int]:
    """Byte range [lo, hi) touched by a view, relative to its first element."""
    if 0 in shape:
        return 0, 0
    lo = sum(s * (n - 1) for n, s in zip(shape, strides) if s < 0)
    hi = sum(s * (n - 1) for n, s in zip(shape, strides) if s > 0) + itemsize
    return lo, hi


class DeviceArray(ArrayFields):
    """An n-dimensional array in device memory.

    Create arrays with :func:`empty`, :func:`zeros`, :func:`full`,
    :func:`asarray` and friends, not with this class.

    Attributes
    ----------
    ptr : int
        Device address of the first element.
    shape : tuple of int
    strides : tuple of int
        Byte steps between elements along each axis (may be negative or 0).
    dtype : numpy.dtype
    device : Device
    is_contiguous : bool
        Whether the elements are dense in C order.

    Notes
    -----
    Work on an array is queued on its device's compute stream unless a
    ``stream`` is given. An array used on another stream should be declared
    with :meth:`record_stream`, so its memory is not reused too early.
    ``__cuda_array_interface__`` and ``__dlpack__`` exist on the ``cuda``
    backend only (simulated memory cannot be shared).
    """

    __slots__ = ()  # (its fields: ArrayFields')

    _block: Block
    _ptr: int  # (read through ptr, which a graph's output checks)
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: np.dtype
    device: Device
    is_contiguous: bool
    _arg: ArrayArg | None  # the view's description, made on first use
    size: int  # number of elements

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError("DeviceArray is not created directly: use cg.empty, cg.zeros, cg.full or cg.asarray")

    @classmethod
    def _wrap(
        cls,
        block: Block,
        ptr: int,
        shape: tuple[int, ...],
        strides: tuple[int, ...],
        dtype: np.dtype,
        size: int | None = None,
    ) -> DeviceArray:
        """An array over ``block``; ``size`` given means a fresh C-contiguous one."""
        if size is None:
            contiguous = _is_contiguous(shape, strides, dtype.itemsize)
            return _new_array(cls, block, ptr, block.device, shape, strides, dtype, contiguous, _prod(shape))
        return _new_array(cls, block, ptr, block.device, shape, strides, dtype, True, size)

    @property
    def ptr(self) -> int:
        """Device address of the first element."""
        return self._ptr

    def _view(self, ptr: int, shape: tuple[int, ...], strides: tuple[int, ...]) -> DeviceArray:
        return DeviceArray._wrap(self._block, ptr, shape, strides, self.dtype)

    def _view_spec(self) -> ArrayArg:
        """(ptr, shape, strides, dtype): what kernels and backends need (made once)."""
        arg = self._arg
        if arg is None:
            arg = self._arg = ArrayArg(self.ptr, self.shape, self.strides, self.dtype)
        return arg

    # shape ----------------------------------------------------------------
    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self.shape)

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        """Bytes of the elements (not of the underlying block)."""
        return self.size * self.dtype.itemsize

    @property
    def T(self) -> DeviceArray:
        """The transposed view."""
        return self.transpose()

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    def transpose(self, *axes: int) -> DeviceArray:
        """A view with the axes permuted (reversed by default)."""
        if len(axes) == 1 and not isinstance(axes[0], int):
            axes = tuple(axes[0])  # type: ignore[unreachable]  # (a sequence given as one argument)
        if not axes:
            axes = tuple(range(self.ndim))[::-1]
        if sorted(axes) != list(range(self.ndim)):
            raise ValueError(f"axes {axes} are not a permutation of 0..{self.ndim - 1}")
        return self._view(self.ptr, tuple(self.shape[i] for i in axes), tuple(self.strides[i] for i in axes))

    def reshape(self, *shape: Any) -> DeviceArray:
        """A view with a new shape (one dimension may be -1); needs a contiguous array.

        Raises
        ------
        ValueError
            If the sizes differ, or the array is not contiguous.
        """
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = tuple(shape[0])
        dims = [operator.index(d) for d in shape]
        _check_ndim(len(dims))
        if dims.count(-1) > 1:
            raise ValueError("only one dimension may be -1 in reshape")
        if any(d < -1 for d in dims):
            raise ValueError(f"negative dimension in reshape {tuple(dims)}")
        known = _prod(tuple(d for d in dims if d != -1))
        if -1 in dims:
            if known == 0 or self.size % known:
                raise ValueError(f"cannot reshape array of size {self.size} into {tuple(dims)}")
            dims[dims.index(-1)] = self.size // known
        new = tuple(dims)
        if _prod(new) != self.size:
            raise ValueError(f"cannot reshape array of size {self.size} into shape {new}")
        if not self.is_contiguous:
            raise ValueError(
                "reshape needs a contiguous array; this view is strided: "
                "call .copy() first to make a contiguous one"
            )
        return self._view(self.ptr, new, _c_strides(new, self.itemsize))

    def ravel(self) -> DeviceArray:
        """A 1-D view of a contiguous array."""
        return self.reshape(-1)

    # indexing -------------------------------------------------------------
    def __getitem__(self, key: Any) -> DeviceArray:
        """Basic indexing: ints, slices (any step), ``None`` and ``...``.

        Raises
        ------
        IndexError
            For an index out of range, too many indices, or a boolean scalar
            (numpy reads ``x[True]`` as a mask, not as ``x[1]``).
        TypeError
            For advanced (array or boolean) indexing, which is not supported.
        ValueError
            For a view of more than 64 dimensions (numpy's limit).
        """
        if not isinstance(key, tuple):
            key = (key,)
        n_real = sum(1 for k in key if k is not None and k is not Ellipsis)
        if sum(1 for k in key if k is Ellipsis) > 1:
            raise IndexError("an index can only have a single ellipsis ('...')")
        if n_real > self.ndim:
            raise IndexError(f"too many indices: array is {self.ndim}-dimensional, but {n_real} were indexed")
        ptr, shape, strides, dim = self.ptr, [], [], 0
        for k in key:
            if k is None:
                shape.append(1)
                strides.append(0)
                continue
            if k is Ellipsis:
                for _ in range(self.ndim - n_real):
                    shape.append(self.shape[dim])
                    strides.append(self.strides[dim])
                    dim += 1
                continue
            n, s = self.shape[dim], self.strides[dim]
            if isinstance(k, slice):
                start, stop, step = k.indices(n)
                length = len(range(start, stop, step))
                if length:
                    ptr += start * s
                shape.append(length)
                strides.append(s * step)
            else:
                if type(k) is bool or type(k) is np.bool_:
                    raise IndexError(
                        f"a boolean index ({k!r}) is a mask in numpy (x[True] adds an axis, x[False] "
                        "selects nothing), not the integer index 1 or 0; masks are not supported on "
                        "a DeviceArray: index with int(...) or None"
                    )
                try:
                    i = operator.index(k)
                except TypeError:
                    raise TypeError(
                        "only integers, slices, None and ... are valid indices of a "
                        f"DeviceArray, got {type(k).__name__}; for gathers, copy to the "
                        "host with .get()"
                    ) from None
                if not -n <= i < n:
                    raise IndexError(f"index {i} is out of bounds for axis {dim} with size {n}")
                ptr += (i + n if i < 0 else i) * s
            dim += 1
        shape.extend(self.shape[dim:])
        strides.extend(self.strides[dim:])
        if len(shape) > MAX_DIMS:
            _check_ndim(len(shape))
        return self._view(ptr, tuple(shape), tuple(strides))

    def __setitem__(self, key: Any, value: Any) -> None:
        """``x[key] = value`` with a scalar, a device array or host data."""
        self[key].set(value)

    # data movement ----------------------------------------------------------
    def set(self, value: Any, *, stream: Stream | StreamLike | None = None) -> DeviceArray:
        """Overwrite the elements with ``value``; returns ``self``.

        ``value`` is a scalar (fills), a DeviceArray of the same shape and
        dtype (device copy), a :class:`HostSlot` (copies its contents as they
        are when the copy runs), or host data (numpy array, list)
        broadcastable to the shape and castable to the dtype within its kind.
        Inside a capture, host data is snapshotted into pinned memory the
        graph owns: every replay copies the data as it was at capture.

        Raises
        ------
        TypeError
            For data of another kind (floats into an integer array).
        ValueError
            For a shape that does not broadcast, or an integer out of range.
        """
        stream = resolve_stream(stream, self.device)
        if isinstance(value, DeviceArray):
            check_same("set", dst=self, src=value)
            copy_view(self, value, stream)
        elif getattr(value, "_host_slot", False):
            value.copy_to(self, stream=stream)
        elif np.ndim(value) == 0 and not isinstance(value, np.ndarray):
            fill_view(self, _fill_value("set", self.dtype, value), stream)
        else:
            to_device(self, value, stream)
        return self

    def get(self, *, stream: Stream | StreamLike | None = None) -> np.ndarray:
        """Copy to a new numpy array, waiting for queued work on ``stream``.

        Raises
        ------
        CaptureError
            While the stream is being captured (a copy to the host cannot be
            replayed).
        """
        return to_host(self, resolve_stream(stream, self.device))

    def get_async(self, *, stream: Stream | StreamLike | None = None) -> PendingCopy:
        """Start a copy to pinned host memory on the copy stream.

        Returns at once; ``.result()`` on the returned handle waits for that
        copy only (not for later work on ``stream``).
        """
        return PendingCopy(self, resolve_stream(stream, self.device))

    def copy(self, *, stream: Stream | StreamLike | None = None) -> DeviceArray:
        """A new contiguous array with the same elements (allocated on ``stream``)."""
        stream = resolve_stream(stream, self.device)
        out = empty(self.shape, self.dtype, device=self.device, stream=stream)
        copy_view(out, self, stream)
        return out

    def record_stream(self, stream: Any) -> None:
        """Declare that ``stream`` uses this array's memory (see :meth:`Block.use_on`)."""
        if not isinstance(stream, Stream):
            if stream is None:
                raise TypeError(
                    "record_stream takes a stream (a Stream, or an object with __cuda_stream__), got None"
                )
            stream = as_stream(stream, self.device)
        self._block.use_on(stream)

    # interoperability -------------------------------------------------------
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        if not self.device.backend.capabilities.shares_memory:
            raise AttributeError(
                "__cuda_array_interface__ is only available on the cuda backend "
                "(sim arrays live in simulated memory)"
            )
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "data": (self.ptr, False),
            "version": 3,
            "strides": None if self.is_contiguous else self.strides,
            "stream": self.device.current_stream().handle,
        }

    def __dlpack__(
        self,
        *,
        stream: int | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> object:
        """Export as a DLPack capsule (cuda backend only); see :mod:`._dlpack`."""
        return _dlpack.export(self, stream=stream, dl_device=dl_device, copy=copy)

    def __dlpack_device__(self) -> tuple[int, int]:
        return _dlpack.device_of(self)

    def __array__(self, *args: object, **kwargs: object) -> np.ndarray:
        raise TypeError(
            "implicit conversion of a DeviceArray to numpy is not allowed (it would "
            "hide a device-to-host copy and a wait); call .get()"
        )

    def __repr__(self) -> str:
        return (
            f"<cudagraphs.DeviceArray shape={self.shape} dtype={self.dtype} "
            f"on {self.device.backend.name}:{self.device.index}>"
        )


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


# constructors ---------------------------------------------------------------


def _new_array(
    cls: type[DeviceArray],
    block: Any,
    ptr: int,
    device: Device,
    shape: tuple[int, ...],
    strides: tuple[int, ...],
    dtype: np.dtype,
    is_contiguous: bool,
    size: int,
) -> DeviceArray:
    """An instance of ``cls`` (DeviceArray or a subclass) with every field set: the one place."""
    # (the class named as such: compiled, its allocation is then a C call, not a method call; a
    # subclass allocates itself: one compiled from a .pxd initializes fields of its own there)
    a = DeviceArray.__new__(DeviceArray) if cls is DeviceArray else cls.__new__(cls)
    a._block = block
    a._ptr = ptr
    a.shape = shape
    a.strides = strides
    a.dtype = dtype
    a.device = device
    a._arg = None
    a.is_contiguous = is_contiguous
    a.size = size
    return a


def empty(
    shape: Shape,
    dtype: Any = "float64",
    *,
    device: Device | int | None = None,
    stream: Stream | StreamLike | None = None,
) -> DeviceArray:
    """A new array whose elements are not initialized.

    Parameters
    ----------
    shape : int or sequence of int
    dtype : dtype-like
        One of :data:`cudagraphs.SUPPORTED_DTYPES` (default float64, as numpy).
    device : Device or int, optional
        Default: the stream's device, else the current device.
    stream : Stream, optional
        The stream that will first use the memory (default: this thread's
        current stream). While it is captured, the memory comes from the
        capture (its graph pool).

    Raises
    ------
    ValueError
        For a negative dimension.
    TypeError
        For an unsupported dtype, or a ``stream`` that is not a Stream.
    OutOfMemoryError
        If the device cannot hold it.
    """
    dims = _shape(shape)
    dt = normalize_dtype(dtype)
    if stream is None:
        dev = as_device(device)
        stream = _current_stream_of(dev)
    else:
        if type(stream) is not Stream:  # (another library's stream: its Stream, of its device)
            stream = as_stream(stream, device)
        dev = stream.device if device is None else as_device(device)  # type: ignore[union-attr]
        stream = resolve_stream(stream, dev)
    size = dims[0] if len(dims) == 1 else _prod(dims)
    itemsize = dt.itemsize
    allocator = dev.allocator
    block = allocator.malloc(size * itemsize, stream)
    strides = _strides_1d(itemsize) if len(dims) == 1 else _c_strides(dims, itemsize)
    return _new_array(DeviceArray, block, block.ptr, block.device, dims, strides, dt, True, size)


def zeros(
    shape: Shape,
    dtype: Any = "float64",
    *,
    device: Device | int | None = None,
    stream: Stream | StreamLike | None = None,
) -> DeviceArray:
    """A new array of zeros (a device memset)."""
    a = empty(shape, dtype, device=device, stream=stream)
    if a.nbytes:
        s = resolve_stream(stream, a.device)
        backend, ptr, nbytes = a.device.backend, a.ptr, a.nbytes
        submit(s, Work("memset", lambda raw, _: backend.memset(ptr, 0, nbytes, raw), None, (), (a,)))
    return a


def full(
    shape: Shape,
    fill_value: Any,
    dtype: Any = None,
    *,
    device: Device | int | None = None,
    stream: Stream | StreamLike | None = None,
) -> DeviceArray:
    """A new array with every element ``fill_value`` (dtype inferred as numpy does)."""
    dt = np.asarray(fill_value).dtype if dtype is None else dtype
    a = empty(shape, dt, device=device, stream=stream)
    fill_view(a, _fill_value("full", a.dtype, fill_value), resolve_stream(stream, a.device))
    return a


def ones(
    shape: Shape,
    dtype: Any = "float64",
    *,
    device: Device | int | None = None,
    stream: Stream | StreamLike | None = None,
) -> DeviceArray:
    """A new array of ones."""
    return full(shape, 1, dtype, device=device, stream=stream)


def asarray(
    obj: Any,
    dtype: Any = None,
    *,
    device: Device | int | None = None,
    stream: Stream | StreamLike | None = None,
) -> DeviceArray:
    """A device array from host data (numpy array, list, scalar) or a device array.

    A DeviceArray already of this dtype on this device is returned as is.
    Another library's device array (``__cuda_array_interface__`` or DLPack:
    PyTorch, CuPy, JAX, ...) is viewed without a copy: the result shares its
    memory and keeps it alive (work on the view is ordered on cudagraphs'
    streams; order it with the other library's stream yourself). Host data
    is copied.

    Raises
    ------
    TypeError
        For a dtype device arrays do not support, or a conversion asked of
        device data.
    """
    if type(obj) is not np.ndarray and not isinstance(obj, DeviceArray):
        view = foreign_view(obj, device)
        if view is not None:
            if dtype is not None and normalize_dtype(dtype) != view.dtype:
                raise TypeError(
                    f"asarray: the {type(obj).__name__} is {view.dtype}; a view of another "
                    f"library's memory cannot be converted to {normalize_dtype(dtype)}"
                )
            return view
    if isinstance(obj, DeviceArray):
        dev = obj.device if device is None else as_device(device)
        dt = obj.dtype if dtype is None else normalize_dtype(dtype)
        if dev is obj.device and dt == obj.dtype:
            return obj
        if dt != obj.dtype:
            raise TypeError(
                f"asarray: converting a {obj.dtype} DeviceArray to {dt} is not supported "
                "on the device; convert on the host with .get().astype(...)"
            )
        return asarray(obj.get(), device=dev, stream=stream)
    host = np.asarray(obj) if dtype is None else np.asarray(obj, dtype=normalize_dtype(dtype))
    out = empty(host.shape, host.dtype, device=device, stream=stream)
    out.set(host, stream=stream)
    return out


class Borrowed:
    """The owner of another library's memory viewed as a DeviceArray: keeps it alive.

    The BlockOwner of such views' block: nothing goes back to any allocator
    when the block dies; the reference to the other library's array is
    dropped, once no capture is active on the device (dropping it may run
    that library's free, which may call the driver in ways a capture forbids:
    measured, PyTorch aborts the process then).
    """

    __slots__ = ("device", "obj")

    def __init__(self, obj: object, device: Device) -> None:
        self.obj, self.device = obj, device

    def release(self, ptr: int, streams: object) -> None:
        obj, self.obj = self.obj, None
        release(self.device, _drop, obj)


def _drop(obj: object) -> None:
    """Nothing: the last reference to ``obj`` goes with the call's arguments."""


def _foreign_device(obj: Any, fallback: Device | int | None, found: int | None) -> Device:
    """The Device of another library's array (its ``device`` attribute, else ``fallback``)."""
    if found is None:
        dev = getattr(obj, "device", None)
        for attr in ("index", "id"):  # torch.device.index, cupy.cuda.Device.id
            value = getattr(dev, attr, None)
            if type(value) is int:
                found = value
                break
    if found is not None:
        if fallback is not None and as_device(fallback).index != found:
            raise ValueError(f"asarray: the {type(obj).__name__} is on device {found}, not {fallback}")
        return Device(found)
    return as_device(fallback)


def _cai_dtype(cai: dict[str, Any]) -> np.dtype | None:
    """The dtype of a ``__cuda_array_interface__``, or None where arrays do not support it."""
    try:
        return normalize_dtype(np.dtype(cai["typestr"]))
    except TypeError:
        return None


def foreign_view(obj: Any, device: Device | int | None) -> DeviceArray | None:
    """A zero-copy view of another library's device array, or None for anything else."""
    if hasattr(obj, "detach") and hasattr(obj, "data_ptr"):
        # a PyTorch tensor: a new tensor of the same storage, so that the view keeps that
        # storage alive even if the original later gets other data (``t.data = ...``),
        # and one autograd does not track (PyTorch shares no tracked tensor)
        obj = obj.detach()
    try:
        cai = getattr(obj, "__cuda_array_interface__", None)
    except Exception:  # (a library's property may raise anything for host tensors)
        cai = None
    if cai is not None and _cai_dtype(cai) is None and hasattr(obj, "__dlpack__"):
        cai = None  # (PyTorch's bfloat16 is "<V2" there: DLPack names it)
    if cai is not None:
        if cai.get("mask") is not None:
            raise ValueError("asarray: masked arrays (__cuda_array_interface__ 'mask') are not supported")
        dtype = normalize_dtype(np.dtype(cai["typestr"]))
        shape = tuple(int(d) for d in cai["shape"])
        strides = cai.get("strides")
        strides = _c_strides(shape, dtype.itemsize) if strides is None else tuple(int(s) for s in strides)
        ptr, keep, found = int(cai["data"][0] or 0), obj, None
    else:
        kind = getattr(obj, "__dlpack_device__", None)
        if kind is None or kind()[0] != 2:  # kDLCUDA
            return None
        imported = _dlpack.import_(obj, None)
        dtype, shape, strides = imported.dtype, imported.shape, imported.strides
        ptr, keep, found = imported.ptr, (obj, imported), imported.device_id
    dev = _foreign_device(obj, device, found)
    lo, hi = _extent(shape, strides, dtype.itemsize)
    block = new_block(dev, ptr + lo, hi - lo, Borrowed(keep, dev))
    return DeviceArray._wrap(block, ptr, shape, strides, dtype)


def operand(x: Any, what: str) -> DeviceArray:
    """``x`` as a DeviceArray: itself, or a zero-copy view of another library's CUDA array.

    For the operations that take any CUDA array (a torch tensor, a CuPy
    array: ``__cuda_array_interface__`` or DLPack) and use it in place.

    Parameters
    ----------
    x : object
    what : str
        Names ``x`` in the errors (``"matmul: a"``).

    Raises
    ------
    TypeError
        For anything else (host data included), or another library's array
        on a backend that cannot read real GPU memory (the simulator).
    """
    if isinstance(x, DeviceArray):
        x._view_spec()  # a subclass's own check (an expired graph output raises here)
        return x
    view = None if isinstance(x, np.ndarray) else foreign_view(x, None)
    if view is None:
        raise TypeError(
            f"{what} must be a device array (a cudagraphs DeviceArray, or another "
            f"library's CUDA array such as a torch tensor or a CuPy array), got "
            f"{type(x).__name__}; copy host data to the device with cg.asarray() first"
        )
    if not view.device.backend.capabilities.shares_memory:
        raise TypeError(
            f"{what} is a {type(x).__name__} in real GPU memory, which the "
            f"{view.device.backend.name} backend cannot read; use the cuda backend"
        )
    return view


def _like(a: Any, dtype: Any, device: Device | int | None) -> tuple[tuple[int, ...], Any, Any]:
    """(shape, dtype, device) for the ``*_like`` constructors."""
    if isinstance(a, DeviceArray):
        return a.shape, a.dtype if dtype is None else dtype, a.device if device is None else device
    host = np.asarray(a)
    return host.shape, host.dtype if dtype is None else dtype, device


def empty_like(
    a: Any,
    dtype: Any = None,
    *,
    device: Device | int | None = None,
    stream: Stream | StreamLike | None = None,
) -> DeviceArray:
    """A new uninitialized array with the shape (and dtype) of ``a``."""
    shape, dt, dev = _like(a, dtype, device)
    return empty(shape, dt, device=dev, stream=stream)


def zeros_like(
    a: Any,
    dtype: Any = None,
    *,
    device: Device | int | None = None,
    stream: Stream | StreamLike | None = None,
) -> DeviceArray:
    """A new array of zeros with the shape (and dtype) of ``a``."""
    shape, dt, dev = _like(a, dtype, device)
    return zeros(shape, dt, device=dev, stream=stream)


def full_like(
    a: Any,
    fill_value: Any,
    dtype: Any = None,
    *,
    device: Device | int | None = None,
    stream: Stream | StreamLike | None = None,
) -> DeviceArray:
    """A new array filled with ``fill_value``, with the shape (and dtype) of ``a``."""
    shape, dt, dev = _like(a, dtype, device)
    return full(shape, fill_value, dt, device=dev, stream=stream)


def as_strided(x: DeviceArray, shape: Shape, strides: Sequence[int], offset: int = 0) -> DeviceArray:
    """A view of ``x``'s memory with any shape, byte strides and byte offset.

    Raises
    ------
    ValueError
        If the view would reach outside the memory block of ``x``, or its
        offset or a stride is not a multiple of the item size (the GPU
        reads elements at aligned addresses only).
    """
    if not isinstance(x, DeviceArray):
        raise TypeError(f"as_strided takes a DeviceArray, got {type(x).__name__}")
    dims = _shape(shape)
    st = tuple(operator.index(s) for s in strides)
    if len(st) != len(dims):
        raise ValueError(f"shape {dims} and strides {st} have different lengths")
    itemsize = x.itemsize
    offset = operator.index(offset)
    if offset % itemsize or any(s % itemsize for s in st):
        raise ValueError(
            f"as_strided: offset {offset} and strides {st} must be multiples of the item "
            f"size ({itemsize} B for {x.dtype}): a misaligned element cannot be read on the GPU"
        )
    ptr = x.ptr + offset
    lo, hi = _extent(dims, st, itemsize)
    start, end = x._block.ptr, x._block.ptr + x._block.nbytes
    if hi > lo and (ptr + lo < start or ptr + hi > end):
        raise ValueError(
            f"view out of range: it reaches bytes [{ptr + lo - start}, {ptr + hi - start}) "
            f"of a {x._block.nbytes}-byte allocation"
        )
    return x._view(ptr, dims, st)
