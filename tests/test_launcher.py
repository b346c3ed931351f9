"""Kernel launches packed and issued by the C part's ``Packer`` (``cudagraphs._fastcall``).

``Kernel.launch`` decides everything (arguments checked and converted, the
stream, whether a capture records the launch); a kernel's ``Packer`` only
packs the converted values into the parameter bytes and calls
``cuLaunchKernel``, or hands the launch to its fallback (the backend's
``launch``, which reports the driver's error). It must pack exactly the
bytes the backend packs. Here a fake ``cuLaunchKernel`` records what it is
given, on any backend, and the test kernel is armed as the cuda backend arms
every kernel; on a GPU the real path runs (``test_gpu``, ``test_ops``).
Graph.rebind's kernel nodes are set through the same ``Packer`` in batches
(``cuGraphExecKernelNodeSetParams``), tested with a fake of that call too.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from conftest import compiled_part_or_skip

import cudagraphs as cg
from cudagraphs import _kernel, _node_changes
from cudagraphs._recording import NodeRecord
from cudagraphs.backends.base import ArrayArg, Copy, KernelLaunch

fast = compiled_part_or_skip()

SOURCE = r"""
extern "C" __global__ void mix(float* out, const float* x, void* raw, int n, unsigned short k,
                               long long big, double alpha, float beta, bool flag, signed char c) {}
"""
FUNCTION = 0xF00D
# the functions whose launches the fake cuLaunchKernel records (the armed test kernel's); on a GPU
# every other launch (the library's own kernels) goes on to the driver
_OURS: set[int] = {FUNCTION}
_KEEP: list[object] = []
P, U = ctypes.c_void_p, ctypes.c_uint


def _bind(name: str, prototype: Any, fn: Any) -> None:
    cb = prototype(fn)
    _KEEP.append(cb)
    fast.bind(name, ctypes.cast(cb, P).value)


def _offsets(params: Any) -> tuple[tuple[int, ...], struct.Struct]:
    from cudagraphs.backends.cuda import _Packer

    return _Packer(params).offsets, _Packer(params).fmt


@pytest.fixture
def driver(backend: str) -> Iterator[tuple[list[dict[str, Any]], list[int], list[int]]]:
    """A fake cuLaunchKernel recording its arguments and the bytes of each kernel parameter.

    (Bound after the backend started: the cuda backend binds the real entry points.)
    """
    cg.Device(0)
    before = fast.bound("cuLaunchKernel")
    seen: list[dict[str, Any]] = []
    result = [0]
    sizes: list[int] = []

    prototype = ctypes.CFUNCTYPE(ctypes.c_int, P, U, U, U, U, U, U, U, P, P, P)
    real = prototype(before) if before else None

    def launch(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):  # type: ignore[no-untyped-def]
        if f not in _OURS and real is not None:
            # another kernel (the library's own, on a GPU): launched by the driver bound before
            return real(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra)
        slots = [ctypes.c_void_p.from_address(params + 8 * i).value for i in range(len(sizes))]
        seen.append(
            {
                "f": f,
                "grid": (gx, gy, gz),
                "block": (bx, by, bz),
                "shared": shared,
                "stream": stream,
                "bytes": [ctypes.string_at(a, n) for a, n in zip(slots, sizes)],
                "extra": extra,
            }
        )
        return result[0]

    _bind("cuLaunchKernel", prototype, launch)
    yield seen, result, sizes
    fast.bind("cuLaunchKernel", before)


@pytest.fixture
def armed(backend: str, driver: Any) -> Iterator[SimpleNamespace]:
    """The test kernel armed as the cuda backend arms it: its launches packed by a Packer.

    The Packer's fallback (the backend's launch on a GPU) records what it is
    handed.
    """
    seen, result, sizes = driver
    dev = cg.Device(0)
    k = cg.Kernel(SOURCE, "mix")
    k.host = lambda *a: None  # (what sim runs, where a launch reaches it)
    offsets, fmt = _offsets(k.params)
    sizes[:] = [p.dtype.itemsize for p in k.params]
    handed: list[tuple[Any, Any]] = []

    def fallback(stream: Any, launch: Any) -> None:
        handed.append((stream, launch))

    fn = k.function(dev)
    plan = k._plans[dev]
    ours = _handle(fn)
    _OURS.add(ours)
    packer = fast.Packer(_kernel._fast_layout(k.params, offsets), fallback)
    k.fast = packer
    k._plans[dev] = _kernel._Plan(dev, fn, packer.issue, plan.describe, packer, FUNCTION)
    try:
        yield SimpleNamespace(k=k, dev=dev, seen=seen, result=result, handed=handed, offsets=offsets, fmt=fmt)
    finally:
        k._plans[dev] = plan
        k.fast = None
        if ours != FUNCTION:
            _OURS.discard(ours)


def _handle(fn: Any) -> int:
    """A loaded function's driver handle (the simulator's has none: FUNCTION stands for it)."""
    try:
        return int(fn)
    except TypeError:
        return FUNCTION


def _args(rng: np.random.Generator) -> list[Any]:
    out = cg.asarray(rng.standard_normal(16).astype(np.float32))
    x = cg.asarray(rng.standard_normal(16).astype(np.float32))
    raw = cg.empty(7, np.uint8)
    return [out, x, raw, 16, 65535, -(2**62), 0.25, 1.5, True, -128]


def _expected_bytes(t: SimpleNamespace, args: list[Any]) -> list[bytes]:
    """What the backend packs: the kernel's converters, then its struct."""
    values = [conv.convert(a, t.dev) for conv, a in zip(t.k._convert, args)]
    packed = t.fmt.pack(*values)
    return [packed[o : o + p.dtype.itemsize] for o, p in zip(t.offsets, t.k.params)]


