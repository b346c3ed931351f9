"""Whole-graph update: new parameters without re-instantiating, clear refusals."""

from __future__ import annotations

import gc
from typing import NamedTuple

import numpy as np
import pytest
from conftest import random_array

import cudagraphs as cg


def axpy_graph(alpha: float, x: cg.DeviceArray, y: cg.DeviceArray, **kw: object) -> cg.Graph:
    return cg.capture(lambda: cg.ops.axpy(alpha, x, y), **kw)


def test_update_repoints_arrays_and_scalars(dev: cg.Device, rng: np.random.Generator) -> None:
    x1_h, x2_h = random_array(rng, 500, "float32"), random_array(rng, 500, "float32")
    x1, y1 = cg.asarray(x1_h), cg.zeros(500, "float32")
    x2, y2 = cg.asarray(x2_h), cg.zeros(500, "float32")
    g = axpy_graph(2.0, x1, y1)
    g.replay()
    source = axpy_graph(3.0, x2, y2, instantiate=False)
    assert source.state == "captured"
    with pytest.raises(RuntimeError, match=r"call g\.instantiate\(\) first"):
        source.replay()
    assert g.update(source) is g
    assert source.state == "consumed"
    with pytest.raises(RuntimeError, match="this graph is consumed"):
        source.replay()
    del x2, source
    gc.collect()  # the updated graph keeps the source's inputs alive
    g.replay()
    g.replay()
    np.testing.assert_allclose(y1.get(), 2 * x1_h, rtol=1e-6)  # untouched since the update
    np.testing.assert_allclose(y2.get(), 6 * x2_h, rtol=1e-6)
    assert [n.name for n in g.nodes] == ["cg_axpy"]
    g.close()


def test_update_takes_over_the_source_pool(dev: cg.Device, rng: np.random.Generator) -> None:
    gc.collect()
    before = dev.allocator.stats()
    x_h = random_array(rng, 300, "float32")
    x, out = cg.asarray(x_h), cg.zeros(300, "float32")

    def step(alpha: float, x: cg.DeviceArray, out: cg.DeviceArray) -> None:
        t = cg.ops.scale(alpha, x)  # pool memory of the capturing graph
        cg.ops.add(t, x, out=out)

    g = cg.capture(step, 2.0, x, out)
    g.update(cg.capture(step, 5.0, x, out, instantiate=False))
    gc.collect()
    g.replay()
    np.testing.assert_allclose(out.get(), 6 * x_h, rtol=1e-6)
    g.close()
    del x, out
    gc.collect()
    assert dev.allocator.stats().in_use == before.in_use


def test_instantiate_a_captured_graph(dev: cg.Device) -> None:
    x = cg.ones(10, "float32")
    g = cg.capture(lambda: cg.ops.scale(4.0, x, out=x), instantiate=False)
    assert g.nodes[0].type == "kernel"
    g.instantiate().replay()
    assert np.all(x.get() == 4)
    with pytest.raises(RuntimeError, match="only a captured graph can be instantiated"):
        g.instantiate()


MISMATCHES = {
    "node count": (
        lambda x, y: [cg.ops.axpy(2.0, x, y), cg.ops.axpy(2.0, x, y)],
        r"the topology changed: this graph recorded 1 nodes, the source 2",
        1,
    ),
    "kernel": (
        lambda x, y: cg.ops.scale(2.0, x, out=y),
        r"node 0 runs kernel 'cg_axpy' in this graph and 'cg_scale' in the source",
        0,
    ),
    "node type": (
        lambda x, y: cg.ops.copy(y, x),
        r"node 0 is a kernel node in this graph and a memcpy node in the source",
        0,
    ),
}


@pytest.mark.parametrize("case", MISMATCHES)
def test_mismatches_raise_and_leave_the_graph_working(
    dev: cg.Device, rng: np.random.Generator, case: str
) -> None:
    build, message, node = MISMATCHES[case]
    x_h = random_array(rng, 64, "float32")
    x, y = cg.asarray(x_h), cg.zeros(64, "float32")
    g = axpy_graph(2.0, x, y)
    source = cg.capture(build, x, cg.zeros(64, "float32"), instantiate=False)
    with pytest.raises(cg.UpdateError, match=message) as info:
        g.update(source)
    assert info.value.node == node
    assert source.state == "captured"  # not consumed by a failed update
    g.replay()
    np.testing.assert_allclose(y.get(), 2 * x_h, rtol=1e-6)
    g.close()
    source.close()


