"""Memory that another library's captured kernels use is kept as long as the graph.

The stand-in library (tests/foreign_lib.py) launches its kernels through the
backend, so a capture records nodes cudagraphs did not make, and hands freed
memory to its next allocation of that size at once, as PyTorch's caching
allocator does: an array only its kernels read, dropped after the capture,
would otherwise give its memory to the next array, and every replay would
read that array's data.
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Iterator
from types import SimpleNamespace

import numpy as np
import pytest
from foreign_lib import AddressView, ForeignLib

import cudagraphs as cg
from cudagraphs import interop
from cudagraphs._pool import GraphPool

N = 1000


@pytest.fixture
def lib(device: cg.Device) -> Iterator[ForeignLib]:
    lib = ForeignLib(device)
    lib.kernel.function(device)  # (compiled before any capture)
    interop.register(lib)
    yield lib
    interop.unregister(lib)
    gc.collect()
    lib.close()


def _capture_scale(lib: ForeignLib, x_h: np.ndarray, a: float) -> tuple[cg.Graph, object, int, cg.Stream]:
    """A graph of ``out = a * x`` by the stand-in library; x dropped afterwards (only the graph uses it)."""
    s = lib.device.create_stream()
    x = lib.array(x_h)
    out = lib.array(np.zeros(N, np.float32))
    with cg.capture(stream=s) as g:
        lib.scale(out, x, a, s)
    ptr = x.ptr
    del x
    return g, out, ptr, s


def test_an_array_only_foreign_kernels_read_outlives_its_last_reference(
    lib: ForeignLib, rng: np.random.Generator
) -> None:
    x_h = rng.standard_normal(N).astype(np.float32)
    g, out, x_ptr, s = _capture_scale(lib, x_h, 3.0)
    # the library's next array of that size: x's memory, were the graph not keeping x
    other = lib.array(np.full(N, 99.0, np.float32))
    assert other.ptr != x_ptr
    for _ in range(3):
        out.set(np.full(N, -7.0, np.float32))  # poisoned
        g.replay(stream=s)
        s.synchronize()
        np.testing.assert_allclose(out.get(), 3.0 * x_h, rtol=1e-6)
    # the graph gone, the library gets x's memory back
    g.close()
    del g
    gc.collect()
    cg.Device(lib.device.index).synchronize()
    again = lib.array(np.zeros(N, np.float32))
    assert again.ptr == x_ptr


def test_a_cudagraphs_array_read_by_a_foreign_kernel_by_address_is_kept(
    lib: ForeignLib, rng: np.random.Generator
) -> None:
    """A cudagraphs array handed to the library as a view of its memory (its kernel reads it)."""
    x_h = rng.standard_normal(N).astype(np.float32)
    x = cg.asarray(x_h, device=lib.device)
    out = lib.array(np.zeros(N, np.float32))
    s = lib.device.create_stream()

    with cg.capture(stream=s) as g:
        lib.scale(out, AddressView(x), 2.0, s)  # type: ignore[arg-type]
    ptr = x.ptr
    del x
    y = cg.full(N, 5.0, "float32", device=lib.device)  # the allocator's cached block, were x not kept
    assert y.ptr != ptr
    out.set(np.full(N, -7.0, np.float32))
    g.replay(stream=s)
    s.synchronize()
    np.testing.assert_allclose(out.get(), 2.0 * x_h, rtol=1e-6)
    g.close()


def test_nothing_is_kept_of_arrays_the_graph_does_not_use(lib: ForeignLib, rng: np.random.Generator) -> None:
    x_h = rng.standard_normal(N).astype(np.float32)
    unused = lib.array(np.ones(N, np.float32))
    unused_ptr = unused.ptr
    g, _out, _, _s = _capture_scale(lib, x_h, 1.0)
    del unused
    again = lib.array(np.zeros(N, np.float32))
    assert again.ptr == unused_ptr  # went back to the library at once
    g.close()


def test_register_refuses_what_is_not_a_library() -> None:
    with pytest.raises(TypeError, match="array_types"):
        interop.register(object())  # type: ignore[arg-type]


def test_a_graph_of_cudagraphs_work_alone_looks_at_nothing(
    lib: ForeignLib, device: cg.Device, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No other library's node: no census of the process's objects (captures stay cheap)."""
    looked: list[int] = []
    census = SimpleNamespace(get_objects=lambda: looked.append(1) or [])
    monkeypatch.setattr(interop._keep, "gc", census)
    x = cg.ones(8, "float32", device=device)
    with cg.capture() as g:
        cg.ops.scale(2.0, x, out=x)
    assert looked == []
    g.close()