def test_a_launch_packs_the_bytes_the_backend_packs(armed: SimpleNamespace) -> None:
    t = armed
    rng = np.random.default_rng(0)
    for trial in range(5):
        args = _args(rng)
        args[3] = int(rng.integers(-(2**31), 2**31))
        args[4] = int(rng.integers(0, 2**16))
        args[5] = int(rng.integers(-(2**63), 2**63 - 1))
        args[6], args[7] = float(rng.normal()), int(rng.integers(-9, 9))
        args[8], args[9] = bool(trial % 2), int(rng.integers(-128, 128))
        assert t.k.launch((3, 2), (32, 4, 2), *args, shared_mem=96) is None
        got = t.seen[-1]
        assert got["f"] == FUNCTION
        assert got["extra"] is None
        assert (got["grid"], got["block"], got["shared"]) == ((3, 2, 1), (32, 4, 2), 96)
        assert got["stream"] == t.dev.stream.handle
        assert got["bytes"] == _expected_bytes(t, args)
    assert len(t.seen) == 5
    assert not t.handed


def test_pointers_given_as_none_ints_or_scalars_launch(armed: SimpleNamespace) -> None:
    t = armed
    args = _args(np.random.default_rng(1))
    scalar = cg.DeviceScalar(np.float32(2.0))
    for a, ptr in (
        (None, 0),
        (0, 0),
        (2**64 - 1, 2**64 - 1),
        (args[0].ptr, args[0].ptr),
        (scalar, scalar.ptr),
    ):
        t.k.launch(1, 1, args[0], a, *args[2:])
        assert t.seen[-1]["bytes"][1] == struct.pack("<Q", ptr)
    assert not t.handed


def test_a_launch_started_by_a_conversion_keeps_the_values_of_its_own(armed: SimpleNamespace) -> None:
    """A launch whose argument's conversion runs Python code that launches the same kernel.

    Each launch packs the values converted from its own arguments: the inner
    one (made while the outer one converts its third argument) does not write
    into the outer one's values.
    """
    t = armed
    rng = np.random.default_rng(5)
    outer, inner = _args(rng), _args(rng)
    inner[3], outer[3] = 7, 9

    class Address(int):
        """A pointer given as an int whose conversion launches the kernel with other arguments."""

        def __int__(self) -> int:
            t.k.launch(1, 1, *inner)
            return int.__int__(self)

    address = Address(outer[2].ptr)
    outer[2] = address
    t.k.launch(1, 1, *outer)
    launches = [got["bytes"] for got in t.seen]
    assert len(launches) >= 2  # (the inner launch, once per conversion of the address, then the outer)
    want_inner = _expected_bytes(t, inner)
    want_outer = _expected_bytes(t, [*outer[:2], int(address), *outer[3:]])
    assert launches[-1] == want_outer
    assert all(b == want_inner for b in launches[:-1])
    assert want_inner[0] != want_outer[0]  # (distinct output arrays: a shared value would show)