def test_driver_refusal_is_an_update_error(dev: cg.Device) -> None:
    """Differences cudagraphs did not trace (e.g. other libraries' nodes) reach the driver."""
    x, y = cg.ones(16, "float32"), cg.zeros(16, "float32")
    g = axpy_graph(2.0, x, y)
    source = cg.capture(lambda: [cg.ops.axpy(1.0, x, y), cg.ops.axpy(1.0, x, y)], instantiate=False)
    source._records = source._records[:1]  # as if the second node came from another library
    with pytest.raises(cg.UpdateError, match="topology changed") as info:
        g.update(source)
    assert info.value.node == 1
    assert "graph update refused" in str(info.value)
    g.replay()
    assert np.all(y.get() == 2)
    g.close()
    source.close()


def test_update_refuses_a_source_with_other_edges(dev: cg.Device, rng: np.random.Generator) -> None:
    """The same nodes, but independent in the source: cuGraphExecUpdate refuses, so does sim."""
    x_h = random_array(rng, 64, "float32")
    x, y, z = cg.asarray(x_h), cg.zeros(64, "float32"), cg.zeros(64, "float32")
    g = cg.capture(lambda: [cg.ops.axpy(2.0, x, y), cg.ops.axpy(3.0, x, z)])  # node 0 -> node 1
    assert g.edges == [(0, 1)]
    side = dev.create_stream()
    with cg.capture(instantiate=False) as source:  # the same two kernels on two streams
        side.wait(dev.stream)
        cg.ops.axpy(2.0, x, y)
        cg.ops.axpy(3.0, x, z, stream=side)
        dev.stream.wait(side)
    assert [n.type for n in source.nodes] == [n.type for n in g.nodes]
    assert source.edges == []
    with pytest.raises(cg.UpdateError, match=r"the topology changed: node 1 depends on nodes \[0\]") as info:
        g.update(source)
    assert info.value.node == 1
    assert source.state == "captured"
    g.replay()  # unchanged
    np.testing.assert_allclose(y.get(), 2 * x_h, rtol=1e-6)
    np.testing.assert_allclose(z.get(), 3 * x_h, rtol=1e-6)
    g.close()
    source.close()
    side.close()


def test_update_refuses_a_copy_that_changes_direction(dev: cg.Device, rng: np.random.Generator) -> None:
    """A host-to-device copy node cannot become a device-to-host one (cuGraphExecUpdate refuses)."""
    x_h = random_array(rng, 32, "float32")
    slot, x = cg.HostSlot(32, "float32"), cg.zeros(32, "float32")
    g = cg.capture(lambda: slot.copy_to(x))
    source = cg.capture(lambda: slot.copy_from(x), instantiate=False)
    assert [n.type for n in source.nodes] == [n.type for n in g.nodes] == ["memcpy"]
    with pytest.raises(cg.UpdateError, match=r"cannot update in place .* host-to-device") as info:
        g.update(source)
    assert info.value.node is None
    slot.array[...] = x_h
    g.replay()  # still the upload
    np.testing.assert_array_equal(x.get(), x_h)
    g.close()
    source.close()


def test_update_argument_errors(dev: cg.Device) -> None:
    x = cg.ones(4, "float32")
    g = cg.capture(lambda: cg.ops.scale(1.0, x, out=x))
    with pytest.raises(TypeError, match="update takes a cudagraphs Graph"):
        g.update("graph")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="from itself"):
        g.update(g)
    other = cg.capture(lambda: cg.ops.scale(1.0, x, out=x))
    other.close()
    with pytest.raises(RuntimeError, match="the source graph is closed"):
        g.update(other)


def test_rebind_repoints_inputs_and_outputs(dev: cg.Device, rng: np.random.Generator) -> None:
    x1_h, x2_h = random_array(rng, 200, "float32"), random_array(rng, 200, "float32")
    x1, x2 = cg.asarray(x1_h), cg.asarray(x2_h)
    y1, y2 = cg.zeros(200, "float32"), cg.zeros(200, "float32")

    def step() -> None:
        cg.ops.axpy(2.0, x1, y1)
        cg.ops.axpy(1.0, x1, y1)  # x1 used by two nodes

    g = cg.capture(step)
    assert g.rebind(x1, x2) is g
    assert g.rebind(y1, y2) is g
    del x2
    gc.collect()  # the graph keeps the new input alive
    z = cg.full(200, 100.0, "float32")  # would take x2's memory, were it freed
    g.replay()
    del z
    np.testing.assert_array_equal(y1.get(), np.zeros(200, np.float32))
    np.testing.assert_allclose(y2.get(), 3 * x2_h, rtol=1e-6)
    g.close()


