"""A graphed callable's repeat call, made in C (``_fastcall.graphed_method``).

After a call C can repeat (positional dense inputs the graph copies itself,
no buckets, outputs not copied), the callable is armed; a call with the same
input types, shapes, dtypes and devices on the same stream is then made in
C. These tests count the calls made there, check every result against numpy
(outputs poisoned first), and run each sequence through the Python call too
(``_graphed_callable.PYTHON_CALL``), which must give the same results, counts and
held inputs. Every test runs on each backend in CUDAGRAPHS_TEST_BACKENDS.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from conftest import call_while_held, compiled_part_or_skip, random_array

import cudagraphs as cg
from cudagraphs import _graphed_callable

fast = compiled_part_or_skip()


def double(u: cg.DeviceArray) -> cg.DeviceArray:
    return cg.ops.scale(2.0, u)


def pair(u: cg.DeviceArray, v: cg.DeviceArray) -> tuple[cg.DeviceArray, cg.DeviceArray]:
    return cg.ops.add(u, v), cg.ops.scale(3.0, v)


def upload(dev: cg.Device, host: np.ndarray) -> cg.DeviceArray:
    a = cg.empty(host.shape, host.dtype, device=dev)
    a.set(host)
    return a


class Counted:
    """Calls of ``f`` and how many of them C made."""

    def __init__(self, f: Callable[..., Any]) -> None:
        self.f = f
        self.made_in_c = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        before = fast.graphed_calls()
        out = self.f(*args, **kwargs)
        self.made_in_c += fast.graphed_calls() - before
        return out


def test_repeat_calls_are_made_in_c_and_match_numpy(dev: cg.Device, rng: np.random.Generator) -> None:
    f = Counted(cg.graphed(double, device=dev))
    a = cg.empty((64, 3), "float32", device=dev)
    out = None
    for k in range(5):
        h = random_array(rng, (64, 3), "float32")
        if out is not None:
            out.set(np.full((64, 3), np.nan, np.float32))  # poisoned: the graph must write it
        a.set(h)
        out = f(a)
        assert type(out) is cg.GraphOutput
        np.testing.assert_allclose(out.get(), 2 * h, rtol=1e-6)
        assert f.made_in_c == k  # the first call captures, every later one is made in C
    stats = f.f.stats()
    assert (stats["calls"], stats["hits"], stats["misses"]) == (5, 4, 1)
    assert next(iter(f.f.graphs.values())).replays == 5


def test_a_moved_input_is_pointed_at_in_c(dev: cg.Device, rng: np.random.Generator) -> None:
    f = Counted(cg.graphed(double, device=dev))
    hosts = [random_array(rng, (32,), "float32") for _ in range(3)]
    arrays = [upload(dev, h) for h in hosts]
    for k in range(7):
        j = k % 3
        out = f(arrays[j])
        np.testing.assert_allclose(out.get(), 2 * hosts[j], rtol=1e-6)
    assert f.made_in_c == 6
    entry = next(iter(f.f._entries.values()))
    assert entry.sources[0] == arrays[0].ptr
    assert entry.held[0] is arrays[0]


def test_earlier_outputs_go_stale_after_a_call_made_in_c(dev: cg.Device, rng: np.random.Generator) -> None:
    f = Counted(cg.graphed(double, device=dev))
    h = random_array(rng, (16,), "float32")
    a = upload(dev, h)
    first = f(a)
    second = f(a)
    assert f.made_in_c == 1
    with pytest.raises(cg.StaleOutputError, match="call 1"):
        first.get()
    np.testing.assert_allclose(second.get(), 2 * h, rtol=1e-6)
    assert "valid until the next call" in repr(second)


def test_tuple_outputs_and_two_inputs(dev: cg.Device, rng: np.random.Generator) -> None:
    f = Counted(cg.graphed(pair, device=dev))
    for _ in range(3):
        hu, hv = random_array(rng, (8, 5), "float32"), random_array(rng, (8, 5), "float32")
        s, t = f(upload(dev, hu), upload(dev, hv))
        np.testing.assert_allclose(s.get(), hu + hv, rtol=1e-6)
        np.testing.assert_allclose(t.get(), 3 * hv, rtol=1e-6)
    assert f.made_in_c == 2


def test_the_current_and_a_fixed_stream(dev: cg.Device, rng: np.random.Generator) -> None:
    h = random_array(rng, (16,), "float32")
    a = upload(dev, h)
    s = dev.create_stream()
    s.wait(dev.stream)
    f = Counted(cg.graphed(double, device=dev))
    with s:
        f(a)
        out = f(a)  # s is the current stream both times: made in C
    assert f.made_in_c == 1
    s.synchronize()
    np.testing.assert_allclose(out.get(stream=s), 2 * h, rtol=1e-6)
    out = f(a)  # another stream than the last call's: the Python call waits for s first
    assert f.made_in_c == 1
    np.testing.assert_allclose(out.get(), 2 * h, rtol=1e-6)
    fixed = Counted(cg.graphed(double, device=dev, stream=s))
    fixed(a)
    out = fixed(a)
    assert fixed.made_in_c == 1
    np.testing.assert_allclose(out.get(stream=s), 2 * h, rtol=1e-6)


def test_calls_c_does_not_make(dev: cg.Device, rng: np.random.Generator) -> None:
    h = random_array(rng, (8, 4), "float32")
    a = upload(dev, h)
    cases: dict[str, tuple[Any, Callable[[Any], Any], np.ndarray]] = {
        "keyword": (cg.graphed(lambda u: double(u), device=dev), lambda f: f(u=a), 2 * h),
        "strided": (cg.graphed(double, device=dev), lambda f: f(a[:, 1]), 2 * h[:, 1]),
        "buckets": (cg.graphed(double, device=dev, buckets=[8]), lambda f: f(a), 2 * h),
        "copied outputs": (cg.graphed(double, device=dev, copy_outputs=True), lambda f: f(a), 2 * h),
        "dict output": (cg.graphed(lambda u: {"y": double(u)}, device=dev), lambda f: f(a)["y"], 2 * h),
        "static argument": (
            cg.graphed(lambda u, k: cg.ops.scale(k, u), device=dev),
            lambda f: f(a, 2.0),
            2 * h,
        ),
    }
    for name, (f, call, want) in cases.items():
        counted = Counted(f)
        for _ in range(3):
            got = call(counted)
            np.testing.assert_allclose(got.get(), want, rtol=1e-6, err_msg=name)
        assert counted.made_in_c == 0, name
    f = Counted(cg.graphed(double, device=dev))
    out = f(a)
    again = f(out)  # a GraphOutput input (not a plain array): the Python call checks it
    assert f.made_in_c == 0
    np.testing.assert_allclose(again.get(), 4 * h, rtol=1e-6)
    other = upload(dev, random_array(rng, (4, 4), "float32"))
    f(a)
    f(other)  # a new shape: captured by the Python call, which arms for it
    f(a)  # the old shape again: not what is armed
    assert f.made_in_c == 0
    f(a)
    assert f.made_in_c == 1


def test_a_call_while_another_thread_holds_the_lock_waits(dev: cg.Device, rng: np.random.Generator) -> None:
    h = random_array(rng, (16,), "float32")
    a = upload(dev, h)
    f = Counted(cg.graphed(double, device=dev))
    f(a)
    got = call_while_held(f.f._lock, lambda: f(a).get())  # the Python call, which waits
    np.testing.assert_allclose(got, 2 * h, rtol=1e-6)
    assert f.made_in_c == 0


def test_close_and_drop_disarm(dev: cg.Device, rng: np.random.Generator) -> None:
    h = random_array(rng, (16,), "float32")
    a = upload(dev, h)
    f = Counted(cg.graphed(double, device=dev))
    f(a)
    f(a)
    f.f.close()
    np.testing.assert_allclose(f(a).get(), 2 * h, rtol=1e-6)  # captured again, not a closed graph
    f.f._drop(set(f.f._entries))  # (what GraphModule.refresh does to graphs it cannot repoint)
    np.testing.assert_allclose(f(a).get(), 2 * h, rtol=1e-6)
    assert f.f.stats()["misses"] == 3
    assert f.made_in_c == 1


def test_the_last_input_stays_alive_for_a_direct_replay(dev: cg.Device, rng: np.random.Generator) -> None:
    f = Counted(cg.graphed(double, device=dev))
    f(upload(dev, random_array(rng, (4096,), "float32")))
    h = random_array(rng, (4096,), "float32")
    out = f(upload(dev, h))  # made in C; the temporary input is referenced only by the callable
    assert f.made_in_c == 1
    gc.collect()
    for _ in range(3):  # blocks freed meanwhile would be reused by these
        cg.empty((4096,), "float32", device=dev).set(np.zeros(4096, np.float32))
    graph = next(iter(f.f.graphs.values()))
    graph.replay(dev.stream)
    np.testing.assert_allclose(out.get(), 2 * h, rtol=1e-6)


def test_an_error_in_a_call_made_in_c_is_the_python_calls(dev: cg.Device, rng: np.random.Generator) -> None:
    a = upload(dev, random_array(rng, (16,), "float32"))
    errors = []
    for call in (None, _graphed_callable.PYTHON_CALL):
        f = cg.graphed(double, device=dev)
        f(a)
        next(iter(f.graphs.values())).close()  # the user closed the graph under the callable
        with pytest.raises(RuntimeError) as info:
            f(a) if call is None else call(f, a)
        errors.append(str(info.value))
        assert f._hot is None  # a failed call disarms (the next one goes through Python)
        assert f._lock.acquire(False)  # the lock is free again
        f._lock.release()
    assert errors[0] == errors[1]
    assert "closed" in errors[0]


def test_c_and_python_calls_agree(dev: cg.Device, rng: np.random.Generator) -> None:
    hosts = [random_array(rng, (8, 6), "float32") for _ in range(3)] + [random_array(rng, (2, 6), "float32")]
    s = dev.create_stream()
    s.wait(dev.stream)
    runs = []
    for call in (None, _graphed_callable.PYTHON_CALL):
        f = cg.graphed(pair, device=dev)
        arrays = [upload(dev, h) for h in hosts]
        got = []
        plan = [(0, 1, None), (0, 1, None), (1, 2, None), (2, 0, s), (2, 0, s), (3, 3, None), (0, 1, None)]
        for i, j, stream in plan:
            if stream is not None:
                with stream:
                    out = f(arrays[i], arrays[j]) if call is None else call(f, arrays[i], arrays[j])
                    got.append([o.get(stream=stream) for o in out])
            else:
                out = f(arrays[i], arrays[j]) if call is None else call(f, arrays[i], arrays[j])
                got.append([o.get() for o in out])
            want = [hosts[i] + hosts[j], 3 * hosts[j]]
            for g, w in zip(got[-1], want):
                np.testing.assert_allclose(g, w, rtol=1e-6)
        entries = list(f._entries.values())
        held = [[arrays.index(x) for x in e.held.values()] for e in entries]
        replays = [e.graph.replays for e in entries if e.graph is not None]
        runs.append((got, f.stats(), held, replays, f._lease.calls))
    (got_c, *rest_c), (got_py, *rest_py) = runs
    for a, b in zip(got_c, got_py):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    assert rest_c == rest_py


# two kinds of device memory ---------------------------------------------------------------
class Plain:
    """Another library's array in memory outside the stream-ordered pool (as PyTorch's)."""

    def __init__(self, dev: cg.Device, host: np.ndarray) -> None:
        self.dev, self.shape, self.dtype = dev, host.shape, host.dtype
        self.ptr = dev.backend.mem_alloc(dev.index, host.nbytes, None)
        view = cg._array.foreign_view(self, dev)
        assert view is not None
        view.set(host)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False), "version": 3}

    def free(self) -> None:
        self.dev.synchronize()
        self.dev.backend.mem_free(self.ptr, None)


def captured_copy(dev: cg.Device, dst: int, src: int, nbytes: int) -> tuple[cg.Graph, Any]:
    """A graph of one device copy (recorded by cudagraphs), and the copy node's handle."""
    from cudagraphs._node_changes import _records
    from cudagraphs._recording import Work, submit
    from cudagraphs.backends.base import Copy

    copy = Copy(dst, src, nbytes, "dtod")
    with cg.capture(device=dev) as g:
        submit(dev.current_stream(), Work("memcpy", dev.backend.memcpy, copy, patch=copy))
    return g, _records(g)[0].handle


