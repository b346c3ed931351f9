"""cg.ops.matmul: numpy's answers on every backend, in captures, and through cuBLASLt's terms.

Three groups:

* every backend (``backend`` fixture): results against numpy per dtype,
  transposed views, batches, alpha/beta, captures replayed with new inputs,
  shared pools, the graph owning its workspace, bad arguments;
* sim only, through a stand-in for ``nvmath.bindings.cublasLt``
  (:class:`FakeCublasLt`): the same products run by the code path the cuda
  backend takes (plans, descriptors, the column-major trick, the workspace
  on the stream), the stand-in computing in cuBLAS's column-major terms on
  simulated memory, so a wrong leading dimension or transpose flag gives a
  wrong answer here;
* GPU only (``gpu`` marker, with nvmath-python): the binding's enum values,
  attribute types and heuristic-result layout against what cudagraphs and the
  stand-in assume; products at sizes where cuBLASLt picks its real
  algorithms (each dtype, TF32, vectors, captures replayed with new inputs,
  a plan made inside a capture, the workspace as graph memory); torch and
  CuPy operands without copies, workspaces under allocator churn, two live
  graphs replayed interleaved (PyTorch #193402).
"""

from __future__ import annotations

import ctypes
import enum
import gc
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from conftest import needs_matmul, random_array

import cudagraphs as cg
from cudagraphs import _blas
from cudagraphs.ops import _matmul

DTYPES = ["float16", "bfloat16", "float32", "float64"]
TOL = {
    "float16": {"rtol": 3e-3, "atol": 3e-3},
    "bfloat16": {"rtol": 2e-2, "atol": 2e-2},
    "float32": {"rtol": 1e-4, "atol": 1e-4},  # (cuBLAS sums in another order than numpy)
    "float64": {"rtol": 1e-12, "atol": 1e-12},
}


@pytest.fixture
def blas_dev(device: cg.Device) -> cg.Device:
    """The device under test, with cuBLASLt to run matmul (skipped on cuda without nvmath-python)."""
    needs_matmul(device)
    return device


def _dtype(name: str) -> np.dtype:
    if name not in cg.SUPPORTED_DTYPES:
        pytest.skip(f"{name} needs ml_dtypes")
    return np.dtype(cg.SUPPORTED_DTYPES[name])


def _ref(a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None, alpha: float = 1, beta: float = 0) -> Any:
    out = alpha * np.matmul(a.astype(np.float64), b.astype(np.float64))
    if beta:
        assert c is not None
        out = out + beta * c.astype(np.float64)
    return out


def _close(got: np.ndarray, want: np.ndarray, dtype: str) -> None:
    assert got.shape == want.shape
    tol = TOL[dtype]  # the absolute part scales with the results' size
    scale = max(1.0, float(np.abs(want).max())) if want.size else 1.0
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol["rtol"], atol=tol["atol"] * scale)


