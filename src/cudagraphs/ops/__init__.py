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

import warnings
from typing import Any

import numpy as np

from .._array import DeviceArray
from .._builtin_kernels import (
    ARITH,
    FLAG_TYPES,
    KERNEL_NAMES,
    MAX_NDIM,
    builtin_kernel,
)
from .._builtin_kernels import condition_kernel as _condition_kernel
from .._control import Condition
from .._device import Device, Stream, StreamLike, as_device, resolve_stream
from .._dtypes import normalize_dtype
from .._kernel import Kernel
from .._kernel import preload as preload_kernels
from ._elementwise import _ARITH_DTYPES, add, axpy, copy, fill, scale
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


def set_condition(cond: Any, flag: DeviceArray, *, stream: Stream | StreamLike | None = None) -> None:
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