def test_the_driver_moves_a_copy_node_only_within_one_kind_of_memory(
    dev: cg.Device, rng: np.random.Generator
) -> None:
    """Measured on an H100 (CUDA 13): pool memory and cuMemAlloc memory cannot replace each other."""
    from cudagraphs.backends.base import Copy

    h = random_array(rng, (256,), "float32")
    dst = cg.empty(256, "float32", device=dev)
    pool = [upload(dev, h), upload(dev, 2 * h)]
    plain = [Plain(dev, 3 * h), Plain(dev, 4 * h)]
    backend, n = dev.backend, h.nbytes
    try:
        for first, other, wrong in (
            (pool[0], pool[1].ptr, plain[0].ptr),
            (plain[0], plain[1].ptr, pool[0].ptr),
        ):
            src = first.ptr
            g, node = captured_copy(dev, dst.ptr, src, n)
            backend.graph_update(g._exec, node, Copy(dst.ptr, other, n, "dtod"))  # same kind: moves
            with pytest.raises(cg.CudaError, match="CUDA_ERROR_INVALID_VALUE"):
                backend.graph_update(g._exec, node, Copy(dst.ptr, wrong, n, "dtod"))
            dst.set(np.full(256, np.nan, np.float32))
            g.replay()
            want = 2 * h if other == pool[1].ptr else 4 * h
            np.testing.assert_array_equal(dst.get(), want)  # the failed move changed nothing
            backend.graph_update(g._exec, node, False)  # switched off: the replay copies nothing
            dst.set(np.zeros(256, np.float32))
            g.replay()
            np.testing.assert_array_equal(dst.get(), np.zeros(256, np.float32))
            backend.graph_update(g._exec, node, True)
            g.replay()
            np.testing.assert_array_equal(dst.get(), want)
            g.close()
    finally:
        for p in plain:
            p.free()