# every backend ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_each_dtype_against_numpy(blas_dev: cg.Device, rng: np.random.Generator, dtype: str) -> None:
    dt = _dtype(dtype)
    a_h, b_h = random_array(rng, (13, 17), dtype), random_array(rng, (17, 9), dtype)
    c = cg.ops.matmul(cg.asarray(a_h), cg.asarray(b_h))
    assert isinstance(c, cg.DeviceArray)
    assert c.dtype == dt
    assert c.shape == (13, 9)
    _close(c.get(), _ref(a_h, b_h), dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
@pytest.mark.parametrize("tout", [False, True])
def test_transposed_views(
    blas_dev: cg.Device, rng: np.random.Generator, dtype: str, ta: bool, tb: bool, tout: bool
) -> None:
    m, k, n = 6, 11, 7
    a_h, b_h = random_array(rng, (m, k), dtype), random_array(rng, (k, n), dtype)
    a = cg.asarray(np.ascontiguousarray(a_h.T)).T if ta else cg.asarray(a_h)
    b = cg.asarray(np.ascontiguousarray(b_h.T)).T if tb else cg.asarray(b_h)
    base = cg.full((n, m) if tout else (m, n), np.nan, dtype)  # poisoned
    out = base.T if tout else base
    assert (a.is_contiguous, b.is_contiguous, out.is_contiguous) == (not ta, not tb, not tout)
    res = cg.ops.matmul(a, b, out=out)
    assert res is out
    _close(out.get(), _ref(a_h, b_h), dtype)


def test_padded_rows_and_slices(blas_dev: cg.Device, rng: np.random.Generator) -> None:
    big_a, big_b = random_array(rng, (10, 20), "float32"), random_array(rng, (30, 8), "float32")
    a, b = cg.asarray(big_a)[2:7, 3:15], cg.asarray(big_b)[4:16, 1:6]  # leading dims 20 and 8
    out = cg.full((9, 12), np.nan, "float32")[1:6, 2:7]
    cg.ops.matmul(a, b, out=out)
    _close(out.get(), _ref(big_a[2:7, 3:15], big_b[4:16, 1:6]), "float32")


@pytest.mark.parametrize("dtype", DTYPES)
def test_batched(blas_dev: cg.Device, rng: np.random.Generator, dtype: str) -> None:
    _dtype(dtype)
    a_h, b_h = random_array(rng, (4, 5, 6), dtype), random_array(rng, (4, 6, 3), dtype)
    a, b = cg.asarray(a_h), cg.asarray(b_h)
    _close(cg.ops.matmul(a, b).get(), _ref(a_h, b_h), dtype)
    # one operand for every product: 2-D, or a batch of one
    w_h = random_array(rng, (6, 3), dtype)
    _close(cg.ops.matmul(a, cg.asarray(w_h)).get(), _ref(a_h, w_h), dtype)
    _close(cg.ops.matmul(cg.asarray(a_h[:1]), b).get(), _ref(a_h[:1], b_h), dtype)
    # transposed matrices inside a batch, into a transposed out
    at = cg.asarray(np.ascontiguousarray(a_h.transpose(0, 2, 1))).transpose(0, 2, 1)
    base = cg.full((4, 3, 5), np.nan, dtype)
    cg.ops.matmul(at, b, out=base.transpose(0, 2, 1))
    _close(base.get().transpose(0, 2, 1), _ref(a_h, b_h), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_alpha_beta(blas_dev: cg.Device, rng: np.random.Generator, dtype: str) -> None:
    _dtype(dtype)
    a_h, b_h, c_h = (random_array(rng, s, dtype) for s in ((5, 8), (8, 4), (5, 4)))
    a, b, c = cg.asarray(a_h), cg.asarray(b_h), cg.asarray(c_h)
    res = cg.ops.matmul(a, b, c, alpha=0.5, beta=np.float32(-2))
    assert res is c
    _close(c.get(), _ref(a_h, b_h, c_h, 0.5, -2.0), dtype)
    # beta = 0 never reads out: NaN there does not leak into the result
    poisoned = cg.full((5, 4), np.nan, dtype)
    cg.ops.matmul(a, b, poisoned, alpha=3, beta=0)
    _close(poisoned.get(), _ref(a_h, b_h, alpha=3), dtype)


def test_out_given_is_written_in_place(blas_dev: cg.Device, rng: np.random.Generator) -> None:
    a_h, b_h = random_array(rng, (7, 3), "float64"), random_array(rng, (3, 5), "float64")
    out = cg.full((7, 5), np.nan, "float64")
    ptr = out.ptr
    assert cg.ops.matmul(cg.asarray(a_h), cg.asarray(b_h), out) is out
    assert out.ptr == ptr
    _close(out.get(), _ref(a_h, b_h), "float64")


def test_empty_and_k_zero(blas_dev: cg.Device) -> None:
    a, b = cg.zeros((0, 4), "float32"), cg.zeros((4, 3), "float32")
    assert cg.ops.matmul(a, b).shape == (0, 3)
    a0, b0 = cg.zeros((3, 0), "float32"), cg.zeros((0, 5), "float32")
    np.testing.assert_array_equal(cg.ops.matmul(a0, b0).get(), np.zeros((3, 5), "float32"))
    c = cg.full((3, 5), 2.0, "float32")
    cg.ops.matmul(a0, b0, c, beta=1.5)
    np.testing.assert_array_equal(c.get(), np.full((3, 5), 3.0, "float32"))


def test_capture_replays_with_new_inputs(blas_dev: cg.Device, rng: np.random.Generator) -> None:
    _check_capture_replays_with_new_inputs(rng, (3, 8, 16, 4), replays=3)


def _check_capture_replays_with_new_inputs(
    rng: np.random.Generator, shape: tuple[int, int, int, int], replays: int, plan_first: bool = False
) -> None:
    """A capture of two batched products (one out of the graph's pool), replayed with new inputs."""
    batch, m, k, n = shape
    a_h, b_h = random_array(rng, (batch, m, k), "float32"), random_array(rng, (batch, k, n), "float32")
    a, b = cg.asarray(a_h), cg.asarray(b_h)
    c = cg.asarray(random_array(rng, (batch, m, n), "float32"))
    if plan_first:
        cg.ops.matmul(a, b, c, beta=0.5)  # the plan, made before the capture
    with cg.capture() as g:
        t = cg.ops.matmul(a, b, alpha=2.0)  # out and workspace from the graph's pool
        cg.ops.matmul(a, b, c, alpha=1.0, beta=0.5)
        del t
    for _ in range(replays):
        a_h, b_h = random_array(rng, a_h.shape, "float32"), random_array(rng, b_h.shape, "float32")
        c_h = random_array(rng, (batch, m, n), "float32")
        a.set(a_h)
        b.set(b_h)
        c.set(c_h)
        g.replay()
        _close(c.get(), _ref(a_h, b_h, c_h, 1.0, 0.5), "float32")


def test_capture_output_and_alpha_baked(blas_dev: cg.Device, rng: np.random.Generator) -> None:
    a_h, b_h = random_array(rng, (4, 6), "float64"), random_array(rng, (6, 2), "float64")
    a, b = cg.asarray(a_h), cg.asarray(b_h)
    with cg.capture() as g:
        out = cg.ops.matmul(a, b, alpha=-1.5)
    g.replay()
    _close(out.get(), _ref(a_h, b_h, alpha=-1.5), "float64")
    g.replay()
    _close(out.get(), _ref(a_h, b_h, alpha=-1.5), "float64")


def test_repoint_moves_the_library_nodes(blas_dev: cg.Device, rng: np.random.Generator) -> None:
    """The product's nodes are the library's (cuBLAS's kernels): repoint finds and moves them."""
    a_h, b_h, a2_h = (random_array(rng, s, "float32") for s in ((4, 6), (6, 2), (4, 6)))
    a, b, a2 = cg.asarray(a_h), cg.asarray(b_h), cg.asarray(a2_h)
    out = cg.zeros((4, 2), "float32", device=blas_dev)
    with cg.capture() as g:
        cg.ops.matmul(a, b, out=out)
    assert g.repoint(a, a2) >= 1
    out.set(np.full((4, 2), np.nan, "float32"))
    g.replay()
    _close(out.get(), _ref(a2_h, b_h), "float32")
    with pytest.raises((ValueError, cg.UpdateError)):  # not recorded by cudagraphs: repoint's job
        g.rebind(a2, a)


def test_capture_with_shared_pool(blas_dev: cg.Device, rng: np.random.Generator) -> None:
    pool = cg.GraphPool(blas_dev)
    a_h, b_h = random_array(rng, (16, 32), "float32"), random_array(rng, (32, 16), "float32")
    a, b = cg.asarray(a_h), cg.asarray(b_h)
    with cg.capture(pool=pool) as g1:
        x = cg.ops.matmul(a, b)
    w_h = random_array(rng, (16, 8), "float32")
    w = cg.asarray(w_h)
    with cg.capture(pool=pool) as g2:
        y = cg.ops.matmul(x, w, alpha=0.25)
    for _ in range(2):
        a_h = random_array(rng, (16, 32), "float32")
        a.set(a_h)
        g1.replay()
        g2.replay()
        _close(x.get(), _ref(a_h, b_h), "float32")
        np.testing.assert_allclose(y.get(), 0.25 * (a_h @ b_h) @ w_h, rtol=1e-4, atol=1e-4)


def test_capture_with_graph_memory(blas_dev: cg.Device, rng: np.random.Generator) -> None:
    a_h, b_h = random_array(rng, (5, 7), "float32"), random_array(rng, (7, 3), "float32")
    a, b, out = cg.asarray(a_h), cg.asarray(b_h), cg.zeros((5, 3), "float32")
    with cg.capture(alloc="graph") as g:  # the workspace: an allocation node and a free node
        cg.ops.matmul(a, b, out)
    g.replay()
    g.replay()
    _close(out.get(), _ref(a_h, b_h), "float32")


def test_graph_keeps_its_workspace_and_inputs(blas_dev: cg.Device, rng: np.random.Generator) -> None:
    a_h, b_h = random_array(rng, (2, 24, 40), "float32"), random_array(rng, (2, 40, 12), "float32")
    a, b = cg.asarray(a_h), cg.asarray(b_h)
    with cg.capture() as g:
        out = cg.ops.matmul(a, b)
    reserved = g.pool.reserved
    assert reserved > 0
    del a, b  # only the graph holds the inputs now; nothing holds the workspace but the pool
    gc.collect()
    # churn: eager products allocate and free workspaces and outputs on the same stream
    for shape in ((2, 24, 40), (64, 64), (3, 40, 40)):
        x = cg.asarray(random_array(rng, shape, "float32"))
        cg.ops.matmul(x, x.T if x.ndim == 2 else x.transpose(0, 2, 1))
        del x
    gc.collect()
    blas_dev.synchronize()
    blas_dev.allocator.empty_cache()
    assert g.pool.reserved == reserved
    g.replay()
    _close(out.get(), _ref(a_h, b_h), "float32")


def test_forbid_policy_refuses_the_output_allocation(blas_dev: cg.Device, rng: np.random.Generator) -> None:
    a, b = cg.asarray(random_array(rng, (4, 4), "float32")), cg.asarray(random_array(rng, (4, 4), "float32"))
    with pytest.raises(cg.CaptureError, match="alloc='forbid'"), cg.capture(alloc="forbid"):
        cg.ops.matmul(a, b)  # the output is an allocation


def test_stream_argument(blas_dev: cg.Device, rng: np.random.Generator) -> None:
    a_h, b_h = random_array(rng, (3, 4), "float32"), random_array(rng, (4, 5), "float32")
    a, b = cg.asarray(a_h), cg.asarray(b_h)
    blas_dev.synchronize()
    s = blas_dev.create_stream()
    out = cg.ops.matmul(a, b, stream=s)
    s.synchronize()
    _close(out.get(stream=s), _ref(a_h, b_h), "float32")
    with pytest.raises(TypeError, match="stream must be a cudagraphs Stream"):
        cg.ops.matmul(a, b, stream=3)  # type: ignore[arg-type]


BAD: list[tuple[str, Callable[[Any, Any], Any], type[Exception], str]] = [
    (
        "host a",
        lambda a, b: cg.ops.matmul(np.ones((4, 5), "float32"), b),
        TypeError,
        "a must be a device array",
    ),
    ("list b", lambda a, b: cg.ops.matmul(a, [[1.0]]), TypeError, "b must be a device array"),
    (
        "int dtype",
        lambda a, b: cg.ops.matmul(cg.ones((4, 5), "int32"), cg.ones((5, 3), "int32")),
        TypeError,
        "supports float16",
    ),
    ("mixed dtypes", lambda a, b: cg.ops.matmul(a, cg.ones((5, 3), "float64")), TypeError, "dtype mismatch"),
    (
        "inner dims",
        lambda a, b: cg.ops.matmul(a, cg.ones((4, 3), "float32")),
        ValueError,
        "inner dimensions differ",
    ),
    ("1-D", lambda a, b: cg.ops.matmul(cg.ones(5, "float32"), b), ValueError, r"a must be 2-D \(m, k\)"),
    ("4-D", lambda a, b: cg.ops.matmul(a, cg.ones((1, 2, 5, 3), "float32")), ValueError, "b must be 2-D"),
    (
        "batches",
        lambda a, b: cg.ops.matmul(cg.ones((2, 4, 5), "float32"), cg.ones((3, 5, 3), "float32")),
        ValueError,
        "batch sizes differ",
    ),
    (
        "out shape",
        lambda a, b: cg.ops.matmul(a, b, cg.ones((3, 4), "float32")),
        ValueError,
        r"out must have shape \(4, 3\)",
    ),
    ("out dtype", lambda a, b: cg.ops.matmul(a, b, cg.ones((4, 3), "float64")), TypeError, "out is float64"),
    (
        "strided",
        lambda a, b: cg.ops.matmul(cg.ones((8, 10), "float32")[::2, ::2], b),
        ValueError,
        r"\.copy\(\)",
    ),
    ("reversed", lambda a, b: cg.ops.matmul(a[::-1], b), ValueError, "rows or columns are contiguous"),
    ("alpha str", lambda a, b: cg.ops.matmul(a, b, alpha="2"), TypeError, "alpha must be a real number"),
    ("alpha bool", lambda a, b: cg.ops.matmul(a, b, alpha=True), TypeError, "alpha must be a real number"),
    ("beta complex", lambda a, b: cg.ops.matmul(a, b, beta=1j), TypeError, "beta must be a real number"),
    ("beta without out", lambda a, b: cg.ops.matmul(a, b, beta=1.0), ValueError, "out must be given"),
    ("tf32", lambda a, b: cg.ops.matmul(a, b, tf32=1), TypeError, "tf32 must be True or False"),
]


@pytest.mark.parametrize(("case", "call", "error", "match"), BAD, ids=[c[0] for c in BAD])
def test_bad_arguments(
    blas_dev: cg.Device, case: str, call: Callable[[Any, Any], Any], error: type[Exception], match: str
) -> None:
    a, b = cg.ones((4, 5), "float32"), cg.ones((5, 3), "float32")
    with pytest.raises(error, match=match):
        call(a, b)


def test_out_overlapping_an_input_is_refused(blas_dev: cg.Device) -> None:
    x = cg.ones((4, 4), "float32")
    with pytest.raises(ValueError, match="out overlaps a"):
        cg.ops.matmul(x, cg.ones((4, 4), "float32"), x)
    batch = cg.ones((3, 4, 4), "float32")
    with pytest.raises(ValueError, match="overlap one another"):
        cg.ops.matmul(batch, batch, cg.as_strided(cg.empty((4, 4), "float32"), (3, 4, 4), (0, 16, 4)))


def test_expired_graph_outputs_are_refused(blas_dev: cg.Device, rng: np.random.Generator) -> None:
    a = cg.asarray(random_array(rng, (4, 4), "float32"))
    f = cg.graphed(lambda x: cg.ops.matmul(x, x))
    f(a)
    f(a)
    old = f(a)
    f(a)
    with pytest.raises(cg.StaleOutputError):
        cg.ops.matmul(old, a)


# the cuda code path on sim, through a stand-in for cuBLASLt --------------------------------
_DESC = enum.IntEnum(
    "MatmulDescAttribute", {"COMPUTE_TYPE": 0, "SCALE_TYPE": 1, "POINTER_MODE": 2, "TRANSA": 3, "TRANSB": 4}
)
_LAYOUT = enum.IntEnum(
    "MatrixLayoutAttribute",
    {"TYPE": 0, "ORDER": 1, "ROWS": 2, "COLS": 3, "LD": 4, "BATCH_COUNT": 5, "STRIDED_BATCH_OFFSET": 6},
)
_PREF = enum.IntEnum(
    "MatmulPreferenceAttribute",
    {
        "SEARCH_MODE": 0,
        "MAX_WORKSPACE_BYTES": 1,
        "MIN_ALIGNMENT_A_BYTES": 5,
        "MIN_ALIGNMENT_B_BYTES": 6,
        "MIN_ALIGNMENT_C_BYTES": 7,
        "MIN_ALIGNMENT_D_BYTES": 8,
    },
)
_TYPES = {2: np.float16, 0: np.float32, 1: np.float64}  # cudaDataType_t -> numpy
_ATTR_DTYPES = {
    "TRANSA": np.int32,
    "TRANSB": np.int32,
    "BATCH_COUNT": np.int32,
    "STRIDED_BATCH_OFFSET": np.int64,
    "MAX_WORKSPACE_BYTES": np.uint64,
}


def _read(ptr: int, dtype: Any) -> Any:
    dt = np.dtype(dtype)
    return np.frombuffer((ctypes.c_char * dt.itemsize).from_address(ptr), dtype=dt)[0]


class FakeCublasLt:
    """``nvmath.bindings.cublasLt``'s functions used by cudagraphs, with the same signatures.

    Descriptors are dictionaries; ``matmul`` queues, on the simulated stream
    whose handle it gets, the product as cuBLAS defines it on column-major
    matrices of simulated memory (and checks the workspace is live memory).
    """

    MatmulDescAttribute, MatrixLayoutAttribute, MatmulPreferenceAttribute = _DESC, _LAYOUT, _PREF

    class cuBLASLtError(Exception):
        """What the binding raises: carries the cublasStatus_t."""

        def __init__(self, status: int) -> None:
            self.status = status
            super().__init__(f"CUBLAS_STATUS_{status}")

    def __init__(self, backend: Any, workspace: int = 4096) -> None:
        self.backend = backend
        self.workspace = workspace
        self.objects: dict[int, dict[str, Any]] = {}
        self.next = 1000
        self.heuristics = 0
        self.calls: list[dict[str, Any]] = []
        self.destroyed: list[int] = []
        self.matmul_heuristic_result_dtype = None  # (use cudagraphs' own layout of the struct)

    def _new(self, **fields: Any) -> int:
        self.next += 1
        self.objects[self.next] = fields
        return self.next

    def create(self) -> int:
        return self._new(kind="handle")

    def destroy(self, light_handle: int) -> None:
        self.destroyed.append(light_handle)

    def matmul_desc_create(self, compute_type: int, scale_type: int) -> int:
        return self._new(kind="desc", compute=compute_type, scale=scale_type, TRANSA=0, TRANSB=0)

    def matrix_layout_create(self, type: int, rows: int, cols: int, ld: int) -> int:
        assert ld >= max(rows, 1), (rows, cols, ld)
        return self._new(
            kind="layout", type=type, rows=rows, cols=cols, ld=ld, BATCH_COUNT=1, STRIDED_BATCH_OFFSET=0
        )

    def matmul_preference_create(self) -> int:
        return self._new(kind="pref")

    def _destroy(self, obj: int) -> None:
        self.objects.pop(obj)

    matmul_desc_destroy = matrix_layout_destroy = matmul_preference_destroy = _destroy

    @staticmethod
    def _dtype(attr: Any) -> np.dtype:
        return np.dtype(_ATTR_DTYPES.get(attr.name, np.uint32))

    get_matmul_desc_attribute_dtype = get_matrix_layout_attribute_dtype = _dtype
    get_matmul_preference_attribute_dtype = _dtype

    def _set(self, obj: int, attr: int, buf: int, size_in_bytes: int) -> None:
        fields = self.objects[obj]
        member = {"desc": _DESC, "layout": _LAYOUT, "pref": _PREF}[fields["kind"]](attr)
        dt = self._dtype(member)
        assert size_in_bytes == dt.itemsize, (member, size_in_bytes)
        fields[member.name] = int(_read(buf, dt))

    matmul_desc_set_attribute = matrix_layout_set_attribute = matmul_preference_set_attribute = _set

    def matmul_algo_get_heuristic(
        self,
        light_handle: int,
        operation_desc: int,
        adesc: int,
        bdesc: int,
        cdesc: int,
        ddesc: int,
        preference: int,
        requested_algo_count: int,
        heuristic_results_array: int,
        return_algo_count: int,
    ) -> None:
        assert self.objects[light_handle]["kind"] == "handle"
        assert cdesc == ddesc
        assert requested_algo_count >= 1
        self.heuristics += 1
        pref = self.objects[preference]
        assert pref["MAX_WORKSPACE_BYTES"] >= self.workspace
        for side in "ABCD":
            assert pref[f"MIN_ALIGNMENT_{side}_BYTES"] in (2, 4, 8, 16, 32, 64, 128, 256)
        result = np.zeros(1, dtype=_blas._RESULT_DTYPE)
        result["algo"][0, 0] = 7
        result["workspace_size"] = self.workspace
        ctypes.memmove(heuristic_results_array, result.ctypes.data, result.nbytes)
        ctypes.memmove(return_algo_count, np.array([1], np.int32).ctypes.data, 4)

    def _matrices(self, ptr: int, layout: dict[str, Any]) -> np.ndarray:
        """The column-major matrices of a layout, as a (batch, rows, cols) view of sim memory."""
        dt = np.dtype(_TYPES.get(layout["type"], np.float32))
        if layout["type"] == 14:
            dt = np.dtype(cg.SUPPORTED_DTYPES["bfloat16"])
        item = dt.itemsize
        shape = (layout["BATCH_COUNT"], layout["rows"], layout["cols"])
        strides = (layout["STRIDED_BATCH_OFFSET"] * item, item, layout["ld"] * item)
        view: np.ndarray = self.backend.view(ptr, shape, strides, dt)
        return view

    def matmul(
        self,
        light_handle: int,
        compute_desc: int,
        alpha: int,
        a: int,
        adesc: int,
        b: int,
        bdesc: int,
        beta: int,
        c: int,
        cdesc: int,
        d: int,
        ddesc: int,
        algo: int,
        workspace: int,
        workspace_size_in_bytes: int,
        stream: int,
    ) -> None:
        desc = dict(self.objects[compute_desc])
        scale = np.float64 if desc["scale"] == 1 else np.float32
        alpha_v, beta_v = _read(alpha, scale), _read(beta, scale)  # host pointer mode: read now
        assert _read(algo, np.uint64) == 7  # the algorithm the heuristic chose
        assert c == d
        assert cdesc == ddesc
        assert workspace_size_in_bytes == self.workspace
        la, lb, lc = (dict(self.objects[x]) for x in (adesc, bdesc, cdesc))
        self.calls.append({"desc": desc, "a": la, "b": lb, "c": lc, "stream": stream})
        sim = self.backend
        target = next(s for s in sim._scheduler.streams if s.address == stream)

        def work() -> None:
            sim._memory.resolve(workspace, workspace_size_in_bytes, "cublasLtMatmul workspace")
            ma, mb, md = self._matrices(a, la), self._matrices(b, lb), self._matrices(d, lc)
            acc = np.float64 if md.dtype == np.float64 else np.float32
            op_a = ma.transpose(0, 2, 1) if desc["TRANSA"] else ma
            op_b = mb.transpose(0, 2, 1) if desc["TRANSB"] else mb
            result = alpha_v * np.matmul(op_a.astype(acc), op_b.astype(acc))
            if beta_v != 0:
                result = result + beta_v * md.astype(acc)
            md[...] = result.astype(md.dtype)

        sim._submit(target, "cublasLtMatmul", "kernel", "fake_cublaslt_gemm", work)


@pytest.fixture
def fake_lt(device: cg.Device, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCublasLt]:
    """The cuda backend's matmul path on sim: cuBLASLt replaced by :class:`FakeCublasLt`."""
    if device.backend.name != "sim":
        pytest.skip("the stand-in for cuBLASLt runs on simulated memory")
    fake = FakeCublasLt(device.backend)
    monkeypatch.setattr(_blas, "_lt", fake)
    monkeypatch.setattr(_blas, "_HANDLES", {})
    monkeypatch.setattr(_blas, "_PLANS", type(_blas._PLANS)())
    monkeypatch.setattr(_matmul, "_runs_host_code", lambda device: False)
    yield fake
    device.synchronize()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tout", [False, True])
def test_cublaslt_path_column_major_terms(
    fake_lt: FakeCublasLt, rng: np.random.Generator, dtype: str, ta: bool, tout: bool
) -> None:
    _dtype(dtype)
    a_h, b_h, c_h = (
        random_array(rng, (5, 9), dtype),
        random_array(rng, (9, 4), dtype),
        random_array(rng, (5, 4), dtype),
    )
    a = cg.asarray(np.ascontiguousarray(a_h.T)).T if ta else cg.asarray(a_h)
    b = cg.asarray(b_h)
    base = cg.asarray(np.ascontiguousarray(c_h.T)) if tout else cg.asarray(c_h)
    out = base.T if tout else base
    cg.ops.matmul(a, b, out, alpha=0.5, beta=2.0)
    _close(out.get(), _ref(a_h, b_h, c_h, 0.5, 2.0), dtype)
    call = fake_lt.calls[-1]
    want_compute = 70 if dtype == "float64" else 68
    assert call["desc"]["compute"] == want_compute
    if not tout:  # row-major out: D^T = b^T a^T, cuBLAS's A is b
        assert (call["c"]["rows"], call["c"]["cols"], call["c"]["ld"]) == (4, 5, 4)
        assert call["desc"]["TRANSA"] == 0
        assert call["desc"]["TRANSB"] == (1 if ta else 0)


def test_cublaslt_path_batched_broadcast_and_padded(fake_lt: FakeCublasLt, rng: np.random.Generator) -> None:
    a_h, b_h = random_array(rng, (3, 6, 8), "float32"), random_array(rng, (8, 5), "float32")
    a, b = cg.asarray(a_h), cg.asarray(b_h)
    _close(cg.ops.matmul(a, b).get(), _ref(a_h, b_h), "float32")
    assert fake_lt.calls[-1]["a"]["STRIDED_BATCH_OFFSET"] == 0  # b (cuBLAS's A) for every product
    assert fake_lt.calls[-1]["b"]["STRIDED_BATCH_OFFSET"] == 48
    big = random_array(rng, (2, 10, 12), "float64")
    x = cg.asarray(big)[:, 1:7, 2:9]  # padded: ld 12, batch stride 120
    y_h = random_array(rng, (2, 7, 3), "float64")
    bt = cg.asarray(np.ascontiguousarray(y_h.transpose(0, 2, 1))).transpose(0, 2, 1)
    _close(cg.ops.matmul(x, bt).get(), _ref(big[:, 1:7, 2:9], y_h), "float64")


VECTOR_SHAPES = [(1, 7, 5), (6, 7, 1), (1, 7, 1), (6, 1, 5), (1, 1, 1)]  # (m, k, n): one of them 1


@pytest.mark.parametrize("mkn", VECTOR_SHAPES)
@pytest.mark.parametrize("views", ["plain", "transposed"])
def test_cublaslt_path_vector_shapes(
    fake_lt: FakeCublasLt, rng: np.random.Generator, mkn: tuple[int, int, int], views: str
) -> None:
    _check_vector_shapes(rng, mkn, views)


def _check_vector_shapes(rng: np.random.Generator, mkn: tuple[int, int, int], views: str) -> None:
    """A batch of two products and a 2-D one, of operands plain or transposed, against numpy."""
    m, k, n = mkn
    a_h, b_h = random_array(rng, (2, m, k), "float32"), random_array(rng, (2, k, n), "float32")
    if views == "plain":
        a, b, base = cg.asarray(a_h), cg.asarray(b_h), cg.full((2, m, n), np.nan, "float32")
        out = base
    else:
        a = cg.asarray(np.ascontiguousarray(a_h.transpose(0, 2, 1))).transpose(0, 2, 1)
        b = cg.asarray(np.ascontiguousarray(b_h.transpose(0, 2, 1))).transpose(0, 2, 1)
        base = cg.full((2, n, m), np.nan, "float32")
        out = base.transpose(0, 2, 1)
    cg.ops.matmul(a, b, out)
    _close(out.get(), _ref(a_h, b_h), "float32")
    _close(cg.ops.matmul(a[0], b[0]).get(), _ref(a_h[0], b_h[0]), "float32")


def test_cublaslt_plans_are_cached_per_problem(fake_lt: FakeCublasLt, rng: np.random.Generator) -> None:
    a, b = cg.asarray(random_array(rng, (8, 8), "float32")), cg.asarray(random_array(rng, (8, 8), "float32"))
    for _ in range(3):
        cg.ops.matmul(a, b)
    assert fake_lt.heuristics == 1
    cg.ops.matmul(a, b, tf32=True)
    assert fake_lt.heuristics == 2
    assert fake_lt.calls[-1]["desc"]["compute"] == 77  # CUBLAS_COMPUTE_32F_FAST_TF32
    cg.ops.matmul(a[:, 1:], b[1:])  # another shape, and a 4-byte-aligned address
    assert fake_lt.heuristics == 3
    assert len([o for o in fake_lt.objects.values() if o["kind"] == "handle"]) == 1  # one per device
    _blas.clear_plans()
    gc.collect()
    assert not [o for o in fake_lt.objects.values() if o["kind"] in ("desc", "layout", "pref")]


def test_cublaslt_path_in_a_capture_owns_its_workspace(
    fake_lt: FakeCublasLt, device: cg.Device, rng: np.random.Generator
) -> None:
    a_h, b_h = random_array(rng, (6, 4), "float32"), random_array(rng, (4, 6), "float32")
    a, b = cg.asarray(a_h), cg.asarray(b_h)
    with cg.capture() as g:  # the plan is made inside the capture: host work only
        out = cg.ops.matmul(a, b)
    assert fake_lt.heuristics == 1
    assert [n.name for n in g.nodes] == ["fake_cublaslt_gemm"]
    for _ in range(2):
        a_h = random_array(rng, (6, 4), "float32")
        a.set(a_h)
        g.replay()
        _close(out.get(), _ref(a_h, b_h), "float32")
    # the workspace is the graph's: churn outside does not touch it, and it lives as long as the graph
    for _ in range(3):
        cg.ops.matmul(a, b)
    gc.collect()
    device.allocator.empty_cache()
    g.replay()
    _close(out.get(), _ref(a_h, b_h), "float32")


def test_cublaslt_errors_name_the_call_and_problem(
    fake_lt: FakeCublasLt, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: Any) -> None:
        raise FakeCublasLt.cuBLASLtError(15)  # CUBLAS_STATUS_NOT_SUPPORTED

    monkeypatch.setattr(fake_lt, "matmul_algo_get_heuristic", refuse)
    with pytest.raises(
        cg.BlasError, match=r"cublasLtMatmulAlgoGetHeuristic failed.*float32 product.*m=3"
    ) as err:
        cg.ops.matmul(cg.ones((2, 5), "float32"), cg.ones((5, 3), "float32"))
    assert err.value.status == 15


def test_missing_nvmath_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> Any:
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr(_blas, "_lt", None)
    monkeypatch.setattr(_blas.importlib, "import_module", missing)
    assert not _blas.available()
    with pytest.raises(cg.BackendUnavailableError, match=r"cudagraphs\[blas\]"):
        _blas.plan(None, None)  # type: ignore[arg-type]


def test_data_types_are_cudas() -> None:
    """The ``cudaDataType_t`` values cudagraphs passes to cuBLASLt as numbers are CUDA's."""
    from cuda.bindings import runtime

    names = {
        "float32": "CUDA_R_32F",
        "float64": "CUDA_R_64F",
        "float16": "CUDA_R_16F",
        "bfloat16": "CUDA_R_16BF",
    }
    assert {key: int(getattr(runtime.cudaDataType, n)) for key, n in names.items()} == _blas.DATA_TYPES


# GPU only -----------------------------------------------------------------------------------
@pytest.fixture
def cuda(blas_dev: cg.Device) -> cg.Device:
    if blas_dev.backend.name != "cuda":
        pytest.skip("needs the cuda backend")
    return blas_dev


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_torch_operands_zero_copy(cuda: cg.Device, dtype: str) -> None:
    _dtype(dtype)
    torch = pytest.importorskip("torch")
    tdt = getattr(torch, dtype)
    a = torch.randn(32, 48, device="cuda", dtype=tdt)
    b = torch.randn(48, 16, device="cuda", dtype=tdt)
    out = torch.full((32, 16), float("nan"), device="cuda", dtype=tdt)
    bt = b.T.contiguous()
    torch.cuda.synchronize()  # torch's work on its stream before ours (we order nothing for it)
    res = cg.ops.matmul(a, bt.T, out)  # a transposed view of a tensor
    assert res is out
    new = cg.ops.matmul(a, b)
    assert isinstance(new, cg.DeviceArray)
    cuda.synchronize()  # ours before torch reads (and before its allocator reuses bt)
    want = _ref(a.double().cpu().numpy(), b.double().cpu().numpy())
    _close(out.double().cpu().numpy(), want, dtype)
    _close(new.get().astype(np.float64), want, dtype)


@pytest.mark.gpu
def test_cupy_operands_zero_copy(cuda: cg.Device) -> None:
    cp = pytest.importorskip("cupy")
    a = cp.random.standard_normal((3, 20, 30))
    b = cp.random.standard_normal((3, 30, 10))
    out = cp.empty((3, 20, 10))
    cp.cuda.Device().synchronize()
    assert cg.ops.matmul(a, b, out) is out
    cuda.synchronize()
    np.testing.assert_allclose(cp.asnumpy(out), cp.asnumpy(cp.matmul(a, b)), rtol=1e-12, atol=1e-12)


@pytest.mark.gpu
def test_capture_after_eager_workspace_and_torch_allocator_churn(
    cuda: cg.Device, rng: np.random.Generator
) -> None:
    torch = pytest.importorskip("torch")
    shapes = [(512, 512, 512), (64, 4096, 64), (2048, 128, 2048)]
    a_h, b_h = random_array(rng, (256, 1024), "float32"), random_array(rng, (1024, 256), "float32")
    a, b = cg.asarray(a_h), cg.asarray(b_h)
    with cg.capture() as g:
        out = cg.ops.matmul(a, b)
    for m, k, n in shapes:  # eager products and torch's allocator reuse memory around the graph's
        x, y = (
            cg.asarray(random_array(rng, (m, k), "float32")),
            cg.asarray(random_array(rng, (k, n), "float32")),
        )
        cg.ops.matmul(x, y)
        junk = [torch.randn(m, n, device="cuda") @ torch.randn(n, k, device="cuda") for _ in range(3)]
        del x, y, junk
        torch.cuda.empty_cache()
    cuda.synchronize()
    cuda.allocator.empty_cache()
    for _ in range(3):
        g.replay()
    _close(out.get(), _ref(a_h, b_h), "float32")


@pytest.mark.gpu
def test_two_live_graphs_replayed_interleaved(cuda: cg.Device, rng: np.random.Generator) -> None:
    """PyTorch #193402: each graph has its own workspace; interleaved replays never fault."""
    a1_h, b1_h = random_array(rng, (8, 1024, 1024), "float32"), random_array(rng, (8, 1024, 64), "float32")
    a2_h, b2_h = random_array(rng, (64, 8192), "float32"), random_array(rng, (8192, 64), "float32")
    a1, b1, a2, b2 = map(cg.asarray, (a1_h, b1_h, a2_h, b2_h))
    s1, s2 = cuda.create_stream(), cuda.create_stream()
    with cg.capture(stream=s1) as g1:
        o1 = cg.ops.matmul(a1, b1, stream=s1)
    with cg.capture(stream=s2) as g2:
        o2 = cg.ops.matmul(a2, b2, stream=s2)
    cuda.synchronize()
    for _ in range(20):
        g1.replay(s1)
        g2.replay(s2)
    s1.synchronize()
    s2.synchronize()
    _close(o1.get(), _ref(a1_h, b1_h), "float32")
    np.testing.assert_allclose(o2.get(), _ref(a2_h, b2_h), rtol=1e-4, atol=1e-3)
    g1.close()
    del g1
    gc.collect()
    for _ in range(5):
        g2.replay(s2)
    s2.synchronize()
    np.testing.assert_allclose(o2.get(), _ref(a2_h, b2_h), rtol=1e-4, atol=1e-3)


@pytest.mark.gpu
def test_cublas_enum_values_are_the_ones_hard_coded(cuda: cg.Device) -> None:
    """The enum values cudagraphs passes to cuBLAS as numbers (its ABI) are nvmath's."""
    from nvmath.bindings import cublas

    ct = cublas.ComputeType
    assert {key: int(getattr(ct, f"COMPUTE_{key}")) for key in _blas.COMPUTE_TYPES} == _blas.COMPUTE_TYPES
    assert (int(cublas.Operation.N), int(cublas.Operation.T)) == (_blas.OP_N, _blas.OP_T)


@pytest.mark.gpu
def test_cublaslt_attribute_types_and_heuristic_result_layout(cuda: cg.Device) -> None:
    """The attributes cudagraphs sets have the types of its fallbacks and of the sim stand-in."""
    lt = _blas._bindings()
    for kind, getter, names in (
        (lt.MatmulDescAttribute, lt.get_matmul_desc_attribute_dtype, ("TRANSA", "TRANSB")),
        (
            lt.MatrixLayoutAttribute,
            lt.get_matrix_layout_attribute_dtype,
            ("BATCH_COUNT", "STRIDED_BATCH_OFFSET"),
        ),
        (
            lt.MatmulPreferenceAttribute,
            lt.get_matmul_preference_attribute_dtype,
            ("MAX_WORKSPACE_BYTES", *(f"MIN_ALIGNMENT_{side}_BYTES" for side in "ABCD")),
        ),
    ):
        for name in names:
            want = np.dtype(_ATTR_DTYPES.get(name, np.uint32))
            assert np.dtype(getter(getattr(kind, name))) == want, name
    used = _blas._result_dtype(lt)  # nvmath's struct where it has the fields, else cudagraphs' own
    assert used.itemsize == _blas._RESULT_DTYPE.itemsize == 96
    assert {f: used.fields[f][1] for f in ("algo", "workspace_size", "state")} == {
        f: _blas._RESULT_DTYPE.fields[f][1] for f in ("algo", "workspace_size", "state")
    }


# the products at sizes where cuBLASLt picks its real algorithms (workspaces, split-K)
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_cublas_sizes_against_numpy(cuda: cg.Device, rng: np.random.Generator, dtype: str) -> None:
    _dtype(dtype)
    a_h, b_h = random_array(rng, (96, 130), dtype), random_array(rng, (130, 72), dtype)
    a, b = cg.asarray(a_h), cg.asarray(b_h)
    _close(cg.ops.matmul(a, b).get(), _ref(a_h, b_h), dtype)
    out = cg.full((96, 72), np.nan, dtype)  # poisoned
    cg.ops.matmul(a, b, out)
    _close(out.get(), _ref(a_h, b_h), dtype)
    x_h, y_h = random_array(rng, (5, 64, 48), dtype), random_array(rng, (5, 48, 32), dtype)
    _close(cg.ops.matmul(cg.asarray(x_h), cg.asarray(y_h)).get(), _ref(x_h, y_h), dtype)


@pytest.mark.gpu
def test_tf32_is_close_to_float32(cuda: cg.Device, rng: np.random.Generator) -> None:
    a_h, b_h = random_array(rng, (256, 256), "float32"), random_array(rng, (256, 256), "float32")
    got = cg.ops.matmul(cg.asarray(a_h), cg.asarray(b_h), tf32=True).get()
    want = _ref(a_h, b_h)  # TF32 keeps 10 bits of mantissa: about 1e-3 relative per product
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-2 * float(np.abs(want).max()))


@pytest.mark.gpu
@pytest.mark.parametrize("mkn", VECTOR_SHAPES)
@pytest.mark.parametrize("views", ["plain", "transposed"])
def test_vector_shapes_on_cublaslt(
    cuda: cg.Device, rng: np.random.Generator, mkn: tuple[int, int, int], views: str
) -> None:
    _check_vector_shapes(rng, mkn, views)


@pytest.mark.gpu
def test_capture_of_cublas_sizes_replays_with_new_inputs(cuda: cg.Device, rng: np.random.Generator) -> None:
    _check_capture_replays_with_new_inputs(rng, (3, 128, 256, 64), replays=5, plan_first=True)


@pytest.mark.gpu
def test_plan_made_inside_a_capture(cuda: cg.Device, rng: np.random.Generator) -> None:
    a_h, b_h = random_array(rng, (77, 91), "float64"), random_array(rng, (91, 13), "float64")
    a, b = cg.asarray(a_h), cg.asarray(b_h)
    before = set(_blas._PLANS)
    with cg.capture() as g:  # a shape never seen: the heuristic query runs inside the capture
        out = cg.ops.matmul(a, b)
    assert len(set(_blas._PLANS) - before) == 1
    g.replay()
    _close(out.get(), _ref(a_h, b_h), "float64")


@pytest.mark.gpu
def test_workspace_as_graph_memory(cuda: cg.Device, rng: np.random.Generator) -> None:
    a_h, b_h = random_array(rng, (512, 1024), "float32"), random_array(rng, (1024, 512), "float32")
    a, b = cg.asarray(a_h), cg.asarray(b_h)
    out = cg.full((512, 512), np.nan, "float32")
    with cg.capture(alloc="graph") as g:
        cg.ops.matmul(a, b, out)
    for _ in range(2):
        g.replay()
        _close(out.get(), _ref(a_h, b_h), "float32")