def test_set_arg_changes_kernel_scalars(dev: cg.Device, rng: np.random.Generator) -> None:
    src = (
        'extern "C" __global__ void sax(float* y, const float* x, float a, int n) {'
        " int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = a * x[i]; }"
    )
    k = cg.Kernel(src, "sax", host=lambda y, x, a, n: np.multiply(a, x[:n], out=y[:n]))
    cg.preload([k], dev)
    x_h = random_array(rng, 100, "float32")
    x, y = cg.asarray(x_h), cg.zeros(100, "float32")
    g = cg.capture(lambda: k.launch(1, 128, y, x, 2.0, 100))
    g.set_arg(0, "a", 0.5)
    g.replay()
    np.testing.assert_allclose(y.get(), 0.5 * x_h, rtol=1e-6)
    g.set_arg(0, 3, 10)  # only the first 10 elements now
    cg.ops.fill(y, -1.0)
    g.replay()
    expect = np.full(100, -1.0, np.float32)
    expect[:10] = 0.5 * x_h[:10]
    np.testing.assert_allclose(y.get(), expect, rtol=1e-6)
    with pytest.raises(TypeError, match="'n' is int32: expected an integer"):
        g.set_arg(0, "n", 1.5)
    with pytest.raises(ValueError, match=r"has parameters \['y', 'x', 'a', 'n'\], got 'b'"):
        g.set_arg(0, "b", 1.0)
    with pytest.raises(IndexError, match="node 3 is not one of"):
        g.set_arg(3, "a", 1.0)
    g.close()


def test_rebind_repoints_device_copies(dev: cg.Device, rng: np.random.Generator) -> None:
    a_h, b_h = random_array(rng, 40, "float32"), random_array(rng, 40, "float32")
    a, b, out1, out2 = cg.asarray(a_h), cg.asarray(b_h), cg.zeros(40, "float32"), cg.zeros(40, "float32")
    g = cg.capture(lambda: cg.ops.copy(out1, a))
    assert g.nodes[0].type == "memcpy"
    g.rebind(a, b).rebind(out1, out2)
    g.replay()
    np.testing.assert_array_equal(out2.get(), b_h)
    assert np.all(out1.get() == 0)
    with pytest.raises(cg.UpdateError, match="node 0 is a memcpy node, not a kernel"):
        g.set_arg(0, 0, 1)
    g.close()


def test_rebind_refusals(dev: cg.Device) -> None:
    x, y = cg.ones(32, "float32"), cg.zeros(32, "float32")
    slot = cg.HostSlot(32, "float32")

    def step() -> None:
        cg.ops.axpy(2.0, x, y)
        slot.copy_from(y)  # a device-to-host copy node using y

    g = cg.capture(step)
    with pytest.raises(ValueError, match="new must match old"):
        g.rebind(x, cg.ones(16, "float32"))
    with pytest.raises(ValueError, match="does not use that array"):
        g.rebind(cg.ones(32, "float32"), cg.ones(32, "float32"))
    with pytest.raises(
        cg.UpdateError, match=r"node 1 \(memcpy\) uses the array, and only kernel and device-copy"
    ) as info:
        g.rebind(y, cg.zeros(32, "float32"))
    assert info.value.node == 1
    with pytest.raises(TypeError, match="must be a DeviceArray"):
        g.rebind(x, 3)
    g.replay()  # unchanged by the refusals
    dev.synchronize()
    assert np.all(slot.array == 2)
    g.close()


def test_node_changes_refuse_a_graph_embedding_another(dev: cg.Device, rng: np.random.Generator) -> None:
    # a graph replayed inside a capture is a child node the driver copied: what it uses cannot
    # be changed node by node (a repoint that skipped it would leave it on the old memory)
    x_h, z_h = random_array(rng, 64, "float32"), random_array(rng, 64, "float32")
    x, y, z, w = cg.asarray(x_h), cg.zeros(64, "float32"), cg.asarray(z_h), cg.zeros(64, "float32")
    inner = cg.capture(lambda: cg.ops.add(z, z, out=w))

    def step() -> None:
        cg.ops.add(x, x, out=y)
        inner.replay()

    g = cg.capture(step)
    assert [n.type for n in g.nodes] == ["kernel", "child"]
    for change in (
        lambda: g.repoint(w, cg.zeros(64, "float32")),
        lambda: g.rebind(x, cg.zeros(64, "float32")),
    ):
        with pytest.raises(cg.UpdateError, match=r"node 1 \(a child node, .*\) may use the memory") as info:
            change()
        assert info.value.node == 1
    g.replay()  # unchanged by the refusals
    np.testing.assert_allclose(y.get(), 2 * x_h, rtol=1e-6)
    np.testing.assert_allclose(w.get(), 2 * z_h, rtol=1e-6)
    g.close()
    inner.close()


