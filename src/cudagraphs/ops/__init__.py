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
=========================  =========================================  ===================

``alpha`` is a Python number or a one-element device array of the same dtype
(read on the device when the kernel runs, so it can change between graph
replays). Kernels compile on first use; before capturing, call
``cg.ops.preload(dtypes)`` so none needs compiling inside the capture.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .._array import DeviceArray, empty
from .._device import Device, Stream
from .._capture import keep
from .._kernel import Kernel

__all__ = ["add", "axpy", "copy", "elementwise_kernel", "fill", "preload", "scale",
           "set_condition"]

SOURCE = (Path(__file__).parent / "kernels" / "elementwise.cu").read_text()
CONDITION_SOURCE = (Path(__file__).parent / "kernels" / "conditional.cu").read_text()
_FLAG_TYPES = {"bool": "bool", "int32": "int", "int64": "long long", "uint8": "unsigned char",
               "float32": "float", "float64": "double"}
MAX_NDIM = 8
_LAYOUT = np.dtype((np.void, 8 + 8 * MAX_NDIM + 3 * 8 * MAX_NDIM))
_LAYOUT_PACK = struct.Struct(f"<q{MAX_NDIM}q{3 * MAX_NDIM}q").pack
_ARITH = {"float32": "float", "float64": "double", "int32": "int", "int64": "long long"}
_ARITH_DTYPES = frozenset(np.dtype(n) for n in _ARITH)
_BITS = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int",
         8: "unsigned long long", 16: "ulonglong2"}
_BLOCK = (256, 1, 1)


# numpy references, run by the sim backend ---------------------------------
def _host_fill(out: np.ndarray, value: Any, *rest: Any) -> None:
    bits = np.asarray(value)
    out.view(bits.dtype)[...] = bits


def _host_copy(dst: np.ndarray, src: np.ndarray, *rest: Any) -> None:
    dst[...] = src


def _host_add(out: np.ndarray, a: np.ndarray, b: np.ndarray, *rest: Any) -> None:
    np.add(a, b, out=out)


def _alpha(alpha: Any) -> Any:
    return alpha.reshape(-1)[0] if isinstance(alpha, np.ndarray) else alpha


def _host_axpy(y: np.ndarray, x: np.ndarray, alpha: Any, *rest: Any) -> None:
    y[...] = (_alpha(alpha) * x + y).astype(y.dtype, copy=False)


def _host_scale(out: np.ndarray, x: np.ndarray, alpha: Any, *rest: Any) -> None:
    out[...] = (_alpha(alpha) * x).astype(out.dtype, copy=False)


# kernel table: name -> (parameter types, host reference); "T" is the element
_KERNELS: dict[str, tuple[Sequence[str], Callable[..., None]]] = {
    "cg_fill": (("void*", "T", "int64"), _host_fill),
    "cg_fill_strided": (("void*", "T", "int64", "L"), _host_fill),
    "cg_copy_strided": (("void*", "void*", "int64", "L"), _host_copy),
    "cg_add": (("void*", "void*", "void*", "int64"), _host_add),
    "cg_add_strided": (("void*", "void*", "void*", "int64", "L"), _host_add),
    "cg_axpy": (("void*", "void*", "T", "int64"), _host_axpy),
    "cg_axpy_ptr": (("void*", "void*", "void*", "int64"), _host_axpy),
    "cg_axpy_strided": (("void*", "void*", "T", "int64", "L"), _host_axpy),
    "cg_axpy_ptr_strided": (("void*", "void*", "void*", "int64", "L"), _host_axpy),
    "cg_scale": (("void*", "void*", "T", "int64"), _host_scale),
    "cg_scale_ptr": (("void*", "void*", "void*", "int64"), _host_scale),
    "cg_scale_strided": (("void*", "void*", "T", "int64", "L"), _host_scale),
    "cg_scale_ptr_strided": (("void*", "void*", "void*", "int64", "L"), _host_scale),
}


