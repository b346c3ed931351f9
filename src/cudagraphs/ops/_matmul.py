"""``cg.ops.matmul``: matrix products through cuBLASLt, safe to capture.

A product is validated here, described in cuBLAS's column-major terms
(:class:`cudagraphs._blas.MatmulProblem`), and queued as one
:class:`~cudagraphs._recording.Work` through
:func:`~cudagraphs._recording.submit`, like every other piece of work: the
capture rules, keep-alive and thread checks apply to it.

Row-major arrays go to cuBLAS without copies by the column-major trick: a
C-contiguous ``m x n`` matrix *is* the column-major ``n x m`` matrix ``D^T``,
so ``D = A @ B`` is computed as ``D^T = B^T @ A^T``. A transposed view
(``x.T``) is a column-major matrix, which cuBLAS takes with its transpose
flag. So each matrix (each 2-D slice of a batch) must have one unit stride
and a leading dimension at least as long as that side; other strided
views are refused (``x.copy()`` makes a contiguous array).

On the ``cuda`` backend the work calls ``cublasLtMatmul`` on the stream
(see :mod:`cudagraphs._blas`); on ``sim`` a kernel whose host
implementation is numpy's ``alpha * a @ b + beta * out`` runs in stream
order and is recorded as a node when captured. Both allocate the workspace
on the stream of the call (the sim stages its accumulator there, as
cuBLASLt's split-K algorithms do), so both exercise the same memory rules.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _blas
from .._array import DeviceArray, _extent, empty, operand
from .._builtin_kernels import Scratch, fill_view, layout, run, scratch
from .._device import Device, Stream, StreamLike, resolve_stream
from .._recording import Work, submit
from ..backends.base import ArrayArg, KernelLaunch, Param

__all__ = ["MATMUL_DTYPES", "matmul"]

MATMUL_DTYPES = ("float16", "bfloat16", "float32", "float64")
"""The dtypes :func:`matmul` takes (every operand of one product has the same one)."""

_OP_N, _OP_T = _blas.OP_N, _blas.OP_T
_SIM_WORKSPACE_LIMIT = 32 << 20  # the sim stages accumulators up to this size in a workspace
_PTR = np.dtype(np.uint64)
_SIM_PARAMS = (
    Param("d", _PTR, True),
    Param("a", _PTR, True),
    Param("b", _PTR, True),
    Param("workspace", _PTR, True),
    Param("alpha", np.dtype(np.float64)),
    Param("beta", np.dtype(np.float64)),
)
_SIM_FUNCTIONS: dict[Device, Any] = {}


def matmul(
    a: Any,
    b: Any,
    out: Any = None,
    *,
    alpha: float = 1,
    beta: float = 0,
    stream: Stream | StreamLike | None = None,
    tf32: bool = False,
) -> Any:
    """``out = alpha * a @ b + beta * out``: a matrix product through cuBLASLt; returns ``out``.

    Parameters
    ----------
    a : DeviceArray or CUDA array
        ``(m, k)``, or a batch ``(batch, m, k)``. Another library's CUDA
        array (a torch tensor, a CuPy array: ``__cuda_array_interface__`` or
        DLPack) is used in place, without a copy.
    b : DeviceArray or CUDA array
        ``(k, n)`` or ``(batch, k, n)``. A 2-D operand, or a batch of one,
        is used for every product of the batch (numpy's broadcasting).
    out : DeviceArray or CUDA array, optional
        ``(m, n)``, or ``(batch, m, n)`` when ``a`` or ``b`` is a batch; a
        new array when None. Another library's array is written in place
        and returned as it was given. It may not overlap ``a`` or ``b``.
    alpha, beta : float
        Python or numpy real numbers. ``beta`` other than 0 reads ``out``
        (which must then be given); ``beta=0`` never reads it.
    stream : Stream, optional
        Default: this thread's current stream of the arrays' device.
    tf32 : bool
        Let float32 products use TF32 tensor cores (faster, about 10 bits of
        mantissa in the products); default: exact float32 arithmetic.

    Returns
    -------
    DeviceArray or the given ``out``

    Raises
    ------
    TypeError
        For an operand that is not a device array, mixed or unsupported
        dtypes (float16, bfloat16, float32, float64 are), a scalar that is
        not a real number.
    ValueError
        For shapes that do not match, arrays on different devices, a
        strided layout cuBLAS cannot read (neither dimension has unit
        stride), misaligned data, an ``out`` that overlaps an input.
    BackendUnavailableError
        On the ``cuda`` backend without nvmath-python
        (``pip install 'cudagraphs[blas]'``).
    cudagraphs.BlasError
        If cuBLASLt refuses the product.

    Notes
    -----
    Capture: the product, its output (when ``out`` is None) and its
    workspace are recorded like any other work. Memory allocated inside a
    capture comes from the graph's pool, so the graph owns its workspace;
    none is shared with other graphs or eager calls (under
    ``alloc="forbid"``, a product whose algorithm needs a workspace is
    refused). ``alpha`` and ``beta`` are read when the call is made: a
    graph replays with the values it was captured with.

    The algorithm is chosen by cuBLASLt's heuristic on the first product of
    each problem (dtype, shapes, strides, alignment) and cached; that is
    host work, legal inside a capture too.

    float16 and bfloat16 products accumulate in float32; float32 in float32
    (or TF32 with ``tf32=True``), float64 in float64. Work on another
    library's arrays is ordered on cudagraphs' streams: order it with that
    library's stream yourself (``stream.wait(...)``).
    """
    given = out
    a = _operand("a", a)
    b = _operand("b", b)
    device = a.device
    if b.device is not device:
        raise ValueError(f"matmul: a is on {device} but b is on {b.device}")
    dtype = a.dtype
    if dtype.name not in MATMUL_DTYPES:
        raise TypeError(f"matmul supports {', '.join(MATMUL_DTYPES)}; a is {dtype}")
    if b.dtype != dtype:
        raise TypeError(f"matmul: dtype mismatch, a is {dtype} and b is {b.dtype} (convert one first)")
    for name, x, dims in (("a", a, "(m, k)"), ("b", b, "(k, n)")):
        if x.ndim not in (2, 3):
            raise ValueError(
                f"matmul: {name} must be 2-D {dims} or a 3-D batch (batch, {dims[1:]}, got shape {x.shape}"
            )
    k, k_b = a.shape[-1], b.shape[-2]
    if k != k_b:
        raise ValueError(
            f"matmul: inner dimensions differ: a has shape {a.shape} (k={k}) and b has shape "
            f"{b.shape} (k={k_b})"
        )
    batch, shape = _batch_shape(a, b)
    alpha_f, beta_f = _real("alpha", alpha), _real("beta", beta)
    if type(tf32) is not bool:
        raise TypeError(f"matmul: tf32 must be True or False, got {tf32!r}")
    _storage("a", a)
    _storage("b", b)
    stream = resolve_stream(stream, device)
    if out is None:
        if beta_f != 0:
            raise ValueError(f"matmul: beta={beta!r} reads out, so out must be given (or beta=0)")
        out = empty(shape, dtype, device=device, stream=stream)
    else:
        out = _operand("out", out)
        _check_out(out, a, b, dtype, shape, device)
    result = given if given is not None and not isinstance(given, DeviceArray) else out
    if out.size == 0:
        return result
    if k == 0:  # no products to sum: out = beta * out
        _scale_out(out, beta_f, stream)
        return result
    compute = "64F" if dtype.name == "float64" else ("32F_FAST_TF32" if tf32 else "32F")
    problem, first, second = _problem(a, b, out, batch, dtype.name, compute)
    reads = (a, b, out) if beta_f != 0 else (a, b)
    if _runs_host_code(device):
        _simulate(device, stream, out, a, b, alpha_f, beta_f, reads)
    else:
        _cublaslt(device, stream, problem, out, first, second, alpha_f, beta_f, reads)
    return result


def _runs_host_code(device: Device) -> bool:
    """Whether ``device`` runs kernels' numpy versions (the sim), not cuBLASLt."""
    return device.backend.capabilities.runs_host_code


# validation ---------------------------------------------------------------------------
def _operand(name: str, x: Any) -> DeviceArray:
    """``x`` as a DeviceArray: itself, or a zero-copy view of another library's CUDA array."""
    return operand(x, f"matmul: {name}")


def _real(name: str, value: Any) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(
            f"matmul: {name} must be a real number (a Python or numpy scalar), got {value!r}; "
            "it is read when the call is made (a captured graph replays with that value)"
        )
    return float(value)


def _batch_shape(a: DeviceArray, b: DeviceArray) -> tuple[int, tuple[int, ...]]:
    """(number of products, shape of the result)."""
    m, n = a.shape[-2], b.shape[-1]
    if a.ndim == 2 and b.ndim == 2:
        return 1, (m, n)
    batch_a = a.shape[0] if a.ndim == 3 else 1
    batch_b = b.shape[0] if b.ndim == 3 else 1
    if batch_a != batch_b and 1 not in (batch_a, batch_b):
        raise ValueError(
            f"matmul: batch sizes differ: a has shape {a.shape} and b has shape {b.shape} "
            "(a batch of one, or a 2-D operand, is used for every product)"
        )
    batch = batch_b if batch_a == 1 else batch_a
    return batch, (batch, m, n)


def _elements(name: str, x: DeviceArray) -> tuple[int, ...]:
    """``x``'s strides in elements (ValueError for misaligned data)."""
    item = x.itemsize
    if x.ptr % item or any(s % item for s in x.strides):
        raise ValueError(
            f"matmul: {name} (address 0x{x.ptr:x}, strides {x.strides}) is not aligned to its "
            f"{item}-byte elements; copy it first"
        )
    return tuple(s // item for s in x.strides)


def _orient(rows: int, cols: int, sr: int, sc: int, prefer_t: bool = False) -> tuple[int, int] | None:
    """How cuBLAS reads a ``rows x cols`` matrix with element strides ``(sr, sc)``.

    ``(OP_N, ld)``: it is column-major (unit row stride) with leading
    dimension ``ld``; ``(OP_T, ld)``: it is row-major, i.e. the transpose of
    a column-major ``cols x rows`` matrix. None: neither (no unit stride, a
    zero or negative stride, or a leading dimension that makes columns or
    rows overlap). ``prefer_t`` decides for matrices that are both (a
    single row or column).
    """
    col = (rows == 1 or sr == 1) and (cols == 1 or sc >= rows)
    row = (cols == 1 or sc == 1) and (rows == 1 or sr >= cols)
    if row and (prefer_t or not col):
        return _OP_T, (sr if rows > 1 else cols)
    if col:
        return _OP_N, (sc if cols > 1 else rows)
    return None


def _storage(name: str, x: DeviceArray) -> None:
    """Check that each matrix of ``x`` is one cuBLAS can read (ValueError otherwise)."""
    es = _elements(name, x)
    rows, cols = x.shape[-2:]
    if x.ndim == 3 and x.shape[0] > 1 and es[0] < 0:
        raise ValueError(f"matmul: {name} has a negative batch stride ({x.strides}); copy it first")
    if rows and cols and _orient(rows, cols, es[-2], es[-1]) is None:
        raise ValueError(
            f"matmul: {name} has shape {x.shape} and strides {x.strides}: cuBLAS reads matrices "
            "whose rows or columns are contiguous (C-contiguous arrays and their transposes .T); "
            "make a contiguous copy with .copy()"
        )


def _check_out(
    out: DeviceArray, a: DeviceArray, b: DeviceArray, dtype: np.dtype, shape: tuple[int, ...], device: Device
) -> None:
    if out.device is not device:
        raise ValueError(f"matmul: out is on {out.device} but a and b are on {device}")
    if out.dtype != dtype:
        raise TypeError(f"matmul: out is {out.dtype} but a and b are {dtype}")
    if out.shape != shape:
        raise ValueError(
            f"matmul: out must have shape {shape} for a {a.shape} @ b {b.shape}, got {out.shape}"
        )
    if out.size == 0:
        return
    _storage("out", out)
    lo, hi = _extent(out.shape, out.strides, out.itemsize)
    for name, x in (("a", a), ("b", b)):
        if x.size:
            x_lo, x_hi = _extent(x.shape, x.strides, x.itemsize)
            if out.ptr + lo < x.ptr + x_hi and x.ptr + x_lo < out.ptr + hi:
                raise ValueError(
                    f"matmul: out overlaps {name}; cuBLAS would read {name} while writing out: "
                    "pass a separate out"
                )


def _alignment(ptr: int, stride_bytes: int) -> int:
    """The alignment (a power of two, at most 256) of every matrix of a batch."""
    v = ptr | stride_bytes | 256
    return v & -v


def _problem(
    a: DeviceArray, b: DeviceArray, out: DeviceArray, batch: int, dtype: str, compute: str
) -> tuple[_blas.MatmulProblem, DeviceArray, DeviceArray]:
    """The product in cuBLAS's column-major terms, and the arrays it calls A and B.

    cuBLAS computes ``E = op(X) @ op(Y)`` on column-major ``E``: with a
    row-major ``out`` (``D``), ``E = D^T = b^T @ a^T``; with a column-major
    one (a transposed view), ``E = D = a @ b``.
    """
    item = out.itemsize
    m, n = out.shape[-2:]
    k = a.shape[-1]
    ea, eb, ed = _elements("a", a), _elements("b", b), _elements("out", out)

    def batch_stride(x: DeviceArray, e: tuple[int, ...]) -> int:
        return e[0] if x.ndim == 3 and x.shape[0] > 1 else 0

    found = _orient(m, n, ed[-2], ed[-1], prefer_t=True)
    assert found is not None  # (checked by _storage)
    d_op, ldc = found
    if d_op == _OP_T:  # row-major D: E = D^T (n x m) = b^T @ a^T
        rows, cols = n, m
        x, x_rows, x_cols, x_sr, x_sc, ex = b, n, k, eb[-1], eb[-2], eb
        y, y_rows, y_cols, y_sr, y_sc, ey = a, k, m, ea[-1], ea[-2], ea
    else:  # column-major D: E = D (m x n) = a @ b
        rows, cols = m, n
        x, x_rows, x_cols, x_sr, x_sc, ex = a, m, k, ea[-2], ea[-1], ea
        y, y_rows, y_cols, y_sr, y_sc, ey = b, k, n, eb[-2], eb[-1], eb
    op_x = _orient(x_rows, x_cols, x_sr, x_sc)
    op_y = _orient(y_rows, y_cols, y_sr, y_sc)
    assert op_x is not None  # (checked by _storage)
    assert op_y is not None
    stride_x, stride_y, stride_d = batch_stride(x, ex), batch_stride(y, ey), batch_stride(out, ed)
    if batch > 1 and stride_d < ldc * (cols - 1) + rows:
        raise ValueError(
            f"matmul: the matrices of out (shape {out.shape}, strides {out.strides}) overlap one "
            "another; pass an out whose batch stride is at least one matrix long"
        )
    problem = _blas.MatmulProblem(
        dtype=dtype,
        compute=compute,
        trans_a=op_x[0],
        trans_b=op_y[0],
        m=rows,
        n=cols,
        k=k,
        lda=op_x[1],
        ldb=op_y[1],
        ldc=ldc,
        batch=batch,
        stride_a=stride_x,
        stride_b=stride_y,
        stride_c=stride_d,
        align_a=_alignment(x.ptr, stride_x * item),
        align_b=_alignment(y.ptr, stride_y * item),
        align_c=_alignment(out.ptr, stride_d * item),
    )
    return problem, x, y


# the work ---------------------------------------------------------------------------------
def _scale_out(out: DeviceArray, beta: float, stream: Stream) -> None:
    """``out = beta * out`` (a product with k = 0)."""
    if beta == 0:
        fill_view(out, np.zeros((), out.dtype)[()], stream)
    elif beta != 1:
        if out.dtype.name not in ("float32", "float64"):
            raise ValueError(
                f"matmul: k = 0 with beta={beta} on {out.dtype} is not supported (only beta 0 or 1)"
            )
        n = out.size
        run(
            "cg_scale_strided",
            out.dtype,
            out.device,
            stream,
            n,
            (out, out, beta, n, layout(out.shape, out, out)),
        )


def _cublaslt(
    device: Device,
    stream: Stream,
    problem: _blas.MatmulProblem,
    out: DeviceArray,
    first: DeviceArray,
    second: DeviceArray,
    alpha: float,
    beta: float,
    reads: tuple[Any, ...],
) -> None:
    plan = _blas.plan(device, problem)
    workspace: Scratch | None = None
    if plan.workspace_size:
        # on the stream of the call: the graph's pool inside a capture, else the
        # cache (back to this stream's free list, stream ordered, once unused)
        workspace = scratch(device, (plan.workspace_size,), np.dtype(np.uint8), stream)
    ws_ptr = workspace.ptr if workspace is not None else 0
    a_ptr, b_ptr, d_ptr = first.ptr, second.ptr, out.ptr
    device.backend.activate(device.index)  # cuBLASLt works on the thread's current context

    def issue(raw: Any, _: Any) -> None:
        plan.run(int(raw), alpha, a_ptr, b_ptr, beta, d_ptr, ws_ptr)

    keep = (workspace,) if workspace is not None else ()
    # kind "": the library's nodes (one or more kernels, maybe a memset) are not ours to patch
    submit(stream, Work("", issue, None, reads, (out,), keep, "matmul"))


def _host_matmul(
    d: np.ndarray, a: np.ndarray, b: np.ndarray, workspace: np.ndarray | None, alpha: Any, beta: Any
) -> None:
    """The sim's cuBLASLt: numpy, accumulating in float32 (float64 for float64)."""
    acc = np.dtype(np.float64) if d.dtype == np.float64 else np.dtype(np.float32)
    result = np.matmul(a.astype(acc, copy=False), b.astype(acc, copy=False))
    result *= acc.type(alpha)
    if beta != 0:  # (beta = 0 never reads d, which may hold anything)
        result += acc.type(beta) * d.astype(acc)
    if workspace is not None:  # staged in the workspace, as split-K algorithms do
        workspace[...] = result
        result = workspace
    d[...] = result.astype(d.dtype)


def _simulate(
    device: Device,
    stream: Stream,
    out: DeviceArray,
    a: DeviceArray,
    b: DeviceArray,
    alpha: float,
    beta: float,
    reads: tuple[Any, ...],
) -> None:
    backend = device.backend
    fn = _SIM_FUNCTIONS.get(device)
    if fn is None:
        fn = _SIM_FUNCTIONS[device] = backend.load_kernel(
            device.index, None, "cg_matmul", _SIM_PARAMS, _host_matmul
        )
    acc = np.dtype(np.float64) if out.dtype == np.float64 else np.dtype(np.float32)
    workspace: Scratch | None = None
    ws_view: ArrayArg | None = None
    if out.size * acc.itemsize <= _SIM_WORKSPACE_LIMIT:
        workspace = scratch(device, out.shape, acc, stream)
        ws_view = workspace._view_spec()
    launch = KernelLaunch(
        fn,
        (1, 1, 1),
        (1, 1, 1),
        0,
        (out.ptr, a.ptr, b.ptr, workspace.ptr if workspace is not None else 0, alpha, beta),
        (out._view_spec(), a._view_spec(), b._view_spec(), ws_view, None, None),
    )
    keep = (workspace,) if workspace is not None else ()
    submit(stream, Work("", backend.launch, launch, reads, (out,), keep, "matmul"))
