"""cuBLASLt through nvmath-python: one handle per device, cached plans, the matmul call.

This is the only module that imports ``nvmath`` (NVIDIA's Python bindings
of the CUDA math libraries), and only when the ``cuda`` backend runs its
first matrix product: importing cudagraphs, and the ``sim`` backend, never
need it. The public face is :func:`cudagraphs.ops.matmul`, which describes
a product in cuBLAS's column-major terms (:class:`MatmulProblem`) and calls
:func:`plan` and :meth:`Plan.run` here.

Why cuBLASLt: its matmul takes the workspace and the stream as arguments,
so the caller decides where the workspace lives. cudagraphs allocates it on
the stream of the call: eagerly from the device's cache (freed, stream
ordered, after the call), inside a capture from the graph's pool, which the
graph owns. No workspace is ever shared by stream between graphs (PyTorch
issue #193402: a stream-keyed cuBLAS workspace freed while another live
graph still used it made replays fault).

Plans
-----
A :class:`Plan` holds the matmul descriptor, the matrix layouts and the
algorithm ``cublasLtMatmulAlgoGetHeuristic`` chose for one problem (dtype,
sizes, leading dimensions, batch strides, transposes, pointer alignments),
with the workspace size that algorithm needs. Plans are cached per device
(least recently used ones are dropped past :data:`MAX_PLANS`); the first
product of a shape pays for the heuristic, eagerly or inside a capture (it
runs on the host and queues no work). Descriptors are host objects read only
during the call: a captured graph does not need its plan afterwards.

Scalars use cuBLASLt's host pointer mode: ``alpha`` and ``beta`` are read
when the call is made, so a captured graph replays with the values it was
captured with.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import importlib
import threading
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from ._errors import BackendUnavailableError, BlasError

__all__ = [
    "INSTALL_HINT",
    "MAX_PLANS",
    "BlasError",
    "MatmulProblem",
    "Plan",
    "available",
    "clear_plans",
    "handle",
    "max_workspace",
    "plan",
]

INSTALL_HINT = "pip install 'cudagraphs[blas]' (nvmath-python, with the nvidia-cublas wheel of CUDA 13)"
MAX_PLANS = 256
"""Plans kept per process (least recently used ones are dropped)."""

# C enum values (cublas_api.h, library_types.h): part of the ABI, so nvmath's
# enum classes (some private) are not needed for them
OP_N, OP_T = 0, 1  # cublasOperation_t
DATA_TYPES = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 14}  # cudaDataType_t
COMPUTE_TYPES = {"32F": 68, "32F_FAST_TF32": 77, "64F": 70}  # cublasComputeType_t
SCALE_TYPES = {"32F": 0, "32F_FAST_TF32": 0, "64F": 1}  # CUDA_R_32F, CUDA_R_64F
_SCALE_DTYPES: dict[str, np.dtype] = {
    "32F": np.dtype(np.float32),
    "32F_FAST_TF32": np.dtype(np.float32),
    "64F": np.dtype(np.float64),
}

# cublasLtMatmulHeuristicResult_t: the algorithm (8 uint64), the workspace it
# needs, its status, its waves count, 4 reserved ints. nvmath's own dtype is
# used when it has these fields; this one otherwise (same C layout)
_RESULT_DTYPE = np.dtype(
    [
        ("algo", "<u8", (8,)),
        ("workspace_size", "<u8"),
        ("state", "<i4"),
        ("waves_count", "<f4"),
        ("reserved", "<i4", (4,)),
    ]
)

_lt: Any = None
_lock = threading.RLock()
_HANDLES: dict[Any, int] = {}  # device -> cublasLtHandle_t
_PLANS: collections.OrderedDict[tuple[Any, MatmulProblem], Plan] = collections.OrderedDict()


def _bindings() -> Any:
    """``nvmath.bindings.cublasLt``, imported on first use."""
    global _lt
    if _lt is None:
        try:  # (by name: nvmath ships no type information)
            cublasLt = importlib.import_module("nvmath.bindings.cublasLt")
        except Exception as exc:  # ImportError, or a broken install (missing libcublasLt)
            raise BackendUnavailableError(
                f"cg.ops.matmul on the cuda backend needs cuBLASLt through nvmath-python, which "
                f"could not be imported ({exc}); install it: {INSTALL_HINT}"
            ) from exc
        _lt = cublasLt
    return _lt


def available() -> bool:
    """Whether nvmath-python's cuBLASLt bindings can be imported here."""
    try:
        _bindings()
    except BackendUnavailableError:
        return False
    return True


