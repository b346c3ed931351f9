"""The element-wise ops (fill, copy, add, axpy, scale): checked, then one kernel launch or copy each.

This module is compiled by Cython from this source where the package is
built (docs/architecture.md, "The compiled part": these ops are hot paths),
and runs as plain Python where not. :mod:`cudagraphs.ops` documents them.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

try:
    import cython
except ImportError:  # (run as Python where Cython is not installed: nothing is compiled)
    cython = SimpleNamespace(compiled=False, cast=lambda _type, value: value)

from .._array import DeviceArray, empty
from .._builtin_kernels import ARITH, check_same, copy_view, fill_value, fill_view, layout, run
from .._device import Device, Stream, StreamLike, _current_stream_of, as_stream, resolve_stream
from .._errors import CaptureError
from .._fields import ArrayFields, DeviceFields
from .._recording import Work, submit
from ..backends.base import Copy

__all__ = ["add", "axpy", "copy", "fill", "scale"]

_ARITH_DTYPES = tuple(np.dtype(n) for n in ARITH)  # (numpy's dtypes of these names are singletons)
# (the same, for the hot paths: compiled, C globals, read without a dictionary lookup)
_DEVICE_ARRAY, _ARITH_DTYPES_C = DeviceArray, _ARITH_DTYPES


# validation ----------------------------------------------------------------
def _arrays(op: str, names: tuple[str, ...], arrays: tuple[Any, ...]) -> Device:
    """Check that ``arrays`` (the arguments ``names``) are device arrays of one shape, dtype, device."""
    first = arrays[0]
    if type(first) is not _DEVICE_ARRAY:
        return _checked(op, names, arrays)
    head = cython.cast(ArrayFields, first)  # (compiled: its fields read as C fields, type known)
    for a in arrays:  # the common case, cheaply: plain arrays that match (identity first)
        if type(a) is not _DEVICE_ARRAY:
            return _checked(op, names, arrays)
        arr = cython.cast(ArrayFields, a)
        if (
            arr.device is not head.device
            or (arr.shape is not head.shape and arr.shape != head.shape)
            or (arr.dtype is not head.dtype and arr.dtype != head.dtype)
        ):
            return _checked(op, names, arrays)
    device: Device = head.device
    return device


def _checked(op: str, names: tuple[str, ...], arrays: tuple[Any, ...]) -> Device:
    """:func:`_arrays` where they are not all plain matching arrays: their device, or the error.

    (Subclasses run their own checks: an expired graph output raises here.)
    """
    named = dict(zip(names, arrays))
    for a in arrays:
        if not isinstance(a, DeviceArray):
            name = names[[v is a for v in arrays].index(True)]  # (compiled: no closure in a cpdef)
            raise TypeError(f"{op}: {name} must be a cudagraphs DeviceArray, got {type(a).__name__}")
        a._view_spec()  # a subclass's own check (an expired graph output raises here)
    return check_same(op, **named)  # type: ignore[no-any-return]  # (raises the error naming a mismatch)


def _arith(op: str, dtype: np.dtype) -> None:
    for d in _ARITH_DTYPES_C:  # (by identity first: == of two dtypes is a call, a hash a tuple's)
        if d is dtype:
            return
    if dtype not in _ARITH_DTYPES_C:
        raise TypeError(f"{op} supports {', '.join(ARITH)}; got {dtype}")


def _scalar_arg(op: str, alpha: Any, dtype: np.dtype, device: Device) -> tuple[bool, Any]:
    """(is_pointer, value) for an alpha given as a number or a 1-element array."""
    if isinstance(alpha, DeviceArray):
        if alpha.size != 1 or alpha.dtype != dtype or alpha.device is not device:
            raise ValueError(
                f"{op}: a device alpha must be a one-element {dtype} array on {device}, "
                f"got shape {alpha.shape} {alpha.dtype} on {alpha.device}"
            )
        return True, alpha
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.integer, np.floating)):
        raise TypeError(f"{op}: alpha must be a real number or a device scalar, got {alpha!r}")
    if dtype.kind in "iu" and isinstance(alpha, (float, np.floating)):
        if not float(alpha).is_integer():
            raise TypeError(f"{op}: alpha {alpha!r} is not an integer but the arrays are {dtype}")
        alpha = int(alpha)
    if dtype.kind in "iu" and not np.iinfo(dtype).min <= alpha <= np.iinfo(dtype).max:
        raise ValueError(f"{op}: alpha {alpha} does not fit in {dtype}, the arrays' dtype")
    return False, dtype.type(alpha).item()


# the ops ------------------------------------------------------------------
def fill(x: DeviceArray, value: Any, *, stream: Stream | StreamLike | None = None) -> DeviceArray:
    """Set every element of ``x`` to ``value`` (converted to ``x.dtype``); returns ``x``.

    Raises
    ------
    TypeError
        If ``value`` is not a scalar of ``x``'s kind (a fraction into integers).
    ValueError
        If an integer ``value`` is out of ``x.dtype``'s range.
    """
    device = _arrays("fill", ("x",), (x,))
    stream = resolve_stream(stream, device)
    value = fill_value("fill", x.dtype, value)
    fill_view(x, value, stream)
    return x


def copy(dst: DeviceArray, src: DeviceArray, *, stream: Stream | StreamLike | None = None) -> DeviceArray:
    """Copy ``src`` into ``dst`` (same shape and dtype, any layouts); returns ``dst``.

    Contiguous pairs use a device-to-device memcpy; any other layout runs the
    strided copy kernel, whose shape and strides are passed by value.

    ``dst`` and ``src`` may be on two devices: the copy then runs on
    ``stream`` (a stream of either device; default: ``dst``'s device's
    current stream), after the work queued so far on the other device's
    current stream, which waits for the copy in turn, so both devices see it
    in stream order. It goes over the peer path (NVLink or PCIe), enabling
    peer access between the two devices the first time, or, where the
    hardware has no peer path, is staged through the host by the driver
    (eagerly only). Inside a capture, the copy becomes a node of the graph;
    the other device's current stream is joined only when it is part of the
    same capture (a wait cannot cross a capture's boundary), so work on it
    outside the graph must be ordered by the caller (``stream.wait(...)``
    before the replay).

    Raises
    ------
    TypeError, ValueError
        For arguments that are not arrays, or differ in shape or dtype, or a
        ``stream`` of a third device.
    CaptureError
        For a capture across two devices without a peer path, or whose peer
        access was not enabled before capturing (:func:`cudagraphs.enable_peer_access`).
    """
    if isinstance(dst, DeviceArray) and isinstance(src, DeviceArray) and dst.device is not src.device:
        _copy_across(dst, src, stream)
        return dst
    device = _arrays("copy", ("dst", "src"), (dst, src))
    copy_view(dst, src, resolve_stream(stream, device))
    return dst


def _copy_across(dst: DeviceArray, src: DeviceArray, stream: Stream | StreamLike | None) -> None:
    """``dst[...] = src`` for arrays on two devices (see :func:`copy`)."""
    if dst.dtype != src.dtype:
        raise TypeError(f"copy: dst is {dst.dtype} but src is {src.dtype} (copy does not convert)")
    if dst.shape != src.shape:
        raise ValueError(f"copy: dst has shape {dst.shape} but src has {src.shape}")
    ddev, sdev = dst.device, src.device
    stream = as_stream(stream, ddev)  # (another library's stream: its Stream, of its device)
    if stream is None:
        stream = ddev.current_stream()
    elif not isinstance(stream, Stream) or stream.device not in (ddev, sdev):
        where = stream.device if isinstance(stream, Stream) else type(stream).__name__
        raise ValueError(
            f"copy: the stream must be a Stream of {ddev} (dst) or {sdev} (src), got one of {where}"
        )
    stream = resolve_stream(stream, stream.device)
    if dst.size == 0:
        return
    here = stream.device
    other = (sdev if here is ddev else ddev).current_stream()
    rec = stream._recording
    peer = ddev._peer_path(sdev)
    if not peer and rec is not None:
        raise CaptureError(
            f"copy between {sdev} and {ddev} during a capture: the two devices have no peer "
            "path, and the copy the driver stages through the host cannot be captured; copy "
            "outside the capture, or through a host array"
        )
    joined = other._recording is rec  # (a wait never crosses a capture's boundary)
    on_src = stream if here is sdev else other
    on_dst = stream if here is ddev else other
    s = src
    if not src.is_contiguous:  # made dense on its device first
        s = empty(src.shape, src.dtype, device=sdev, stream=on_src)
        copy_view(s, src, on_src)
    d = dst if dst.is_contiguous else empty(dst.shape, dst.dtype, device=ddev, stream=on_dst)
    if joined:
        stream.wait(other)
    copy = Copy(d.ptr, s.ptr, dst.nbytes, "dtod" if peer else "peer")
    submit(stream, Work("memcpy", ddev.backend.memcpy, copy, (s,), (d,)))
    if joined:
        other.wait(stream)
    if d is not dst:
        copy_view(dst, d, on_dst)


def add(
    a: DeviceArray,
    b: DeviceArray,
    out: DeviceArray | None = None,
    *,
    stream: Stream | StreamLike | None = None,
) -> DeviceArray:
    """``out = a + b`` element-wise (a new array when ``out`` is None); returns ``out``."""
    if out is None:
        device = _arrays("add", ("a", "b"), (a, b))
    else:
        device = _arrays("add", ("a", "b", "out"), (a, b, out))
    # (compiled: their fields read as C fields; _arrays checked that they are arrays)
    x, y = cython.cast(ArrayFields, a), cython.cast(ArrayFields, b)
    _arith("add", x.dtype)
    if stream is None:  # (a Device, as _arrays returns it)
        stream = _current_stream_of(cython.cast(DeviceFields, device))
    else:
        stream = resolve_stream(stream, device)
    if out is None:
        out = empty(x.shape, x.dtype, device=device, stream=stream)
    z = cython.cast(ArrayFields, out)
    n = x.size
    if n == 0:
        return out
    if x.is_contiguous and y.is_contiguous and z.is_contiguous:
        run("cg_add", x.dtype, device, stream, n, (out, a, b, n))
    else:
        run("cg_add_strided", x.dtype, device, stream, n, (out, a, b, n, layout(x.shape, out, a, b)))
    return out


def axpy(
    alpha: Any, x: DeviceArray, y: DeviceArray, *, stream: Stream | StreamLike | None = None
) -> DeviceArray:
    """``y += alpha * x`` in place; returns ``y``.

    ``alpha`` is a number or a one-element device array (read when the
    kernel runs).
    """
    device = _arrays("axpy", ("y", "x"), (y, x))
    _arith("axpy", y.dtype)
    pointer, a = _scalar_arg("axpy", alpha, y.dtype, device)
    return _alpha_op("cg_axpy", pointer, a, x, y, device, resolve_stream(stream, device))


def scale(
    alpha: Any, x: DeviceArray, out: DeviceArray | None = None, *, stream: Stream | StreamLike | None = None
) -> DeviceArray:
    """``out = alpha * x`` (a new array when ``out`` is None); returns ``out``."""
    device = _arrays("scale", ("x",), (x,))
    _arith("scale", x.dtype)
    pointer, a = _scalar_arg("scale", alpha, x.dtype, device)
    stream = resolve_stream(stream, device)
    if out is None:
        out = empty(x.shape, x.dtype, device=device, stream=stream)
    else:
        _arrays("scale", ("out", "x"), (out, x))
    return _alpha_op("cg_scale", pointer, a, x, out, device, stream)


def _alpha_op(
    base: str,
    pointer: bool,
    alpha: Any,
    x: DeviceArray,
    out: DeviceArray,
    device: Device,
    stream: Stream,
) -> DeviceArray:
    n = x.size
    if n == 0:
        return out
    name = base + ("_ptr" if pointer else "")
    if x.is_contiguous and out.is_contiguous:
        run(name, x.dtype, device, stream, n, (out, x, alpha, n))
    else:
        run(name + "_strided", x.dtype, device, stream, n, (out, x, alpha, n, layout(x.shape, out, x)))
    return out
