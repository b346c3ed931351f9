"""Graphed callables, buckets, GraphModule, repoint, pools shared by buckets, foreign views.

Every test runs on each backend in CUDAGRAPHS_TEST_BACKENDS; numbers are
checked against numpy on random data, outputs poisoned first.
"""

from __future__ import annotations

import gc
import threading
from typing import Any

import numpy as np
import pytest
from conftest import needs_matmul, random_array, settle

import cudagraphs as cg
from cudagraphs._options import GraphedOptions


def affine(x: cg.DeviceArray, y: cg.DeviceArray, *, scale: float = 2.0) -> dict[str, Any]:
    """Compute scale * x + y and x + y: two outputs, allocated inside."""
    s = cg.ops.scale(scale, x)
    return {"out": cg.ops.add(s, y), "sum": cg.ops.add(x, y)}


class FakeForeign:
    """Another library's device array, as far as cudagraphs can tell (it speaks CAI)."""

    def __init__(self, a: cg.DeviceArray) -> None:
        self.a = a

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        a = self.a
        return {
            "shape": a.shape,
            "typestr": a.dtype.str,
            "data": (a.ptr, False),
            "version": 3,
            "strides": None,
        }


# graphed callables -----------------------------------------------------------------------
def test_graphed_replays_with_new_inputs_and_matches_numpy(dev: cg.Device, rng: np.random.Generator) -> None:
    f = cg.graphed(affine, device=dev)
    for _ in range(4):
        xh, yh = random_array(rng, (64, 3), "float32"), random_array(rng, (64, 3), "float32")
        r = f(cg.asarray(xh), cg.asarray(yh))
        np.testing.assert_allclose(r["out"].get(), 2 * xh + yh, rtol=1e-6)
        np.testing.assert_allclose(r["sum"].get(), xh + yh, rtol=1e-6)
    st = f.stats()
    assert (st["calls"], st["captures"], st["misses"], st["hits"]) == (4, 1, 1, 3)
    assert len(f.graphs) == 1
    assert f.graphs[((64, 3), (64, 3))].replays == 4


def test_a_new_static_argument_is_a_new_graph(dev: cg.Device, rng: np.random.Generator) -> None:
    f = cg.graphed(lambda x, y, scale: affine(x, y, scale=scale), device=dev)
    xh, yh = random_array(rng, 32, "float32"), random_array(rng, 32, "float32")
    x, y = cg.asarray(xh), cg.asarray(yh)
    np.testing.assert_allclose(f(x, y, 2.0)["out"].get(), 2 * xh + yh, rtol=1e-6)
    np.testing.assert_allclose(f(x, y, 3.0)["out"].get(), 3 * xh + yh, rtol=1e-6)
    np.testing.assert_allclose(f(x, y, 2.0)["out"].get(), 2 * xh + yh, rtol=1e-6)
    assert f.stats()["captures"] == 2


def test_nested_arguments_and_outputs_keep_their_structure(dev: cg.Device, rng: np.random.Generator) -> None:
    def fn(pair: tuple[cg.DeviceArray, cg.DeviceArray], extra: dict[str, Any]) -> list[Any]:
        a, b = pair
        return [cg.ops.add(a, b), (cg.ops.scale(extra["k"], extra["c"]),)]

    f = cg.graphed(fn, device=dev)
    ah, bh, ch = (random_array(rng, 16, "float32") for _ in range(3))
    out = f((cg.asarray(ah), cg.asarray(bh)), {"k": 4.0, "c": cg.asarray(ch)})
    assert isinstance(out, list)
    assert isinstance(out[1], tuple)
    np.testing.assert_allclose(out[0].get(), ah + bh, rtol=1e-6)
    np.testing.assert_allclose(out[1][0].get(), 4 * ch, rtol=1e-6)


def test_outputs_expire_at_the_next_call(dev: cg.Device, rng: np.random.Generator) -> None:
    f = cg.graphed(affine, device=dev)
    x, y = cg.asarray(random_array(rng, 8, "float32")), cg.asarray(random_array(rng, 8, "float32"))
    first = f(x, y)["out"]
    kept = first.copy()
    part = first[2:]
    assert "valid" in repr(first)
    f(x, y)
    for use in (first.get, part.get, lambda: first[1:], lambda: cg.ops.add(first, first), first.copy):
        with pytest.raises(cg.StaleOutputError, match="copy them"):
            use()
    assert "stale" in repr(first)
    np.testing.assert_allclose(kept.get(), 2 * x.get() + y.get(), rtol=1e-6)


def test_every_use_of_a_stale_output_raises(dev: cg.Device, rng: np.random.Generator) -> None:
    """Issue 26, item 7: the callable, host slots, repoint and every read refuse a stale output."""
    f = cg.graphed(lambda x: cg.ops.scale(2.0, x), device=dev)
    x_h = random_array(rng, 8, "float32")
    x = cg.asarray(x_h)
    stale = f(x)
    f(x)
    target_h = random_array(rng, 8, "float32")
    target = cg.asarray(target_h)
    with cg.capture() as g:
        cg.ops.scale(3.0, target, out=target)
    slot = cg.HostSlot(8, "float32")
    slot.array[...] = 7.0
    keep = slot.array.copy()
    uses = {
        "the callable": lambda: f(stale),
        "HostSlot.copy_from": lambda: slot.copy_from(stale),
        "HostSlot.copy_to": lambda: slot.copy_to(stale),
        "Graph.repoint (new)": lambda: g.repoint(target, stale),
        "Graph.repoint (old)": lambda: g.repoint(stale, target),
        "Graph.rebind": lambda: g.rebind(target, stale),
        "get": stale.get,
        "get_async": stale.get_async,
        "copy": stale.copy,
        "set": lambda: stale.set(np.ones(8, "float32")),
        "a view": lambda: stale.reshape(2, 4),
        "an op": lambda: cg.ops.add(stale, x),
        "an op's out=": lambda: cg.ops.scale(1.0, x, out=stale),
        "ptr": lambda: stale.ptr,
    }
    if dev.backend.capabilities.shares_memory:  # (sim arrays have neither)
        uses["__cuda_array_interface__"] = lambda: stale.__cuda_array_interface__
        uses["__dlpack__"] = stale.__dlpack__
    for name, use in uses.items():
        with pytest.raises(cg.StaleOutputError, match="copy them"):
            use()
            pytest.fail(f"{name} took a stale output")
    dev.synchronize()
    np.testing.assert_array_equal(slot.array, keep)  # nothing was copied in or out
    g.replay()
    np.testing.assert_allclose(target.get(), 3 * target_h, rtol=1e-6)  # g was not repointed
    assert f.stats()["calls"] == 2  # the refused call counted nothing


