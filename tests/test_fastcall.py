"""The compiled fast driver calls (``cudagraphs._fastcall``).

On any machine: each call passes its arguments to the bound entry point
unchanged and returns what cuda.bindings would (a tuple starting with the
CUresult), with fake driver functions made by ctypes. On a GPU: the cuda
backend uses them, and the same work gives the same results through
cuda.bindings alone (``CUDAGRAPHS_FASTCALL=0``, in a subprocess).
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import compiled_part_or_skip

fast = compiled_part_or_skip()

P, U, Z = ctypes.c_void_p, ctypes.c_uint, ctypes.c_size_t
I64 = ctypes.c_uint64
SIGNATURES = {
    "cuLaunchKernel": (P, U, U, U, U, U, U, U, P, P, P),
    "cuGraphLaunch": (P, P),
    "cuMemcpyDtoDAsync": (I64, I64, Z, P),
    "cuMemcpyHtoDAsync": (I64, P, Z, P),
    "cuMemcpyDtoHAsync": (P, I64, Z, P),
    "cuMemsetD8Async": (I64, ctypes.c_ubyte, Z, P),
    "cuMemFreeAsync": (I64, P),
    "cuEventRecord": (P, P),
    "cuStreamWaitEvent": (P, P, U),
    "cuGraphExecKernelNodeSetParams": (P, P, P),
}


_CALLBACKS: list[object] = []


class Handle:
    """Like a cuda.bindings handle: converts with int()."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __int__(self) -> int:
        return self.value


@pytest.fixture
def restore():
    """Give the entry points back after a test that rebinds them (the cuda backend calls them).

    Only such tests use it: a test that starts the cuda backend binds the real
    entry points, which a restore of what was there before would undo.
    """
    before = {name: fast.bound(name) for name in fast.names()}
    yield
    for name, address in before.items():
        fast.bind(name, address)
    assert {name: fast.bound(name) for name in fast.names()} == before


@pytest.fixture
def fake(restore):
    """Bind every entry point to a Python function that records its arguments."""
    seen: dict[str, tuple[object, ...]] = {}
    keep = _CALLBACKS  # (never freed: a bound address must not dangle)
    for name, args in SIGNATURES.items():

        def record(*a: object, name: str = name) -> int:
            seen[name] = a
            return 700 + len(seen)

        cb = ctypes.CFUNCTYPE(ctypes.c_int, *args)(record)
        keep.append(cb)
        fast.bind(name, ctypes.cast(cb, P).value)

    def alloc(out, n, pool, stream):
        seen["cuMemAllocFromPoolAsync"] = (n, pool, stream)
        out[0] = 0xABC000 + n
        return 0

    cb = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(I64), Z, P, P)(alloc)
    keep.append(cb)
    fast.bind("cuMemAllocFromPoolAsync", ctypes.cast(cb, P).value)

    def ctx(out):
        out[0] = 0xC7C7
        return 0

    def copy_node(exec_, node, params, context):
        p = _Memcpy3D.from_address(params)
        seen["cuGraphExecMemcpyNodeSetParams"] = (
            exec_,
            node,
            context,
            {n: getattr(p, n) for n, _ in p._fields_},
        )
        return 0

    for name, cb in (
        ("cuCtxGetCurrent", ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(P))(ctx)),
        ("cuGraphExecMemcpyNodeSetParams", ctypes.CFUNCTYPE(ctypes.c_int, P, P, P, P)(copy_node)),
    ):
        keep.append(cb)
        fast.bind(name, ctypes.cast(cb, P).value)
    return seen


class _Memcpy3D(ctypes.Structure):
    """The driver's CUDA_MEMCPY3D, as cuda.h declares it."""

    _fields_ = [
        *[(f"src{n}", Z) for n in ("XInBytes", "Y", "Z", "LOD")],
        ("srcMemoryType", ctypes.c_int),
        ("srcHost", P),
        ("srcDevice", I64),
        ("srcArray", P),
        ("reserved0", P),
        ("srcPitch", Z),
        ("srcHeight", Z),
        *[(f"dst{n}", Z) for n in ("XInBytes", "Y", "Z", "LOD")],
        ("dstMemoryType", ctypes.c_int),
        ("dstHost", P),
        ("dstDevice", I64),
        ("dstArray", P),
        ("reserved1", P),
        ("dstPitch", Z),
        ("dstHeight", Z),
        ("WidthInBytes", Z),
        ("Height", Z),
        ("Depth", Z),
    ]


