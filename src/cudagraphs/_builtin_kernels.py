"""The built-in kernels, and the copy and fill primitives on views.

This sits below the array layer: it works on anything that looks like an
array (``ptr``, ``shape``, ``strides``, ``dtype``, ``device``,
``is_contiguous``, ``size``, ``nbytes``, ``_block``, ``_view_spec()``), so
array methods (``x[...] = v``, ``x.copy()``) and the public ops above both
use it. Every kernel is ``ops/kernels/*.cu`` with a numpy reference run by
the ``sim`` backend; shapes and strides go by value in a ``Layout`` struct,
so strided kernels are graph-safe. Parameter names are real (``set_arg``
takes them); ``n`` and ``layout`` are fixed by the arrays' shapes.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

try:
    import cython
except ImportError:  # (run as Python where Cython is not installed: nothing is compiled)
    cython = SimpleNamespace(compiled=False)

from ._allocator import Block
from ._kernel import Kernel, _param_from_spec
from ._recording import Work, address, submit
from .backends.base import ArrayArg, ContextualHost, Copy, HostContext

__all__ = [
    "ARITH",
    "FLAG_TYPES",
    "MAX_NDIM",
    "Scratch",
    "builtin_kernel",
    "c_strides",
    "check_same",
    "condition_kernel",
    "copy_view",
    "fill_value",
    "fill_view",
    "layout",
    "run",
    "scratch",
]

_KERNELS_DIR = Path(__file__).parent / "ops" / "kernels"
SOURCE = (_KERNELS_DIR / "elementwise.cu").read_text()
CONDITION_SOURCE = (_KERNELS_DIR / "conditional.cu").read_text()
FLAG_TYPES = {
    "bool": "bool",
    "int32": "int",
    "int64": "long long",
    "uint8": "unsigned char",
    "float32": "float",
    "float64": "double",
}
MAX_NDIM = 8
_LAYOUT = np.dtype((np.void, 8 + 8 * MAX_NDIM + 3 * 8 * MAX_NDIM))
_LAYOUT_PACK = struct.Struct(f"<q{MAX_NDIM}q{3 * MAX_NDIM}q").pack
ARITH = {"float32": "float", "float64": "double", "int32": "int", "int64": "long long"}
_BITS = {
    1: "unsigned char",
    2: "unsigned short",
    4: "unsigned int",
    8: "unsigned long long",
    16: "ulonglong2",
}
BLOCK = (256, 1, 1)
_BLOCK = BLOCK  # (the same, for the hot paths: compiled, a C global, no name lookup)
_FIXED = frozenset({"n", "layout"})


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


_P = tuple[str, str]  # (parameter name, type: "T" element, "L" layout, or a C type)
_KERNELS: dict[str, tuple[Sequence[_P], Callable[..., None]]] = {
    "cg_fill": ((("out", "void*"), ("value", "T"), ("n", "int64")), _host_fill),
    "cg_fill_strided": ((("out", "void*"), ("value", "T"), ("n", "int64"), ("layout", "L")), _host_fill),
    "cg_copy_strided": ((("dst", "void*"), ("src", "void*"), ("n", "int64"), ("layout", "L")), _host_copy),
    "cg_add": ((("out", "void*"), ("a", "void*"), ("b", "void*"), ("n", "int64")), _host_add),
    "cg_add_strided": (
        (("out", "void*"), ("a", "void*"), ("b", "void*"), ("n", "int64"), ("layout", "L")),
        _host_add,
    ),
    "cg_axpy": ((("y", "void*"), ("x", "void*"), ("alpha", "T"), ("n", "int64")), _host_axpy),
    "cg_axpy_ptr": ((("y", "void*"), ("x", "void*"), ("alpha", "void*"), ("n", "int64")), _host_axpy),
    "cg_axpy_strided": (
        (("y", "void*"), ("x", "void*"), ("alpha", "T"), ("n", "int64"), ("layout", "L")),
        _host_axpy,
    ),
    "cg_axpy_ptr_strided": (
        (("y", "void*"), ("x", "void*"), ("alpha", "void*"), ("n", "int64"), ("layout", "L")),
        _host_axpy,
    ),
    "cg_scale": ((("out", "void*"), ("x", "void*"), ("alpha", "T"), ("n", "int64")), _host_scale),
    "cg_scale_ptr": ((("out", "void*"), ("x", "void*"), ("alpha", "void*"), ("n", "int64")), _host_scale),
    "cg_scale_strided": (
        (("out", "void*"), ("x", "void*"), ("alpha", "T"), ("n", "int64"), ("layout", "L")),
        _host_scale,
    ),
    "cg_scale_ptr_strided": (
        (("out", "void*"), ("x", "void*"), ("alpha", "void*"), ("n", "int64"), ("layout", "L")),
        _host_scale,
    ),
}
KERNEL_NAMES = tuple(_KERNELS)


def _make(
    source: str,
    name: str,
    host: Callable[..., object],
    params: Sequence[tuple[str, Any]],
    defines: dict[str, str],
) -> Kernel:
    signature = []
    for i, (pname, spec) in enumerate(params):
        p = _param_from_spec(i, spec, name)
        signature.append(type(p)(pname, p.dtype, p.pointer, p.pointee))
    kernel = Kernel(source, name, host, signature=signature, defines=defines)
    kernel.fixed = _FIXED
    return kernel


@functools.cache
def builtin_kernel(name: str, dtype: np.dtype) -> Kernel:
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
        ctype, tdt = ARITH[dtype.name], dtype
        defines = {"CG_T": ctype}
    resolved = [(p, tdt if t == "T" else _LAYOUT if t == "L" else t) for p, t in params]
    return _make(SOURCE, name, host, resolved, defines)


# condition kernels act on the device that runs them: their host code takes its context
def _host_set_condition(device: HostContext, handle: Any, flag: np.ndarray) -> None:
    device.set_conditional(int(handle), int(flag.reshape(-1)[0] != 0))


def _host_set_condition_index(device: HostContext, handle: Any, flag: np.ndarray) -> None:
    v = int(flag.reshape(-1)[0])
    device.set_conditional(int(handle), v if 0 <= v <= 0xFFFFFFFF else 0xFFFFFFFF)


def _host_loop_guard(device: HostContext, handle: Any, count: np.ndarray, cap: Any) -> None:
    count[0] += 1
    if count[0] >= cap:
        device.set_conditional(int(handle), 0)


@functools.cache
def condition_kernel(name: str, dtype: np.dtype) -> Kernel:
    """The built-in kernel ``name`` that sets a condition from a ``dtype`` flag.

    ``cg_set_condition`` (flag != 0), ``cg_set_condition_index`` (the value),
    or ``cg_loop_guard`` (a while loop's iteration cap; ``dtype`` int64).
    """
    defines = {"CG_T": FLAG_TYPES.get(dtype.name, "int")}
    if name == "cg_loop_guard":
        return _make(
            CONDITION_SOURCE,
            name,
            ContextualHost(_host_loop_guard),
            [("handle", "uint64"), ("count", "int64*"), ("cap", "int64")],
            defines,
        )
    host = _host_set_condition if name == "cg_set_condition" else _host_set_condition_index
    return _make(
        CONDITION_SOURCE, name, ContextualHost(host), [("handle", "uint64"), ("flag", "void*")], defines
    )


class Scratch:
    """A contiguous temporary of the allocator, shaped like an array (below arrays)."""

    __slots__ = (
        "_block",
        "device",
        "dtype",
        "is_contiguous",
        "itemsize",
        "nbytes",
        "ptr",
        "shape",
        "size",
        "strides",
    )

    def __init__(self, block: Block, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self._block, self.ptr, self.shape, self.dtype = block, block.ptr, shape, dtype
        self.device = block.device
        self.size = int(np.prod(shape, dtype=np.int64))
        self.itemsize = dtype.itemsize
        self.nbytes = self.size * dtype.itemsize
        self.strides = c_strides(shape, dtype.itemsize)
        self.is_contiguous = True

    def _view_spec(self) -> ArrayArg:
        return ArrayArg(self.ptr, self.shape, self.strides, self.dtype)


def c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def scratch(device: Any, shape: tuple[int, ...], dtype: np.dtype, stream: Any) -> Scratch:
    """A contiguous temporary on ``stream`` (from the capture's memory when captured)."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return Scratch(device.allocator.malloc(nbytes, stream), shape, dtype)


def layout(shape: tuple[int, ...], *arrays: Any) -> bytes:
    """The ``Layout`` struct of up to three operands of one shape."""
    if len(shape) > MAX_NDIM:
        raise ValueError(f"strided ops support up to {MAX_NDIM} dimensions, got {len(shape)}")
    pad = (0,) * (MAX_NDIM - len(shape))
    strides: list[int] = []
    for k in range(3):
        s = arrays[k].strides if k < len(arrays) else (0,) * len(shape)
        strides += [*s, *pad]
    return _LAYOUT_PACK(len(shape), *shape, *pad, *strides)


def grid_of(n: int, cap: int) -> tuple[int, int, int]:
    """The grid of a built-in kernel over ``n`` elements (at most ``cap`` blocks).

    The last one made is made once (a loop launches over arrays of one size:
    the launch then meets the same tuple, which it has read already).
    """
    last = _LAST_GRID[0]
    if last[0] == n and last[1] == cap:
        return last[2]  # type: ignore[no-any-return]
    grid = (min(-(-n // _BLOCK[0]), cap), 1, 1)
    _LAST_GRID[0] = (n, cap, grid)
    return grid


_LAST_GRID: list[tuple[Any, Any, Any]] = [(None, None, None)]  # (n, cap, grid) of the last grid_of
_RUNS: dict[tuple[str, Any, Any], tuple[Kernel, int]] = {}  # (name, dtype, device) -> (kernel, grid cap)
_LAST_RUN: list[tuple[Any, Any, Any, Any]] = [(None, None, None, None)]  # (name, dtype, device, plan)


def run(
    name: str, dtype: np.dtype, device: Any, stream: Any, n: int, args: tuple[Any, ...], writes: int = 1
) -> None:
    """Launch a built-in kernel over ``n`` elements; the first ``writes`` arguments are written.

    ``args`` were validated by the caller; arrays among them are passed as
    their address, with their (possibly strided) view for the simulator.
    """
    last = _LAST_RUN[0]  # (the last run's plan, found by identity: a dtype's hash is a tuple's)
    if last[0] is name and last[1] is dtype and last[2] is device:
        plan = last[3]
    else:
        key = (name, dtype, device)
        plan = _RUNS.get(key)
        if plan is None:  # (its kernel, and the grid's cap: blocks enough to fill the device)
            plan = _RUNS[key] = (builtin_kernel(name, dtype), device.properties.multiprocessors * 32)
        _LAST_RUN[0] = (name, dtype, device, plan)
    kernel, cap = plan
    grid = grid_of(n, cap)
    count = len(args)
    values = kernel._lend_values(count)  # (the kernel's spare list, given back after)
    for i in range(count):  # (by identity: a set of the plain types would hash each one's type)
        a = args[i]
        t = type(a)
        values[i] = a if t is int or t is float or t is bytes else address(a)
    kernel._enqueue(device, stream, grid, _BLOCK, 0, values, args, writes)
    kernel._spare = values


def fill_view(x: Any, value: Any, stream: Any) -> None:
    """``x[...] = value`` on any layout; ``value`` is already of ``x.dtype`` (numpy scalar)."""
    n = x.size
    if n == 0:
        return
    bits = np.asarray(value, dtype=x.dtype)
    raw = bits.tobytes() if x.itemsize == 16 else int(bits.view(f"u{x.itemsize}"))
    if x.is_contiguous:
        run("cg_fill", x.dtype, x.device, stream, n, (x, raw, n))
    else:
        run("cg_fill_strided", x.dtype, x.device, stream, n, (x, raw, n, layout(x.shape, x)))


def copy_view(dst: Any, src: Any, stream: Any) -> None:
    """``dst[...] = src`` (same shape and dtype, any layouts).

    Contiguous pairs use a device-to-device memcpy (a node ``rebind`` can
    repoint); any other layout runs the strided copy kernel.
    """
    n = dst.size
    if n == 0:
        return
    if dst.is_contiguous and src.is_contiguous:
        copy = Copy(dst.ptr, src.ptr, dst.nbytes, "dtod")
        backend = dst.device.backend
        submit(stream, Work("memcpy", backend.memcpy, copy, (src,), (dst,), patch=copy))
    else:
        run("cg_copy_strided", dst.dtype, dst.device, stream, n, (dst, src, n, layout(dst.shape, dst, src)))


def check_same(op: str, **named: Any) -> Any:
    """Check that the named arguments are arrays of one shape, dtype and device.

    Returns the device. ``TypeError`` names a non-array or a dtype mismatch,
    ``ValueError`` a device or shape mismatch (there is no broadcasting).
    """
    arrays = list(named.values())
    first = arrays[0]
    for a in arrays:
        if (
            getattr(a, "_view_spec", None) is None
            or a.device is not first.device
            or a.shape != first.shape
            or a.dtype != first.dtype
        ):
            _mismatch(op, named)
    return first.device


def _mismatch(op: str, named: dict[str, Any]) -> None:
    first_name, first = next(iter(named.items()))
    for arg, a in named.items():
        if getattr(a, "_view_spec", None) is None:
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
            raise TypeError(f"{op}: dtype mismatch, {first_name} is {first.dtype} and {arg} is {a.dtype}")


def fill_value(op: str, dtype: np.dtype, value: Any) -> np.generic:
    """``value`` as a scalar of ``dtype``, or a clear error.

    Raises
    ------
    TypeError
        For a non-number, an array, or a fraction into an integer dtype.
    ValueError
        For an integer out of the dtype's range.
    """
    if dtype.kind in "iub" and isinstance(value, (float, np.floating)) and not float(value).is_integer():
        raise TypeError(f"{op}: {value!r} is not an integer but the array is {dtype}")
    if dtype.kind in "iu" and isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        info = np.iinfo(dtype)
        if not info.min <= int(value) <= info.max:
            raise ValueError(
                f"{op}: cannot store {value} in a {dtype} array: out of range {info.min}..{info.max}"
            )
    try:
        bits = np.asarray(value, dtype=dtype)
    except (TypeError, ValueError, OverflowError) as exc:
        raise TypeError(f"{op}: cannot store {value!r} in a {dtype} array: {exc}") from None
    if bits.ndim:
        raise TypeError(f"{op} takes a scalar value, got shape {bits.shape}; use copy() for arrays")
    return bits[()]  # type: ignore[return-value]  # (indexing a 0-d array gives a numpy scalar)