def test_an_output_fed_back_into_its_callable_is_read_before_it_is_overwritten(
    dev: cg.Device, rng: np.random.Generator
) -> None:
    """``h = f(h)``: the output is valid at the call; the call reads it, then overwrites it."""
    f = cg.graphed(lambda h: cg.ops.add(cg.ops.scale(2.0, h), h), device=dev)
    h_h = random_array(rng, 16, "float32")
    h = f(cg.asarray(h_h))
    expect = 3 * h_h
    for _ in range(4):
        h = f(h)
        expect = 3 * expect
        np.testing.assert_allclose(h.get(), expect, rtol=1e-5)


def test_an_output_of_another_callable_is_an_input(dev: cg.Device, rng: np.random.Generator) -> None:
    g = cg.graphed(lambda x: cg.ops.scale(2.0, x), device=dev)
    f = cg.graphed(lambda x: cg.ops.add(x, x), device=dev)
    x_h = random_array(rng, 16, "float32")
    x = cg.asarray(x_h)
    for _ in range(3):
        out = f(g(x))
        np.testing.assert_allclose(out.get(), 4 * x_h, rtol=1e-6)
    first = g(x)
    g(x)
    with pytest.raises(cg.StaleOutputError):
        f(first)


def test_copy_outputs_returns_arrays_that_survive_later_calls(
    dev: cg.Device, rng: np.random.Generator
) -> None:
    f = cg.graphed(affine, device=dev, copy_outputs=True)
    xh, yh = random_array(rng, 8, "float32"), random_array(rng, 8, "float32")
    a = f(cg.asarray(xh), cg.asarray(yh))["out"]
    f(cg.asarray(yh), cg.asarray(xh))
    assert type(a) is cg.DeviceArray
    np.testing.assert_allclose(a.get(), 2 * xh + yh, rtol=1e-6)


def test_buckets_pad_and_cut_and_match_numpy(dev: cg.Device, rng: np.random.Generator) -> None:
    f = cg.graphed(affine, buckets=[2, 4, 8], device=dev)
    for n in (1, 3, 8, 2, 5, 3):
        xh, yh = random_array(rng, (n, 5), "float32"), random_array(rng, (n, 5), "float32")
        r = f(cg.asarray(xh), cg.asarray(yh))
        assert r["out"].shape == (n, 5)
        np.testing.assert_allclose(r["out"].get(), 2 * xh + yh, rtol=1e-6)
    st = f.stats()
    assert st["captures"] == 3
    assert sorted(f.graphs) == [2, 4, 8]
    # 1 -> 2, 3 -> 4, 8 -> 8 capture; 2 -> 2, 5 -> 8, 3 -> 4 replay
    assert [st["graphs"][b]["hits"] for b in (2, 4, 8)] == [1, 1, 1]
    with pytest.raises(ValueError, match="larger than the largest bucket"):
        f(cg.zeros((9, 5), "float32", device=dev), cg.zeros((9, 5), "float32", device=dev))
    with pytest.raises(ValueError, match="of one size"):
        f(cg.zeros((2, 5), "float32", device=dev), cg.zeros((3, 5), "float32", device=dev))


def test_padding_rows_are_filled_with_pad_value(dev: cg.Device, rng: np.random.Generator) -> None:
    seen: list[cg.DeviceArray] = []

    def fn(x: cg.DeviceArray) -> cg.DeviceArray:
        seen.append(x)
        return cg.ops.scale(1.0, x)

    f = cg.graphed(fn, buckets=[4], device=dev, pad_value=-7.0)
    f(cg.asarray(random_array(rng, (4, 2), "float32")))  # the static buffer holds data now
    xh = random_array(rng, (1, 2), "float32")
    f(cg.asarray(xh))
    static = seen[-1].get()
    np.testing.assert_array_equal(static[0], xh[0])
    np.testing.assert_array_equal(static[1:], np.full((3, 2), -7.0, "float32"))


def test_capture_all_captures_largest_first_and_shares_memory(
    dev: cg.Device, rng: np.random.Generator
) -> None:
    order: list[int] = []

    def fn(x: cg.DeviceArray) -> cg.DeviceArray:
        order.append(x.shape[0])
        t = cg.ops.scale(3.0, x)  # temporaries the smaller buckets can reuse
        u = cg.ops.add(t, x)
        return cg.ops.add(u, t)

    buckets = [1, 2, 4, 8, 16, 32, 64, 128]
    f = cg.graphed(fn, buckets=buckets, device=dev, warmup=0)
    f.capture_all(cg.asarray(random_array(rng, (3, 256), "float32")))
    assert order == buckets[::-1]
    shared = f.stats()["reserved"]
    alone = cg.graphed(fn, buckets=[128], device=dev, warmup=0)
    alone(cg.asarray(random_array(rng, (128, 256), "float32")))
    largest = alone.stats()["reserved"]
    assert shared <= 1.5 * largest, (shared, largest)
    graphs = [cg.capture(fn, cg.zeros((b, 256), "float32", device=dev)) for b in buckets]
    separate = sum(g.pool.reserved for g in graphs)
    assert separate > 1.5 * largest  # what sharing saves
    for n in (1, 7, 100, 128):
        xh = random_array(rng, (n, 256), "float32")
        np.testing.assert_allclose(f(cg.asarray(xh)).get(), 7 * xh, rtol=1e-5)
    assert f.stats()["captures"] == 8


def test_warmup_runs_eagerly_before_the_capture(dev: cg.Device, rng: np.random.Generator) -> None:
    calls: list[bool] = []

    def fn(x: cg.DeviceArray) -> cg.DeviceArray:
        calls.append(cg.is_capturing())
        return cg.ops.scale(2.0, x)

    f = cg.graphed(fn, warmup=2, device=dev)
    f(cg.asarray(random_array(rng, 4, "float32")))
    f(cg.asarray(random_array(rng, 4, "float32")))
    assert calls == [False, False, True]


