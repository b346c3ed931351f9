"""A graphed callable's repeat call (``GraphedCallable._repeat``), compiled and as plain Python.

A call with the key of the call before it (the same argument types,
shapes, dtypes and devices, on the same stream) reuses what that call
decided (its graph, its stream, the inputs it described) and then stages,
replays and wraps its outputs as every call does. These tests count the
calls made that way (``_repeats``), check every result against numpy
(outputs poisoned first), and run each sequence through the whole call too
(the callable disarmed before each call), which must give the same results,
counts and held inputs. They run in every mode that ships: compiled, and
plain Python (``scripts/plain_tree.py``), on each backend in
CUDAGRAPHS_TEST_BACKENDS.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from conftest import call_while_held, random_array

import cudagraphs as cg
from cudagraphs import GraphedCallable


def double(u: cg.DeviceArray) -> cg.DeviceArray:
    return cg.ops.scale(2.0, u)


def pair(u: cg.DeviceArray, v: cg.DeviceArray) -> tuple[cg.DeviceArray, cg.DeviceArray]:
    return cg.ops.add(u, v), cg.ops.scale(3.0, v)


def upload(dev: cg.Device, host: np.ndarray) -> cg.DeviceArray:
    a = cg.empty(host.shape, host.dtype, device=dev)
    a.set(host)
    return a


def whole(f: GraphedCallable) -> Callable[..., Any]:
    """``f`` called as a call that nothing armed makes it (the reference for the repeat call)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        f._armed = None
        return f(*args, **kwargs)

    return call


def poison(out: Any) -> None:
    """Fill a valid output with NaN (or its dtype's max): the next replay must write all of it."""
    h = out.get()
    out.set(np.full(h.shape, np.nan if h.dtype.kind == "f" else np.iinfo(h.dtype).max, h.dtype))


def test_repeat_calls_match_numpy_and_count_as_calls(dev: cg.Device, rng: np.random.Generator) -> None:
    f = cg.graphed(double, device=dev)
    a = cg.empty((64, 3), "float32", device=dev)
    out = None
    for k in range(5):
        h = random_array(rng, (64, 3), "float32")
        if out is not None:
            poison(out)
        a.set(h)
        out = f(a)
        assert type(out) is cg.GraphOutput
        np.testing.assert_allclose(out.get(), 2 * h, rtol=1e-6)
        assert f._repeats == k  # the first call captures (and arms), every later one repeats
    stats = f.stats()
    assert (stats["calls"], stats["hits"], stats["misses"]) == (5, 4, 1)
    assert next(iter(f.graphs.values())).replays == 5


def test_a_moved_input_is_pointed_at(dev: cg.Device, rng: np.random.Generator) -> None:
    hosts = [random_array(rng, (32,), "float32") for _ in range(3)]
    runs = []
    for made in ("repeated", "whole"):
        f = cg.graphed(double, device=dev)
        call = f if made == "repeated" else whole(f)
        arrays = [upload(dev, h) for h in hosts]
        for k in range(7):
            j = k % 3
            out = call(arrays[j])
            np.testing.assert_allclose(out.get(), 2 * hosts[j], rtol=1e-6)
        assert f._repeats == (6 if made == "repeated" else 0)
        entry = next(iter(f._entries.values()))
        assert entry.sources[0] == arrays[0].ptr  # the copy node reads the last call's input
        assert entry.held[0] is arrays[0]  # (kept alive: a direct replay reads it)
        runs.append((f.stats(), next(iter(f.graphs.values())).replays))
    assert runs[0] == runs[1]


def test_earlier_outputs_go_stale_after_a_repeated_call(dev: cg.Device, rng: np.random.Generator) -> None:
    f = cg.graphed(double, device=dev)
    h = random_array(rng, (16,), "float32")
    a = upload(dev, h)
    first = f(a)
    second = f(a)
    assert f._repeats == 1
    with pytest.raises(cg.StaleOutputError, match="call 1"):
        first.get()
    np.testing.assert_allclose(second.get(), 2 * h, rtol=1e-6)
    assert "valid until the next call" in repr(second)
    with pytest.raises(cg.StaleOutputError):
        f(first)  # a stale output given back: refused, as by the whole call