def test_threads_launching_one_kernel_each_pack_their_own_values(armed: SimpleNamespace) -> None:
    """Eight threads launch one kernel at once: every launch carries one thread's values."""
    import threading

    t = armed
    rng = np.random.default_rng(6)
    per_thread = [_args(rng) for _ in range(8)]
    for i, args in enumerate(per_thread):
        args[3] = i
    expected = {i: _expected_bytes(t, args) for i, args in enumerate(per_thread)}
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def run(args: list[Any]) -> None:
        try:
            barrier.wait()
            for _ in range(200):
                t.k.launch(1, 1, *args)
        except BaseException as exc:  # (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(a,)) for a in per_thread]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    assert len(t.seen) == 8 * 200
    for got in t.seen:
        n = struct.unpack("<i", got["bytes"][3])[0]
        assert got["bytes"] == expected[n]


def test_the_current_stream_and_a_given_stream_are_used(armed: SimpleNamespace) -> None:
    t = armed
    args = _args(np.random.default_rng(2))
    s = t.dev.create_stream()
    with s:
        t.k.launch(1, 1, *args)
    assert t.seen[-1]["stream"] == s.handle
    t.k.launch(1, 1, *args, stream=s)
    assert t.seen[-1]["stream"] == s.handle
    t.k.launch(1, 1, *args, stream=None)
    assert t.seen[-1]["stream"] == t.dev.stream.handle
    assert not t.handed
    s.close()


def _bad_cases(dev: cg.Device, args: list[Any]) -> dict[str, tuple[tuple[Any, ...], dict[str, Any]]]:
    """Launches Kernel.launch refuses: none may reach the driver."""
    bad_dtype = cg.asarray(np.zeros(16, np.float64))
    strided = cg.asarray(np.zeros(32, np.float32))[::2]
    closed = dev.create_stream()
    closed.close()
    return {
        "too few arguments": ((1, 1, *args[:-1]), {}),
        "a float grid": ((1.0, 1, *args), {}),
        "an empty grid": ((0, 1, *args), {}),
        "too many threads": ((1, (32, 32, 2), *args), {}),
        "a grid out of range": (((1, 65536), 1, *args), {}),
        "an unknown keyword": ((1, 1, *args), {"stram": None}),
        "a negative shared_mem": ((1, 1, *args), {"shared_mem": -1}),
        "a float shared_mem": ((1, 1, *args), {"shared_mem": 1.0}),
        "a stream of another type": ((1, 1, *args), {"stream": "default"}),
        "a closed stream": ((1, 1, *args), {"stream": closed}),
        "another dtype": ((1, 1, args[0], bad_dtype, *args[2:]), {}),
        "a strided view": ((1, 1, args[0], strided, *args[2:]), {}),
        "a numpy array": ((1, 1, args[0], np.zeros(16, np.float32), *args[2:]), {}),
        "a negative address": ((1, 1, args[0], -8, *args[2:]), {}),
        "an address over 64 bits": ((1, 1, args[0], 2**64, *args[2:]), {}),
        "an int out of int32": ((1, 1, *args[:3], 2**31, *args[4:]), {}),
        "a negative unsigned": ((1, 1, *args[:4], -1, *args[5:]), {}),
        "an unsigned over 16 bits": ((1, 1, *args[:4], 65536, *args[5:]), {}),
        "a bool for an int": ((1, 1, *args[:3], True, *args[4:]), {}),
        "a float for an int": ((1, 1, *args[:3], 3.0, *args[4:]), {}),
        "a string for a double": ((1, 1, *args[:6], "0.5", *args[7:]), {}),
        "a float too big for float32": ((1, 1, *args[:7], 1e300, *args[8:]), {}),
        "an int too big for a double": ((1, 1, *args[:6], 10**400, *args[7:]), {}),
        "an int out of int8": ((1, 1, *args[:9], 128), {}),
    }


