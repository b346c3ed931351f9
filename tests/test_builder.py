"""GraphBuilder: explicit nodes and dependencies, on both backends."""

from __future__ import annotations

import gc
import re

import numpy as np
import pytest
from conftest import random_array

import cudagraphs as cg

F32 = np.dtype("float32")


def add_kernel() -> cg.Kernel:
    return cg.ops.elementwise_kernel("cg_add", F32)


def test_dag_with_roots_and_joins(dev: cg.Device, rng: np.random.Generator) -> None:
    a_h, b_h = random_array(rng, 300, "float32"), random_array(rng, 300, "float32")
    a, b_in = cg.asarray(a_h), cg.asarray(b_h)
    x, y, out = cg.zeros(300, "float32"), cg.zeros(300, "float32"), cg.zeros(300, "float32")
    bld = cg.GraphBuilder()
    n1 = bld.memcpy(x, a)  # two roots
    n2 = bld.memcpy(y, b_in)
    n3 = bld.launch(add_kernel(), 2, 256, out, x, y, 300, after=[n1, n2])
    n4 = bld.fill(x, 0.0, after=[n3])
    g = bld.instantiate()
    assert bld.state == "instantiated"
    assert sorted(n.type for n in g.nodes) == ["kernel", "kernel", "memcpy", "memcpy"]
    kinds = {n.type for n in (n1, n2, n3, n4)}
    assert kinds == {"memcpy", "kernel"}
    edges = g.edges
    assert len(edges) == 3
    assert len({b for _, b in edges if _ is not None}) == 2
    g.replay()
    np.testing.assert_array_equal(out.get(), a_h + b_h)
    assert np.all(x.get() == 0)


def test_host_node_runs_in_order_every_replay(dev: cg.Device) -> None:
    seen: list[float] = []
    x = cg.zeros(1, "float32")
    slot = cg.HostSlot(1, "float32")
    bld = cg.GraphBuilder()
    n1 = bld.fill(x, 5.0)
    n2 = bld.memcpy(slot, x, after=[n1])
    bld.host(lambda: seen.append(float(slot.array[0])), after=[n2])
    g = bld.instantiate()
    assert "host" in [n.type for n in g.nodes]
    for _ in range(3):
        g.replay()
    dev.synchronize()
    assert seen == [5.0, 5.0, 5.0]


def test_child_graph_node(dev: cg.Device, rng: np.random.Generator) -> None:
    v_h = random_array(rng, 64, "float32")
    v = cg.asarray(v_h)
    inner = cg.capture(lambda: cg.ops.scale(2.0, v, out=v))
    bld = cg.GraphBuilder()
    first = bld.child(inner)
    bld.child(inner, after=[first])
    g = bld.instantiate()
    assert [n.type for n in g.nodes].count("child") == 2
    del inner
    gc.collect()  # the parent keeps the child graph's inputs alive
    g.replay()
    np.testing.assert_allclose(v.get(), 4 * v_h, rtol=1e-6)


def test_event_nodes(dev: cg.Device) -> None:
    ev = cg.Event(dev)
    x = cg.zeros(4, "float32")
    bld = cg.GraphBuilder()
    n1 = bld.fill(x, 1.0)
    rec = bld.event_record(ev, after=[n1])
    bld.event_wait(ev, after=[rec])
    g = bld.instantiate()
    types = [n.type for n in g.nodes]
    assert "event_record" in types
    assert "event_wait" in types
    g.replay()
    ev.synchronize()
    assert ev.query()
    assert np.all(x.get() == 1)


def test_alloc_and_free_nodes(dev: cg.Device, rng: np.random.Generator) -> None:
    a_h = random_array(rng, 128, "float32")
    a, out = cg.asarray(a_h), cg.zeros(128, "float32")
    bld = cg.GraphBuilder()
    t, n_alloc = bld.alloc(128, "float32")
    n1 = bld.memcpy(t, a, after=[n_alloc])
    n2 = bld.launch(add_kernel(), 1, 256, out, t, t, 128, after=[n1])
    bld.free(t, after=[n2])
    g = bld.instantiate()
    types = [n.type for n in g.nodes]
    assert "mem_alloc" in types
    assert "mem_free" in types
    g.replay()
    g.replay()
    np.testing.assert_array_equal(out.get(), 2 * a_h)
    bld2 = cg.GraphBuilder()
    kept, _ = bld2.alloc(16, "float32")  # never freed, still referenced
    with pytest.raises(cg.CaptureError, match="still alive at the end of the capture"):
        bld2.instantiate()
    del kept


def test_memset_and_host_data(dev: cg.Device) -> None:
    x = cg.full(8, 7, "int32")
    data = np.arange(8, dtype=np.int32)
    y = cg.zeros(8, "int32")
    bld = cg.GraphBuilder()
    bld.memset(x, 0)
    bld.memcpy(y, data)  # a snapshot, taken now
    data[:] = -1
    g = bld.instantiate()
    g.replay()
    assert np.all(x.get() == 0)
    assert y.get().tolist() == list(range(8))


def test_while_loop_in_a_builder(dev: cg.Device) -> None:
    remaining, count = cg.full(1, 5, "int32"), cg.zeros(1, "float32")
    minus, one = cg.full(1, -1, "int32"), cg.ones(1, "float32")
    bld = cg.GraphBuilder()
    cond = bld.condition()
    setter = bld.launch(
        cg.ops.condition_kernel("cg_set_condition_index", np.dtype("int32")), 1, 1, cond.handle, remaining
    )
    body = bld.while_loop(cond, after=[setter])
    with body:
        s = body.stream
        cg.ops.add(count, one, out=count, stream=s)
        cg.ops.add(remaining, minus, out=remaining, stream=s)
        cg.ops.set_condition(cond, remaining, stream=s)
    assert body.node.type == "conditional"
    g = bld.instantiate()
    g.replay()
    assert count.get()[0] == 5