def test_a_failing_function_leaves_nothing_behind(dev: cg.Device) -> None:
    def fn(x: cg.DeviceArray) -> cg.DeviceArray:
        if cg.is_capturing():
            x.get()  # a host read: refused in a capture
        return cg.ops.scale(2.0, x)

    f = cg.graphed(fn, device=dev)
    x = cg.ones(4, "float32", device=dev)
    with pytest.raises(cg.CaptureError, match="get"):
        f(x)
    assert f.stats()["captures"] == 0
    assert not cg.is_capturing()
    np.testing.assert_array_equal(cg.ops.scale(2.0, x).get(), np.full(4, 2.0, "float32"))


_BAD_OPTIONS = [
    ({"buckets": [0, 2]}, ValueError, "buckets must be positive integers"),
    ({"buckets": "48"}, TypeError, "buckets must be a non-empty sequence"),
    ({"buckets": []}, TypeError, "buckets must be a non-empty sequence"),
    ({"dim": -1}, ValueError, "dim must be a non-negative int"),
    ({"warmup": True}, TypeError, "warmup must be an int"),
    ({"warmup": 1001}, ValueError, r"warmup must be in 0\.\.1000"),
    ({"mode": "eager"}, ValueError, "mode must be one of"),
    ({"pool": 3}, TypeError, "pool must be a cudagraphs GraphPool"),
    ({"stream": 3}, TypeError, "stream must be a cudagraphs Stream"),
    ({"fallback": "sometimes"}, ValueError, r"fallback must be one of \('raise', 'eager'\), got 'sometimes'"),
    ({"fallback": None}, ValueError, r"fallback must be one of \('raise', 'eager'\), got None"),
]


@pytest.mark.parametrize(("bad", "error", "message"), _BAD_OPTIONS)
def test_graphed_and_graph_module_check_their_options_alike(
    dev: cg.Device, bad: dict[str, Any], error: type[Exception], message: str
) -> None:
    """One check of the options they share: the same error from graphed, its decorator and GraphModule."""
    with pytest.raises(error, match=message):
        cg.graphed(affine, device=dev, **bad)
    decorate = cg.graphed(device=dev, **bad)  # (the decorator checks them when it is given the function)
    with pytest.raises(error, match=message):
        decorate(affine)
    with pytest.raises(error, match=message):
        cg.GraphModule(affine, device=dev, **bad)


def test_graphed_options_are_checked_and_frozen(dev: cg.Device) -> None:
    f = cg.graphed(affine, buckets=[8, 2, 8, 4], dim=1, warmup=0, copy_outputs=1, device=dev)  # type: ignore[arg-type]
    assert (f.buckets, f.dim, f.warmup, f.copy_outputs, f.device) == ((2, 4, 8), 1, 0, True, dev)
    m = cg.GraphModule(affine, buckets=(4, 2), dim=1, device=dev)
    assert (m.graphed.buckets, m.graphed.dim, m.graphed.device) == ((2, 4), 1, dev)
    assert m.graphed.pool is not f.pool  # (each callable makes its own pool unless given one)
    options = GraphedOptions.checked(
        buckets=[2], dim=0, warmup=1, pool=None, stream=None, mode="global", copy_outputs=False,
        pad_value=None, device=dev,
    )  # fmt: skip
    with pytest.raises(AttributeError):
        options.dim = 1  # type: ignore[misc]
    g = cg.GraphedCallable(affine, options)
    assert (g.buckets, g.mode, g.pad_value, g.device) == ((2,), "global", None, dev)


def test_bad_arguments_are_clear(dev: cg.Device) -> None:
    with pytest.raises(TypeError, match="callable"):
        cg.graphed(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="positive"):
        cg.graphed(affine, buckets=[0, 2])
    with pytest.raises(TypeError, match="sequence"):
        cg.graphed(affine, buckets=4)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="mode"):
        cg.graphed(affine, mode="eager")
    with pytest.raises(ValueError, match="warmup"):
        cg.graphed(affine, warmup=-1)
    f = cg.graphed(lambda x, opts: cg.ops.scale(2.0, x), device=dev)
    with pytest.raises(TypeError, match="neither a device array nor hashable"):
        f(cg.ones(2, "float32", device=dev), {"k": {1}})
    with pytest.raises(TypeError, match="host numpy array"):
        f(np.ones(2, "float32"), 1)
    with pytest.raises(ValueError, match="buckets"):
        cg.graphed(affine).capture_all(cg.ones(2, "float32", device=dev), cg.ones(2, "float32", device=dev))


def test_decorator_form(dev: cg.Device, rng: np.random.Generator) -> None:
    @cg.graphed(buckets=[4], device=dev)
    def double(x: cg.DeviceArray) -> cg.DeviceArray:
        return cg.ops.scale(2.0, x)

    xh = random_array(rng, (3,), "float32")
    np.testing.assert_allclose(double(cg.asarray(xh)).get(), 2 * xh, rtol=1e-6)


def test_calls_from_several_threads_are_serialized(dev: cg.Device, rng: np.random.Generator) -> None:
    f = cg.graphed(affine, buckets=[4, 8], device=dev, copy_outputs=True)
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        r = np.random.default_rng(seed)
        try:
            for _ in range(10):
                n = int(r.integers(1, 9))
                xh, yh = r.standard_normal((n, 3)).astype("f4"), r.standard_normal((n, 3)).astype("f4")
                out = f(cg.asarray(xh), cg.asarray(yh))["out"]
                np.testing.assert_allclose(out.get(), 2 * xh + yh, rtol=1e-6)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert f.stats()["calls"] == 40