def test_every_refused_launch_raises_before_anything_is_queued(armed: SimpleNamespace) -> None:
    t = armed
    args = _args(np.random.default_rng(3))
    for what, (a, kw) in _bad_cases(t.dev, args).items():
        with pytest.raises((TypeError, ValueError, OverflowError)):
            t.k.launch(*a, **kw)
        assert not t.seen, f"{what}: launched"
        assert not t.handed, f"{what}: handed to the fallback"
    # what Kernel.launch converts launches with the converted values' bytes
    for a in ((1, [32], *args), (1, 1, *args[:3], np.int32(3), *args[4:])):
        t.k.launch(*a)
        assert t.seen[-1]["bytes"] == _expected_bytes(t, list(a[2:]))
    t.k.launch(1, 1, *args, device=t.dev)
    assert t.seen[-1]["bytes"] == _expected_bytes(t, args)
    assert len(t.seen) == 3


def test_a_driver_error_is_raised_as_the_driver_first_answered(armed: SimpleNamespace) -> None:
    """One launch, its error raised: not launched again (a capture would be invalidated by then)."""
    t = armed
    args = _args(np.random.default_rng(5))
    t.result[0] = 1  # CUDA_ERROR_INVALID_VALUE
    with pytest.raises(
        cg.CudaError, match=r"cuLaunchKernel failed with CUDA_ERROR_INVALID_VALUE \(1\)"
    ) as err:
        t.k.launch((2, 1), 64, *args, shared_mem=8)
    assert err.value.code == 1
    assert len(t.seen) == 1
    assert (t.seen[0]["grid"], t.seen[0]["block"], t.seen[0]["shared"]) == ((2, 1, 1), (64, 1, 1), 8)
    assert not t.handed
    t.result[0] = 0
    t.k.launch(1, 1, *args)  # (the stream and the kernel still work)
    assert len(t.seen) == 2


def test_an_output_that_expires_is_launched_under_its_guard_never_by_the_fast_path(
    armed: SimpleNamespace,
) -> None:
    """A graphed callable's output as an argument: the launch is a Work issued holding its lock.

    (Checked and queued as one step for the thread whose next call makes it stale: the uncaptured
    fast path, which queues with the plan's function, must not take it.)
    """
    t = armed
    args = _args(np.random.default_rng(9))
    step = cg.graphed(lambda a: cg.ops.scale(2.0, a, out=cg.empty_like(a)))
    for _ in range(3):
        out = step(args[1])
    assert type(out) is cg.GraphOutput
    t.k.launch(1, 1, out, *args[1:])
    assert len(t.seen) + len(t.handed) == 1
    assert all(s["f"] != FUNCTION for s in t.seen)  # (the fast path launches the plan's function)
    step(args[1])  # out is stale now: refused, nothing queued
    with pytest.raises(cg.StaleOutputError):
        t.k.launch(1, 1, out, *args[1:])
    assert len(t.seen) + len(t.handed) == 1


class _Abandon(Exception):
    """Ends a capture by the exception path (its partial graph is destroyed)."""


def test_a_captured_launch_is_recorded_and_issued_through_the_packer(armed: SimpleNamespace) -> None:
    """Captured, the launch is a Work: recorded (its node, the arrays kept), then issued packed."""
    t = armed
    args = _args(np.random.default_rng(8))
    args[6] = 3  # an int for a double: the converter makes it a float
    s = t.dev.create_stream()
    with pytest.raises(_Abandon), cg.capture(stream=s):
        rec = s._recording
        args[0] = cg.empty(16, np.float32, stream=s)  # the capture's memory: not kept
        keep, nodes = len(rec.keep), len(rec.nodes)
        t.k.launch((5, 2), 64, *args, stream=s, shared_mem=8)
        kept, recorded = rec.keep[keep:], rec.nodes[nodes:]
        raise _Abandon
    ((node,),) = (recorded,)
    assert type(node) is NodeRecord
    assert (node.kind, node.name) == ("kernel", "mix")
    kernel, launch = node.patch
    assert kernel is t.k
    assert type(launch) is KernelLaunch
    expected = [conv.convert(a, t.dev) for conv, a in zip(t.k._convert, args)]
    assert list(launch.values) == expected
    assert [type(v) for v in launch.values] == [type(v) for v in expected]
    assert launch.views[:3] == (args[0]._view_spec(), args[1]._view_spec(), args[2]._view_spec())
    assert launch.views[3:] == (None,) * 7
    assert {id(a) for a in args[1:3]} <= {id(o) for o in kept}
    assert id(args[0]) not in {id(o) for o in kept}
    # issued once, by the Packer, with the launch's function (sim's has no driver handle: the
    # Packer's fallback issues it there)
    assert len(t.seen) + len(t.handed) == 1
    if t.seen:
        (got,) = t.seen
        want = (launch.function.handle, (5, 2, 1), (64, 1, 1), 8)
        assert (got["f"], got["grid"], got["block"], got["shared"]) == want
        assert got["bytes"] == _expected_bytes(t, args)
    else:
        ((_, handed),) = t.handed
        assert handed == launch
    s.close()