@functools.lru_cache(maxsize=None)
def elementwise_kernel(name: str, dtype: np.dtype) -> Kernel:
    """The built-in kernel ``name`` for elements of ``dtype``.

    Fill and copy kernels are built per element size (they move bits);
    arithmetic kernels per arithmetic dtype.
    """
    params, host = _KERNELS[name]
    if name.startswith(("cg_fill", "cg_copy")):
        ctype = _BITS[dtype.itemsize]
        tdt: Any = np.dtype((np.void, 16)) if dtype.itemsize == 16 else np.dtype(f"u{dtype.itemsize}")
        defines = {"CG_T": ctype, "CG_BITS_ONLY": "1"}
    else:
        ctype, tdt = _ARITH[dtype.name], dtype
        defines = {"CG_T": ctype}
    signature = [tdt if p == "T" else _LAYOUT if p == "L" else p for p in params]
    return Kernel(SOURCE, name, host, signature=signature, defines=defines)


def preload(dtypes: Sequence[Any] = ("float32",), device: Device | None = None) -> None:
    """Compile every built-in kernel for ``dtypes`` now, e.g. before a capture.

    A kernel is compiled on first use, which is illegal inside a capture;
    call this first for the dtypes the captured ops will use.
    """
    from .._dtypes import normalize_dtype
    from .._kernel import preload as preload_kernels

    kernels = []
    for d in dtypes:
        dt = normalize_dtype(d)
        for name in _KERNELS:
            if name.startswith(("cg_fill", "cg_copy")) or dt in _ARITH_DTYPES:
                kernels.append(elementwise_kernel(name, dt))
        if dt.name in _FLAG_TYPES:
            kernels += [condition_kernel(n, dt) for n in ("cg_set_condition", "cg_set_condition_index")]
    preload_kernels(kernels, device)


def _host_set_condition(handle: Any, flag: np.ndarray) -> None:
    from ..backends.sim import CONDITIONS

    CONDITIONS[int(handle)] = int(flag.reshape(-1)[0] != 0)


def _host_set_condition_index(handle: Any, flag: np.ndarray) -> None:
    from ..backends.sim import CONDITIONS

    v = int(flag.reshape(-1)[0])
    CONDITIONS[int(handle)] = v if 0 <= v <= 0xFFFFFFFF else 0xFFFFFFFF


@functools.lru_cache(maxsize=None)
def condition_kernel(name: str, dtype: np.dtype) -> Kernel:
    """The built-in kernel ``name`` that sets a condition from a ``dtype`` flag."""
    host = _host_set_condition if name == "cg_set_condition" else _host_set_condition_index
    return Kernel(CONDITION_SOURCE, name, host, signature=["uint64", "void*"],
                  defines={"CG_T": _FLAG_TYPES[dtype.name]})


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
    from .._graph import Condition

    if not isinstance(cond, Condition):
        raise TypeError(f"set_condition takes a Condition from g.condition(), got {type(cond).__name__}")
    if not isinstance(flag, DeviceArray) or flag.dtype.name not in _FLAG_TYPES or flag.size < 1:
        raise TypeError(
            f"set_condition's flag must be a non-empty device array of {', '.join(_FLAG_TYPES)}; "
            f"got {flag!r}"
        )
    device = flag.device
    stream = _stream(device, stream)
    name = "cg_set_condition_index" if flag.dtype.kind in "iu" else "cg_set_condition"
    kernel = condition_kernel(name, flag.dtype)
    kernel.enqueue(device, stream, (1, 1, 1), (1, 1, 1), 0, [cond.handle, flag.ptr], [cond.handle, flag])


# validation and launch helpers --------------------------------------------
def _arrays(op: str, **named: Any) -> Device:
    """Check that the named arguments are device arrays of one shape, dtype, device."""
    arrays = list(named.values())
    first = arrays[0]
    for a in arrays:
        if (type(a) is not DeviceArray or a.device is not first.device
                or a.shape != first.shape or a.dtype != first.dtype):
            _mismatch(op, named)
    return first.device