def _call(call: str, fn: Callable[..., Any], *args: Any, problem: MatmulProblem | None = None) -> Any:
    """``fn(*args)``, cuBLASLt's failures raised as :class:`BlasError`."""
    lt = _bindings()
    try:
        return fn(*args)
    except getattr(lt, "cuBLASLtError", RuntimeError) as exc:
        status = getattr(exc, "status", None)
        status = int(status) if status is not None else None
        about = f" for {problem.describe()}" if problem is not None else ""
        raise BlasError(
            call,
            status,
            f"{exc}{about}; check that the arrays are on the device the call runs on and that no "
            "earlier kernel faulted (CUDA_LAUNCH_BLOCKING=1 finds the one that did)",
        ) from exc


class MatmulProblem(NamedTuple):
    """One product ``D = alpha * op(A) @ op(B) + beta * C`` in cuBLAS's column-major terms.

    ``D`` (and ``C``, the same memory) is ``m x n`` with leading dimension
    ``ldc``; ``op(A)`` is ``m x k`` and ``op(B)`` is ``k x n``. The key of
    the plan cache.

    Attributes
    ----------
    dtype : str
        ``"float16"``, ``"bfloat16"``, ``"float32"`` or ``"float64"`` (all operands).
    compute : str
        ``"32F"``, ``"32F_FAST_TF32"`` or ``"64F"`` (also the scalars' type).
    trans_a, trans_b : int
        :data:`OP_N` or :data:`OP_T`.
    m, n, k : int
    lda, ldb, ldc : int
        Leading dimensions, in elements, of the matrices as stored.
    batch : int
        Number of products (1: not batched).
    stride_a, stride_b, stride_c : int
        Elements from one matrix of the batch to the next (0: the same
        matrix for every product).
    align_a, align_b, align_c : int
        The alignment in bytes (a power of two, at most 256) guaranteed for
        every matrix of the batch: algorithms are chosen for it.
    """

    dtype: str
    compute: str
    trans_a: int
    trans_b: int
    m: int
    n: int
    k: int
    lda: int
    ldb: int
    ldc: int
    batch: int
    stride_a: int
    stride_b: int
    stride_c: int
    align_a: int
    align_b: int
    align_c: int

    def describe(self) -> str:
        """The problem in words, for error messages."""
        ops = "NT"
        return (
            f"a {self.dtype} product (compute {self.compute}) m={self.m} n={self.n} k={self.k}, "
            f"op(A)={ops[self.trans_a]} op(B)={ops[self.trans_b]}, lda={self.lda} ldb={self.ldb} "
            f"ldc={self.ldc}, batch={self.batch} (strides {self.stride_a}, {self.stride_b}, "
            f"{self.stride_c}), alignments {self.align_a}/{self.align_b}/{self.align_c} B"
        )


def max_workspace(device: Any) -> int:
    """The most workspace an algorithm may ask for on ``device`` (bytes).

    32 MiB on compute capability 9.0 and later, 4 MiB before: what cuBLAS
    itself uses by default. Only what the chosen algorithm needs is allocated.
    """
    return (32 if device.properties.compute_capability >= (9, 0) else 4) << 20


def handle(device: Any) -> int:
    """The cuBLASLt handle of ``device`` (one per device, made on first use)."""
    h = _HANDLES.get(device)
    if h is None:
        with _lock:
            h = _HANDLES.get(device)
            if h is None:
                lt = _bindings()
                device.backend.activate(device.index)
                h = int(_call("cublasLtCreate", lt.create))
                if not _HANDLES:
                    atexit.register(_destroy_handles)
                _HANDLES[device] = h
    return h


def _destroy_handles() -> None:
    """Destroy every handle (at exit; the driver may already be going away)."""
    clear_plans()
    lt = _lt
    with _lock:
        handles = list(_HANDLES.values())
        _HANDLES.clear()
    for h in handles:
        with contextlib.suppress(Exception):  # (at exit: nothing useful can be done about it)
            lt.destroy(h)


def clear_plans() -> None:
    """Forget every cached plan (their descriptors are destroyed once unused)."""
    with _lock:
        _PLANS.clear()


def _destroy_all(owned: list[tuple[Callable[[int], Any], int]]) -> None:
    """Destroy host descriptors (finalizer of a plan: no driver call, legal any time)."""
    while owned:
        destroy, ptr = owned.pop()
        with contextlib.suppress(Exception):  # (a finalizer must not raise)
            destroy(ptr)