def test_packer_issue_packs_a_launch_or_hands_it_to_the_fallback(driver: Any) -> None:
    """``Packer.issue`` is the work of a launch: the backend's launch(), in C."""
    seen, result, sizes = driver
    k = cg.Kernel(SOURCE, "mix")
    offsets, fmt = _offsets(k.params)
    sizes[:] = [p.dtype.itemsize for p in k.params]
    fallback: list[tuple[Any, Any]] = []
    packer = fast.Packer(_kernel._fast_layout(k.params, offsets), lambda *a: fallback.append(a))
    dev = cg.Device(0)
    args = _args(np.random.default_rng(10))
    values = tuple(conv.convert(a, dev) for conv, a in zip(k._convert, args))
    function = SimpleNamespace(handle=FUNCTION)  # what KernelLaunch.function is on cuda
    launch = KernelLaunch(function, (7, 1, 1), (128, 2, 1), 16, values, ())
    assert packer.issue(0x5150, launch) is None
    got = seen[-1]
    assert (got["f"], got["grid"], got["block"], got["shared"], got["stream"]) == (
        FUNCTION,
        (7, 1, 1),
        (128, 2, 1),
        16,
        0x5150,
    )
    assert got["bytes"] == [fmt.pack(*values)[o : o + p.dtype.itemsize] for o, p in zip(offsets, k.params)]
    assert not fallback
    odd = [
        launch._replace(values=values[:-1]),  # a value short
        launch._replace(values=(*values[:3], "n", *values[4:])),  # not a number
        launch._replace(grid=(0, 1, 1)),
        launch._replace(shared_mem=-1),
        launch._replace(function=object()),  # no handle
    ]
    for bad in odd:
        packer.issue(0x5150, bad)
        assert fallback[-1] == (0x5150, bad)
    result[0] = 2  # a driver error: the backend's launch raises it
    packer.issue(0x5150, launch)
    assert fallback[-1] == (0x5150, launch)
    assert len(seen) == 2
    assert len(fallback) == len(odd) + 1
    with pytest.raises(TypeError):
        packer.issue(0x5150)
    with pytest.raises(TypeError):
        fast.Packer([("p", 8, 0)], "not callable")
    with pytest.raises(ValueError, match="no packing"):
        fast.Packer([("x", 8, 0)], print)


def test_a_submitted_kernel_work_the_driver_refused_raises_its_first_answer(driver: Any) -> None:
    """A kernel's Work (its issue a Packer's) queued by submit: one launch, its error raised."""
    from cudagraphs._recording import Work, submit

    seen, result, sizes = driver
    sizes[:] = [8]
    fallback: list[tuple[Any, Any]] = []
    packer = fast.Packer([("p", 8, 0)], lambda *a: fallback.append(a))
    launch = KernelLaunch(SimpleNamespace(handle=FUNCTION), (1, 1, 1), (32, 1, 1), 0, (4096,), (None,))
    stream = cg.Device(0).stream
    assert submit(stream, Work("kernel", packer.issue, launch)) is None
    assert [s["bytes"] for s in seen] == [[struct.pack("<Q", 4096)]]
    result[0] = 1  # CUDA_ERROR_INVALID_VALUE
    with pytest.raises(cg.CudaError, match=r"cuLaunchKernel failed with CUDA_ERROR_INVALID_VALUE") as err:
        submit(stream, Work("kernel", packer.issue, launch))
    assert err.value.code == 1
    assert len(seen) == 2  # (not launched again to have the error reported)
    assert not fallback