def test_tuple_outputs_and_two_inputs(dev: cg.Device, rng: np.random.Generator) -> None:
    f = cg.graphed(pair, device=dev)
    outs: list[Any] = []
    for _ in range(3):
        for o in outs:
            poison(o)
        hu, hv = random_array(rng, (8, 5), "float32"), random_array(rng, (8, 5), "float32")
        outs = list(f(upload(dev, hu), upload(dev, hv)))
        np.testing.assert_allclose(outs[0].get(), hu + hv, rtol=1e-6)
        np.testing.assert_allclose(outs[1].get(), 3 * hv, rtol=1e-6)
    assert f._repeats == 2


def test_the_current_and_a_fixed_stream(dev: cg.Device, rng: np.random.Generator) -> None:
    h = random_array(rng, (16,), "float32")
    a = upload(dev, h)
    s = dev.create_stream()
    s.wait(dev.stream)
    f = cg.graphed(double, device=dev)
    with s:
        f(a)
        out = f(a)  # s is the current stream both times: repeated
    assert f._repeats == 1
    s.synchronize()
    np.testing.assert_allclose(out.get(stream=s), 2 * h, rtol=1e-6)
    out = f(a)  # another stream than the last call's: the whole call, which waits for s first
    assert f._repeats == 1
    np.testing.assert_allclose(out.get(), 2 * h, rtol=1e-6)
    out = f(a)  # and it armed the call for this stream
    assert f._repeats == 2
    np.testing.assert_allclose(out.get(), 2 * h, rtol=1e-6)
    fixed = cg.graphed(double, device=dev, stream=s)
    fixed(a)
    with dev.create_stream():  # (another current stream: the callable's own stream is used)
        out = fixed(a)
    assert fixed._repeats == 1
    np.testing.assert_allclose(out.get(stream=s), 2 * h, rtol=1e-6)


def test_what_the_repeat_call_makes_and_what_it_leaves(dev: cg.Device, rng: np.random.Generator) -> None:
    h = random_array(rng, (8, 4), "float32")
    a = upload(dev, h)
    # name: (callable, its call, the expected result, calls repeated of 3)
    cases: dict[str, tuple[Any, Callable[[Any], Any], np.ndarray, int]] = {
        "keyword": (cg.graphed(lambda u: double(u), device=dev), lambda f: f(u=a), 2 * h, 0),
        "buckets": (cg.graphed(double, device=dev, buckets=[8]), lambda f: f(a), 2 * h, 0),
        "static argument": (
            cg.graphed(lambda u, k: cg.ops.scale(k, u), device=dev),
            lambda f: f(a, 2.0),
            2 * h,
            0,
        ),
        "strided": (cg.graphed(double, device=dev), lambda f: f(a[:, 1]), 2 * h[:, 1], 2),
        "copied outputs": (cg.graphed(double, device=dev, copy_outputs=True), lambda f: f(a), 2 * h, 2),
        "dict output": (cg.graphed(lambda u: {"y": double(u)}, device=dev), lambda f: f(a)["y"], 2 * h, 2),
    }
    for name, (f, call, want, repeated) in cases.items():
        for _ in range(3):
            got = call(f)
            np.testing.assert_allclose(got.get(), want, rtol=1e-6, err_msg=name)
            poison(got)
        assert f._repeats == repeated, name
    f = cg.graphed(double, device=dev)
    out = f(a)
    again = f(out)  # a GraphOutput input (checked when described): the whole call
    assert f._repeats == 0
    np.testing.assert_allclose(again.get(), 4 * h, rtol=1e-6)
    other = upload(dev, random_array(rng, (4, 4), "float32"))
    f(a)
    f(other)  # another shape: the whole call, which captures it and arms for it
    assert f._repeats == 0
    np.testing.assert_allclose(f(a).get(), 2 * h, rtol=1e-6)  # the first shape again: not what is armed
    assert f._repeats == 0
    np.testing.assert_allclose(f(a).get(), 2 * h, rtol=1e-6)
    assert f._repeats == 1
    h64 = random_array(rng, (8, 4), "float64")
    np.testing.assert_allclose(f(upload(dev, h64)).get(), 2 * h64)  # another dtype: captured
    assert f._repeats == 1
    np.testing.assert_allclose(f(a).get(), 2 * h, rtol=1e-6)
    assert f.stats()["misses"] == 3