def test_an_input_of_the_other_kind_of_memory_is_copied_eagerly(
    dev: cg.Device, rng: np.random.Generator
) -> None:
    hosts = [random_array(rng, (128,), "float32") for _ in range(4)]
    for plain_first in (True, False):
        f = Counted(cg.graphed(double, device=dev))
        plain = [Plain(dev, hosts[0]), Plain(dev, hosts[1])]
        pool = [upload(dev, hosts[2]), upload(dev, hosts[3])]
        # (pool first: the plain input as a cudagraphs array, which the C call takes)
        as_array = cg._array.foreign_view(plain[0], dev)
        order = (
            [plain[0], pool[0], plain[1], pool[1]] if plain_first else [pool[0], pool[1], as_array, pool[0]]
        )
        want = (
            [hosts[0], hosts[2], hosts[1], hosts[3]]
            if plain_first
            else [hosts[2], hosts[3], hosts[0], hosts[2]]
        )
        try:
            for k, (x, w) in enumerate(zip(order, want)):
                out = f(x)
                np.testing.assert_allclose(out.get(), 2 * w, rtol=1e-6, err_msg=f"call {k}")
            entry = next(iter(f.f._entries.values()))
            assert entry.copies == {}  # the copy node is off: the input is copied by each call
            assert f.f._hot is None
            graph = next(iter(f.f.graphs.values()))
            out.set(np.zeros(128, np.float32))
            graph.replay(dev.stream)  # a direct replay reads what the last call copied in
            np.testing.assert_allclose(out.get(), 2 * want[-1], rtol=1e-6)
            # pool first: the second call was made in C, the third (plain) too, switching the node off
            assert f.made_in_c == (0 if plain_first else 2)
        finally:
            f.f.close()
            for p in plain:
                p.free()


