"""Kernel.launch's repeat path in C (``cudagraphs._fastcall.Launcher``).

The Launcher must launch exactly what the Python path would (the same
function, dimensions, stream and argument bytes) or hand the call to the
Python path unchanged: never launch what the Python path refuses. Here a
fake ``cuLaunchKernel`` records what it is given, on any backend; on a GPU
the cuda backend arms every kernel with a Launcher and the launches run in C.
"""

from __future__ import annotations

import ctypes
import struct
from types import MethodType, SimpleNamespace

import numpy as np
import pytest
from conftest import compiled_part_or_skip

import cudagraphs as cg
from cudagraphs import _kernel
from cudagraphs._array import DeviceArray

fast = compiled_part_or_skip()

SOURCE = r"""
extern "C" __global__ void mix(float* out, const float* x, void* raw, int n, unsigned short k,
                               long long big, double alpha, float beta, bool flag, signed char c) {}
"""
FUNCTION = 0xF00D
_KEEP: list[object] = []


def _offsets(params):
    from cudagraphs.backends.cuda import _Packer

    return _Packer(params).offsets, _Packer(params).fmt


@pytest.fixture
def driver(backend):
    """A fake cuLaunchKernel recording its arguments and the bytes of each kernel parameter.

    (Bound after the backend started: the cuda backend binds the real entry points.)
    """
    cg.Device(0)
    before = fast.bound("cuLaunchKernel")
    seen: list[dict[str, object]] = []
    result = [0]
    sizes: list[int] = []

    def launch(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
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

    P, U = ctypes.c_void_p, ctypes.c_uint
    cb = ctypes.CFUNCTYPE(ctypes.c_int, P, U, U, U, U, U, U, U, P, P, P)(launch)
    _KEEP.append(cb)
    fast.bind("cuLaunchKernel", ctypes.cast(cb, P).value)
    yield seen, result, sizes
    fast.bind("cuLaunchKernel", before)


@pytest.fixture
def plan(backend, driver):
    """A Launcher of the test kernel, the calls it handed over, the fake driver's records."""
    seen, result, sizes = driver
    k = cg.Kernel(SOURCE, "mix")
    offsets, fmt = _offsets(k.params)
    sizes[:] = [p.dtype.itemsize for p in k.params]
    handed: list[tuple[tuple[object, ...], dict[str, object]]] = []

    def slow(*args, **kwargs):
        handed.append((args, kwargs))
        return "python path"

    launcher = fast.Launcher(slow, _kernel._fast_layout(k.params, offsets))
    dev = cg.Device(0)
    launcher.add(dev, FUNCTION, dev.stream)
    return SimpleNamespace(
        k=k, launcher=launcher, handed=handed, seen=seen, dev=dev, offsets=offsets, fmt=fmt, result=result
    )


def _args(dev, rng):
    out = cg.asarray(rng.standard_normal(16).astype(np.float32))
    x = cg.asarray(rng.standard_normal(16).astype(np.float32))
    raw = cg.empty(7, np.uint8)
    return [out, x, raw, 16, 65535, -(2**62), 0.25, 1.5, True, -128]


def _expected_bytes(k, args, dev, offsets, fmt):
    """What the Python path packs: its converters, then the backend's struct."""
    values = [conv(a, dev) for conv, a in zip(k._convert, args)]
    packed = fmt.pack(*values)
    return [packed[o : o + p.dtype.itemsize] for o, p in zip(offsets, k.params)]


def test_a_launch_packs_the_bytes_the_python_path_packs(plan):
    t = plan
    k, launcher, handed, seen, dev = t.k, t.launcher, t.handed, t.seen, t.dev
    rng = np.random.default_rng(0)
    for trial in range(5):
        args = _args(dev, rng)
        args[3], args[6], args[7] = (
            int(rng.integers(-(2**31), 2**31)),
            float(rng.normal()),
            int(rng.integers(-9, 9)),
        )
        args[8] = bool(trial % 2)
        assert launcher((3, 2), (32, 4, 2), *args, shared_mem=96) is None
        got = seen[-1]
        assert got["f"] == FUNCTION
        assert got["extra"] is None
        assert (got["grid"], got["block"], got["shared"]) == ((3, 2, 1), (32, 4, 2), 96)
        assert got["stream"] == dev.stream.handle
        assert got["bytes"] == _expected_bytes(k, args, dev, t.offsets, t.fmt)
    assert not handed
    assert launcher.counts() == (5, 0)


def test_pointers_given_as_none_ints_or_plain_subclasses_launch(plan):
    t = plan
    launcher, handed, seen, dev = t.launcher, t.handed, t.seen, t.dev
    args = _args(dev, np.random.default_rng(1))
    scalar = cg.DeviceScalar(np.float32(2.0)) if hasattr(cg, "DeviceScalar") else None
    for a in (None, 0, 2**64 - 1, args[0].ptr):
        launcher(1, 1, args[0], a, *args[2:])
        assert seen[-1]["bytes"][1] == struct.pack("<Q", 0 if a is None else a)
    if scalar is not None:
        launcher(1, 1, args[0], scalar, *args[2:])
        assert seen[-1]["bytes"][1] == struct.pack("<Q", scalar.ptr)
    assert not handed


def test_the_current_stream_and_a_given_stream_are_used(plan):
    t = plan
    launcher, handed, seen, dev = t.launcher, t.handed, t.seen, t.dev
    args = _args(dev, np.random.default_rng(2))
    s = dev.create_stream()
    with s:
        launcher(1, 1, *args)
    assert seen[-1]["stream"] == s.handle
    launcher(1, 1, *args, stream=s)
    assert seen[-1]["stream"] == s.handle
    launcher(1, 1, *args, stream=None)
    assert seen[-1]["stream"] == dev.stream.handle
    assert not handed
    s.close()


class _Checked(DeviceArray):
    """A subclass with its own check, as graph outputs have: launches must run it."""

    __slots__ = ()

    def _view_spec(self):
        raise RuntimeError("checked")


def _handed_cases(dev, args):
    bad_dtype = cg.asarray(np.zeros(16, np.float64))
    strided = cg.asarray(np.zeros(32, np.float32))[::2]
    closed = dev.create_stream()
    closed.close()
    checked = _Checked._wrap(args[0]._block, args[0].ptr, (16,), (4,), np.dtype(np.float32), 16)
    return {
        "too few arguments": ((1, 1, *args[:-1]), {}),
        "a float grid": ((1.0, 1, *args), {}),
        "a list block": ((1, [32], *args), {}),
        "an empty grid": ((0, 1, *args), {}),
        "too many threads": ((1, (32, 32, 2), *args), {}),
        "a grid out of range": (((1, 65536), 1, *args), {}),
        "device=": ((1, 1, *args), {"device": dev}),
        "an unknown keyword": ((1, 1, *args), {"stram": None}),
        "a negative shared_mem": ((1, 1, *args), {"shared_mem": -1}),
        "a float shared_mem": ((1, 1, *args), {"shared_mem": 1.0}),
        "a stream of another type": ((1, 1, *args), {"stream": dev.stream.handle}),
        "a closed stream": ((1, 1, *args), {"stream": closed}),
        "another dtype": ((1, 1, args[0], bad_dtype, *args[2:]), {}),
        "a strided view": ((1, 1, args[0], strided, *args[2:]), {}),
        "a subclass with its own check": ((1, 1, checked, *args[1:]), {}),
        "a numpy array": ((1, 1, args[0], np.zeros(16, np.float32), *args[2:]), {}),
        "a negative address": ((1, 1, args[0], -8, *args[2:]), {}),
        "an address over 64 bits": ((1, 1, args[0], 2**64, *args[2:]), {}),
        "an int out of int32": ((1, 1, *args[:3], 2**31, *args[4:]), {}),
        "a negative unsigned": ((1, 1, *args[:4], -1, *args[5:]), {}),
        "an unsigned over 16 bits": ((1, 1, *args[:4], 65536, *args[5:]), {}),
        "a bool for an int": ((1, 1, *args[:3], True, *args[4:]), {}),
        "a numpy int": ((1, 1, *args[:3], np.int32(3), *args[4:]), {}),
        "a float for an int": ((1, 1, *args[:3], 3.0, *args[4:]), {}),
        "a string for a double": ((1, 1, *args[:6], "0.5", *args[7:]), {}),
        "a float too big for float32": ((1, 1, *args[:7], 1e300, *args[8:]), {}),
        "an int too big for a double": ((1, 1, *args[:6], 10**400, *args[7:]), {}),
        "a None for a bool": ((1, 1, *args[:8], None, *args[9:]), {}),
        "an int out of int8": ((1, 1, *args[:9], 128), {}),
    }


def test_what_the_c_path_cannot_decide_goes_to_the_python_path_unchanged(plan):
    t = plan
    launcher, handed, seen, dev = t.launcher, t.handed, t.seen, t.dev
    args = _args(dev, np.random.default_rng(3))
    cases = _handed_cases(dev, args)
    for what, (a, kw) in cases.items():
        before = len(seen)
        assert launcher(*a, **kw) == "python path", what
        assert len(seen) == before, f"{what}: launched in C"
        got_args, got_kw = handed[-1]
        assert len(got_args) == len(a), what
        assert all(x is y for x, y in zip(got_args, a)), what
        assert got_kw == kw, what
    assert launcher.counts() == (0, len(cases))


def test_the_python_path_refuses_every_case_the_c_path_handed_over(plan, backend):
    """Those cases are errors in Kernel.launch (or launch through it), never silent launches in C."""
    t = plan
    k, dev = t.k, t.dev
    k.host = lambda *a: None  # (what sim runs for the cases that launch)
    args = _args(dev, np.random.default_rng(4))
    launchable = {"a list block", "device=", "a numpy int", "a None for a bool"}  # Python converts these
    for what, (a, kw) in _handed_cases(dev, args).items():
        if what not in launchable:
            with pytest.raises((TypeError, ValueError, OverflowError, RuntimeError)):
                _kernel.Kernel.launch(k, *a, **kw)


def test_a_driver_error_goes_to_the_python_path_which_reports_it(plan):
    t = plan
    launcher, handed, seen, dev = t.launcher, t.handed, t.seen, t.dev
    args = _args(dev, np.random.default_rng(5))
    t.result[0] = 1  # CUDA_ERROR_INVALID_VALUE
    assert launcher(1, 1, *args) == "python path"
    assert len(seen) == 1
    assert len(handed) == 1


def test_a_captured_stream_goes_to_the_python_path(plan):
    t = plan
    launcher, handed, seen, dev = t.launcher, t.handed, t.seen, t.dev
    args = _args(dev, np.random.default_rng(6))
    s = dev.create_stream()
    with cg.capture(stream=s):
        assert launcher(1, 1, *args, stream=s) == "python path"
        cg.ops.copy(args[1], args[0], stream=s)  # (a capture must record something: a copy, no kernel)
    assert not seen
    assert len(handed) == 1
    s.close()


def test_a_captured_launch_is_checked_in_c_and_recorded_by_the_python_path(plan):
    """Given ``record`` (Kernel.enqueue), it gets the values Kernel.launch's converters make."""
    t = plan
    recorded = []
    launcher = fast.Launcher(
        t.launcher, _kernel._fast_layout(t.k.params, t.offsets), lambda *a: recorded.append(a)
    )
    launcher.add(t.dev, FUNCTION, t.dev.stream)
    args = _args(t.dev, np.random.default_rng(8))
    args[6] = 3  # an int for a double: the converter makes it a float
    s = t.dev.create_stream()
    with cg.capture(stream=s):
        assert launcher((5, 2), 64, *args, stream=s, shared_mem=8) is None
        cg.ops.copy(args[1], args[0], stream=s)  # (a capture must record something: a copy, no kernel)
        args_bad = [*args[:3], 2**40, *args[4:]]
        assert launcher(1, 1, *args_bad, stream=s) == "python path"  # (through t.launcher: no device)
    assert not t.seen
    ((device, stream, grid, block, shared, values, given),) = recorded
    assert (device, stream, grid, block, shared) == (t.dev, s, (5, 2, 1), (64, 1, 1), 8)
    assert given == tuple(args)
    expected = tuple(conv(a, t.dev) for conv, a in zip(t.k._convert, args))
    assert values == expected
    assert [type(v) for v in values] == [type(v) for v in expected]
    assert launcher.counts() == (1, 1)
    s.close()


class _Abandon(Exception):
    """Ends a capture by the exception path (its partial graph is destroyed)."""


LOADED = object()  # stands for the backend's loaded kernel, named by KernelLaunch


def _recording_launcher(t, record):
    """A Launcher as Kernel._arm makes it, with ``loaded``: captured launches recorded in C."""
    launcher = fast.Launcher(
        MethodType(cg.Kernel.launch, t.k), _kernel._fast_layout(t.k.params, t.offsets), record
    )
    launcher.add(t.dev, FUNCTION, t.dev.stream, LOADED)
    return launcher


def test_a_captured_launch_is_recorded_in_c_as_the_python_path_records_it(plan):
    """The NodeRecord and the arrays kept: what Kernel.enqueue and Recording.record make."""
    t = plan
    launcher = _recording_launcher(t, lambda *a: pytest.fail(f"handed to the Python path: {a}"))
    args = _args(t.dev, np.random.default_rng(11))
    args[6] = 3  # an int for a double: the converter makes it a float
    s = t.dev.create_stream()
    t.k._issue[t.dev] = lambda raw, launch: None  # (the Python twin's work: queue nothing)
    t.dev.kernels[t.k] = LOADED
    try:
        with pytest.raises(_Abandon), cg.capture(stream=s):
            rec = s._recording
            args[0] = cg.empty(16, np.float32, stream=s)  # the capture's memory: not kept
            before = len(rec.keep), len(rec.nodes)
            assert launcher((5, 2), 64, *args, stream=s, shared_mem=8) is None
            c_keep, c_node = rec.keep[before[0] :], rec.nodes[before[1] :]
            middle = len(rec.keep), len(rec.nodes)
            cg.Kernel.launch(t.k, (5, 2), 64, *args, stream=s, shared_mem=8)  # the Python path
            py_keep, py_node = rec.keep[middle[0] :], rec.nodes[middle[1] :]
            raise _Abandon
    finally:
        del t.dev.kernels[t.k]
    assert len(t.seen) == 1
    got = t.seen[0]
    assert (got["f"], got["stream"], got["grid"], got["block"], got["shared"]) == (
        FUNCTION,
        s.handle,
        (5, 2, 1),
        (64, 1, 1),
        8,
    )
    assert got["bytes"] == _expected_bytes(t.k, args, t.dev, t.offsets, t.fmt)
    assert [id(o) for o in c_keep] == [id(o) for o in py_keep] == [id(args[1]), id(args[2])]
    assert c_node == py_node
    ((node,),) = (c_node,)
    assert type(node) is type(py_node[0])
    assert node.patch[0] is t.k
    assert type(node.patch[1]) is type(py_node[0].patch[1])
    assert [type(v) for v in node.patch[1].values] == [type(v) for v in py_node[0].patch[1].values]
    assert node.patch[1].views[:3] == (args[0]._view_spec(), args[1]._view_spec(), args[2]._view_spec())
    assert launcher.counts() == (1, 0)
    s.close()


def test_a_captured_launch_the_c_path_cannot_record_goes_to_the_python_path(plan):
    """Pending graph-memory frees, an invalid capture, a driver error: the Python path records."""
    t = plan
    recorded = []
    launcher = _recording_launcher(t, lambda *a: recorded.append(a))
    args = _args(t.dev, np.random.default_rng(12))
    s = t.dev.create_stream()
    with pytest.raises(_Abandon), cg.capture(stream=s):
        rec = s._recording
        rec.frees.append(0)  # a graph-memory block died: its free node comes first
        assert launcher(1, 1, *args, stream=s) is None
        rec.frees.clear()
        rec.invalid = "made invalid by the test"
        assert launcher(1, 1, *args, stream=s) is None
        rec.invalid = None
        t.result[0] = 1  # CUDA_ERROR_INVALID_VALUE: nothing queued, the Python path relaunches
        assert launcher(1, 1, *args, stream=s) is None
        t.result[0] = 0
        nodes = len(rec.nodes)
        raise _Abandon
    assert len(recorded) == 3
    assert nodes == 0
    assert len(t.seen) == 1  # only the refused launch reached the driver
    assert launcher.counts() == (3, 0)  # (checked in C, each given to `record`)
    s.close()


def test_issue_queues_a_recorded_launch_with_the_bytes_the_backend_packs(plan):
    """Launcher.issue is the work of a recorded launch: the backend's launch(), in C."""
    from cudagraphs.backends.base import KernelLaunch

    t = plan
    fallback = []
    launcher = fast.Launcher(
        print, _kernel._fast_layout(t.k.params, t.offsets), None, lambda *a: fallback.append(a)
    )
    args = _args(t.dev, np.random.default_rng(10))
    values = tuple(conv(a, t.dev) for conv, a in zip(t.k._convert, args))

    class Function:  # what KernelLaunch.function is on cuda: it has the CUfunction as .handle
        handle = FUNCTION

    launch = KernelLaunch(Function(), (7, 1, 1), (128, 2, 1), 16, values, ())
    assert launcher.issue(0x5150, launch) is None
    got = t.seen[-1]
    assert (got["f"], got["grid"], got["block"], got["shared"], got["stream"]) == (
        FUNCTION,
        (7, 1, 1),
        (128, 2, 1),
        16,
        0x5150,
    )
    assert got["bytes"] == _expected_bytes(t.k, args, t.dev, t.offsets, t.fmt)
    assert not fallback
    odd = [
        launch._replace(values=values[:-1]),  # a value short
        launch._replace(values=(*values[:3], "n", *values[4:])),  # not a number
        launch._replace(grid=(0, 1, 1)),
        launch._replace(shared_mem=-1),
        launch._replace(function=object()),  # no handle
    ]
    for bad in odd:
        launcher.issue(0x5150, bad)
        assert fallback[-1] == (0x5150, bad)
    t.result[0] = 2  # a driver error: the backend's launch raises it
    launcher.issue(0x5150, launch)
    assert fallback[-1] == (0x5150, launch)
    assert len(t.seen) == 2
    assert len(fallback) == len(odd) + 1
    with pytest.raises(TypeError, match="issue takes"):
        fast.Launcher(print, []).issue(1, launch)


@pytest.fixture
def node_set(backend):
    """A fake cuGraphExecKernelNodeSetParams recording the exec, node, struct and argument bytes."""
    cg.Device(0)
    before = fast.bound("cuGraphExecKernelNodeSetParams")
    seen, result, sizes = [], [0], []

    class Params(ctypes.Structure):  # CUDA_KERNEL_NODE_PARAMS_v2
        _fields_ = [("func", ctypes.c_void_p)] + [
            (f, ctypes.c_uint) for f in ["gx", "gy", "gz", "bx", "by", "bz", "shared"]
        ]
        _fields_ += [("params", ctypes.c_void_p), ("extra", ctypes.c_void_p)]

    def set_params(exec_, node, p):
        q = Params.from_address(p)
        slots = [ctypes.c_void_p.from_address(q.params + 8 * i).value for i in range(len(sizes))]
        seen.append(
            (exec_, node, q.func, (q.gx, q.gy, q.gz), (q.bx, q.by, q.bz), q.shared, q.extra,
             [ctypes.string_at(a, n) for a, n in zip(slots, sizes)])
        )  # fmt: skip
        return result[0]

    P = ctypes.c_void_p
    cb = ctypes.CFUNCTYPE(ctypes.c_int, P, P, P)(set_params)
    _KEEP.append(cb)
    fast.bind("cuGraphExecKernelNodeSetParams", ctypes.cast(cb, P).value)
    yield seen, result, sizes
    fast.bind("cuGraphExecKernelNodeSetParams", before)


def test_patch_kernels_moves_the_nodes_of_a_view_and_their_records(node_set, backend):
    """The repeat path of Graph.rebind: users() finds the nodes, patch_kernels() moves them."""
    from cudagraphs._recording import NodeRecord
    from cudagraphs.backends.base import ArrayArg, KernelLaunch

    seen, result, sizes = node_set
    k = cg.Kernel(SOURCE, "mix")
    offsets, fmt = _offsets(k.params)
    sizes[:] = [p.dtype.itemsize for p in k.params]
    kernel = SimpleNamespace(fast=fast.Launcher(print, _kernel._fast_layout(k.params, offsets)))
    dev = cg.Device(0)
    args = _args(dev, np.random.default_rng(11))
    values = [conv(a, dev) for conv, a in zip(k._convert, args)]
    old, other = args[0]._view_spec(), args[1]._view_spec()
    views = (old, other, args[2]._view_spec(), *[None] * 7)

    class Function:
        handle = FUNCTION

    def record(i, vs, vals):
        launch = KernelLaunch(Function(), (2, 1, 1), (64, 1, 1), 0, tuple(vals), vs)
        return NodeRecord(0x100 + i, "kernel", "mix", (), (kernel, launch), True)

    records = [
        record(0, views, values),
        NodeRecord(0x101, "memcpy", "", (other, old), None, True),
        record(2, (other, old, *views[2:]), [values[1], values[0], *values[2:]]),
        record(3, (other, other, *views[2:]), [values[1], values[1], *values[2:]]),
    ]
    assert fast.users(records, old) == [0, 1, 2]
    assert fast.users(records, old) == [i for i, r in enumerate(records) if old in _used(r)]
    new = ArrayArg(0xABC000, old.shape, old.strides, old.dtype)
    plain = SimpleNamespace(fast=None)  # a kernel without a C launch path: left to the caller
    records.append(record(4, views, values)._replace(patch=(plain, records[0].patch[1])))
    assert fast.patch_kernels(0x77, records, [0, 1, 2, 4], old, new, new.ptr) == [1, 4]
    assert [s[:2] for s in seen] == [(0x77, 0x100), (0x77, 0x102)]
    for got, r, swap in zip(seen, (records[0], records[2]), (False, True)):
        moved = [new.ptr, values[1]] if not swap else [values[1], new.ptr]
        want = [*moved, *values[2:]]
        assert got[2:7] == (FUNCTION, (2, 1, 1), (64, 1, 1), 0, None)
        assert got[7] == [fmt.pack(*want)[o : o + n] for o, n in zip(offsets, sizes)]
        assert type(r) is NodeRecord
        assert type(r.patch[1]) is KernelLaunch
        assert r.patch[1].values == tuple(want)
        assert r.patch[1].views[int(swap)] is new
        assert r.patch[0] is kernel
    assert fast.users(records, old) == [1, 4]  # (the copy and the plain kernel are the caller's)
    result[0] = 700  # the driver refuses the first: it and every later hit go back, records kept
    third = records[3]
    assert fast.patch_kernels(0x77, records, [3, 0, 1], other, new, 5) == [3, 0, 1]
    assert records[3] is third
    assert len(seen) == 3
    with pytest.raises(TypeError, match="not a node record"):
        fast.patch_kernels(0x77, [("not", "a", "record")], [0], old, new, 5)
    with pytest.raises(IndexError):
        fast.patch_kernels(0x77, records, [9], old, new, 5)


def _used(r):
    from cudagraphs._node_changes import _used

    return _used(r)


def test_ops_add_repeats_in_c_and_hands_everything_else_to_python(driver, backend):
    """ops.add's C path (fastcall.Elementwise): dense arrays of one shape, dtype, device; out given."""
    from cudagraphs._builtin_kernels import ARMED, BLOCK, builtin_kernel
    from cudagraphs._kernel import _fast_layout

    seen, _, sizes = driver
    if not isinstance(cg.ops.add, fast.Elementwise):
        pytest.skip("ops.add has no C path here")
    if backend != "sim":  # (the Python op's cases run kernels, which the fake driver would swallow)
        pytest.skip("the fake driver and real kernels: sim only (the GPU test below runs the real path)")
    dev = cg.Device(0)
    k = builtin_kernel("cg_add", np.dtype(np.float32))
    sizes[:] = [p.dtype.itemsize for p in k.params]
    offsets, fmt = _offsets(k.params)
    handed = []
    launcher = fast.Launcher(lambda *a, **kw: handed.append(a), _fast_layout(k.params, offsets))
    launcher.add(dev, FUNCTION, dev.stream)
    key = ("cg_add", np.dtype(np.float32), dev)
    before = ARMED.get(key)
    ARMED[key] = (launcher, 4)  # a grid of at most 4 blocks
    rng = np.random.default_rng(12)
    a0, b0 = rng.standard_normal(3000).astype(np.float32), rng.standard_normal(3000).astype(np.float32)
    a, b, out = cg.asarray(a0), cg.asarray(b0), cg.empty(3000, np.float32)
    try:
        assert cg.ops.add(a, b, out=out) is out
        assert cg.ops.add(a, b, out, stream=None) is out
        assert len(seen) == 2
        got = seen[-1]
        assert (got["f"], got["grid"], got["block"], got["stream"]) == (
            FUNCTION,
            (4, 1, 1),
            BLOCK,
            dev.stream.handle,
        )
        assert got["bytes"] == [
            fmt.pack(out.ptr, a.ptr, b.ptr, 3000)[o : o + n] for o, n in zip(offsets, sizes)
        ]
        small = cg.asarray(a0[:300]), cg.asarray(b0[:300]), cg.empty(300, np.float32)
        cg.ops.add(*small[:2], out=small[2])
        assert seen[-1]["grid"] == (2, 1, 1)  # ceil(300 / 256) blocks
        assert launcher.counts() == (3, 0)
        # anything else is the Python op's, which computes it (checked against numpy)
        strided = cg.asarray(np.zeros(6000, np.float32))[::2]
        cases = [
            ((a, b), {}),  # no out: a new array
            ((a, b), {"out": strided}),  # not dense
            ((a, b), {"out": out, "stream": dev.stream}),  # a stream given
            ((a, cg.asarray(b0[:2999])), {"out": out}),  # another shape: an error
            ((a, cg.asarray(b0.astype(np.float64))), {"out": out}),  # another dtype: an error
            ((a, b0), {"out": out}),  # not an array: an error
        ]
        for args, kw in cases:
            try:
                r = cg.ops.add(*args, **kw)
            except (TypeError, ValueError):
                continue
            np.testing.assert_allclose(r.get(), a0 + b0, rtol=1e-6)
        assert len(seen) == 3
        empty = cg.empty(0, np.float32)
        assert cg.ops.add(empty, empty, out=empty) is empty
        assert len(seen) == 3
    finally:
        if before is None:
            del ARMED[key]
        else:
            ARMED[key] = before


def test_same_nodes_finds_the_first_record_that_differs_and_counts_handles():
    from cudagraphs._recording import NodeRecord

    def rec(kind, name, handle=None):
        return NodeRecord(handle, kind, name, (), None, True)

    a = [rec("kernel", "k"), rec("memcpy", ""), rec("kernel", "j")]
    assert fast.same_nodes(a, list(a)) == (-1, 0)
    assert fast.same_nodes(a, [rec("kernel", "k"), rec("memcpy", "", 7), rec("kernel", "j", 9)]) == (-1, 2)
    assert fast.same_nodes(a, [rec("kernel", "k"), rec("memset", ""), rec("kernel", "x")]) == (1, 0)
    assert fast.same_nodes(a, [rec("kernel", "k"), rec("memcpy", ""), rec("kernel", "x")]) == (2, 0)
    assert fast.same_nodes(a, a[:2]) == (2, 0)  # shorter: differs where it ends
    assert fast.same_nodes(a[:1], a) == (1, 0)
    assert fast.same_nodes([], []) == (-1, 0)
    with pytest.raises(TypeError, match="two lists"):
        fast.same_nodes(a, tuple(a))
    with pytest.raises(TypeError, match="record 0"):
        fast.same_nodes(a, [("kernel",)])


def test_bad_layouts_and_calls_are_refused():
    with pytest.raises(TypeError, match="callable"):
        fast.Launcher(3, [])
    with pytest.raises(TypeError, match="callable"):
        fast.Launcher(print, [], 3)
    with pytest.raises(ValueError, match="no fast packing"):
        fast.Launcher(print, [("f", 2, 0, None)])
    with pytest.raises(ValueError, match="no fast packing"):
        fast.Launcher(print, [("i", 4, 2, None)])  # misaligned
    with pytest.raises(ValueError, match="at most 64"):
        fast.Launcher(print, [("i", 4, 4 * i, None) for i in range(65)])
    launcher = fast.Launcher(print, [])
    with pytest.raises(TypeError, match="add takes"):
        launcher.add(cg.Device(0), 1, "a stream")


def test_a_kernel_is_armed_unless_its_class_launches_its_own_way(backend):
    dev = cg.Device(0)

    class Logged(cg.Kernel):
        def launch(self, *args, **kwargs):
            self.calls = getattr(self, "calls", 0) + 1
            return super().launch(*args, **kwargs)

    plain, logged = cg.Kernel(SOURCE, "mix"), Logged(SOURCE, "mix")
    offsets = _offsets(plain.params)[0]
    for k in (plain, logged):
        k._arm(dev, FUNCTION, offsets)
    assert isinstance(plain.launch, fast.Launcher)
    assert plain.fast is plain.launch
    assert logged.fast is None
    assert "launch" not in vars(logged)


def test_layouts_leave_out_kernels_the_c_path_cannot_pack():
    k = cg.Kernel(
        'extern "C" __global__ void h(__half* p, __half v) {}', "h", signature=["float16*", "float16"]
    )
    assert _kernel._fast_layout(k.params, (0, 8)) is None
    k = cg.Kernel(SOURCE, "mix")
    layout = _kernel._fast_layout(k.params, _offsets(k.params)[0])
    assert [(kind, size) for kind, size, _, _ in layout] == [
        ("p", 8),
        ("p", 8),
        ("p", 8),
        ("i", 4),
        ("u", 2),
        ("i", 8),
        ("f", 8),
        ("f", 4),
        ("b", 1),
        ("i", 1),
    ]
    assert layout[0][3] == np.dtype(np.float32)
    assert layout[2][3] is None  # void*: any array


@pytest.mark.gpu
def test_on_the_gpu_kernels_launch_through_the_c_path(backend):
    if cg.backend() != "cuda":
        pytest.skip("needs the cuda backend")
    if not cg.Device(0).backend.fastcall:
        pytest.skip("fast calls are switched off")
    k = cg.Kernel(
        'extern "C" __global__ void axpb(float* y, const float* x, float a, int n)'
        "{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = a * x[i] + y[i]; }",
        "axpb",
    )
    rng = np.random.default_rng(7)
    x0, y0 = rng.standard_normal(1000).astype(np.float32), rng.standard_normal(1000).astype(np.float32)
    x, y = cg.asarray(x0), cg.asarray(y0)
    k.launch(4, 256, y, x, 2.0, 1000)  # the first launch compiles and arms it
    assert isinstance(k.launch, fast.Launcher)
    for _ in range(3):
        k.launch(4, 256, y, x, 2.0, 1000)
    fast_n, handed_n = k.launch.counts()
    assert fast_n == 3
    assert handed_n == 0
    np.testing.assert_allclose(y.get(), y0 + 8 * x0, rtol=1e-5, atol=1e-5)
    with pytest.raises(TypeError, match="expects float32 data"):
        k.launch(4, 256, y, cg.asarray(x0.astype(np.float64)), 2.0, 1000)
    with pytest.raises(ValueError, match="does not fit in int32"):
        k.launch(4, 256, y, x, 2.0, 2**31)
    np.testing.assert_allclose(y.get(), y0 + 8 * x0, rtol=1e-5, atol=1e-5)  # nothing launched
    with cg.capture() as g:  # checked in C, recorded by Kernel.enqueue
        k.launch(4, 256, y, x, 2.0, 1000)
    assert k.launch.counts() == (4, 2)  # (the two refused launches went to the Python path)
    np.testing.assert_allclose(y.get(), y0 + 8 * x0, rtol=1e-5, atol=1e-5)  # captured, not run
    g.replay()
    g.replay()
    np.testing.assert_allclose(y.get(), y0 + 12 * x0, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_on_the_gpu_ops_add_repeats_through_the_c_path(backend):
    if cg.backend() != "cuda" or not cg.Device(0).backend.fastcall:
        pytest.skip("needs the cuda backend with fast calls")
    from cudagraphs._builtin_kernels import builtin_kernel

    rng = np.random.default_rng(9)
    a0, b0 = rng.standard_normal(3000), rng.standard_normal(3000)
    a, b, out = cg.asarray(a0), cg.asarray(b0), cg.full(3000, np.nan)
    cg.ops.add(a, b, out=out)  # the first: compiles, arms
    launcher = builtin_kernel("cg_add", np.dtype(np.float64)).fast
    before = launcher.counts()
    for _ in range(3):
        cg.ops.add(out, b, out=out)
    assert launcher.counts()[0] == before[0] + 3
    np.testing.assert_allclose(out.get(), a0 + 4 * b0)
    strided = cg.asarray(np.zeros(6000))[::2]  # not dense: the general path, its strided kernel
    cg.ops.add(a, b, out=strided)
    np.testing.assert_allclose(strided.get(), a0 + b0)
    with pytest.raises((TypeError, ValueError)):
        cg.ops.add(a, cg.asarray(b0.astype(np.float32)), out=out)
    np.testing.assert_allclose(out.get(), a0 + 4 * b0)


# found in review: what another thread (or Python code run meanwhile) may change -----------------
def test_patch_kernels_keeps_the_record_another_thread_put_meanwhile(node_set, backend):
    from cudagraphs._recording import NodeRecord
    from cudagraphs.backends.base import ArrayArg, KernelLaunch

    kernel = SimpleNamespace(fast=fast.Launcher(print, [("p", 8, 0, None)]))
    key = ArrayArg(int("4096"), (4,), (4,), np.dtype(np.float32))
    new = ArrayArg(int("8192"), (4,), (4,), np.dtype(np.float32))
    function = SimpleNamespace(handle=FUNCTION)
    launch = KernelLaunch(function, (1, 1, 1), (1, 1, 1), 0, (int("4096"),), (key,))
    records = [NodeRecord(int("77"), "kernel", "k", (), (kernel, launch), True)]
    theirs = records[0]._replace(name="theirs")

    def replaced_meanwhile(exec_, node, p):
        records[0] = theirs
        return 0

    cb = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)(replaced_meanwhile)
    _KEEP.append(cb)
    fast.bind("cuGraphExecKernelNodeSetParams", ctypes.cast(cb, ctypes.c_void_p).value)
    assert fast.patch_kernels(1, records, [0], key, new, new.ptr) == []
    assert records == [theirs]

    def cleared_meanwhile(exec_, node, p):
        records.clear()
        return 0

    cb = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)(cleared_meanwhile)
    _KEEP.append(cb)
    fast.bind("cuGraphExecKernelNodeSetParams", ctypes.cast(cb, ctypes.c_void_p).value)
    records[:] = [NodeRecord(int("77"), "kernel", "k", (), (kernel, launch), True)]
    assert fast.patch_kernels(1, records, [0], key, new, new.ptr) == []
    assert records == []
    # what it cannot patch for sure goes back to the caller, with every later hit
    records[:] = [
        NodeRecord(int("77"), "kernel", "k", (), (kernel, launch._replace(values=(1, 2))), True),
        NodeRecord(int("78"), "kernel", "k", (), (kernel, launch), True),
    ]
    assert fast.patch_kernels(1, records, [0, 1], key, new, new.ptr) == [0, 1]
    fast.bind("cuGraphExecKernelNodeSetParams", 0)
    assert fast.patch_kernels(1, records, [1], key, new, new.ptr) == [1]