def test_other_arguments_of_the_same_arrays_are_other_keys(dev: cg.Device, rng: np.random.Generator) -> None:
    hosts = [random_array(rng, (8, 4), "float32") for _ in range(2)]
    a, b = (upload(dev, h) for h in hosts)
    f = cg.graphed(lambda *xs: cg.ops.add(xs[0], xs[-1]), device=dev)
    f(a)
    np.testing.assert_allclose(f(a, b).get(), hosts[0] + hosts[1], rtol=1e-6)  # one array more
    np.testing.assert_allclose(f(a).get(), 2 * hosts[0], rtol=1e-6)
    scaled = cg.graphed(lambda u, k=2.0: cg.ops.scale(k, u), device=dev)
    scaled(a)
    np.testing.assert_allclose(scaled(a, k=3.0).get(), 3 * hosts[0], rtol=1e-6)  # a keyword more
    assert f._repeats == scaled._repeats == 0
    small = cg.graphed(double, device=dev, buckets=[8])
    part = upload(dev, hosts[1][:5])
    for _ in range(3):  # (padded to the bucket, cut back: never repeated)
        out = small(part)
        assert out.shape == (5, 4)
        np.testing.assert_allclose(out.get(), 2 * hosts[1][:5], rtol=1e-6)
    assert small._repeats == 0


def test_a_subclass_input_is_read_through_its_properties(dev: cg.Device, rng: np.random.Generator) -> None:
    h = random_array(rng, (16,), "float32")
    reads = []

    class Watched(cg.DeviceArray):
        @property
        def ptr(self) -> int:
            reads.append(1)
            return self._ptr

    a = upload(dev, h)
    w = Watched._wrap(a._block, a.ptr, a.shape, a.strides, a.dtype)
    f = cg.graphed(double, device=dev)
    for k in range(3):
        before = len(reads)
        np.testing.assert_allclose(f(w).get(), 2 * h, rtol=1e-6)
        assert len(reads) > before, f"call {k} did not read the address through the property"
    assert f._repeats == 0


def test_an_input_of_another_type_takes_the_whole_call(dev: cg.Device, rng: np.random.Generator) -> None:
    hosts = [random_array(rng, (64,), "float32") for _ in range(2)]
    f = cg.graphed(double, device=dev)
    a = upload(dev, hosts[0])
    f(a)
    plain = Plain(dev, hosts[1])  # (another library's array: of its own type, described anew)
    try:
        np.testing.assert_allclose(f(plain).get(), 2 * hosts[1], rtol=1e-6)
        assert f._repeats == 0
        np.testing.assert_allclose(f(a).get(), 2 * hosts[0], rtol=1e-6)
    finally:
        f.close()
        plain.free()


def test_an_input_on_another_device_is_refused_as_by_the_whole_call(devices: list[cg.Device]) -> None:
    d0, d1 = devices[0], devices[1]
    f = cg.graphed(double, device=d0)
    h = np.arange(1, 9, dtype=np.float32)
    f(upload(d0, h))
    np.testing.assert_allclose(f(upload(d0, h)).get(), 2 * h)
    assert f._repeats == 1
    errors = []
    for call in (f, whole(f)):
        with pytest.raises(ValueError, match="the callable on") as info:
            call(upload(d1, h))
        errors.append(str(info.value))
        assert f._armed is None
    assert errors[0] == errors[1]
    assert f._repeats == 1


def test_a_call_while_another_thread_holds_the_lock_waits(dev: cg.Device, rng: np.random.Generator) -> None:
    h = random_array(rng, (16,), "float32")
    a = upload(dev, h)
    f = cg.graphed(double, device=dev)
    f(a)
    got = call_while_held(f._lock, lambda: f(a).get())  # (waits, then repeats)
    np.testing.assert_allclose(got, 2 * h, rtol=1e-6)
    assert f._repeats == 1