def armed_on_own_stream(dev: cg.Device, a: cg.DeviceArray) -> tuple[cg.Stream, Counted]:
    """``double`` graphed on a stream of its own and called twice with ``a``: its next call is made in C."""
    s = dev.create_stream()
    s.wait(dev.stream)
    f = Counted(cg.graphed(double, device=dev, stream=s))
    f(a)
    f(a)
    assert f.made_in_c == 1
    return s, f


def test_a_closed_stream_is_refused_as_the_python_call_refuses_it(
    dev: cg.Device, rng: np.random.Generator
) -> None:
    a = upload(dev, random_array(rng, (16,), "float32"))
    errors = []
    for call in (None, _graphed_callable.PYTHON_CALL):
        s, f = armed_on_own_stream(dev, a)
        s.synchronize()
        s.close()
        with pytest.raises(ValueError, match="closed") as info:
            f(a) if call is None else call(f.f, a)
        errors.append(str(info.value))
    assert errors[0] == errors[1]


def test_a_stream_closed_while_a_moved_input_is_pointed_at_is_not_launched_on(
    dev: cg.Device, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stream is read again after Python code ran inside the C call (``_moved``)."""
    hosts = [random_array(rng, (16,), "float32") for _ in range(2)]
    a, b = (upload(dev, h) for h in hosts)
    s, f = armed_on_own_stream(dev, a)
    graph = next(iter(f.f.graphs.values()))
    replays = graph.replays
    moved = f.f._moved

    def moved_then_closed(*args: Any) -> Any:
        out = moved(*args)
        s.synchronize()
        s.close()  # (as a callback run by Python code here could)
        return out

    monkeypatch.setattr(f.f, "_moved", moved_then_closed)
    with pytest.raises(ValueError, match="closed"):
        f(b)  # (b moved: _moved runs, then the launch is refused as Python refuses it)
    assert graph.replays == replays  # nothing queued on the closed stream
    assert f.f._hot is None