def test_patch_kernels_in_chunks_keeps_the_order_of_what_it_leaves(node_set, backend):
    """A refusal in a later chunk leaves that hit and every later one, after those left before.

    Nodes are set in chunks, the GIL released once per chunk.
    """
    from cudagraphs._recording import NodeRecord
    from cudagraphs.backends.base import ArrayArg, KernelLaunch

    kernel = SimpleNamespace(fast=fast.Launcher(print, [("p", 8, 0, None)]))
    plain = SimpleNamespace(fast=None)
    key = ArrayArg(int("4096"), (4,), (4,), np.dtype(np.float32))
    new = ArrayArg(int("8192"), (4,), (4,), np.dtype(np.float32))
    launch = KernelLaunch(SimpleNamespace(handle=FUNCTION), (1, 1, 1), (1, 1, 1), 0, (int("4096"),), (key,))
    records = [
        NodeRecord(1000 + i, "kernel", "k", (), (plain if i == 70 else kernel, launch), True)
        for i in range(150)
    ]
    old = list(records)
    seen: list[int] = []

    def refuse_100(exec_, node, p):
        seen.append(node)
        return 700 if node == 1100 else 0

    cb = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)(refuse_100)
    _KEEP.append(cb)
    fast.bind("cuGraphExecKernelNodeSetParams", ctypes.cast(cb, ctypes.c_void_p).value)
    assert fast.patch_kernels(1, records, list(range(150)), key, new, new.ptr) == [70, *range(100, 150)]
    assert seen == [1000 + i for i in range(101) if i != 70]  # (none after the refusal)
    for i, (r, o) in enumerate(zip(records, old)):
        moved = i < 100 and i != 70
        assert (r is o) != moved
        assert r.patch[1].values == ((int("8192"),) if moved else (int("4096"),))
        assert r.patch[1].views[0] is (new if moved else key)