def _mismatch(op: str, named: dict[str, Any]) -> None:
    """Raise the error that says which argument does not match and how."""
    first_name, first = next(iter(named.items()))
    for arg, a in named.items():
        if not isinstance(a, DeviceArray):
            raise TypeError(f"{op}: {arg} must be a cudagraphs DeviceArray, got {type(a).__name__}")
    for arg, a in named.items():
        if a.device is not first.device:
            raise ValueError(f"{op}: {arg} is on {a.device} but {first_name} is on {first.device}")
        if a.shape != first.shape:
            raise ValueError(
                f"{op}: shape mismatch, {first_name} has shape {first.shape} and "
                f"{arg} has {a.shape} (no broadcasting)"
            )
        if a.dtype != first.dtype:
            raise TypeError(
                f"{op}: dtype mismatch, {first_name} is {first.dtype} and {arg} is {a.dtype}"
            )


def _arith(op: str, dtype: np.dtype) -> None:
    if dtype not in _ARITH_DTYPES:
        raise TypeError(f"{op} supports {', '.join(_ARITH)}; got {dtype}")


def _stream(device: Device, stream: Stream | None) -> Stream:
    if stream is None:
        return device.stream
    if not isinstance(stream, Stream) or stream.device is not device:
        raise ValueError(f"stream must be a cudagraphs Stream of {device}, got {stream!r}")
    return stream


def _layout(shape: tuple[int, ...], *arrays: DeviceArray) -> bytes:
    if len(shape) > MAX_NDIM:
        raise ValueError(f"strided ops support up to {MAX_NDIM} dimensions, got {len(shape)}")
    pad = (0,) * (MAX_NDIM - len(shape))
    strides: list[int] = []
    for k in range(3):
        s = arrays[k].strides if k < len(arrays) else (0,) * len(shape)
        strides += [*s, *pad]
    return _LAYOUT_PACK(len(shape), *shape, *pad, *strides)


