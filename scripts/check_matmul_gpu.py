"""cg.ops.matmul on a real GPU, end to end, one PASS/FAIL line per check.

Exercises the cuda path through nvmath-python's cuBLASLt bindings: the
binding itself (enum values, attribute types, the heuristic result's
layout), each dtype against numpy, transposed views, batches, alpha/beta,
captures replayed with new inputs (with the plan made before and inside the
capture), torch and CuPy operands without copies, and two live graphs
replayed interleaved (PyTorch #193402). Each check runs on its own and
prints its traceback when it fails, so one run shows every problem.

Usage (from the repository root, cudagraphs installed or not):
    python3 scripts/check_matmul_gpu.py [-v]
Exit status: the number of failed checks (0: all passed).
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("CUDAGRAPHS_BACKEND", "cuda")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import numpy as np

import cudagraphs as cg
from cudagraphs import _blas

VERBOSE = "-v" in sys.argv
RESULTS: list[tuple[str, bool, str]] = []
RNG = np.random.default_rng(0)
TOL = {"float16": 3e-3, "bfloat16": 2e-2, "float32": 1e-4, "float64": 1e-11}


def check(name: str) -> Callable[[Callable[[], str | None]], Callable[[], str | None]]:
    def wrap(fn: Callable[[], str | None]) -> Callable[[], str | None]:
        t0 = time.perf_counter()
        try:
            note = fn() or ""
            cg.Device(0).synchronize()  # an asynchronous fault shows up here, in this check
            ok = True
        except Exception:
            note, ok = traceback.format_exc(), False
        ms = (time.perf_counter() - t0) * 1e3
        RESULTS.append((name, ok, note))
        first = note.strip().splitlines()[-1] if note.strip() else ""
        print(f"{'PASS' if ok else 'FAIL'}  {name}  ({ms:.0f} ms)  {first if ok else ''}", flush=True)
        if not ok or (VERBOSE and note):
            print("      " + note.replace("\n", "\n      "), flush=True)
        return fn

    return wrap


def rand(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    return RNG.standard_normal(shape).astype(cg.SUPPORTED_DTYPES[dtype])


def ref(a: np.ndarray, b: np.ndarray, c: np.ndarray | None = None, alpha: float = 1, beta: float = 0) -> Any:
    out = alpha * np.matmul(a.astype(np.float64), b.astype(np.float64))
    return out + beta * c.astype(np.float64) if beta else out


def compare(got: np.ndarray, want: np.ndarray, dtype: str, what: str = "") -> str:
    got64 = np.asarray(got).astype(np.float64)
    if got64.shape != want.shape:
        raise AssertionError(f"{what} shape {got64.shape}, expected {want.shape}")
    scale = max(1.0, float(np.abs(want).max()))
    err = float(np.abs(got64 - want).max()) / scale
    if not np.isfinite(err) or err > TOL[dtype] * 10:
        raise AssertionError(f"{what} max relative error {err:.3g} > {TOL[dtype] * 10:.3g} ({dtype})")
    return f"{what} max rel err {err:.2e}"


dev = cg.Device(0)
print(f"device: {dev}, compute capability {dev.compute_capability}, backend {dev.backend_name}")
print(f"numpy {np.__version__}, cudagraphs {cg.__version__}")


# the binding ------------------------------------------------------------------------------
@check("nvmath-python imports and cuBLASLt loads")
def _import() -> str:
    import nvmath

    lt = _blas._bindings()
    return f"nvmath {getattr(nvmath, '__version__', '?')}, cuBLASLt {lt.get_version()}"


@check("enum values cudagraphs hard-codes match nvmath's")
def _enums() -> str:
    from nvmath.bindings import cublas

    ct, op = cublas.ComputeType, cublas.Operation
    want = {"32F": ct.COMPUTE_32F, "32F_FAST_TF32": ct.COMPUTE_32F_FAST_TF32, "64F": ct.COMPUTE_64F}
    for key, value in want.items():
        assert _blas.COMPUTE_TYPES[key] == int(value), (key, _blas.COMPUTE_TYPES[key], int(value))
    assert (int(op.N), int(op.T)) == (_blas.OP_N, _blas.OP_T), (int(op.N), int(op.T))
    try:
        from nvmath._utils import CudaDataType as dt

        for name, code in {
            "float16": dt.CUDA_R_16F,
            "bfloat16": dt.CUDA_R_16BF,
            "float32": dt.CUDA_R_32F,
        }.items():
            assert _blas.DATA_TYPES[name] == int(code), name
        assert _blas.DATA_TYPES["float64"] == int(dt.CUDA_R_64F)
    except ImportError:
        return "cudaDataType not checked (nvmath._utils moved)"
    return "compute types, operations, data types agree"


@check("attribute types and the heuristic result's layout")
def _layout() -> str:
    lt = _blas._bindings()
    lines = []
    for enum, getter, names in (
        (lt.MatmulDescAttribute, lt.get_matmul_desc_attribute_dtype, ("TRANSA", "TRANSB")),
        (
            lt.MatrixLayoutAttribute,
            lt.get_matrix_layout_attribute_dtype,
            ("BATCH_COUNT", "STRIDED_BATCH_OFFSET"),
        ),
        (
            lt.MatmulPreferenceAttribute,
            lt.get_matmul_preference_attribute_dtype,
            ("MAX_WORKSPACE_BYTES", "MIN_ALIGNMENT_A_BYTES"),
        ),
    ):
        for n in names:
            lines.append(f"{n}={np.dtype(getter(getattr(enum, n)))}")
    dt = getattr(lt, "matmul_heuristic_result_dtype", None)
    used = _blas._result_dtype(lt)
    lines.append(
        f"nvmath result dtype {dt} (itemsize {getattr(dt, 'itemsize', '?')}); used {used.itemsize} B"
    )
    assert used.itemsize == 96, used
    assert used.fields["algo"][1] == 0
    return "; ".join(lines)


# results against numpy ------------------------------------------------------------------------
for dtype in ("float16", "bfloat16", "float32", "float64"):

    @check(f"{dtype}: (96, 130) @ (130, 72) against numpy, out=None and out given")
    def _dtype(dtype: str = dtype) -> str:
        a_h, b_h = rand((96, 130), dtype), rand((130, 72), dtype)
        a, b = cg.asarray(a_h), cg.asarray(b_h)
        c = cg.ops.matmul(a, b)
        note = compare(c.get(), ref(a_h, b_h), dtype, "new out")
        out = cg.full((96, 72), np.nan, dtype)
        cg.ops.matmul(a, b, out)
        return note + "; " + compare(out.get(), ref(a_h, b_h), dtype, "given out")


@check("float32 with tf32=True (loose tolerance)")
def _tf32() -> str:
    a_h, b_h = rand((256, 256), "float32"), rand((256, 256), "float32")
    got = cg.ops.matmul(cg.asarray(a_h), cg.asarray(b_h), tf32=True).get()
    err = float(np.abs(got - ref(a_h, b_h)).max() / np.abs(ref(a_h, b_h)).max())
    assert err < 1e-2, err
    return f"max rel err {err:.2e}"


@check("transposed views of a, b and out (8 combinations, float32 and float64)")
def _transposes() -> str:
    for dtype in ("float32", "float64"):
        for code in range(8):
            ta, tb, tout = bool(code & 1), bool(code & 2), bool(code & 4)
            a_h, b_h = rand((33, 17), dtype), rand((17, 41), dtype)
            a = cg.asarray(np.ascontiguousarray(a_h.T)).T if ta else cg.asarray(a_h)
            b = cg.asarray(np.ascontiguousarray(b_h.T)).T if tb else cg.asarray(b_h)
            base = cg.full((41, 33) if tout else (33, 41), np.nan, dtype)
            out = base.T if tout else base
            cg.ops.matmul(a, b, out)
            compare(out.get(), ref(a_h, b_h), dtype, f"{dtype} ta={ta} tb={tb} tout={tout}")
    return "all combinations agree"


@check("padded rows (slices with leading dimensions > width), odd alignments")
def _padded() -> str:
    big_a, big_b = rand((40, 70), "float32"), rand((90, 50), "float32")
    a, b = cg.asarray(big_a)[3:30, 1:62], cg.asarray(big_b)[5:66, 3:40]  # 4-byte aligned starts
    out = cg.ops.matmul(a, b)
    return compare(out.get(), ref(big_a[3:30, 1:62], big_b[5:66, 3:40]), "float32")


@check("batched (5, 64, 48) @ (5, 48, 32), broadcast operands, transposed batches")
def _batched() -> str:
    for dtype in ("float16", "float32", "float64"):
        a_h, b_h, w_h = rand((5, 64, 48), dtype), rand((5, 48, 32), dtype), rand((48, 32), dtype)
        a, b = cg.asarray(a_h), cg.asarray(b_h)
        compare(cg.ops.matmul(a, b).get(), ref(a_h, b_h), dtype, f"{dtype} batch")
        compare(cg.ops.matmul(a, cg.asarray(w_h)).get(), ref(a_h, w_h), dtype, f"{dtype} 2-D b")
        compare(
            cg.ops.matmul(cg.asarray(a_h[:1]), b).get(), ref(a_h[:1], b_h), dtype, f"{dtype} batch of one"
        )
        at = cg.asarray(np.ascontiguousarray(a_h.transpose(0, 2, 1))).transpose(0, 2, 1)
        compare(cg.ops.matmul(at, b).get(), ref(a_h, b_h), dtype, f"{dtype} transposed batch")
    return "float16, float32, float64"


@check("vector shapes (m, n or k of 1), batched and transposed")
def _vectors() -> str:
    for m, k, n in ((1, 70, 50), (60, 70, 1), (1, 70, 1), (60, 1, 50), (1, 1, 1)):
        for transposed in (False, True):
            a_h, b_h = rand((2, m, k), "float32"), rand((2, k, n), "float32")
            if transposed:
                a = cg.asarray(np.ascontiguousarray(a_h.transpose(0, 2, 1))).transpose(0, 2, 1)
                b = cg.asarray(np.ascontiguousarray(b_h.transpose(0, 2, 1))).transpose(0, 2, 1)
                out = cg.full((2, n, m), np.nan, "float32").transpose(0, 2, 1)
            else:
                a, b, out = cg.asarray(a_h), cg.asarray(b_h), cg.full((2, m, n), np.nan, "float32")
            what = f"m={m} k={k} n={n} transposed={transposed}"
            cg.ops.matmul(a, b, out)
            compare(out.get(), ref(a_h, b_h), "float32", what)
            compare(cg.ops.matmul(a[0], b[0]).get(), ref(a_h[0], b_h[0]), "float32", what + " 2-D")
    return "all shapes"


@check("alpha and beta (beta=0 never reads a NaN-poisoned out)")
def _alpha_beta() -> str:
    for dtype in ("float16", "bfloat16", "float32", "float64"):
        a_h, b_h, c_h = rand((40, 24), dtype), rand((24, 56), dtype), rand((40, 56), dtype)
        a, b, c = cg.asarray(a_h), cg.asarray(b_h), cg.asarray(c_h)
        cg.ops.matmul(a, b, c, alpha=0.5, beta=-2.0)
        compare(c.get(), ref(a_h, b_h, c_h, 0.5, -2.0), dtype, dtype)
        poisoned = cg.full((40, 56), np.nan, dtype)
        cg.ops.matmul(a, b, poisoned, alpha=3.0)
        compare(poisoned.get(), ref(a_h, b_h, alpha=3.0), dtype, dtype + " poisoned")
    return "all dtypes"


# captures ---------------------------------------------------------------------------------
@check("capture (plan made eagerly first), replayed 5 times with new inputs")
def _capture() -> str:
    a_h, b_h = rand((3, 128, 256), "float32"), rand((3, 256, 64), "float32")
    a, b = cg.asarray(a_h), cg.asarray(b_h)
    c = cg.zeros((3, 128, 64), "float32")
    cg.ops.matmul(a, b, c, beta=0.5)  # the plan, before the capture
    with cg.capture() as g:
        t = cg.ops.matmul(a, b, alpha=2.0)
        cg.ops.matmul(a, b, c, beta=0.5)
        del t
    for _ in range(5):
        a_h, b_h, c_h = rand(a_h.shape, "float32"), rand(b_h.shape, "float32"), rand((3, 128, 64), "float32")
        a.set(a_h)
        b.set(b_h)
        c.set(c_h)
        g.replay()
        note = compare(c.get(), ref(a_h, b_h, c_h, 1.0, 0.5), "float32")
    kinds = [(n.type, n.name) for n in g.nodes]
    return f"{note}; nodes {kinds}; pool {g.pool.reserved} B"


@check("capture of a shape never seen before (plan made inside the capture)")
def _plan_inside() -> str:
    a_h, b_h = rand((77, 91), "float64"), rand((91, 13), "float64")
    a, b = cg.asarray(a_h), cg.asarray(b_h)
    before = len(_blas._PLANS)
    with cg.capture() as g:
        out = cg.ops.matmul(a, b)
    assert len(_blas._PLANS) == before + 1
    g.replay()
    return compare(out.get(), ref(a_h, b_h), "float64") + f"; nodes {[n.name for n in g.nodes]}"


@check("capture with alloc='graph' (workspace as graph memory)")
def _graph_memory() -> str:
    a_h, b_h = rand((512, 1024), "float32"), rand((1024, 512), "float32")
    a, b, out = cg.asarray(a_h), cg.asarray(b_h), cg.zeros((512, 512), "float32")
    with cg.capture(alloc="graph") as g:
        cg.ops.matmul(a, b, out)
    g.replay()
    g.replay()
    return compare(out.get(), ref(a_h, b_h), "float32") + f"; nodes {[n.type for n in g.nodes]}"


@check("shared GraphPool: two graphs replayed in order")
def _shared_pool() -> str:
    pool = cg.GraphPool(dev)
    a_h, b_h, w_h = rand((64, 128), "float32"), rand((128, 64), "float32"), rand((64, 32), "float32")
    a, b, w = cg.asarray(a_h), cg.asarray(b_h), cg.asarray(w_h)
    with cg.capture(pool=pool) as g1:
        x = cg.ops.matmul(a, b)
    with cg.capture(pool=pool) as g2:
        y = cg.ops.matmul(x, w)
    for _ in range(3):
        a_h = rand((64, 128), "float32")
        a.set(a_h)
        g1.replay()
        g2.replay()
    return compare(y.get(), ref(a_h @ b_h, w_h), "float32")


@check("graph keeps its workspace: replay after eager churn and empty_cache")
def _workspace_alive() -> str:
    import gc

    a_h, b_h = rand((4, 512, 2048), "float32"), rand((4, 2048, 256), "float32")
    a, b = cg.asarray(a_h), cg.asarray(b_h)
    with cg.capture() as g:
        out = cg.ops.matmul(a, b)
    plans = [p for (d, _), p in _blas._PLANS.items() if d is dev]
    ws = max((p.workspace_size for p in plans), default=0)
    del a, b
    gc.collect()
    for m, k, n in ((2048, 64, 2048), (64, 8192, 64), (1024, 1024, 1024)):
        x, y = cg.asarray(rand((m, k), "float32")), cg.asarray(rand((k, n), "float32"))
        cg.ops.matmul(x, y)
        del x, y
    gc.collect()
    dev.synchronize()
    dev.allocator.empty_cache()
    for _ in range(3):
        g.replay()
    return compare(out.get(), ref(a_h, b_h), "float32") + f"; largest workspace of a plan {ws} B"


@check("two live graphs on two streams replayed interleaved (PyTorch #193402)")
def _interleaved() -> str:
    import gc

    a1_h, b1_h = rand((8, 1024, 1024), "float32"), rand((8, 1024, 64), "float32")
    a2_h, b2_h = rand((64, 16384), "float32"), rand((16384, 64), "float32")  # split-K: workspace
    a1, b1, a2, b2 = map(cg.asarray, (a1_h, b1_h, a2_h, b2_h))
    s1, s2 = dev.create_stream(), dev.create_stream()
    with cg.capture(stream=s1) as g1:
        o1 = cg.ops.matmul(a1, b1, stream=s1)
    with cg.capture(stream=s2) as g2:
        o2 = cg.ops.matmul(a2, b2, stream=s2)
    dev.synchronize()  # the uploads (on the default stream) before the replays (on s1, s2)
    for _ in range(50):
        g1.replay(s1)
        g2.replay(s2)
    s1.synchronize()
    s2.synchronize()
    note = (
        compare(o1.get(), ref(a1_h, b1_h), "float32") + "; " + compare(o2.get(), ref(a2_h, b2_h), "float32")
    )
    g1.close()
    del g1
    gc.collect()
    for _ in range(10):
        g2.replay(s2)
    s2.synchronize()
    return note + "; " + compare(o2.get(), ref(a2_h, b2_h), "float32", "after the other graph closed")


# other libraries --------------------------------------------------------------------------
@check("torch tensors in and out, zero-copy (float32, float16, bfloat16)")
def _torch() -> str:
    import torch

    notes = []
    for tdt, name in ((torch.float32, "float32"), (torch.float16, "float16"), (torch.bfloat16, "bfloat16")):
        a = torch.randn(64, 96, device="cuda", dtype=tdt)
        b = torch.randn(96, 48, device="cuda", dtype=tdt)
        out = torch.full((64, 48), float("nan"), device="cuda", dtype=tdt)
        bt = b.t().contiguous()
        torch.cuda.synchronize()  # torch's work (on its stream) before ours
        res = cg.ops.matmul(a, bt.t(), out)  # a transposed view of a tensor
        assert res is out, type(res)
        dev.synchronize()  # ours before torch reads out (and may reuse bt's memory)
        want = ref(a.float().cpu().numpy(), b.float().cpu().numpy())
        notes.append(compare(out.float().cpu().numpy(), want, name, name))
        new = cg.ops.matmul(a, b)
        assert isinstance(new, cg.DeviceArray)
        notes.append(compare(new.get(), want, name, "new"))
    return "; ".join(notes)


@check("CuPy arrays in and out, zero-copy (batched float64)")
def _cupy() -> str:
    import cupy as cp

    a = cp.random.standard_normal((3, 40, 30))
    b = cp.random.standard_normal((3, 30, 20))
    out = cp.empty((3, 40, 20))
    cp.cuda.Device().synchronize()
    assert cg.ops.matmul(a, b, out) is out
    dev.synchronize()
    return compare(cp.asnumpy(out), ref(cp.asnumpy(a), cp.asnumpy(b)), "float64")


@check("torch allocator churn around a captured matmul")
def _torch_churn() -> str:
    import torch

    a_h, b_h = rand((256, 1024), "float32"), rand((1024, 256), "float32")
    a, b = cg.asarray(a_h), cg.asarray(b_h)
    with cg.capture() as g:
        out = cg.ops.matmul(a, b)
    for n in (512, 2048, 4096):
        junk = [torch.randn(n, n, device="cuda") @ torch.randn(n, n, device="cuda") for _ in range(2)]
        del junk
        torch.cuda.empty_cache()
        g.replay()
    torch.cuda.synchronize()
    return compare(out.get(), ref(a_h, b_h), "float32")


@check("errors: strided view refused, mixed dtypes refused (clear messages)")
def _errors() -> str:
    msgs = []
    for call in (
        lambda: cg.ops.matmul(cg.ones((8, 8), "float32")[::2, ::2], cg.ones((4, 4), "float32")),
        lambda: cg.ops.matmul(cg.ones((4, 4), "float32"), cg.ones((4, 4), "float64")),
    ):
        try:
            call()
        except (TypeError, ValueError) as exc:
            msgs.append(str(exc)[:80])
        else:
            raise AssertionError("no error")
    return " | ".join(msgs)


failed = [name for name, ok, _ in RESULTS if not ok]
print(f"\n{len(RESULTS) - len(failed)} passed, {len(failed)} failed" + (f": {failed}" if failed else ""))
sys.exit(len(failed))