def test_a_read_of_an_output_and_another_threads_call_do_not_interleave(
    dev: cg.Device, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 26, item 8: the check of an output and the copy that reads it are one step.

    Thread A reads its output; another thread calls the callable at the worst
    moment, after A's check and before A's copy is queued (the copy's issue
    is where it is made to happen). The call must wait for A's copy, so A
    reads its own result, never the other thread's.
    """
    f = cg.graphed(lambda x: cg.ops.scale(2.0, x), device=dev)
    a_h, b_h = random_array(rng, 64, "float32"), random_array(rng, 64, "float32")
    a, b = cg.asarray(a_h), cg.asarray(b_h)
    other = dev.create_stream()
    dev.synchronize()
    out_a = f(a)
    results: dict[str, Any] = {}

    def call_b() -> None:
        try:
            with other:
                out_b = f(b)
                results["b"] = out_b.get()  # (its replay has run: the buffers hold b's result)
        except BaseException as exc:  # reported below
            results["b"] = exc

    backend = dev.backend
    real = backend.memcpy
    caller = threading.Thread(target=call_b)

    def memcpy(raw: Any, copy: Any) -> Any:
        if copy.kind == "dtoh" and not caller.is_alive() and "b" not in results:
            caller.start()  # the other thread's call, between A's check and A's copy
            caller.join(1.0)
            results["b waited"] = caller.is_alive()
        return real(raw, copy)

    monkeypatch.setattr(backend, "memcpy", memcpy)
    got = out_a.get()
    monkeypatch.setattr(backend, "memcpy", real)
    caller.join(30)
    assert not isinstance(results["b"], BaseException), results["b"]
    np.testing.assert_allclose(got, 2 * a_h, rtol=1e-6)  # A's own result
    np.testing.assert_allclose(results["b"], 2 * b_h, rtol=1e-6)
    assert results["b waited"]  # the call waited for A's copy (it takes the callable's lock)
    with pytest.raises(cg.StaleOutputError):
        out_a.get()


def test_a_call_after_another_thread_began_capturing_the_previous_calls_stream(
    dev: cg.Device, rng: np.random.Generator
) -> None:
    """The call waits for what was queued there before that capture, and records nothing in it."""
    f = cg.graphed(lambda x: cg.ops.scale(2.0, x), device=dev)
    a_h, b_h = random_array(rng, 64, "float32"), random_array(rng, 64, "float32")
    a = cg.asarray(a_h)
    dev.synchronize()
    theirs = dev.create_stream()
    capturing, done = threading.Event(), threading.Event()
    results: dict[str, Any] = {}

    def other_thread() -> None:
        try:
            with theirs:
                b = cg.asarray(b_h)
                results["b"] = f(b).copy()  # the callable's last stream: `theirs`
                with cg.capture() as g:  # ... which this thread captures now
                    cg.ops.scale(3.0, b, out=b)
                    capturing.set()
                    done.wait(30)
                g.replay()
                results["b*3"] = b.get()
        except BaseException as exc:  # reported below
            results["error"] = exc
            capturing.set()

    t = threading.Thread(target=other_thread)
    t.start()
    capturing.wait(30)
    try:
        got = f(a).get()  # waits for `theirs` as it was before the capture began
    finally:
        done.set()
        t.join(30)
    assert "error" not in results, results["error"]
    np.testing.assert_allclose(got, 2 * a_h, rtol=1e-6)
    np.testing.assert_allclose(results["b"].get(), 2 * b_h, rtol=1e-6)
    np.testing.assert_allclose(results["b*3"], 3 * b_h, rtol=1e-6)  # the capture was not broken


def test_foreign_arrays_are_viewed_without_copies(dev: cg.Device, rng: np.random.Generator) -> None:
    base = cg.asarray(random_array(rng, 6, "float32"))
    foreign = FakeForeign(base)
    view = cg.asarray(foreign)
    assert (view.ptr, view.shape, view.dtype) == (base.ptr, (6,), np.float32)
    before = base.get()
    cg.ops.scale(2.0, view, view)
    np.testing.assert_allclose(base.get(), 2 * before)  # (the same memory)
    with pytest.raises(TypeError, match="cannot be converted"):
        cg.asarray(foreign, dtype="float64")
    # a foreign array stays alive as long as views of it (and graphs using them) do
    g = cg.capture(lambda: cg.ops.scale(3.0, cg.asarray(FakeForeign(base)), base))
    gc.collect()
    g.replay()
    assert g.replays == 1


def test_graphed_takes_foreign_inputs(dev: cg.Device, rng: np.random.Generator) -> None:
    f = cg.graphed(affine, device=dev)
    xh, yh = random_array(rng, 10, "float32"), random_array(rng, 10, "float32")
    r = f(FakeForeign(cg.asarray(xh)), FakeForeign(cg.asarray(yh)))
    np.testing.assert_allclose(r["out"].get(), 2 * xh + yh, rtol=1e-6)


# repoint ----------------------------------------------------------------------------------
def test_repoint_moves_views_and_parts_of_an_array(dev: cg.Device, rng: np.random.Generator) -> None:
    wh, wh2 = random_array(rng, (4, 6), "float32"), random_array(rng, (4, 6), "float32")
    w, w2 = cg.asarray(wh), cg.asarray(wh2)
    out1, out2 = cg.zeros(6, "float32", device=dev), cg.zeros((6, 4), "float32", device=dev)

    def fn() -> None:
        cg.ops.scale(2.0, w[1], out1)  # a row view
        cg.ops.copy(out2, w.T)  # a transposed view (strided copy kernel)

    g = cg.capture(fn)
    assert g.repoint(w, w2) == 2
    del w2
    gc.collect()  # the graph keeps the new array alive
    out1.set(np.full(6, np.nan, "float32"))
    g.replay()
    np.testing.assert_allclose(out1.get(), 2 * wh2[1], rtol=1e-6)
    np.testing.assert_array_equal(out2.get(), wh2.T)
    with pytest.raises(ValueError, match="no node"):
        g.repoint(cg.zeros((4, 6), "float32", device=dev), cg.zeros((4, 6), "float32", device=dev))
    with pytest.raises(ValueError, match="must match"):
        g.repoint(w, cg.zeros((6, 4), "float32", device=dev))


def test_repoint_refuses_nodes_it_cannot_change_and_changes_nothing(dev: cg.Device) -> None:
    x, y = cg.ones(8, "float32", device=dev), cg.zeros(8, "float32", device=dev)
    host = np.arange(8, dtype="float32")

    def fn() -> None:
        x.set(host)  # a host-to-device copy node writes x
        cg.ops.scale(2.0, x, y)

    g = cg.capture(fn)
    with pytest.raises(cg.UpdateError, match="node by node"):
        g.repoint(x, cg.ones(8, "float32", device=dev))
    g.replay()
    np.testing.assert_array_equal(y.get(), 2 * host)


# GraphModule --------------------------------------------------------------------------------
class Dense(cg.GraphModule):
    def __init__(self, w: cg.DeviceArray, b: cg.DeviceArray, **kw: Any) -> None:
        super().__init__(**kw)
        self.w, self.b = w, b

    def compute(self, x: cg.DeviceArray, k: float) -> cg.DeviceArray:
        t = cg.empty_like(x)
        cg.ops.copy(t, x)
        cg.ops.axpy(k, self.w, t)
        return cg.ops.add(t, self.b)


def test_graph_module_subclass_forward_and_refresh(dev: cg.Device, rng: np.random.Generator) -> None:
    wh, bh = random_array(rng, (3, 4), "float32"), random_array(rng, (3, 4), "float32")
    m = Dense(cg.asarray(wh), cg.asarray(bh), device=dev)
    assert set(m.parameters()) == {"w", "b"}
    xh = random_array(rng, (3, 4), "float32")
    np.testing.assert_allclose(m(cg.asarray(xh), 1.0).get(), xh + wh + bh, rtol=1e-6)
    np.testing.assert_allclose(m(cg.asarray(xh), 2.0).get(), xh + 2 * wh + bh, rtol=1e-6)
    wh2 = random_array(rng, (3, 4), "float32")
    m.w = cg.asarray(wh2)  # a weight reload
    with pytest.raises(cg.StaleParameterError, match=r"'w'.*refresh"):
        m(cg.asarray(xh), 1.0)
    report = m.refresh()
    assert report == {"replaced": 1, "added": 0, "repointed": 2, "recaptured": 0}
    gc.collect()
    np.testing.assert_allclose(m(cg.asarray(xh), 1.0).get(), xh + wh2 + bh, rtol=1e-6)
    np.testing.assert_allclose(m(cg.asarray(xh), 2.0).get(), xh + 2 * wh2 + bh, rtol=1e-6)
    assert m.graphed.stats()["captures"] == 2  # no capture again
    m.w = cg.asarray(wh2[:, :2].copy())  # another shape: graphs are captured again
    assert m.refresh()["recaptured"] == 2


def test_graph_module_function_form(dev: cg.Device, rng: np.random.Generator) -> None:
    def fn(x: cg.DeviceArray, *, scale: cg.DeviceArray, shift: cg.DeviceArray) -> cg.DeviceArray:
        out = cg.ops.add(x, shift)
        cg.ops.axpy(1.0, scale, out)
        return out

    sh, hh = random_array(rng, 5, "float32"), random_array(rng, 5, "float32")
    m = cg.GraphModule(fn, params={"scale": cg.asarray(sh), "shift": cg.asarray(hh)}, device=dev)
    xh = random_array(rng, 5, "float32")
    np.testing.assert_allclose(m(cg.asarray(xh)).get(), xh + sh + hh, rtol=1e-6)
    assert m.params is not None
    sh2 = random_array(rng, 5, "float32")
    m.params["scale"] = cg.asarray(sh2)
    with pytest.raises(cg.StaleParameterError):
        m(cg.asarray(xh))
    assert m.refresh()["repointed"] == 1
    np.testing.assert_allclose(m(cg.asarray(xh)).get(), xh + sh2 + hh, rtol=1e-6)


def _check(m: cg.GraphModule, xh: np.ndarray, want: np.ndarray) -> None:
    """``m(xh)`` is ``want``; its output is poisoned after (a later replay must write it)."""
    out = m(cg.asarray(xh))
    np.testing.assert_allclose(out.get(), want, rtol=1e-5, atol=1e-5)
    out.set(np.full(out.shape, np.nan, out.dtype))


class Pair(cg.GraphModule):
    """``x + a + 3 b``: a kernel node reads ``a``, a device copy node ``b``."""

    def __init__(self, a: cg.DeviceArray, b: cg.DeviceArray, **kw: Any) -> None:
        super().__init__(**kw)
        self.a, self.b = a, b

    def compute(self, x: cg.DeviceArray) -> cg.DeviceArray:
        t = cg.empty_like(x)
        cg.ops.copy(t, self.b)
        out = cg.ops.add(x, self.a)
        cg.ops.axpy(3.0, t, out)
        return out


def test_graph_module_refresh_moves_exchanged_parameters_at_once(
    dev: cg.Device, rng: np.random.Generator
) -> None:
    ah, bh, xh = (random_array(rng, (3, 4), "float32") for _ in range(3))
    m = Pair(cg.asarray(ah), cg.asarray(bh), device=dev)
    for _ in range(3):  # eagerly, captured, replayed (its input copy moved to a new input)
        _check(m, xh, xh + ah + 3 * bh)
    m.a, m.b = m.b, m.a
    with pytest.raises(cg.StaleParameterError, match="'a', 'b'"):
        m(cg.asarray(xh))
    # each node follows its own parameter (the add a -> b, the copy b -> a), not one after the other
    assert m.refresh() == {"replaced": 2, "added": 0, "repointed": 2, "recaptured": 0}
    gc.collect()
    _check(m, xh, xh + bh + 3 * ah)
    m.a, m.b = m.b, m.a  # and back
    m.refresh()
    _check(m, xh, xh + ah + 3 * bh)
    assert m.graphed.stats()["captures"] == 1


def test_graph_module_exchanges_parameters_another_librarys_nodes_read(
    dev: cg.Device, rng: np.random.Generator
) -> None:
    needs_matmul(dev)

    def fn(x: cg.DeviceArray, *, a: cg.DeviceArray, b: cg.DeviceArray) -> cg.DeviceArray:
        return cg.ops.add(cg.ops.matmul(x, a), cg.ops.scale(2.0, cg.ops.matmul(x, b)))

    ah, bh, xh = (random_array(rng, (4, 4), "float32") for _ in range(3))
    m = cg.GraphModule(fn, params={"a": cg.asarray(ah), "b": cg.asarray(bh)}, device=dev)
    for _ in range(3):
        _check(m, xh, xh @ ah + 2 * (xh @ bh))
    assert m.params is not None
    m.params["a"], m.params["b"] = m.params["b"], m.params["a"]
    assert m.refresh() == {"replaced": 2, "added": 0, "repointed": 2, "recaptured": 0}
    _check(m, xh, xh @ bh + 2 * (xh @ ah))
    assert m.graphed.stats()["captures"] == 1


class Tied(cg.GraphModule):
    """``x + head + 2 w[4:]``, ``head`` being ``w[:4]`` (tied); without it, ``x + w[2:6] + 2 w[4:]``."""

    def __init__(self, w: cg.DeviceArray, use_head: bool = True, **kw: Any) -> None:
        super().__init__(**kw)
        self.w = w
        self.head = w[:4]
        self.use_head = use_head

    def compute(self, x: cg.DeviceArray) -> cg.DeviceArray:
        out = cg.ops.add(x, self.head if self.use_head else self.w[2:6])
        cg.ops.axpy(2.0, self.w[4:], out)
        return out


@pytest.mark.parametrize("use_head", [True, False])
def test_graph_module_refresh_of_tied_weights_computes_what_a_new_capture_does(
    dev: cg.Device, rng: np.random.Generator, use_head: bool
) -> None:
    wh, xh = random_array(rng, (8, 4), "float32"), random_array(rng, (4, 4), "float32")
    m = Tied(cg.asarray(wh), use_head, device=dev)
    first = slice(0, 4) if use_head else slice(2, 6)
    for _ in range(3):
        _check(m, xh, xh + wh[first] + 2 * wh[4:])
    # only w is reloaded: head still views the old w, and a new capture reads it there
    w2 = random_array(rng, (8, 4), "float32")
    m.w = cg.asarray(w2)
    report = m.refresh()
    if use_head:  # the add reads memory head and the old w share: which one it reads is unknown
        assert report == {"replaced": 1, "added": 0, "repointed": 0, "recaptured": 1}
        _check(m, xh, xh + wh[:4] + 2 * w2[4:])
    else:  # every node reads through w (views of w that do not lie inside head): moved
        assert report == {"replaced": 1, "added": 0, "repointed": 2, "recaptured": 0}
        _check(m, xh, xh + w2[2:6] + 2 * w2[4:])
    # both reloaded, head a view of the new w: the same move for both, no capture
    w3 = random_array(rng, (8, 4), "float32")
    m.w = cg.asarray(w3)
    m.head = m.w[:4]
    assert m.refresh()["recaptured"] == 0
    _check(m, xh, xh + w3[first] + 2 * w3[4:])
    # head reloaded on its own (w stays): a node inside head cannot be told from one of w
    h4 = random_array(rng, (4, 4), "float32")
    m.head = cg.asarray(h4)
    assert m.refresh()["recaptured"] == (1 if use_head else 0)
    _check(m, xh, (xh + h4 if use_head else xh + w3[2:6]) + 2 * w3[4:])


def test_graph_module_refresh_of_a_tied_weight_another_librarys_node_reads(
    dev: cg.Device, rng: np.random.Generator
) -> None:
    needs_matmul(dev)

    def fn(x: cg.DeviceArray, *, w: cg.DeviceArray, head: cg.DeviceArray) -> cg.DeviceArray:
        return cg.ops.add(cg.ops.matmul(x, head), w[2:])  # the library's node reads head

    wh, xh = random_array(rng, (5, 4), "float32"), random_array(rng, (3, 2), "float32")
    w = cg.asarray(wh)
    m = cg.GraphModule(fn, params={"w": w, "head": w[:2]}, device=dev)  # tied
    for _ in range(3):
        _check(m, xh, xh @ wh[:2] + wh[2:])
    assert m.params is not None
    w2 = random_array(rng, (5, 4), "float32")
    m.params["w"] = cg.asarray(w2)
    # the library's node holds an address inside both: which array it reads cannot be told
    assert m.refresh()["recaptured"] == 1
    _check(m, xh, xh @ wh[:2] + w2[2:])


class Biased(cg.GraphModule):
    """``x + w``, plus ``bias`` and ``extra`` once there are."""

    def __init__(self, w: cg.DeviceArray, **kw: Any) -> None:
        super().__init__(**kw)
        self.w = w
        self.bias: cg.DeviceArray | None = None

    def compute(self, x: cg.DeviceArray) -> cg.DeviceArray:
        out = cg.ops.add(x, self.w)
        for extra in (self.bias, getattr(self, "extra", None)):
            if extra is not None:
                cg.ops.axpy(1.0, extra, out)
        return out


def test_graph_module_refuses_a_parameter_added_after_capture_until_refresh(
    dev: cg.Device, rng: np.random.Generator
) -> None:
    wh, bh, eh, xh = (random_array(rng, (3, 4), "float32") for _ in range(4))
    m = Biased(cg.asarray(wh), device=dev)
    for _ in range(3):
        _check(m, xh, xh + wh)
    m.bias = cg.asarray(bh)  # None -> an array
    with pytest.raises(cg.StaleParameterError, match=r"'bias' were added.*refresh"):
        m(cg.asarray(xh))
    assert m.refresh() == {"replaced": 0, "added": 1, "repointed": 0, "recaptured": 1}
    for _ in range(2):
        _check(m, xh, xh + wh + bh)
    m.extra = cg.asarray(eh)  # a new attribute
    with pytest.raises(cg.StaleParameterError, match="'extra' were added"):
        m(cg.asarray(xh))
    assert m.refresh()["added"] == 1
    _check(m, xh, xh + wh + bh + eh)
    m.bias = None  # gone: replaced by nothing, captured again too
    assert m.refresh()["recaptured"] == 1
    _check(m, xh, xh + wh + eh)


def test_graph_module_refuses_a_params_key_added_after_capture(
    dev: cg.Device, rng: np.random.Generator
) -> None:
    def fn(x: cg.DeviceArray, **params: cg.DeviceArray) -> cg.DeviceArray:
        out = cg.ops.copy(cg.empty_like(x), x)
        for p in params.values():
            cg.ops.axpy(1.0, p, out)
        return out

    wh, bh, eh, xh = (random_array(rng, 6, "float32") for _ in range(4))
    m = cg.GraphModule(fn, params={"w": cg.asarray(wh)}, device=dev)
    for _ in range(3):
        _check(m, xh, xh + wh)
    assert m.params is not None
    m.params["b"] = cg.asarray(bh)
    with pytest.raises(cg.StaleParameterError, match="'b' were added"):
        m(cg.asarray(xh))
    m.refresh()
    _check(m, xh, xh + wh + bh)
    m.params = {**m.params, "e": cg.asarray(eh)}  # a new dict
    with pytest.raises(cg.StaleParameterError, match="'e' were added"):
        m(cg.asarray(xh))
    m.refresh()
    _check(m, xh, xh + wh + bh + eh)


def test_graph_module_needs_something_to_run() -> None:
    with pytest.raises(TypeError, match="compute"):
        cg.GraphModule()
    with pytest.raises(TypeError, match="callable"):
        cg.GraphModule(3)
    with pytest.raises(TypeError, match="params"):
        cg.GraphModule(affine, params=[1])  # type: ignore[arg-type]


# graph pools ----------------------------------------------------------------------------------
def test_pool_reuses_freed_ranges_by_best_fit_and_merges_neighbours(dev: cg.Device) -> None:
    pool = cg.GraphPool(dev)
    pool.acquire()
    try:
        a = pool.allocate(4096)
        b = pool.allocate(4096)
        reserved = pool.reserved
        pool.release(a, None)
        pool.release(b, None)
        c = pool.allocate(3000)  # fits in a freed range: no new segment
        assert pool.reserved == reserved
        assert c in (a, b)
        pool.release(c, None)
    finally:
        pool.drop([])


def test_rebind_and_repoint_refuse_arrays_used_inside_conditional_bodies(dev: cg.Device) -> None:
    x, y = cg.ones(8, "float32", device=dev), cg.zeros(8, "float32", device=dev)
    flag = cg.ones(1, "int32", device=dev)
    with cg.capture() as g:
        cg.ops.scale(2.0, x, y)
        cond = g.condition()
        cg.ops.set_condition(cond, flag)
        with g.if_then(cond):
            cg.ops.axpy(1.0, x, y)  # x used inside the body too
    x2 = cg.full(8, 5.0, "float32", device=dev)
    for change in (g.rebind, g.repoint):
        with pytest.raises(cg.UpdateError, match="conditional body"):
            change(x, x2)
    g.replay()  # unchanged
    np.testing.assert_array_equal(y.get(), np.full(8, 3.0, "float32"))


def test_rebind_refuses_an_array_another_librarys_node_uses_and_repoint_moves_it(
    dev: cg.Device, rng: np.random.Generator
) -> None:
    needs_matmul(dev)
    a_h, b_h = random_array(rng, (4, 4), "float32"), random_array(rng, (4, 4), "float32")
    a, b = cg.asarray(a_h), cg.asarray(b_h)
    y, out = cg.zeros((4, 4), "float32", device=dev), cg.zeros((4, 4), "float32", device=dev)
    with cg.capture() as g:
        cg.ops.scale(2.0, a, y)  # recorded by cudagraphs
        cg.ops.matmul(a, b, out=out)  # the library's node
    a2_h, a3_h = random_array(rng, (4, 4), "float32"), random_array(rng, (4, 4), "float32")
    a2, a3 = cg.asarray(a2_h), cg.asarray(a3_h)
    with pytest.raises(cg.UpdateError, match="use repoint"):
        g.rebind(a, a2)
    assert g.repoint(a, a2) == 2
    assert g.repoint(a2, a3) == 2  # moves compose: the library's node follows
    del a2, a3
    gc.collect()
    g.replay()
    np.testing.assert_allclose(y.get(), 2 * a3_h, rtol=1e-6)
    np.testing.assert_allclose(out.get(), a3_h @ b_h, rtol=1e-4, atol=1e-5)


def test_graph_module_repoints_library_nodes_without_capturing_again(
    dev: cg.Device, rng: np.random.Generator
) -> None:
    needs_matmul(dev)
    w_h, w2_h = random_array(rng, (8, 8), "float32"), random_array(rng, (8, 8), "float32")
    m = cg.GraphModule(lambda x, *, w: cg.ops.matmul(x, w), params={"w": cg.asarray(w_h)}, device=dev)
    x_h = random_array(rng, (3, 8), "float32")
    np.testing.assert_allclose(m(cg.asarray(x_h)).get(), x_h @ w_h, rtol=1e-4, atol=1e-5)
    assert m.params is not None
    m.params["w"] = cg.asarray(w2_h)
    assert m.refresh() == {"replaced": 1, "added": 0, "repointed": 1, "recaptured": 0}
    np.testing.assert_allclose(m(cg.asarray(x_h)).get(), x_h @ w2_h, rtol=1e-4, atol=1e-5)
    assert m.graphed.stats()["captures"] == 1


def test_another_librarys_array_is_let_go_only_outside_captures(dev: cg.Device) -> None:
    import weakref

    base = cg.zeros(16, "float32", device=dev)
    foreign = FakeForeign(base)
    alive = weakref.ref(foreign)
    view = cg.asarray(foreign)
    del foreign
    with cg.capture() as g:
        cg.ops.scale(2.0, base, base)
        del view
        gc.collect()
        cg.empty(4, "float32")  # an allocation: a safe point where dead blocks are released
        assert alive() is not None  # its free may call the driver: not during a capture
    g.close()
    settle(dev)  # (a safe point where dead blocks are released, the device idle)
    assert alive() is None


def test_the_fast_path_and_the_general_one_find_the_same_graph(
    dev: cg.Device, rng: np.random.Generator
) -> None:
    f = cg.graphed(affine, buckets=[4], device=dev)
    x_h, y_h = random_array(rng, (3, 2), "float32"), random_array(rng, (3, 2), "float32")
    x, y = cg.asarray(x_h), cg.asarray(y_h)
    f.capture_all(x, y)  # the general path (capture_all flattens every argument)
    out = f(x, y)  # positional arrays: the fast path
    np.testing.assert_allclose(out["out"].get(), 2 * x_h + y_h, rtol=1e-6)
    np.testing.assert_allclose(f(x, y=y)["sum"].get(), x_h + y_h, rtol=1e-6)  # a keyword: general
    assert f.stats()["captures"] == 2  # (a keyword argument is another key)
    assert f.stats()["misses"] == 1


def test_capture_all_waits_for_the_previous_calls_stream(dev: cg.Device) -> None:
    """capture_all fills the static buffers too: after the previous call's replay, on any stream."""
    for seed in range(8 if cg.backend() == "sim" else 2):
        if cg.backend() == "sim":
            dev.backend.reseed(seed)  # (a missing wait shows under some interleavings)
        f = cg.graphed(lambda u: cg.ops.scale(2.0, u), buckets=(8, 16), copy_outputs=True)
        x, y = cg.asarray(np.arange(16.0)), cg.asarray(-np.arange(16.0) - 100)
        a, b = dev.create_stream(), dev.create_stream()
        with a:
            out = f(x)
        with b:
            f.capture_all(y)
        dev.synchronize()
        np.testing.assert_array_equal(out.get(), 2 * np.arange(16.0), err_msg=f"seed {seed}")


# inputs copied by the graph itself ---------------------------------------------------------
def test_the_graph_copies_its_inputs_and_follows_their_address(
    dev: cg.Device, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No copy is queued per call: the graph's copy nodes read the input, re-pointed when it moves."""
    f = cg.graphed(affine, device=dev)
    xh, yh = random_array(rng, (64, 3), "float32"), random_array(rng, (64, 3), "float32")
    x, y = cg.asarray(xh), cg.asarray(yh)
    f(x, y)  # the capture
    (graph,) = f.graphs.values()
    assert [n.type for n in graph.nodes][:2] == ["memcpy", "memcpy"]
    backend = dev.backend
    queued, pointed = [], []
    memcpy, update = backend.memcpy, backend.graph_update
    monkeypatch.setattr(backend, "memcpy", lambda *a: queued.append(a) or memcpy(*a))
    monkeypatch.setattr(backend, "graph_update", lambda *a: pointed.append(a) or update(*a))
    for _ in range(3):  # the same arrays, new values in place: nothing to change
        xh, yh = random_array(rng, (64, 3), "float32"), random_array(rng, (64, 3), "float32")
        x.set(xh)
        y.set(yh)
        out = f(x, y)
        np.testing.assert_allclose(out["out"].get(), 2 * xh + yh, rtol=1e-6)
        np.testing.assert_allclose(out["sum"].get(), xh + yh, rtol=1e-6)
    assert not pointed
    for _ in range(3):  # new arrays each call: each node is pointed at its input
        xh, yh = random_array(rng, (64, 3), "float32"), random_array(rng, (64, 3), "float32")
        out = f(cg.asarray(xh), cg.asarray(yh))
        np.testing.assert_allclose(out["out"].get(), 2 * xh + yh, rtol=1e-6)
        np.testing.assert_allclose(out["sum"].get(), xh + yh, rtol=1e-6)
    assert len(pointed) == 6
    assert all(type(p[2]).__name__ == "Copy" for p in pointed)
    statics = {a.ptr for a in f._entries[next(iter(f._entries))].static}
    assert not [a for a in queued if a[1].dst in statics]  # no input copy was queued by a call


def test_a_direct_replay_reads_the_last_input_which_is_kept_alive(
    dev: cg.Device, rng: np.random.Generator
) -> None:
    import weakref

    f = cg.graphed(lambda a: cg.ops.scale(3.0, a), device=dev)
    f(cg.asarray(random_array(rng, 32, "float32")))
    xh = random_array(rng, 32, "float32")
    x = cg.asarray(xh)
    out = f(x)
    np.testing.assert_allclose(out.get(), 3 * xh, rtol=1e-6)
    alive = weakref.ref(x)
    static_out = f._entries[next(iter(f._entries))].outs[0]
    del x, out
    gc.collect()
    assert alive() is not None  # the graph's copy node reads it
    static_out.set(np.full(32, np.nan, np.float32))  # poisoned
    (graph,) = f.graphs.values()
    graph.replay(dev.current_stream())  # (in order after the poisoning)
    np.testing.assert_allclose(static_out.get(), 3 * xh, rtol=1e-6)
    f(cg.asarray(random_array(rng, 32, "float32")))  # the next input takes its place
    settle(dev)
    assert alive() is None


def test_strided_inputs_are_copied_dense_first(dev: cg.Device, rng: np.random.Generator) -> None:
    f = cg.graphed(lambda a: cg.ops.scale(2.0, a), device=dev)
    xh = random_array(rng, (8, 6), "float32")
    f(cg.asarray(xh))
    wide = random_array(rng, (8, 12), "float32")
    out = f(cg.asarray(wide)[:, ::2])  # same shape and dtype, not dense
    np.testing.assert_allclose(out.get(), 2 * wide[:, ::2], rtol=1e-6)
    xh2 = random_array(rng, (8, 6), "float32")
    out = f(cg.asarray(xh2))
    np.testing.assert_allclose(out.get(), 2 * xh2, rtol=1e-6)


def test_inside_another_capture_the_call_uses_a_graph_without_input_nodes(
    dev: cg.Device, rng: np.random.Generator
) -> None:
    """An embedded graph replays its captured graph, which node changes do not reach."""
    f = cg.graphed(lambda a: cg.ops.scale(2.0, a), device=dev)
    xh = random_array(rng, 16, "float32")
    x = cg.asarray(xh)
    f(cg.asarray(random_array(rng, 16, "float32")))
    f(x)  # the eager graph's node now reads x
    s = dev.create_stream()
    out = cg.zeros(16, "float32", stream=s)
    dev.synchronize()  # (x was made on another stream)
    with cg.capture(stream=s) as outer:
        with s:  # (the callable replays on the current stream)
            r = f(x)
        cg.ops.copy(out, r, stream=s)
    assert len(f._entries) == 2
    assert len(f.graphs) == 2
    assert sorted(n.type for n in outer.nodes) == ["child", "memcpy", "memcpy"]  # no warmup recorded
    out.set(np.full(16, np.nan, np.float32), stream=s)  # poisoned, in order before the replay
    outer.replay()
    np.testing.assert_allclose(out.get(stream=s), 2 * xh, rtol=1e-6)
    s.close()


def test_a_function_that_queues_nothing_returns_what_it_returns(
    dev: cg.Device, rng: np.random.Generator
) -> None:
    """Issue 26, item 6: a zero-size batch without buckets (its capture records nothing)."""
    f = cg.graphed(lambda x: cg.ops.scale(2.0, x), device=dev)
    for _ in range(3):
        out = f(cg.zeros((0, 4), "float32"))
        assert out.shape == (0, 4)
        assert out.get().shape == (0, 4)
    x_h = random_array(rng, (3, 4), "float32")
    np.testing.assert_allclose(f(cg.asarray(x_h)).get(), 2 * x_h, rtol=1e-6)  # other shapes: graphs
    assert len(f.graphs) == 1
    stats = f.stats()
    assert stats["calls"] == 4
    (only,) = stats["graphs"].values()
    assert only["nodes"] > 0
    f.close()