class Plan:
    """Descriptors and the chosen algorithm for one :class:`MatmulProblem` on one device.

    Attributes
    ----------
    problem : MatmulProblem
    workspace_size : int
        Bytes of workspace the algorithm needs (0: none).

    Notes
    -----
    The descriptors are destroyed when the plan is garbage collected (a
    ``weakref.finalize`` on the list that owns them); a plan dropped from
    the cache stays valid for calls that still hold it.
    """

    __slots__ = (
        "__weakref__",
        "_algo",
        "_desc",
        "_finalizer",
        "_handle",
        "_layouts",
        "_result",
        "_scale",
        "problem",
        "workspace_size",
    )

    problem: MatmulProblem
    workspace_size: int
    _algo: int
    _desc: int
    _finalizer: weakref.finalize[Any, Any]
    _handle: int
    _layouts: tuple[int, int, int]
    _result: np.ndarray
    _scale: np.dtype

    def __init__(self, device: Any, problem: MatmulProblem) -> None:
        lt = _bindings()
        p = problem
        self.problem = p
        self._handle = handle(device)
        self._scale = _SCALE_DTYPES[p.compute]
        owned: list[tuple[Callable[[int], Any], int]] = []
        self._finalizer = weakref.finalize(self, _destroy_all, owned)
        desc_attr, layout_attr = lt.MatmulDescAttribute, lt.MatrixLayoutAttribute
        pref_attr = lt.MatmulPreferenceAttribute

        desc = _call(
            "cublasLtMatmulDescCreate",
            lt.matmul_desc_create,
            COMPUTE_TYPES[p.compute],
            SCALE_TYPES[p.compute],
            problem=p,
        )
        owned.append((lt.matmul_desc_destroy, desc))
        set_desc = _setter(
            "cublasLtMatmulDescSetAttribute",
            lt.matmul_desc_set_attribute,
            lt.get_matmul_desc_attribute_dtype,
            p,
        )
        set_desc(desc, desc_attr.TRANSA, p.trans_a, np.int32)
        set_desc(desc, desc_attr.TRANSB, p.trans_b, np.int32)
        self._desc = desc

        set_layout = _setter(
            "cublasLtMatrixLayoutSetAttribute",
            lt.matrix_layout_set_attribute,
            lt.get_matrix_layout_attribute_dtype,
            p,
        )
        data_type = DATA_TYPES[p.dtype]

        def layout(rows: int, cols: int, ld: int, stride: int) -> int:
            made = _call(
                "cublasLtMatrixLayoutCreate", lt.matrix_layout_create, data_type, rows, cols, ld, problem=p
            )
            owned.append((lt.matrix_layout_destroy, made))
            if p.batch > 1:
                set_layout(made, layout_attr.BATCH_COUNT, p.batch, np.int32)
                set_layout(made, layout_attr.STRIDED_BATCH_OFFSET, stride, np.int64)
            return int(made)

        a_rows, a_cols = (p.m, p.k) if p.trans_a == OP_N else (p.k, p.m)
        b_rows, b_cols = (p.k, p.n) if p.trans_b == OP_N else (p.n, p.k)
        la = layout(a_rows, a_cols, p.lda, p.stride_a)
        lb = layout(b_rows, b_cols, p.ldb, p.stride_b)
        lc = layout(p.m, p.n, p.ldc, p.stride_c)  # C and D: the same memory, the same layout
        self._layouts = (la, lb, lc)

        pref = _call("cublasLtMatmulPreferenceCreate", lt.matmul_preference_create, problem=p)
        try:
            set_pref = _setter(
                "cublasLtMatmulPreferenceSetAttribute",
                lt.matmul_preference_set_attribute,
                lt.get_matmul_preference_attribute_dtype,
                p,
            )
            set_pref(pref, pref_attr.MAX_WORKSPACE_BYTES, max_workspace(device), np.uint64)
            set_pref(pref, pref_attr.MIN_ALIGNMENT_A_BYTES, p.align_a, np.uint32)
            set_pref(pref, pref_attr.MIN_ALIGNMENT_B_BYTES, p.align_b, np.uint32)
            set_pref(pref, pref_attr.MIN_ALIGNMENT_C_BYTES, p.align_c, np.uint32)
            set_pref(pref, pref_attr.MIN_ALIGNMENT_D_BYTES, p.align_c, np.uint32)
            results = np.zeros(1, dtype=_result_dtype(lt))
            count = np.zeros(1, dtype=np.int32)
            device.backend.activate(device.index)
            _call(
                "cublasLtMatmulAlgoGetHeuristic",
                lt.matmul_algo_get_heuristic,
                self._handle,
                desc,
                la,
                lb,
                lc,
                lc,
                pref,
                1,
                results.ctypes.data,
                count.ctypes.data,
                problem=p,
            )
        finally:
            lt.matmul_preference_destroy(pref)
        if int(count[0]) < 1 or int(results["state"][0]) != 0:
            raise BlasError(
                "cublasLtMatmulAlgoGetHeuristic",
                int(results["state"][0]) if int(count[0]) >= 1 else None,
                f"cuBLASLt has no algorithm for {p.describe()}; contiguous arrays aligned to "
                "16 bytes or more are the safe choice (x.copy() makes one)",
            )
        self._result = results  # the algorithm's bytes: the call reads them by address
        self._algo = results.ctypes.data + results.dtype.fields["algo"][1]
        self.workspace_size = int(results["workspace_size"][0])

    def run(self, stream: int, alpha: float, a: int, b: int, beta: float, d: int, workspace: int) -> None:
        """Queue ``d = alpha * op(a) @ op(b) + beta * d`` on the stream with handle ``stream``.

        ``workspace`` is the address of :attr:`workspace_size` bytes (0 if
        none) that nothing else uses until the work is done. Inside a capture
        this records the library's nodes into the graph.
        """
        lt = _bindings()
        scalars = np.array([alpha, beta], dtype=self._scale)  # read by cuBLASLt during the call
        alpha_ptr = scalars.ctypes.data
        beta_ptr = alpha_ptr + scalars.itemsize
        la, lb, lc = self._layouts
        _call(
            "cublasLtMatmul",
            lt.matmul,
            self._handle,
            self._desc,
            alpha_ptr,
            a,
            la,
            b,
            lb,
            beta_ptr,
            d,
            lc,
            d,
            lc,
            self._algo,
            workspace,
            self.workspace_size,
            stream,
            problem=self.problem,
        )

    def __repr__(self) -> str:
        return f"<cudagraphs cuBLASLt plan: {self.problem.describe()}, workspace {self.workspace_size} B>"