def test_repoint_onto_the_same_memory_changes_nothing_and_counts_its_users(
    dev: cg.Device, rng: np.random.Generator
) -> None:
    x_h = random_array(rng, 64, "float32")
    x, y, z = cg.asarray(x_h), cg.zeros(64, "float32"), cg.zeros(64, "float32")

    def step() -> None:
        cg.ops.add(x, x, out=y)  # a kernel node reads x
        cg.ops.copy(z, x)  # a device copy node reads it

    g = cg.capture(step)
    assert g.repoint(x, x) == 2  # a no-op: the nodes that read x, nothing changed
    assert g.repoint(x, x[:]) == 2  # another view of the same memory: the same
    assert g.rebind(x, x) is g
    with pytest.raises(ValueError, match="no node of this graph uses that memory"):
        g.repoint(y[:0], y[:0])
    x2_h = random_array(rng, 64, "float32")
    assert g.repoint(x, cg.asarray(x2_h)) == 2  # the same count when it moves
    for out in (y, z):
        out.set(np.full(64, np.nan, "float32"))
    g.replay()
    np.testing.assert_allclose(y.get(), 2 * x2_h, rtol=1e-6)
    np.testing.assert_array_equal(z.get(), x2_h)
    g.close()


def test_repoint_refuses_a_node_that_reads_more_than_the_memory_moved(
    dev: cg.Device, rng: np.random.Generator
) -> None:
    w_h = random_array(rng, 64, "float32")
    w, y = cg.asarray(w_h), cg.zeros(64, "float32")
    g = cg.capture(lambda: cg.ops.scale(2.0, w, y))
    # the node reads all of w: moving its first half alone would make it read past the new array
    with pytest.raises(cg.UpdateError, match=r"node 0 \(kernel\) reads memory of which only a part"):
        g.repoint(w[:32], cg.zeros(32, "float32"))
    y.set(np.full(64, np.nan, "float32"))
    g.replay()  # unchanged
    np.testing.assert_allclose(y.get(), 2 * w_h, rtol=1e-6)
    g.close()


class _TwoDevices(NamedTuple):
    """A graph of ``y = 2 * x`` on the first of two devices, and ``x``'s values on the second."""

    g: cg.Graph
    x: cg.DeviceArray
    y: cg.DeviceArray
    x_h: np.ndarray
    there: cg.DeviceArray
    stream: cg.Stream
    here: str
    far: str

    def replays_unchanged(self) -> None:
        self.y.set(np.full(16, np.nan, "float32"))
        self.g.replay(self.stream)
        np.testing.assert_allclose(self.y.get(stream=self.stream), 2 * self.x_h, rtol=1e-6)
        self.g.close()


def _scale_on_first_of(devices: list[cg.Device], rng: np.random.Generator) -> _TwoDevices:
    a, b = devices[0], devices[1]
    x_h = random_array(rng, 16, "float32")
    x, y = cg.asarray(x_h, device=a), cg.zeros(16, "float32", device=a)
    there = cg.asarray(x_h, device=b)
    stream = a.current_stream()  # (in stream order with the uploads and the reads)
    with cg.capture(stream=stream) as g:
        cg.ops.scale(2.0, x, y, stream=stream)
    here, far = (f"{d.backend.name} device {d.index}" for d in (a, b))
    return _TwoDevices(g, x, y, x_h, there, stream, here, far)


def test_rebind_and_repoint_name_the_device_of_an_array_of_another_device(
    devices: list[cg.Device], rng: np.random.Generator
) -> None:
    t = _scale_on_first_of(devices, rng)
    g, x, there, here, far = t.g, t.x, t.there, t.here, t.far
    for change in (g.rebind, g.repoint):
        what = rf"{change.__name__}: new must match old in shape, strides, dtype and device; they differ in"
        with pytest.raises(ValueError, match=rf"{what} device: new is on {far}, old on {here}"):
            change(x, there)
        with pytest.raises(ValueError, match=rf"{what} device: new is on {here}, old on {far}"):
            change(there, x)
    with pytest.raises(ValueError, match=r"they differ in shape \(16,\) \(old\) and \(8,\) \(new\)"):
        g.repoint(x, cg.zeros(8, "float32", device=devices[0]))
    t.replays_unchanged()


def test_set_arg_names_the_device_of_an_array_of_another_device(
    devices: list[cg.Device], rng: np.random.Generator
) -> None:
    t = _scale_on_first_of(devices, rng)
    node = next(n for n in t.g.nodes if n.type == "kernel")
    with pytest.raises(ValueError, match=rf"the array is on {t.far}, the graph on {t.here}"):
        t.g.set_arg(node, 1, t.there)
    with pytest.raises(TypeError, match="pass a DeviceArray of this device like it, got list"):
        t.g.set_arg(node, 1, [1.0])
    t.replays_unchanged()