def test_ops_with_no_stream_in_a_builders_body_land_in_the_body(
    dev: cg.Device, rng: np.random.Generator
) -> None:
    """Issue 26 item 5: as in cg.capture, ``with b.if_then(c): op(...)`` records op in the body.

    It used to run op at build time, on the device's stream, and leave the body empty.
    """
    data = random_array(rng, 64, "float32")
    x, out = cg.asarray(data), cg.full(64, np.nan, "float32")
    flag = cg.zeros(1, "int32")
    bld = cg.GraphBuilder()
    cond = bld.condition()
    set_flag = cg.ops.condition_kernel("cg_set_condition", np.dtype("int32"))
    setter = bld.launch(set_flag, 1, 1, cond.handle, flag)
    then, otherwise = bld.if_else(cond, after=[setter])
    with then:
        cg.ops.scale(2.0, x, out=out)  # no stream=: the body's
    with otherwise:
        cg.ops.scale(-3.0, x, out=out)
        assert cg.current_stream() is otherwise.stream
    assert cg.current_stream() is dev.stream  # (restored after the block)
    assert np.isnan(out.get()).all()  # nothing ran while building
    g = bld.instantiate()
    g.replay()
    np.testing.assert_allclose(out.get(), -3 * data, rtol=1e-6)
    flag.set(np.ones(1, np.int32))
    cg.ops.fill(out, np.nan)
    g.replay()
    np.testing.assert_allclose(out.get(), 2 * data, rtol=1e-6)


def test_an_empty_while_body_in_a_builder_is_refused(dev: cg.Device) -> None:
    """Issue 26 item 5: a loop body whose work went elsewhere would spin forever: refused."""
    x = cg.zeros(4, "float32")
    other = dev.create_stream()
    bld = cg.GraphBuilder()
    cond = bld.condition(default=1)
    with pytest.raises(cg.CaptureError, match="while body 0 recorded no work"), bld.while_loop(cond):
        cg.ops.fill(x, 1.0, stream=other)  # (not the body's stream: runs now, eagerly)
    with pytest.raises(cg.CaptureInvalidatedError, match="recorded no work"):
        bld.instantiate()
    assert cg.capture_status(dev.stream) == "none"
    assert not dev.captures
    other.synchronize()
    other.close()


def test_misuse_and_abandoning(dev: cg.Device) -> None:
    gc.collect()
    before = dev.allocator.stats()
    x = cg.zeros(4, "float32")
    other = cg.GraphBuilder()
    foreign = other.fill(x, 1.0)
    bld = cg.GraphBuilder()
    with pytest.raises(TypeError, match="after= takes nodes of this builder"):
        bld.fill(x, 2.0, after=[foreign])
    with pytest.raises(ValueError, match="recorded no node"):
        bld.fill(cg.zeros(0, "float32"), 1.0)
    with pytest.raises(ValueError, match=re.escape("value must be in 0..255")):
        bld.memset(x, 300)
    with pytest.raises(ValueError, match="made by this builder's alloc"):
        bld.free(x)
    with pytest.raises(TypeError, match="host needs a callable"):
        bld.host(3)
    t = bld.launch(add_kernel(), 1, 4, x, x, x, 4)
    scratch = cg.ops.scale(2.0, x, stream=bld.stream)  # pool memory of the builder's graph
    del scratch, t
    bld.close()
    bld.close()
    with pytest.raises(RuntimeError, match="this builder is closed"):
        bld.fill(x, 1.0)
    other.close()
    del x, foreign
    gc.collect()
    assert dev.allocator.stats().in_use == before.in_use
    assert cg.capture_status(dev.stream) == "none"
    assert not dev.captures


def test_dropped_builder_ends_its_capture(dev: cg.Device) -> None:
    x = cg.zeros(4, "float32")
    bld = cg.GraphBuilder()
    bld.fill(x, 1.0)
    stream = bld.stream
    assert cg.capture_status(stream) == "active"
    del bld
    gc.collect()
    assert cg.capture_status(stream) == "none"
    assert not dev.captures
    assert np.all(x.get() == 0)  # the abandoned graph never ran


def test_event_record_node_keeps_its_event(dev: cg.Device) -> None:
    x = cg.zeros(16, "float32")
    bld = cg.GraphBuilder()
    first = bld.fill(x, 1.0)
    bld.event_record(cg.Event(dev), after=[first])  # only the graph holds the event
    g = bld.instantiate()
    del bld
    gc.collect()
    dev.synchronize()
    g.replay()
    g.replay()
    np.testing.assert_array_equal(x.get(), np.ones(16))
    g.close()


def test_memset_node_keeps_its_array(dev: cg.Device) -> None:
    x = cg.full(256, 3.0, "float32")
    bld = cg.GraphBuilder()
    bld.memset(x, 0)
    g = bld.instantiate()
    del bld, x
    gc.collect()
    dev.synchronize()
    z = cg.full(256, 5.0, "float32")  # would take x's memory, were it freed
    g.replay()
    np.testing.assert_array_equal(z.get(), np.full(256, 5.0))  # the memset did not hit z
    g.close()