def _as(cls, a):
    """``a``'s fields in an instance of ``cls``, a subclass of DeviceArray (whatever it overrides)."""
    b = DeviceArray.__new__(cls)
    for name in DeviceArray.__slots__:
        if name != "__weakref__":
            DeviceArray.__dict__[name].__set__(b, getattr(a, name))
    return b


def test_a_class_changed_after_its_first_launch_is_read_again(plan):
    t = plan

    class Sub(DeviceArray):
        __slots__ = ()

    args = _args(t.dev, np.random.default_rng(13))
    a = _as(Sub, cg.asarray(np.zeros(16, np.float32)))
    t.launcher(1, 1, a, *args[1:])
    assert not t.handed
    Sub._view_spec = lambda self: pytest.fail("not to be called by C")  # a check of its own, added later
    assert t.launcher(1, 1, a, *args[1:]) == "python path"
    assert len(t.handed) == 1
    for name in ("__getattribute__", "__getattr__", "_block"):
        own = lambda self, n: object.__getattribute__(self, n)  # noqa: E731  (a method of its own)
        other = type("Other", (DeviceArray,), {"__slots__": (), name: own})
        b = _as(other, cg.asarray(np.zeros(16, np.float32)))
        assert t.launcher(1, 1, b, *args[1:]) == "python path", name