def test_the_memory_a_graph_holds_is_read_only_where_others_nodes_need_it(
    lib: ForeignLib, device: cg.Device, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A graph's pools' segments (PyTorch's pool: an allocator snapshot) are read for a census alone.

    With torch 2.11, threads that took their PyTorch pool's snapshot at every capture's end
    crashed the interpreter: a capture of cudagraphs' own work reads none.
    """
    asked: list[int] = []
    real = GraphPool.ranges
    monkeypatch.setattr(GraphPool, "ranges", lambda self: asked.append(1) or real(self))
    x = cg.ones(8, "float32", device=device)
    with cg.capture() as g:
        cg.ops.scale(2.0, x, out=x)
    assert asked == []
    g.close()
    g2, _out, _ptr, _s = _capture_scale(lib, rng.standard_normal(N).astype(np.float32), 2.0)
    assert asked  # another library's node: its pools are read (their memory is not searched for)
    g2.close()


def test_the_census_is_what_finds_the_arrays(
    lib: ForeignLib, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The census seeing no object, the dropped array is not kept: its memory is handed on."""
    monkeypatch.setattr(interop._keep, "gc", SimpleNamespace(get_objects=lambda: []))
    g, _out, x_ptr, _s = _capture_scale(lib, rng.standard_normal(N).astype(np.float32), 2.0)
    assert lib.array(np.zeros(N, np.float32)).ptr == x_ptr
    g.close()


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the census's passes over the collector's objects."""
    calls: list[int] = []

    def get_objects() -> list[object]:
        calls.append(1)
        return gc.get_objects()

    monkeypatch.setattr(interop._keep, "gc", SimpleNamespace(get_objects=get_objects))
    return calls


def test_a_census_is_made_only_for_memory_no_known_array_holds(
    lib: ForeignLib, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The arrays one census found serve the next capture; a new array makes a new census."""
    censuses = _counting(monkeypatch)
    s = lib.device.create_stream()
    x_h, y_h = rng.standard_normal(N).astype(np.float32), rng.standard_normal(N).astype(np.float32)
    x, out = lib.array(x_h), lib.array(np.zeros(N, np.float32))
    graphs = []
    for _ in range(2):  # the same arrays: one census
        with cg.capture(stream=s) as g:
            lib.scale(out, x, 2.0, s)
        graphs.append(g)
    assert len(censuses) == 1
    y = lib.array(y_h)  # an array the census has not seen
    with cg.capture(stream=s) as g3:
        lib.scale(out, y, 5.0, s)
    assert len(censuses) == 2
    del x, y  # kept by their graphs, the second's found without a census
    taken = [lib.array(np.full(N, 99.0, np.float32)) for _ in range(2)]
    for g, a, want in ((graphs[1], 2.0, x_h), (g3, 5.0, y_h)):
        out.set(np.full(N, -7.0, np.float32))
        g.replay(stream=s)
        s.synchronize()
        np.testing.assert_allclose(out.get(), a * want, rtol=1e-6)
    for g in (*graphs, g3):
        g.close()
    del taken


def test_memory_of_the_graphs_own_pool_makes_no_census(
    lib: ForeignLib, device: cg.Device, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A foreign kernel reading and writing arrays of the capture's pool: nothing to look for."""
    censuses = _counting(monkeypatch)
    s = device.create_stream()

    with cg.capture(stream=s) as g:
        a = cg.full(N, 2.0, "float32", device=device, stream=s)  # from the graph's pool
        b = cg.empty(N, "float32", device=device, stream=s)
        lib.scale(AddressView(b), AddressView(a), 3.0, s)  # type: ignore[arg-type]
    assert censuses == []
    cg.ops.fill(b, -1.0, stream=s)  # poisoned
    g.replay(stream=s)
    np.testing.assert_allclose(b.get(stream=s), np.full(N, 6.0, np.float32))
    g.close()


def test_a_node_whose_arguments_cannot_be_read_is_warned_of(lib: ForeignLib, device: cg.Device) -> None:
    """Another library's embedded graph is a node cudagraphs cannot see into: said at the user's line."""
    x = cg.zeros(8, "float32", device=device)
    inner = cg.capture(lambda: cg.ops.fill(x, 1.0))
    s = device.create_stream()
    # (the other library's child node: not recorded by cudagraphs)
    with (
        pytest.warns(cg.CudaGraphsWarning, match=r"node 0: a child node.*not kept alive") as seen,
        cg.capture(stream=s) as g,
    ):
        device.backend.capture_node(s._raw, "child", inner._res.graph)
    assert seen[0].filename == __file__
    g.close()
    a, b = lib.array(np.ones(N, np.float32)), lib.array(np.ones(N, np.float32))
    with warnings.catch_warnings():  # an embedded graph of cudagraphs' own is kept whole: no warning
        warnings.simplefilter("error", cg.CudaGraphsWarning)
        with cg.capture(stream=s) as g:
            inner.replay(s)
            lib.scale(a, b, 2.0, s)
    g.replay(s)
    s.synchronize()
    g.close()
    inner.close()