def _result_dtype(lt: Any) -> np.dtype:
    """The dtype of ``cublasLtMatmulHeuristicResult_t``: nvmath's if it has the fields used."""
    dt = getattr(lt, "matmul_heuristic_result_dtype", None)
    if isinstance(dt, np.dtype) and dt.fields and {"algo", "workspace_size", "state"} <= set(dt.fields):
        return dt
    return _RESULT_DTYPE


def _setter(
    call: str, set_attribute: Callable[..., Any], dtype_of: Callable[[int], Any], problem: MatmulProblem
) -> Callable[[int, Any, int, Any], None]:
    """A function setting one attribute of a descriptor, in the type cuBLASLt declares for it."""

    def set_one(obj: int, attr: Any, value: int, fallback: Any) -> None:
        try:
            dt = np.dtype(dtype_of(attr))
        except Exception:  # (an older binding without the type table)
            dt = np.dtype(fallback)
        buf = np.array(value, dtype=dt)
        name = getattr(attr, "name", str(attr))
        _call(f"{call}({name})", set_attribute, obj, attr, buf.ctypes.data, buf.itemsize, problem=problem)

    return set_one


def plan(device: Any, problem: MatmulProblem) -> Plan:
    """The cached plan of ``problem`` on ``device``, made (heuristic and all) if new.

    Raises
    ------
    BackendUnavailableError
        If nvmath-python is not installed (the message says how to install it).
    BlasError
        If cuBLASLt refuses the problem or has no algorithm for it.
    """
    key = (device, problem)
    found = _PLANS.get(key)
    if found is not None:
        # (atomic: the most recently used plans stay; another thread may have
        # dropped it just now, and it is still valid)
        with contextlib.suppress(KeyError):
            _PLANS.move_to_end(key)
        return found
    with _lock:
        found = _PLANS.get(key)
        if found is None:
            found = _PLANS[key] = Plan(device, problem)
            while len(_PLANS) > MAX_PLANS:
                _PLANS.popitem(last=False)
        else:
            _PLANS.move_to_end(key)
    return found