def test_close_and_drop_disarm(dev: cg.Device, rng: np.random.Generator) -> None:
    h = random_array(rng, (16,), "float32")
    a = upload(dev, h)
    f = cg.graphed(double, device=dev)
    f(a)
    f(a)
    f.close()
    np.testing.assert_allclose(f(a).get(), 2 * h, rtol=1e-6)  # captured again, not a closed graph
    f._drop(set(f._entries))  # (what GraphModule.refresh does to graphs it cannot repoint)
    np.testing.assert_allclose(f(a).get(), 2 * h, rtol=1e-6)
    assert f.stats()["misses"] == 3
    assert f._repeats == 1


def test_the_last_input_stays_alive_for_a_direct_replay(dev: cg.Device, rng: np.random.Generator) -> None:
    f = cg.graphed(double, device=dev)
    f(upload(dev, random_array(rng, (4096,), "float32")))
    h = random_array(rng, (4096,), "float32")
    out = f(upload(dev, h))  # repeated; the temporary input is referenced only by the callable
    assert f._repeats == 1
    gc.collect()
    for _ in range(3):  # blocks freed meanwhile would be reused by these
        cg.empty((4096,), "float32", device=dev).set(np.zeros(4096, np.float32))
    graph = next(iter(f.graphs.values()))
    graph.replay(dev.stream)
    np.testing.assert_allclose(out.get(), 2 * h, rtol=1e-6)


def test_an_error_in_a_repeated_call_is_the_whole_calls(dev: cg.Device, rng: np.random.Generator) -> None:
    a = upload(dev, random_array(rng, (16,), "float32"))
    errors = []
    for made in ("repeated", "whole"):
        f = cg.graphed(double, device=dev)
        f(a)
        next(iter(f.graphs.values())).close()  # the user closed the graph under the callable
        with pytest.raises(RuntimeError) as info:
            f(a) if made == "repeated" else whole(f)(a)
        errors.append(str(info.value))
        assert f._armed is None  # a failed call disarms (the next one is the whole call)
        assert f._lock.acquire(False)  # the lock is free again
        f._lock.release()
    assert errors[0] == errors[1]
    assert "closed" in errors[0]


def test_repeated_and_whole_calls_agree(dev: cg.Device, rng: np.random.Generator) -> None:
    hosts = [random_array(rng, (8, 6), "float32") for _ in range(3)] + [random_array(rng, (2, 6), "float32")]
    s = dev.create_stream()
    s.wait(dev.stream)
    runs = []
    for made in ("repeated", "whole"):
        f = cg.graphed(pair, device=dev)
        call = f if made == "repeated" else whole(f)
        arrays = [upload(dev, h) for h in hosts]
        got = []
        plan = [(0, 1, None), (0, 1, None), (1, 2, None), (2, 0, s), (2, 0, s), (3, 3, None), (0, 1, None)]
        for i, j, stream in plan:
            if stream is not None:
                with stream:
                    out = call(arrays[i], arrays[j])
                    got.append([o.get(stream=stream) for o in out])
            else:
                out = call(arrays[i], arrays[j])
                got.append([o.get() for o in out])
            want = [hosts[i] + hosts[j], 3 * hosts[j]]
            for g, w in zip(got[-1], want):
                np.testing.assert_allclose(g, w, rtol=1e-6)
            for o in out:
                poison(o)
        entries = list(f._entries.values())
        held = [[arrays.index(x) for x in e.held] for e in entries]
        replays = [e.graph.replays for e in entries if e.graph is not None]
        runs.append((got, f.stats(), held, replays, f._lease.calls))
        assert f._repeats == (3 if made == "repeated" else 0)  # calls 2, 3 and 5
    (got_r, *rest_r), (got_w, *rest_w) = runs
    for a, b in zip(got_r, got_w):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    assert rest_r == rest_w