def test_a_copy_node_update_passes_a_one_dimensional_device_copy(fake):
    big = 2**40 + 8
    assert fast.cuGraphExecMemcpyNodeSetParams(Handle(0x70), 0x71, big, big + 256, 4096) == (0,)
    exec_, node, context, p = fake["cuGraphExecMemcpyNodeSetParams"]
    assert (exec_, node, context) == (0x70, 0x71, 0xC7C7)
    assert ctypes.sizeof(_Memcpy3D) == 200  # (cuda.h's CUDA_MEMCPY3D on 64-bit hosts)
    assert (p["srcMemoryType"], p["dstMemoryType"]) == (2, 2)  # CU_MEMORYTYPE_DEVICE
    assert (p["srcDevice"], p["dstDevice"], p["WidthInBytes"], p["Height"], p["Depth"]) == (
        big + 256,
        big,
        4096,
        1,
        1,
    )
    rest = set(p) - {
        "srcMemoryType",
        "dstMemoryType",
        "srcDevice",
        "dstDevice",
        "WidthInBytes",
        "Height",
        "Depth",
    }
    assert all(not p[k] for k in rest)  # offsets, pitches, host pointers, arrays: none
    with pytest.raises(TypeError, match="takes 5 arguments"):
        fast.cuGraphExecMemcpyNodeSetParams(1, 2, 3, 4)
    with pytest.raises(OverflowError):
        fast.cuGraphExecMemcpyNodeSetParams(1, 2, 3, 4, -1)


def test_every_call_passes_its_arguments_and_returns_the_result(fake):
    err = fast.cuLaunchKernel(Handle(0x1234), 1, 2, 3, 4, 5, 6, 7, Handle(0xBEEF), 0x5000, None)
    assert err == (701,)
    assert fake["cuLaunchKernel"] == (0x1234, 1, 2, 3, 4, 5, 6, 7, 0xBEEF, 0x5000, None)
    assert fast.cuGraphLaunch(0x10, 0x20) == (702,)
    assert fake["cuGraphLaunch"] == (0x10, 0x20)
    big = 2**40 + 8
    fast.cuMemcpyDtoDAsync(big, big + 64, 4096, 0x30)
    assert fake["cuMemcpyDtoDAsync"] == (big, big + 64, 4096, 0x30)
    fast.cuMemcpyHtoDAsync(big, 0x7000, 16, 0x30)
    assert fake["cuMemcpyHtoDAsync"] == (big, 0x7000, 16, 0x30)
    fast.cuMemcpyDtoHAsync(0x7000, big, 16, 0x30)
    assert fake["cuMemcpyDtoHAsync"] == (0x7000, big, 16, 0x30)
    fast.cuMemsetD8Async(big, 0xAB, 99, 0x31)
    assert fake["cuMemsetD8Async"] == (big, 0xAB, 99, 0x31)
    assert fast.cuMemAllocFromPoolAsync(512, Handle(0x40), 0x41) == (0, 0xABC000 + 512)
    assert fake["cuMemAllocFromPoolAsync"] == (512, 0x40, 0x41)
    fast.cuMemFreeAsync(big, 0x41)
    assert fake["cuMemFreeAsync"] == (big, 0x41)
    fast.cuEventRecord(0x50, 0x51)
    assert fake["cuEventRecord"] == (0x50, 0x51)
    fast.cuStreamWaitEvent(0x51, 0x50, 1)
    assert fake["cuStreamWaitEvent"] == (0x51, 0x50, 1)
    fast.cuGraphExecKernelNodeSetParams(0x60, 0x61, 0x62)
    assert fake["cuGraphExecKernelNodeSetParams"] == (0x60, 0x61, 0x62)


def test_numbers_with_index_are_accepted_as_cuda_bindings_accepts_them(fake):
    np = pytest.importorskip("numpy")
    fast.cuMemsetD8Async(np.uint64(4096), np.uint8(7), np.int64(64), 0x31)
    assert fake["cuMemsetD8Async"] == (4096, 7, 64, 0x31)
    fast.cuLaunchKernel(1, np.int32(2), 1, 1, np.int64(128), 1, 1, 0, 0, 0, 0)
    assert fake["cuLaunchKernel"][1] == 2
    assert fake["cuLaunchKernel"][4] == 128