def test_a_malformed_armed_plan_goes_to_the_python_op(plan):
    t = plan
    a, b, out = (cg.asarray(np.zeros(4, np.float32)) for _ in range(3))

    def op(*args, **kwargs):
        return "python op"

    for bad in ((t.launcher,), "plan", (t.launcher, "cap")):
        e = fast.Elementwise(op, "k", {("k", a.dtype, t.dev): bad}, (64, 1, 1), 2)
        assert e(a, b, out) == "python op"
    with pytest.raises(TypeError, match="positional"):
        fast.Elementwise(op, "k", {}, (64, 1, 1), inputs=2)
    with pytest.raises(TypeError, match="positional"):
        fast.Launcher(print, [], record=print)


def test_an_interrupt_in_python_code_the_c_path_runs_is_not_swallowed(plan):
    """A KeyboardInterrupt raised by code the C path calls propagates; an error hands over."""
    t = plan
    args = _args(t.dev, np.random.default_rng(14))
    s = t.dev.create_stream()

    class Alive:
        def __init__(self, exc):
            self.exc = exc

        @property
        def alive(self):
            raise self.exc

    real = s._finalizer
    try:
        s._finalizer = Alive(KeyboardInterrupt())
        with pytest.raises(KeyboardInterrupt):
            t.launcher(1, 1, *args, stream=s)
        s._finalizer = Alive(RuntimeError("odd"))
        assert t.launcher(1, 1, *args, stream=s) == "python path"
    finally:
        s._finalizer = real
    assert not t.seen
    s.close()