def armed_on_own_stream(dev: cg.Device, a: cg.DeviceArray) -> tuple[cg.Stream, GraphedCallable]:
    """``double`` graphed on a stream of its own and called twice with ``a``: its next call repeats."""
    s = dev.create_stream()
    s.wait(dev.stream)
    f = cg.graphed(double, device=dev, stream=s)
    f(a)
    f(a)
    assert f._repeats == 1
    return s, f


def test_a_call_on_a_captured_stream_is_the_whole_call(dev: cg.Device, rng: np.random.Generator) -> None:
    """Captured, the call's key is another (its graph has no input nodes): not the armed call."""
    h = random_array(rng, (16,), "float32")
    a = upload(dev, h)
    s, f = armed_on_own_stream(dev, a)
    with cg.capture(stream=s) as g:
        out = f(a)
    assert f._repeats == 1
    assert f.stats()["misses"] == 2
    poison(out)
    g.replay(s)
    np.testing.assert_allclose(out.get(stream=s), 2 * h, rtol=1e-6)
    out = f(a)  # (not captured: its own key's graph, and the call arms for it again)
    np.testing.assert_allclose(out.get(stream=s), 2 * h, rtol=1e-6)
    assert f._repeats == 1
    assert [stats["hits"] for stats in f.stats()["graphs"].values()] == [2, 0]
    f(a)
    assert f._repeats == 2


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
        f = cg.graphed(double, device=dev)
        plain = [Plain(dev, hosts[0]), Plain(dev, hosts[1])]
        pool = [upload(dev, hosts[2]), upload(dev, hosts[3])]
        # (pool first: the plain input as a cudagraphs array, which a repeated call takes)
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
            for k, (x, w) in enumerate([*zip(order, want), (order[-1], want[-1])]):  # (the last twice)
                out = f(x)
                np.testing.assert_allclose(out.get(), 2 * w, rtol=1e-6, err_msg=f"call {k}")
                poison(out)
            entry = next(iter(f._entries.values()))
            assert entry.copies == [None]  # the copy node is off: the input is copied by each call
            graph = next(iter(f.graphs.values()))
            out.set(np.zeros(128, np.float32))
            graph.replay(dev.stream)  # a direct replay reads what the last call copied in
            np.testing.assert_allclose(out.get(), 2 * want[-1], rtol=1e-6)
            # pool first: calls 2-5 repeated, the third (plain memory) switching the node off; plain
            # first: the plain arrays are described anew (views), and only the last call repeats
            assert f._repeats == (1 if plain_first else 4)
        finally:
            f.close()
            for p in plain:
                p.free()


def test_a_closed_stream_is_refused_as_the_whole_call_refuses_it(
    dev: cg.Device, rng: np.random.Generator
) -> None:
    a = upload(dev, random_array(rng, (16,), "float32"))
    errors = []
    for made in ("repeated", "whole"):
        s, f = armed_on_own_stream(dev, a)
        s.synchronize()
        s.close()
        with pytest.raises(ValueError, match="closed") as info:
            f(a) if made == "repeated" else whole(f)(a)
        errors.append(str(info.value))
        assert f._armed is None
    assert errors[0] == errors[1]


def test_a_stream_closed_while_a_moved_input_is_pointed_at_is_not_launched_on(
    dev: cg.Device, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stream is checked by the replay, after Python code ran in the call (the node's move)."""
    hosts = [random_array(rng, (16,), "float32") for _ in range(2)]
    a, b = (upload(dev, h) for h in hosts)
    s, f = armed_on_own_stream(dev, a)
    graph = next(iter(f.graphs.values()))
    replays = graph.replays
    update = dev.backend.graph_update

    def moved_then_closed(*args: Any) -> Any:
        out = update(*args)
        s.synchronize()
        s.close()  # (as a callback run by Python code here could)
        return out

    monkeypatch.setattr(dev.backend, "graph_update", moved_then_closed)
    with pytest.raises(ValueError, match="closed"):
        f(b)  # (b moved: its copy node is pointed at it, then the launch is refused)
    assert f._repeats == 2
    assert graph.replays == replays  # nothing queued on the closed stream
    assert f._armed is None