def test_bad_arguments_raise_before_any_call(fake):
    with pytest.raises(TypeError, match="cuGraphLaunch takes 2 arguments, got 1"):
        fast.cuGraphLaunch(1)
    with pytest.raises(TypeError):
        fast.cuGraphLaunch("exec", 0)
    np = pytest.importorskip("numpy")
    for not_an_address in (np.float32(1.5), bytearray(b"123"), 2.0):
        with pytest.raises(TypeError, match="must be an int"):
            fast.cuGraphLaunch(not_an_address, 0)
    with pytest.raises(OverflowError):
        fast.cuLaunchKernel(1, 2**33, 1, 1, 1, 1, 1, 0, 0, 0, 0)
    with pytest.raises(OverflowError):
        fast.cuMemFreeAsync(-1, 0)
    with pytest.raises(OverflowError, match="sets bytes, got the value 256"):
        fast.cuMemsetD8Async(0x1000, 256, 1, 0)
    assert not {"cuGraphLaunch", "cuLaunchKernel", "cuMemFreeAsync", "cuMemsetD8Async"} & set(fake)
    with pytest.raises(ValueError, match="no fast call for cuNothing"):
        fast.bind("cuNothing", 1)
    with pytest.raises(TypeError):
        fast.bind(3, 1)
    with pytest.raises(ValueError, match="no fast call for cuNothing"):
        fast.bound("cuNothing")


def test_the_cuda_backend_still_works_after_these_tests(backend):
    """(run after the fakes: the fixture gave the real entry points back)."""
    import numpy as np

    import cudagraphs as cg

    x = cg.asarray(np.arange(8.0))
    cg.ops.scale(3.0, x, out=x)
    np.testing.assert_array_equal(x.get(), np.arange(8.0) * 3)


def test_an_unbound_call_raises_instead_of_jumping_to_null(restore):
    fast.bind("cuGraphLaunch", 0)
    assert fast.bound("cuGraphLaunch") == 0
    with pytest.raises(RuntimeError, match="cuGraphLaunch is not bound"):
        fast.cuGraphLaunch(1, 2)
    assert set(fast.names()) == set(SIGNATURES) | {
        "cuMemAllocFromPoolAsync",
        "cuCtxGetCurrent",
        "cuGraphExecMemcpyNodeSetParams",
    }
    fast.bind("cuCtxGetCurrent", 0)
    fast.bind("cuGraphExecMemcpyNodeSetParams", 1)  # (never jumped to: the context comes first)
    with pytest.raises(RuntimeError, match="cuCtxGetCurrent is not bound"):
        fast.cuGraphExecMemcpyNodeSetParams(1, 2, 3, 4, 5)


def test_settings_switch_fast_calls_off():
    from cudagraphs import _config

    assert _config._from_environ({}).fastcall is True
    assert _config._from_environ({"CUDAGRAPHS_FASTCALL": "0"}).fastcall is False
    assert _config._from_environ({"CUDAGRAPHS_FASTCALL": "on"}).fastcall is True
    with pytest.raises(ValueError, match="CUDAGRAPHS_FASTCALL must be 0 or 1"):
        _config._from_environ({"CUDAGRAPHS_FASTCALL": "maybe"})


WORK = textwrap.dedent(
    """
    import numpy as np
    import cudagraphs as cg
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal(1000), rng.standard_normal(1000)
    x, y = cg.asarray(a), cg.asarray(b)
    out = cg.full(1000, np.nan)
    cg.ops.add(x, y, out=out)                       # a launch
    with cg.capture() as g:                           # a replay, a pool allocation
        t = cg.empty(1000)
        cg.ops.add(out, y, out=t)
        cg.ops.copy(out, t)
    g.replay(); g.replay()
    s = cg.Device(0).create_stream()                  # events between streams, a free
    s.wait(cg.Device(0).stream)
    z = cg.empty(1000, stream=s)
    cg.ops.copy(z, out, stream=s)
    cg.Device(0).stream.wait(s)
    cg.ops.fill(x, 0.0)                               # a memset
    got = z.get()
    assert np.allclose(got, a + 3 * b), abs(got - (a + 3 * b)).max()
    assert not x.get().any()
    print("fast" if cg.Device(0).backend.fastcall else "bindings")
    """
)


@pytest.mark.gpu
def test_the_cuda_backend_calls_the_driver_fast_and_through_bindings_alike():
    import cudagraphs as cg

    if cg.backend() != "cuda":
        pytest.skip("needs the cuda backend")
    assert cg.Device(0).backend.fastcall, "the fast calls are built but the cuda backend does not use them"
    src = str(Path(cg.__file__).resolve().parent.parent)
    for flag, path in (("1", "fast"), ("0", "bindings")):
        env = dict(os.environ, CUDAGRAPHS_FASTCALL=flag, CUDAGRAPHS_BACKEND="cuda", PYTHONPATH=src)
        done = subprocess.run(
            [sys.executable, "-c", WORK], env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == path
