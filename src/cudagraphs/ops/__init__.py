"""Built-in capture-safe operations on device arrays.

Each op is a CUDA kernel (``ops/kernels/elementwise.cu``) with a numpy
reference that runs on the ``sim`` backend. All ops queue work on a stream
(default: the arrays' device's compute stream) and return without waiting;
they take arrays of any layout, including strided and reversed views, and
pass shapes and strides by value, so they are safe to capture in a graph.

=========================  =========================================  ===================
op                         computes                                   dtypes
=========================  =========================================  ===================
``fill(x, value)``         ``x[...] = value``                         all
``copy(dst, src)``         ``dst[...] = src``                         all (same dtype)
``add(a, b, out=None)``    ``out = a + b``                            float32/64, int32/64
``axpy(alpha, x, y)``      ``y += alpha * x``                         float32/64, int32/64
``scale(alpha, x, out)``   ``out = alpha * x``                        float32/64, int32/64
``matmul(a, b, out)``      ``out = alpha*a@b + beta*out`` (cuBLASLt)  float16/32/64, bfloat16
=========================  =========================================  ===================

``alpha`` is a Python number or a one-element device array of the same dtype
(read on the device when the kernel runs, so it can change between graph
replays). Kernels compile on first use, also inside a capture;
``cg.ops.preload_dtypes(dtypes)`` compiles them ahead of time.

Ops that create their output (``add``/``scale`` without ``out``) allocate it
on the stream they run on, so inside a capture it comes from the graph's
pool (or is refused under ``alloc="forbid"``).

Writing a new op
----------------
Validate the arguments, then queue the work through
:func:`cudagraphs._recording.submit` with a :class:`~cudagraphs._recording.Work`
naming what it reads and writes (a :class:`cudagraphs.Kernel` launch does
that for you). The capture rules, keep-alive and node records then apply
without any code of the op's own.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import numpy as np

from .._array import DeviceArray, empty
from .._builtin_kernels import (
    ARITH,
    ARMED,
    BLOCK,
    FLAG_TYPES,
    KERNEL_NAMES,
    MAX_NDIM,
    builtin_kernel,
    check_same,
    copy_view,
    fill_value,
    fill_view,
    layout,
    run,
)
from .._builtin_kernels import condition_kernel as _condition_kernel
from .._control import Condition
from .._device import Device, Stream, as_device, resolve_stream
from .._dtypes import normalize_dtype
from .._errors import CaptureError
from .._kernel import Kernel, fastcall
from .._kernel import preload as preload_kernels
from .._recording import Work, submit
from ..backends.base import Copy
from ._matmul import matmul

__all__ = [
    "MAX_NDIM",
    "add",
    "axpy",
    "condition_kernel",
    "copy",
    "elementwise_kernel",
    "fill",
    "matmul",
    "preload_dtypes",
    "scale",
    "set_condition",
]

_ARITH_DTYPES = frozenset(np.dtype(n) for n in ARITH)
_CONDITION_KERNELS = ("cg_set_condition", "cg_set_condition_index", "cg_loop_guard")


def _kernel_name(what: str, name: Any, names: tuple[str, ...]) -> str:
    if not isinstance(name, str):
        raise TypeError(f"{what}: name must be a str, got {type(name).__name__}")
    if name not in names:
        raise ValueError(f"{what}: no built-in kernel {name!r}; the kernels are {', '.join(names)}")
    return name


def elementwise_kernel(name: str, dtype: Any) -> Kernel:
    """The built-in kernel ``name`` for elements of ``dtype`` (e.g. to launch one in a GraphBuilder).

    Parameters
    ----------
    name : str
        One of the kernels of ``ops/kernels/elementwise.cu`` (``"cg_add"``,
        ``"cg_fill"``, ``"cg_axpy"``, ...).
    dtype : dtype-like
        ``"float32"`` or ``np.dtype("float32")``; fill and copy kernels take
        every supported dtype, arithmetic ones float32/64 and int32/64.

    Raises
    ------
    TypeError, ValueError
        For a name that is not a built-in kernel, or a dtype it does not take.
    """
    name = _kernel_name("elementwise_kernel", name, KERNEL_NAMES)
    dt = normalize_dtype(dtype)
    if not name.startswith(("cg_fill", "cg_copy")) and dt not in _ARITH_DTYPES:
        raise TypeError(f"elementwise_kernel: {name} takes {', '.join(ARITH)}, got {dt}")
    return builtin_kernel(name, dt)


def condition_kernel(name: str, dtype: Any) -> Kernel:
    """The built-in kernel ``name`` that sets a graph condition from a flag of ``dtype``.

    ``cg_set_condition`` (flag != 0) and ``cg_set_condition_index`` (the
    value) take flags of bool, int32, int64, uint8, float32 or float64;
    ``cg_loop_guard`` (a while loop's iteration cap) takes int64.

    Raises
    ------
    TypeError, ValueError
        For another name, or a dtype the kernel does not take.
    """
    name = _kernel_name("condition_kernel", name, _CONDITION_KERNELS)
    dt = normalize_dtype(dtype)
    takes = ("int64",) if name == "cg_loop_guard" else tuple(FLAG_TYPES)
    if dt.name not in takes:
        raise TypeError(f"condition_kernel: {name} takes flags of {', '.join(takes)}, got {dt}")
    return _condition_kernel(name, dt)


def preload_dtypes(dtypes: Any = ("float32",), device: Device | int | None = None) -> None:
    """Compile every built-in kernel for ``dtypes`` now (a cost paid early).

    ``dtypes`` is one dtype (``"float32"``) or a sequence of them. (To
    compile your own :class:`~cudagraphs.Kernel` objects ahead of time, use
    :func:`cudagraphs.preload`.)

    Raises
    ------
    TypeError
        For an unsupported dtype.
    """
    device = as_device(device)  # (checked before any compilation)
    if isinstance(dtypes, (str, np.dtype, type)):
        dtypes = (dtypes,)
    kernels = []
    for d in dtypes:
        dt = normalize_dtype(d)
        for name in KERNEL_NAMES:
            if name.startswith(("cg_fill", "cg_copy")) or dt in _ARITH_DTYPES:
                kernels.append(builtin_kernel(name, dt))
        if dt.name in FLAG_TYPES:
            kernels += [_condition_kernel(n, dt) for n in ("cg_set_condition", "cg_set_condition_index")]
    kernels.append(_condition_kernel("cg_loop_guard", np.dtype("int64")))
    preload_kernels(kernels, device)


def preload(dtypes: Any = ("float32",), device: Device | int | None = None) -> None:
    """Deprecated name of :func:`preload_dtypes` (told apart from :func:`cudagraphs.preload`)."""
    warnings.warn(
        "cg.ops.preload(dtypes) is now cg.ops.preload_dtypes(dtypes) (cg.preload(kernels) compiles "
        "Kernel objects); the old name will be removed",
        DeprecationWarning,
        stacklevel=2,
    )
    preload_dtypes(dtypes, device)


def set_condition(cond: Any, flag: DeviceArray, *, stream: Stream | None = None) -> None:
    """Set a graph condition on the device from ``flag[0]`` when the kernel runs.

    An integer flag sets the value ``flag[0]`` (any non-zero value is true
    for ``if``/``while``; for a ``switch`` it selects the branch, and an out
    of range or negative one selects none). A float or bool flag sets
    ``flag[0] != 0``. Queue it inside the capture, before the conditional
    node it drives (and, for a while loop, at the end of the body).

    Raises
    ------
    TypeError
        If ``cond`` is not a graph condition or ``flag`` not a device array of
        bool, int32, int64, uint8, float32 or float64.
    """
    if not isinstance(cond, Condition):
        raise TypeError(f"set_condition takes a Condition from g.condition(), got {type(cond).__name__}")
    if not isinstance(flag, DeviceArray) or flag.dtype.name not in FLAG_TYPES or flag.size < 1:
        raise TypeError(
            f"set_condition's flag must be a non-empty device array of {', '.join(FLAG_TYPES)}; got {flag!r}"
        )
    device = flag.device
    stream = resolve_stream(stream, device)
    name = "cg_set_condition_index" if flag.dtype.kind in "iu" else "cg_set_condition"
    kernel = _condition_kernel(name, flag.dtype)
    first = flag[(0,) * flag.ndim] if flag.ndim else flag  # a 0-d view: contiguous
    kernel.launch(1, 1, cond.handle, first, stream=stream)


# validation ----------------------------------------------------------------
def _arrays(op: str, **named: Any) -> Device:
    """Check that the named arguments are device arrays of one shape, dtype, device."""
    arrays = named.values()
    first = next(iter(arrays))
    for a in arrays:  # the common case first, cheaply: plain arrays that match
        if (
            type(a) is not DeviceArray
            or a.device is not first.device
            or a.shape != first.shape
            or a.dtype != first.dtype
        ):
            if not isinstance(a, DeviceArray):
                name = next(n for n, v in named.items() if v is a)
                raise TypeError(f"{op}: {name} must be a cudagraphs DeviceArray, got {type(a).__name__}")
            a._view_spec()  # a subclass's own check (an expired graph output raises here)
            check_same(op, **named)  # raises the error that names the mismatch
    return first.device  # type: ignore[no-any-return]


def _arith(op: str, dtype: np.dtype) -> None:
    if dtype not in _ARITH_DTYPES:
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
def fill(x: DeviceArray, value: Any, *, stream: Stream | None = None) -> DeviceArray:
    """Set every element of ``x`` to ``value`` (converted to ``x.dtype``); returns ``x``.

    Raises
    ------
    TypeError
        If ``value`` is not a scalar of ``x``'s kind (a fraction into integers).
    ValueError
        If an integer ``value`` is out of ``x.dtype``'s range.
    """
    device = _arrays("fill", x=x)
    stream = resolve_stream(stream, device)
    value = fill_value("fill", x.dtype, value)
    fill_view(x, value, stream)
    return x


def copy(dst: DeviceArray, src: DeviceArray, *, stream: Stream | None = None) -> DeviceArray:
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
    device = _arrays("copy", dst=dst, src=src)
    copy_view(dst, src, resolve_stream(stream, device))
    return dst


def _copy_across(dst: DeviceArray, src: DeviceArray, stream: Stream | None) -> None:
    """``dst[...] = src`` for arrays on two devices (see :func:`copy`)."""
    if dst.dtype != src.dtype:
        raise TypeError(f"copy: dst is {dst.dtype} but src is {src.dtype} (copy does not convert)")
    if dst.shape != src.shape:
        raise ValueError(f"copy: dst has shape {dst.shape} but src has {src.shape}")
    ddev, sdev = dst.device, src.device
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
    a: DeviceArray, b: DeviceArray, out: DeviceArray | None = None, *, stream: Stream | None = None
) -> DeviceArray:
    """``out = a + b`` element-wise (a new array when ``out`` is None); returns ``out``."""
    device = _arrays("add", a=a, b=b) if out is None else _arrays("add", a=a, b=b, out=out)
    _arith("add", a.dtype)
    stream = device.current_stream() if stream is None else resolve_stream(stream, device)
    if out is None:
        out = empty(a.shape, a.dtype, device=device, stream=stream)
    n = a.size
    if n == 0:
        return out
    if a.is_contiguous and b.is_contiguous and out.is_contiguous:
        run("cg_add", a.dtype, device, stream, n, [out, a, b, n])
    else:
        run("cg_add_strided", a.dtype, device, stream, n, [out, a, b, n, layout(a.shape, out, a, b)])
    return out


if fastcall is not None:  # the repeat path in C (dense arrays of one shape, dtype, device; out given)
    globals()["add"] = functools.update_wrapper(fastcall.Elementwise(add, "cg_add", ARMED, BLOCK, 2), add)


def axpy(alpha: Any, x: DeviceArray, y: DeviceArray, *, stream: Stream | None = None) -> DeviceArray:
    """``y += alpha * x`` in place; returns ``y``.

    ``alpha`` is a number or a one-element device array (read when the
    kernel runs).
    """
    device = _arrays("axpy", y=y, x=x)
    _arith("axpy", y.dtype)
    pointer, a = _scalar_arg("axpy", alpha, y.dtype, device)
    return _alpha_op("cg_axpy", pointer, a, x, y, device, resolve_stream(stream, device))


def scale(
    alpha: Any, x: DeviceArray, out: DeviceArray | None = None, *, stream: Stream | None = None
) -> DeviceArray:
    """``out = alpha * x`` (a new array when ``out`` is None); returns ``out``."""
    device = _arrays("scale", x=x)
    _arith("scale", x.dtype)
    pointer, a = _scalar_arg("scale", alpha, x.dtype, device)
    stream = resolve_stream(stream, device)
    if out is None:
        out = empty(x.shape, x.dtype, device=device, stream=stream)
    else:
        _arrays("scale", out=out, x=x)
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
        run(name, x.dtype, device, stream, n, [out, x, alpha, n])
    else:
        run(name + "_strided", x.dtype, device, stream, n, [out, x, alpha, n, layout(x.shape, out, x)])
    return out