def _run(
    name: str, dtype: np.dtype, device: Device, stream: Stream, n: int, args: list[Any]
) -> None:
    """Launch a built-in kernel; ``args`` were validated by the op."""
    kernel = elementwise_kernel(name, dtype)
    grid = (min(-(-n // _BLOCK[0]), device.properties.multiprocessors * 32), 1, 1)
    raw = [getattr(a, "ptr", a) for a in args]
    kernel.enqueue(device, stream, grid, _BLOCK, 0, raw, args)


def _scalar_arg(op: str, alpha: Any, dtype: np.dtype, device: Device) -> tuple[bool, Any]:
    """(is_pointer, value) for an alpha given as a number or a 1-element array."""
    if isinstance(alpha, DeviceArray) or hasattr(alpha, "_view_spec"):
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
    return False, dtype.type(alpha).item()


# the ops ------------------------------------------------------------------
def fill(x: DeviceArray, value: Any, *, stream: Stream | None = None) -> DeviceArray:
    """Set every element of ``x`` to ``value`` (converted to ``x.dtype``); returns ``x``.

    Raises
    ------
    TypeError
        If ``value`` cannot be represented in ``x.dtype`` without loss of kind.
    """
    device = _arrays("fill", x=x)
    stream = _stream(device, stream)
    if x.dtype.kind in "iub" and isinstance(value, (float, np.floating)) and not float(value).is_integer():
        raise TypeError(f"fill: {value!r} is not an integer but x is {x.dtype}")
    try:
        bits = np.asarray(value, dtype=x.dtype)
    except (TypeError, ValueError, OverflowError) as exc:
        raise TypeError(f"fill: cannot store {value!r} in a {x.dtype} array: {exc}") from None
    if bits.ndim:
        raise TypeError(f"fill takes a scalar value, got shape {bits.shape}; use copy() for arrays")
    raw = bits.tobytes() if x.itemsize == 16 else int(bits.view(f"u{x.itemsize}"))
    n = x.size
    if n == 0:
        return x
    if x.is_contiguous:
        _run("cg_fill", x.dtype, device, stream, n, [x, raw, n])
    else:
        _run("cg_fill_strided", x.dtype, device, stream, n, [x, raw, n, _layout(x.shape, x)])
    return x


def copy(dst: DeviceArray, src: DeviceArray, *, stream: Stream | None = None) -> DeviceArray:
    """Copy ``src`` into ``dst`` (same shape and dtype, any layouts); returns ``dst``.

    Contiguous pairs use a device-to-device memcpy; any other layout runs the
    strided copy kernel, whose shape and strides are passed by value.
    """
    device = _arrays("copy", dst=dst, src=src)
    stream = _stream(device, stream)
    n = dst.size
    if n == 0:
        return dst
    if dst.is_contiguous and src.is_contiguous:
        device.backend.memcpy_dtod(dst.ptr, src.ptr, dst.nbytes, stream._live())
        if device.captures:
            keep(device, stream, (dst, src), "memcpy", "", ("memcpy", dst.nbytes))
    else:
        _run("cg_copy_strided", dst.dtype, device, stream, n,
             [dst, src, n, _layout(dst.shape, dst, src)])
    return dst


def add(
    a: DeviceArray, b: DeviceArray, out: DeviceArray | None = None, *, stream: Stream | None = None
) -> DeviceArray:
    """``out = a + b`` element-wise (a new array when ``out`` is None); returns ``out``."""
    device = _arrays("add", a=a, b=b) if out is None else _arrays("add", a=a, b=b, out=out)
    _arith("add", a.dtype)
    if out is None:
        out = empty(a.shape, a.dtype, device=device)
    stream = _stream(device, stream)
    n = a.size
    if n == 0:
        return out
    if a.is_contiguous and b.is_contiguous and out.is_contiguous:
        _run("cg_add", a.dtype, device, stream, n, [out, a, b, n])
    else:
        _run("cg_add_strided", a.dtype, device, stream, n,
             [out, a, b, n, _layout(a.shape, out, a, b)])
    return out


def axpy(alpha: Any, x: DeviceArray, y: DeviceArray, *, stream: Stream | None = None) -> DeviceArray:
    """``y += alpha * x`` in place; returns ``y``.

    ``alpha`` is a number or a one-element device array (read when the
    kernel runs).
    """
    device = _arrays("axpy", y=y, x=x)
    _arith("axpy", y.dtype)
    pointer, a = _scalar_arg("axpy", alpha, y.dtype, device)
    return _alpha_op("cg_axpy", pointer, a, x, y, device, _stream(device, stream))


def scale(
    alpha: Any, x: DeviceArray, out: DeviceArray | None = None, *, stream: Stream | None = None
) -> DeviceArray:
    """``out = alpha * x`` (a new array when ``out`` is None); returns ``out``."""
    device = _arrays("scale", x=x)
    _arith("scale", x.dtype)
    pointer, a = _scalar_arg("scale", alpha, x.dtype, device)
    if out is None:
        out = empty(x.shape, x.dtype, device=device)
    else:
        _arrays("scale", out=out, x=x)
    return _alpha_op("cg_scale", pointer, a, x, out, device, _stream(device, stream))


def _alpha_op(
    base: str, pointer: bool, alpha: Any, x: DeviceArray, out: DeviceArray,
    device: Device, stream: Stream,
) -> DeviceArray:
    n = x.size
    if n == 0:
        return out
    name = base + ("_ptr" if pointer else "")
    if x.is_contiguous and out.is_contiguous:
        _run(name, x.dtype, device, stream, n, [out, x, alpha, n])
    else:
        _run(name + "_strided", x.dtype, device, stream, n,
             [out, x, alpha, n, _layout(x.shape, out, x)])
    return out