# Graph.rebind's kernel nodes: _node_changes._move ------------------------------------------------
@pytest.fixture
def node_set(backend: str) -> Iterator[tuple[list[tuple[Any, ...]], list[int], list[int]]]:
    """A fake cuGraphExecKernelNodeSetParams recording the exec, node, struct and argument bytes."""
    cg.Device(0)
    before = fast.bound("cuGraphExecKernelNodeSetParams")
    seen: list[tuple[Any, ...]] = []
    result = [0]
    sizes: list[int] = []

    class Params(ctypes.Structure):  # CUDA_KERNEL_NODE_PARAMS_v2
        _fields_ = [("func", ctypes.c_void_p)] + [
            (f, ctypes.c_uint) for f in ["gx", "gy", "gz", "bx", "by", "bz", "shared"]
        ]
        _fields_ += [("params", ctypes.c_void_p), ("extra", ctypes.c_void_p)]

    def set_params(exec_: int, node: int, p: int) -> int:
        q = Params.from_address(p)
        slots = [ctypes.c_void_p.from_address(q.params + 8 * i).value for i in range(len(sizes))]
        seen.append(
            (exec_, node, q.func, (q.gx, q.gy, q.gz), (q.bx, q.by, q.bz), q.shared, q.extra,
             [ctypes.string_at(a, n) for a, n in zip(slots, sizes)])
        )  # fmt: skip
        return result[0] if node != result[1] else 700

    _bind("cuGraphExecKernelNodeSetParams", ctypes.CFUNCTYPE(ctypes.c_int, P, P, P), set_params)
    result.append(-1)  # result[1]: a node the fake refuses (700)
    yield seen, result, sizes
    fast.bind("cuGraphExecKernelNodeSetParams", before)


def _batched() -> bool:
    """Whether _node_changes sets kernel nodes through the C part (compiled) or the backend (plain)."""
    return not _node_changes.__file__.endswith(".py")


def test_rebind_moves_each_node_of_a_view_once_and_replaces_its_record(node_set: Any) -> None:
    """Kernel nodes with a Packer set in C (compiled); copies and other kernels by the backend."""
    seen, _, sizes = node_set
    k = cg.Kernel(SOURCE, "mix")
    offsets, fmt = _offsets(k.params)
    sizes[:] = [p.dtype.itemsize for p in k.params]
    kernel = SimpleNamespace(fast=fast.Packer(_kernel._fast_layout(k.params, offsets), print))
    plain = SimpleNamespace(fast=None)  # a kernel without a Packer: set by the backend
    dev = cg.Device(0)
    args = _args(np.random.default_rng(11))
    values = [conv.convert(a, dev) for conv, a in zip(k._convert, args)]
    old, other = args[0]._view_spec(), args[1]._view_spec()
    views = (old, other, args[2]._view_spec(), *[None] * 7)

    class Function:
        handle = FUNCTION

        def __int__(self) -> int:
            return FUNCTION

    def record(i: int, vs: tuple[Any, ...], vals: list[Any], owner: Any = kernel) -> NodeRecord:
        launch = KernelLaunch(Function(), (2, 1, 1), (64, 1, 1), 0, tuple(vals), vs)
        return NodeRecord(0x100 + i, "kernel", "mix", (), (owner, launch), True)

    copy = Copy(other.ptr, old.ptr, 64, "dtod")
    records = [
        record(0, views, values),
        NodeRecord(0x101, "memcpy", "", (other, old), copy, True),
        record(2, (other, old, *views[2:]), [values[1], values[0], *values[2:]]),
        record(3, (other, other, *views[2:]), [values[1], values[1], *values[2:]]),
        record(4, views, values, plain),
    ]
    before = list(records)
    updated: list[tuple[Any, Any, Any]] = []
    backend = SimpleNamespace(
        fastcall=True, graph_update=lambda exec_, node, patch: updated.append((exec_, node, patch))
    )
    new = ArrayArg(0xABC000, old.shape, old.strides, old.dtype)
    hits = _node_changes._users(records, old)
    assert hits == [0, 1, 2, 4]
    _node_changes._move(backend, 0x77, records, hits, old, new, new.ptr)
    assert records[3] is before[3]
    for i, swap in ((0, False), (2, True), (4, False)):
        r = records[i]
        moved = [values[1], new.ptr] if swap else [new.ptr, values[1]]
        assert type(r) is NodeRecord
        assert r[:4] == before[i][:4]
        assert r.patch[0] is before[i].patch[0]
        assert type(r.patch[1]) is KernelLaunch
        assert r.patch[1].values == (*moved, *values[2:])
        assert r.patch[1].views[int(swap)] is new
        assert r.patch[1].views[1 - int(swap)] == other
    assert records[1].patch == copy._replace(dst=new.ptr)
    assert records[1].views == (other, new)
    batched = _batched()
    in_c = [0x100, 0x102] if batched else []
    assert [s[:2] for s in seen] == [(0x77, n) for n in in_c]
    for got, i in zip(seen, (0, 2)):
        assert got[2:7] == (FUNCTION, (2, 1, 1), (64, 1, 1), 0, None)
        want = records[i].patch[1].values
        assert got[7] == [fmt.pack(*want)[o : o + n] for o, n in zip(offsets, sizes)]
    by_backend = [0x101, 0x104] if batched else [0x101, 0x100, 0x102, 0x104]
    assert sorted(n for _, n, _ in updated) == sorted(by_backend)
    assert all(e == 0x77 for e, _, _ in updated)
    assert _node_changes._users(records, old) == []