def test_rebind_after_update(dev: cg.Device, rng: np.random.Generator) -> None:
    xs = [cg.asarray(random_array(rng, 50, "float32")) for _ in range(3)]
    y = cg.zeros(50, "float32")
    g = axpy_graph(1.0, xs[0], y)
    g.update(axpy_graph(1.0, xs[1], y, instantiate=False))
    g.rebind(xs[1], xs[2])  # nodes of the graph g was instantiated from
    g.replay()
    np.testing.assert_allclose(y.get(), xs[2].get(), rtol=1e-6)
    g.close()


def test_rebind_after_update_from_a_rebound_source(dev: cg.Device, rng: np.random.Generator) -> None:
    """A source rebound before the update carries its own nodes' handles: they are not reused."""
    xs = [cg.asarray(random_array(rng, 50, "float32")) for _ in range(4)]
    y = cg.zeros(50, "float32")
    g = axpy_graph(1.0, xs[0], y)
    source = axpy_graph(1.0, xs[1], y)  # instantiated, so that it can be rebound
    source.rebind(xs[1], xs[2])
    g.update(source)
    g.rebind(xs[2], xs[3])  # failed: the node is not in the instantiated graph
    y.set(np.zeros(50, np.float32))  # (y += x: a wrong x shows)
    g.replay()
    np.testing.assert_allclose(y.get(), xs[3].get(), rtol=1e-6)
    g.close()


def test_a_switched_off_kernel_node_stays_off_when_its_parameters_change(dev: cg.Device) -> None:
    """A disabled node stays disabled through a parameter update, and runs the new ones once on.

    As the driver does; sim used to switch the node back on with the new
    parameters, and to run the old ones once it was enabled again.
    """
    from cudagraphs import _node_changes

    x = cg.full(4, 5.0, "float32")
    with cg.capture() as g:
        cg.ops.fill(x, 1.0)
    g.replay()
    np.testing.assert_array_equal(x.get(), 1.0)
    r = next(r for r in _node_changes._records(g) if r.kind == "kernel")
    _, launch = r.patch
    two = int(np.float32(2.0).view(np.uint32))
    backend = dev.backend
    backend.graph_update(g._exec, r.handle, False)  # off
    backend.graph_update(
        g._exec, r.handle, launch._replace(values=(launch.values[0], two, *launch.values[2:]))
    )
    cg.ops.fill(x, 7.0)
    g.replay()
    np.testing.assert_array_equal(x.get(), 7.0)  # still off: nothing ran
    backend.graph_update(g._exec, r.handle, True)  # on again: the new parameters
    g.replay()
    np.testing.assert_array_equal(x.get(), 2.0)
    g.close()


def test_captures_of_the_same_nodes_share_a_signature_and_others_do_not(dev: cg.Device) -> None:
    """Graph.update skips reading the records of two captures whose signatures are equal.

    The signature follows each recorded node's kind and name, in order: the same
    work captured twice has one, another kernel, another order or one node more
    change it; an update between graphs of other signatures still compares
    their records (and refuses them).
    """
    x, y = cg.zeros(64, "float32"), cg.zeros(64, "float32")

    def sig(fn: object) -> int | None:
        g = cg.capture(fn, instantiate=False)
        try:
            return g._sig  # type: ignore[no-any-return]
        finally:
            g.close()

    def add_then_scale() -> None:
        cg.ops.add(x, y, out=y)
        cg.ops.scale(2.0, x, out=y)

    def scale_then_add() -> None:
        cg.ops.scale(2.0, x, out=y)
        cg.ops.add(x, y, out=y)

    def add_twice() -> None:
        cg.ops.add(x, y, out=y)
        cg.ops.add(x, y, out=y)

    def add_then_scale_then_add() -> None:
        add_then_scale()
        cg.ops.add(x, y, out=y)

    first = sig(add_then_scale)
    assert first is not None
    assert sig(add_then_scale) == first  # (other arrays, same nodes: the same)
    others = {sig(scale_then_add), sig(add_twice), sig(add_then_scale_then_add)}
    assert first not in others
    assert len(others) == 3
    g = cg.capture(add_then_scale)
    with pytest.raises(cg.UpdateError, match="kernel"):
        g.update(cg.capture(add_twice, instantiate=False))
    g.update(cg.capture(add_then_scale, instantiate=False))  # (the same nodes: accepted)
    g.close()