def test_patched_records_keep_their_type_named_tuple_or_not(node_set, backend):
    """Records are rebuilt as their own type: NamedTuples directly, other tuple types through __new__."""
    from cudagraphs._recording import NodeRecord
    from cudagraphs.backends.base import ArrayArg, KernelLaunch

    class Loose(tuple):  # a tuple type with a __dict__ of its own
        pass

    kernel = SimpleNamespace(fast=fast.Launcher(print, [("p", 8, 0, None)]))
    key = ArrayArg(4096, (4,), (4,), np.dtype(np.float32))
    new = ArrayArg(8192, (4,), (4,), np.dtype(np.float32))
    function = SimpleNamespace(handle=FUNCTION)
    for record_type in (NodeRecord, Loose):
        launch = KernelLaunch(function, (1, 1, 1), (1, 1, 1), 0, (4096,), (key,))
        items = (77, "kernel", "k", (), (kernel, launch), True)
        records = [record_type(items) if record_type is Loose else NodeRecord(*items)]
        assert fast.patch_kernels(1, records, [0], key, new, new.ptr) == []
        (r,) = records
        assert type(r) is record_type
        assert r[:4] == items[:4]
        assert r[5] is True
        assert type(r[4][1]) is KernelLaunch
        assert r[4][1] == launch._replace(values=(8192,), views=(new,))


def test_unpatchable_finds_the_first_record_rebind_must_refuse():
    from cudagraphs import _node_changes
    from cudagraphs._recording import NodeRecord
    from cudagraphs.backends.base import Copy

    def rec(kind, patch):
        return NodeRecord(None, kind, "", (), patch, True)

    copy = Copy(1, 2, 3, "dtod")
    records = [
        rec("kernel", ("k", "launch")),
        rec("memcpy", copy),
        rec("memcpy", ("not", "a copy")),
        rec("memset", None),
    ]
    for hits, want in (([0, 1], -1), ([0, 1, 2], 2), ([3, 0], 3), ([], -1), ([1, 3, 2], 3)):
        assert fast.unpatchable(records, hits, Copy) == want
        assert _node_changes._unpatchable(records, hits) == want  # (the Python twin, where C is not built)
    with pytest.raises(IndexError):
        fast.unpatchable(records, [7], Copy)
    with pytest.raises(TypeError, match="not a node record"):
        fast.unpatchable([("x",)], [0], Copy)