def test_rebind_in_batches_hands_the_refused_node_and_the_rest_to_the_backend(node_set: Any) -> None:
    """Nodes are set in batches (the GIL released once a batch); from a refusal the backend sets them."""
    seen, result, sizes = node_set
    sizes[:] = [8]
    kernel = SimpleNamespace(fast=fast.Packer([("p", 8, 0)], print))
    key = ArrayArg(4096, (4,), (4,), np.dtype(np.float32))
    new = ArrayArg(8192, (4,), (4,), np.dtype(np.float32))

    class Function:
        handle = FUNCTION

        def __int__(self) -> int:
            return FUNCTION

    launch = KernelLaunch(Function(), (1, 1, 1), (1, 1, 1), 0, (4096,), (key,))
    records = [NodeRecord(1000 + i, "kernel", "k", (), (kernel, launch), True) for i in range(150)]
    old = list(records)
    updated: list[int] = []
    backend = SimpleNamespace(fastcall=True, graph_update=lambda exec_, node, patch: updated.append(node))
    result[1] = 1100  # the fake refuses node 1100
    _node_changes._move(backend, 1, records, list(range(150)), key, new, new.ptr)
    for r, o in zip(records, old):
        assert r is not o
        assert r.patch[1].values == (8192,)
        assert r.patch[1].views[0] is new
        assert r[:4] == o[:4]
    if _batched():
        assert [s[1] for s in seen] == list(range(1000, 1101))  # none after the refusal
        assert all(s[7] == [struct.pack("<Q", 8192)] for s in seen)
        assert updated == list(range(1100, 1150))
    else:
        assert not seen
        assert updated == list(range(1000, 1150))


def test_a_backend_without_the_c_part_sets_every_node_itself(node_set: Any) -> None:
    """A kernel armed on a GPU and rebound in a graph of another backend (sim): the backend's way."""
    seen, _, sizes = node_set
    sizes[:] = [8]
    kernel = SimpleNamespace(fast=fast.Packer([("p", 8, 0)], print))
    key = ArrayArg(4096, (4,), (4,), np.dtype(np.float32))
    new = ArrayArg(8192, (4,), (4,), np.dtype(np.float32))
    function = SimpleNamespace(handle=FUNCTION)  # (no int(): sim's loaded functions have none)
    launch = KernelLaunch(function, (1, 1, 1), (1, 1, 1), 0, (4096,), (key,))
    records = [NodeRecord(object(), "kernel", "k", (), (kernel, launch), True) for _ in range(3)]
    updated: list[Any] = []
    backend = SimpleNamespace(fastcall=False, graph_update=lambda exec_, node, patch: updated.append(patch))
    _node_changes._move(backend, object(), records, [0, 1, 2], key, new, new.ptr)
    assert not seen
    assert [p.values for p in updated] == [(8192,)] * 3
    assert [r.patch[1].views[0] for r in records] == [new] * 3


def test_unpatchable_finds_the_first_record_rebind_must_refuse() -> None:
    def rec(kind: str, patch: Any) -> NodeRecord:
        return NodeRecord(None, kind, "", (), patch, True)

    copy = Copy(1, 2, 3, "dtod")
    records = [
        rec("kernel", ("k", "launch")),
        rec("memcpy", copy),
        rec("memcpy", ("not", "a copy")),
        rec("memset", None),
    ]
    for hits, want in (([0, 1], -1), ([0, 1, 2], 2), ([3, 0], 3), ([], -1), ([1, 3, 2], 3)):
        assert _node_changes._unpatchable(records, hits) == want
    with pytest.raises(IndexError):
        _node_changes._unpatchable(records, [7])
