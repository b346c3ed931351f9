"""The core's contract.

One submission path, layers, deferred release, threads, and a regression test
for every defect of the core issue (both backends).
"""

from __future__ import annotations

import ast
import gc
import os
import re
import threading
import weakref
from pathlib import Path

import numpy as np
import pytest
from conftest import random_array, settle

import cudagraphs as cg
from cudagraphs._recording import Work, submit

SRC = Path(cg.__file__).resolve().parent


# layers ------------------------------------------------------------------------------
def _imports(path: Path) -> list[ast.AST]:
    """Import nodes of a module, those inside functions included, except TYPE_CHECKING blocks."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for b in node.body for n in ast.walk(b))
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in skip]


def _modules() -> dict[str, tuple[Path, bool]]:
    """Every module of the package by dotted name: its file and whether it is a package.

    Compiled modules count by their source (a ``.c`` file defining ``PyInit_``,
    or a ``.pyx``); their imports are not walked.
    """
    mods = {}
    for f in SRC.rglob("*"):
        compiled = (f.suffix == ".c" and f"PyInit_{f.stem}" in f.read_text()) or f.suffix == ".pyx"
        if f.suffix != ".py" and not compiled:
            continue
        parts = list(f.relative_to(SRC.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        mods[".".join(parts[:-1] if is_pkg else parts)] = (f, is_pkg)
    return mods


def _module_graph() -> dict[str, dict[str, int]]:
    """What each module imports of the package: imported module -> line of its first import."""
    mods = _modules()
    edges: dict[str, dict[str, int]] = {m: {} for m in mods}
    for m, (f, is_pkg) in mods.items():
        if f.suffix != ".py":
            continue
        for node in _imports(f):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = m.split(".") if is_pkg else m.split(".")[:-1]
                if node.level > 1:
                    base = base[: len(base) - node.level + 1]
                prefix = (
                    ".".join(base + ([node.module] if node.module else [])) if node.level else node.module
                )
                subs = [f"{prefix}.{a.name}" for a in node.names if f"{prefix}.{a.name}" in mods]
                targets = subs + ([prefix] if len(subs) < len(node.names) else [])
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != m:
                    edges[m].setdefault(t, node.lineno)
    return edges


def test_no_import_cycle() -> None:
    edges = _module_graph()
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in edges[m]:
            if state.get(t) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*path[path.index(t) :], t]))
            if t not in state:
                visit(t, [*path, t])
        state[m] = 2

    for m in edges:
        if m not in state:
            visit(m, [m])
    # the capture state sits below devices: it knows them only by duck type
    assert not any(
        t.startswith(("cudagraphs._device", "cudagraphs._array", "cudagraphs._graph"))
        for t in edges["cudagraphs._recording"]
    )
    assert not any(t.startswith("cudagraphs.ops") for t in edges["cudagraphs._array"])


def test_only_backend_selection_imports_the_simulator() -> None:
    # the layers above reach sim through base.py's contracts: a kernel's host code
    # through HostContext, the simulated communicator through SimulatedCollectives
    edges = _module_graph()
    sim = "cudagraphs.backends.sim"
    users = {m for m, targets in edges.items() for t in targets if t == sim or t.startswith(sim + ".")}
    assert {m for m in users if m != sim and not m.startswith(sim + ".")} == {"cudagraphs.backends"}


ARCHITECTURE = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def _layers() -> list[list[str]]:
    """The Layers block of docs/architecture.md, top layer first: the module names of each line.

    A line gives the names of its modules (``_graph``, ``ops/``,
    ``backends/sim/``, ``cudagraphs/__init__.py``), then, after three spaces
    or more, what they hold.
    """
    block = ARCHITECTURE.read_text().split("## Layers", 1)[1].split("```", 2)[1]
    return [re.split(r"\s{3,}", line.strip(), maxsplit=1)[0].split() for line in block.strip().splitlines()]


def _dotted(name: str) -> str:
    """``backends/sim/`` -> ``cudagraphs.backends.sim``; ``cudagraphs/__init__.py`` -> ``cudagraphs``."""
    parts = [p for p in name.removesuffix(".py").split("/") if p]
    if parts[:1] == ["cudagraphs"]:
        parts = parts[1:]
    if parts[-1:] == ["__init__"]:
        parts = parts[:-1]
    return ".".join(["cudagraphs", *parts])


def test_imports_follow_the_layers_of_architecture_md() -> None:
    """No module imports one of a higher line of the Layers block, and every module has a line.

    A module is on the line that names it or the package it is in (the
    nearest; ``cudagraphs/__init__.py`` names the package's own module only).
    Modules of one line may import each other (the cycle test rules there).
    """
    rows, mods, edges = _layers(), _modules(), _module_graph()
    line = [f"`{' '.join(names)}`" for names in rows]  # (how messages show a line)
    named: dict[str, int] = {}
    problems = []
    for i, names in enumerate(rows):
        for name in names:
            m = _dotted(name)
            if m not in mods:
                problems.append(
                    f"{line[i]} names {name}, which is no module of src/cudagraphs: rename or drop it"
                )
            elif m in named:
                problems.append(f"{name} is on two lines: {line[named[m]]} and {line[i]}")
            named[m] = i

    def layer(m: str) -> int | None:
        if m == "cudagraphs":
            return named.get(m)
        while m not in named and m.count(".") > 1:  # (a package's line covers its modules)
            m = m.rpartition(".")[0]
        return named.get(m)

    where = {m: layer(m) for m in mods}
    unplaced = {m for m, at in where.items() if at is None}
    for m in sorted(unplaced):
        if m.rpartition(".")[0] in unplaced:
            continue  # (told with its package)
        group = {u for u in unplaced if u == m or u.startswith(m + ".")}
        users = [where[u] for u in edges if where[u] is not None and group & edges[u].keys()]
        used = [where[t] for u in group for t in edges[u] if where[t] is not None]
        place = [f"at or below {line[max(users)]} (it imports {m})"] if users else []
        place += [f"at or above {line[min(used)]} (which {m} imports)"] if used else []
        name = "/".join(m.split(".")[1:]) + ("/" if mods[m][1] else "")
        problems.append(
            f"{m} is on no line of the Layers block of docs/architecture.md: "
            f"add `{name}   <what it holds>` {' and '.join(place) or 'where it belongs'}"
        )
    for m, targets in edges.items():
        for t, lineno in targets.items():
            if where[m] is not None and where[t] is not None and where[t] < where[m]:
                problems.append(
                    f"{mods[m][0].relative_to(SRC.parent)}:{lineno}: {m} imports {t}, a higher layer: "
                    f"{line[where[t]]} is above {line[where[m]]} in docs/architecture.md"
                )
    assert not problems, "\n".join(problems)


def test_no_backend_name_checks_outside_backends() -> None:
    for f in SRC.rglob("*.py"):
        if "backends" in f.parts:
            continue
        text = f.read_text()
        for pattern in ('.name == "cuda"', '.name != "cuda"', '.name == "sim"', '.name != "sim"'):
            assert pattern not in text, f"{f.name}: use backend.capabilities, not {pattern}"


def test_backend_interface_is_small() -> None:
    from cudagraphs.backends.base import Backend

    methods = [n for n in vars(Backend) if not n.startswith("_") and callable(getattr(Backend, n))]
    assert len(methods) <= 34, methods  # (34th: graph_node_count, asked at every capture's end)


# one submission path -------------------------------------------------------------------
def test_a_new_op_written_the_documented_way_gets_the_rules_for_free(
    dev: cg.Device, rng: np.random.Generator
) -> None:
    """An op that only describes its work (no capture code of its own)."""

    def add_one(x: cg.DeviceArray, stream: cg.Stream | None = None) -> None:
        stream = stream if stream is not None else dev.current_stream()
        backend, nbytes = dev.backend, x.nbytes

        def issue(raw: object, arg: object) -> None:  # a memset of byte 1 into the array
            backend.memset(x.ptr, 1, nbytes, raw)

        submit(stream, Work("memset", issue, None, (), (x,), name="add_one"))

    x = cg.zeros(64, "uint8")
    add_one(x)
    assert np.all(x.get() == 1)  # eager
    with cg.capture() as g:
        add_one(x)
        assert g._rec.nodes[-1].kind == "memset"  # traced
    ref = weakref.ref(x._block)
    del x
    gc.collect()
    assert ref() is not None  # kept alive by the graph
    with pytest.raises(cg.CaptureError, match=r"is being captured by thread|capturing"):
        other = dev.create_stream()
        y = cg.zeros(8, "uint8", stream=other)
        other.synchronize()
        with cg.capture(stream=other):
            errors: list[BaseException] = []
            t = threading.Thread(target=lambda: _catch(errors, add_one, y, other))
            t.start()
            t.join()
            raise errors[0]  # refused: another thread's work on a captured stream
    g.replay()
    g.close()


def _catch(errors: list[BaseException], fn: object, *args: object) -> None:
    try:
        fn(*args)  # type: ignore[operator]
    except BaseException as exc:
        errors.append(exc)


def test_keep_holds_anything_for_the_graphs_life(dev: cg.Device) -> None:
    class Foreign:  # stands for another library's array
        pass

    during, after = Foreign(), Foreign()
    refs = [weakref.ref(during), weakref.ref(after)]
    x = cg.ones(4, "float32")
    with cg.capture() as g:
        cg.ops.scale(2.0, x, out=x)
        g.keep(during)
    g.keep(after)
    del during, after
    gc.collect()
    assert all(r() is not None for r in refs)
    g.close()
    settle(dev)
    assert all(r() is None for r in refs)
    with pytest.raises(RuntimeError, match="nothing can be kept"):
        g.keep(1)


def test_refused_work_invalidates_and_status_says_so(dev: cg.Device) -> None:
    x = cg.ones(8, "float32")
    with pytest.raises(cg.CaptureInvalidatedError), cg.capture():
        cg.ops.scale(2.0, x, out=x)
        assert cg.is_capturing()
        assert cg.capture_status() == "active"
        with pytest.raises(cg.CaptureError):
            dev.stream.synchronize()
        assert cg.capture_status() == "invalidated"
        assert not cg.is_capturing()
    assert cg.capture_status() == "none"


def test_compiling_inside_a_capture_is_allowed(dev: cg.Device, rng: np.random.Generator) -> None:
    src = (
        'extern "C" __global__ void triple(float* p, int n) {'
        " int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) p[i] *= 3.0f; }"
    )
    k = cg.Kernel(src, "triple", host=lambda p, n: p.__imul__(3))
    assert k not in dev.kernels
    data = random_array(rng, 100, "float32")
    x = cg.asarray(data)
    with cg.capture() as g:
        k.launch(1, 128, x, 100)  # compiles and loads here
    g.replay()
    np.testing.assert_allclose(x.get(), data * 3, rtol=1e-6)


# deferred release ----------------------------------------------------------------------
def test_graph_collected_during_another_capture(dev: cg.Device, rng: np.random.Generator) -> None:
    """``for n in sizes: with cg.capture() as g:`` rebinds g while the next capture runs."""
    data = random_array(rng, 32, "float32")
    x, y = cg.asarray(data), cg.zeros(32, "float32")
    results = []
    g = None
    for alpha in (1.0, 2.0, 3.0):
        with cg.capture() as g:  # noqa: F811 - the previous g dies here, mid-capture
            gc.collect()
            cg.ops.axpy(alpha, x, y)
        results.append(g)
        del g
        if len(results) > 1:
            results.pop(0)
    g = results[-1]
    g.replay()
    np.testing.assert_allclose(y.get(), 3 * data, rtol=1e-6)


def test_closing_graphs_streams_and_events_during_another_capture(dev: cg.Device) -> None:
    x = cg.ones(16, "float32")
    old = cg.capture(lambda: cg.ops.scale(2.0, x, out=x))
    s, ev = dev.create_stream(), cg.Event(dev)
    with cg.capture() as g:
        cg.ops.scale(3.0, x, out=x)
        old.close()  # destroying an executable now would invalidate this capture
        s.close()
        ev.close()
        assert old.state == "closed"
        assert s.closed
        cg.ops.scale(3.0, x, out=x)
    settle(dev)
    g.replay()
    assert np.all(x.get() == 9)


def test_unread_get_async_collected_during_a_capture(dev: cg.Device) -> None:
    x = cg.ones(1000, "float32")
    pending = x.get_async()
    free_before = sum(len(v) for v in dev.pinned._free.values())
    with cg.capture() as g:
        cg.ops.scale(2.0, x, out=x)
        del pending
        gc.collect()  # its finalizer must neither wait on an event nor leak the buffer
        cg.ops.scale(2.0, x, out=x)
    settle(dev)
    assert sum(len(v) for v in dev.pinned._free.values()) == free_before + 1
    g.replay()
    assert np.all(x.get() == 4)


def test_host_slot_array_outlives_the_slot(dev: cg.Device) -> None:
    a = cg.HostSlot(256, "float32").array  # the slot itself is dropped at once
    settle(dev)
    a[...] = np.arange(256)
    others = [cg.HostSlot(256, "float32") for _ in range(4)]  # would reuse freed memory
    for o in others:
        o.array[...] = -1
    np.testing.assert_array_equal(a, np.arange(256))
    x = cg.zeros(256, "float32")
    x.set(a)  # still usable as host data
    np.testing.assert_array_equal(x.get(), np.arange(256))
    if dev.backend.name == "sim":
        assert dev.backend.is_pinned(a.ctypes.data, a.nbytes)
        address = a.ctypes.data
        del a
        settle(dev)
        assert not dev.backend.is_pinned(address, 4)


@pytest.mark.parametrize("how", ["copy_to", "set", "copy_from"])
def test_eager_copy_keeps_a_dropped_host_slot_until_it_completes(
    dev: cg.Device, rng: np.random.Generator, how: str
) -> None:
    """Eager work keeps what it touches until it is done: a slot dropped after a copy too."""
    pinned_before = len(dev.backend._host) if dev.backend.name == "sim" else 0
    data = random_array(rng, 4096, "float32")
    x = cg.asarray(data) if how == "copy_from" else cg.full(4096, -1.0, "float32")
    s = dev.create_stream()
    s.wait(dev.stream)
    gate = threading.Event()
    b = cg.GraphBuilder(device=dev)
    b.host(gate.wait, 60)
    blocker = b.instantiate()
    blocker.replay(stream=s)  # the copy below is still pending when the slot dies
    slot = cg.HostSlot(4096, "float32")
    slot.array[...] = data if how != "copy_from" else 0.0
    if how == "copy_to":
        slot.copy_to(x, stream=s)
    elif how == "set":
        x.set(slot.array, stream=s)
    else:
        slot.copy_from(x, stream=s)
    del slot
    gc.collect()
    opener = threading.Timer(0.2, gate.set)
    opener.start()
    try:
        cg.empty(1, "float32")  # a safe point: the slot's memory is freed after the copy
        others = [cg.HostSlot(4096, "float32") for _ in range(4)]  # would reuse freed memory
        for other in others:
            other.array[...] = 7.0
        del other
        s.synchronize()
    finally:
        gate.set()
        opener.join()
    np.testing.assert_array_equal(x.get(stream=s), data)  # (and no device fault)
    del others
    blocker.close()
    s.close()
    settle(dev)
    if dev.backend.name == "sim":  # every pinned allocation was freed
        assert len(dev.backend._host) == pinned_before


def test_closed_host_slot_stays_alive_for_its_graph(dev: cg.Device, rng: np.random.Generator) -> None:
    slot = cg.HostSlot(64, "float32")
    data = random_array(rng, 64, "float32")
    slot.array[...] = data
    address = slot.array.ctypes.data
    x = cg.zeros(64, "float32")
    with cg.capture() as g:
        slot.copy_to(x)
    slot.close()
    slot.close()
    with pytest.raises(ValueError, match="closed"):
        _ = slot.array
    settle(dev)
    cg.ops.fill(x, -1.0)
    g.replay()  # still copies from the slot's memory (no use after free)
    np.testing.assert_array_equal(x.get(), data)
    if dev.backend.name == "sim":
        assert dev.backend.is_pinned(address, 4)
        g.close()
        settle(dev)
        assert not dev.backend.is_pinned(address, 4)


def test_collecting_a_cycle_under_the_allocator_lock_does_not_deadlock(dev: cg.Device) -> None:
    done = threading.Event()

    def work() -> None:
        for _ in range(50):
            cycle: list[object] = [cg.empty(16, "float32")]
            cycle.append(cycle)  # an array held by a reference cycle
            del cycle
            with dev.allocator._lock:  # what an allocation holds when gc strikes
                gc.collect()
        done.set()

    t = threading.Thread(target=work, daemon=True)
    t.start()
    t.join(timeout=60)
    assert done.is_set(), "the garbage collector deadlocked on the allocator's lock"
    settle(dev)
    assert cg.empty(16, "float32").size == 16


# captures on a stream of one's own ---------------------------------------------------------
def test_outputs_allocated_during_capture_on_a_stream_come_from_the_graph(dev: cg.Device) -> None:
    s = dev.create_stream()
    x = cg.ones(100, "float32", stream=s)
    s.synchronize()
    with cg.capture(stream=s) as g:
        a = cg.ops.add(x, x, stream=s)
        b = cg.ops.scale(3.0, x, stream=s)
        c = x.copy(stream=s)
    for out in (a, b, c):
        assert out._block.owner is g.pool
    with pytest.raises(cg.CaptureError, match="alloc='forbid'"), cg.capture(stream=s, alloc="forbid"):
        cg.ops.add(x, x, stream=s)
    # with s: the current stream, where ops that name none allocate
    with pytest.raises(cg.CaptureError, match="alloc='forbid'"), cg.capture(stream=s, alloc="forbid"), s:
        x.copy()
    g.replay(stream=s)
    s.synchronize()
    assert np.all(a.get(stream=s) == 2)
    assert np.all(b.get(stream=s) == 3)
    assert np.all(c.get(stream=s) == 1)
    g.close()
    s.close()


# bodies and embedding ----------------------------------------------------------------------
def test_body_after_the_capture_ended_is_refused(dev: cg.Device) -> None:
    x = cg.zeros(1, "float32")
    with cg.capture() as g:
        cond = g.condition(default=1)
        body = g.if_then(cond)
        cg.ops.fill(x, 1.0)
    with pytest.raises(RuntimeError, match="has ended"), body:
        cg.ops.fill(x, 5.0)
    g.replay()
    assert x.get()[0] == 1.0


def test_replay_inside_another_capture_embeds_a_child(dev: cg.Device, rng: np.random.Generator) -> None:
    data = random_array(rng, 50, "float32")
    x = cg.asarray(data)
    inner = cg.capture(lambda: cg.ops.scale(2.0, x, out=x))
    ref = weakref.ref(inner)
    with cg.capture() as outer:
        inner.replay()
        inner.replay()
    assert [n.type for n in outer.nodes] == ["child", "child"]
    assert inner.replays == 0
    del inner
    gc.collect()
    assert ref() is not None  # the outer graph keeps the inner one
    outer.replay()
    np.testing.assert_allclose(x.get(), 4 * data, rtol=1e-6)


# kernel arguments -------------------------------------------------------------------------
def test_strided_views_are_refused_for_pointer_parameters(dev: cg.Device) -> None:
    k = cg.Kernel(
        'extern "C" __global__ void put(float* p) { p[0] = 1.0f; }',
        "put",
        host=lambda p: p.__setitem__(0, 1.0),
    )
    x = cg.zeros(8, "float32")
    for view in (x[::2], x[::-1]):
        with pytest.raises(ValueError, match="strided view"):
            k.launch(1, 1, view)
    k.launch(1, 1, x[2:])  # contiguous views are fine
    assert x.get().tolist() == [0, 0, 1, 0, 0, 0, 0, 0]


def test_as_strided_refuses_misaligned_views(dev: cg.Device) -> None:
    x = cg.zeros(16, "float32")
    with pytest.raises(ValueError, match="multiples of the item size"):
        cg.as_strided(x, (4,), (4,), offset=1)
    with pytest.raises(ValueError, match="multiples of the item size"):
        cg.as_strided(x, (4,), (6,))
    assert cg.as_strided(x, (4,), (8,), offset=4).shape == (4,)


@pytest.mark.parametrize(("dtype", "value"), [("int32", 2**31), ("int16", 70000), ("uint8", -1)])
def test_out_of_range_integers_are_refused(dev: cg.Device, dtype: str, value: int) -> None:
    x = cg.zeros(3, dtype)
    with pytest.raises(ValueError, match=f"cannot store {value}"):
        x.set([value, 0, 0])
    with pytest.raises(ValueError, match=f"cannot store {value}"):
        x[0] = value
    with pytest.raises(ValueError, match=f"cannot store {value}"):
        cg.full(2, value, dtype)
    assert np.all(x.get() == 0)


def test_update_releases_what_the_previous_parameters_used(dev: cg.Device) -> None:
    before = settle(dev)
    y = cg.zeros(1 << 18, "float32")
    g = cg.capture(cg.ops.axpy, 1.0, cg.ones(1 << 18, "float32"), y)
    refs = []
    for i in range(50):
        x = cg.full(1 << 18, float(i), "float32")  # 1 MiB inputs
        refs.append(weakref.ref(x._block))
        g.update(cg.capture(cg.ops.axpy, 1.0, x, y, instantiate=False))
        del x
    stats = settle(dev)
    assert sum(r() is not None for r in refs) == 1  # only the latest input is held
    assert stats.in_use - before.in_use <= 4 << 20
    g.replay()
    assert y.get()[0] == 49.0
    g.close()


def test_pool_memory_returns_for_later_captures(backend: str) -> None:
    """A 64 MiB device runs many 16 MiB captures in turn (sim: memory was never reused)."""
    with cg.override(sim_memory_mb=64):
        dev = cg.Device(0)
        cg.ops.preload_dtypes(["float32"], dev)
        settle(dev)
        dev.allocator.empty_cache()  # (blocks earlier tests left in the cache count against the 64 MiB)
        x = cg.ones(4 << 20, "float32")  # 16 MiB
        for _ in range(6):
            with cg.capture() as g:
                t = cg.ops.scale(2.0, x)  # 16 MiB of the graph's pool
                cg.ops.add(t, x, out=x)
            g.replay()
            g.close()
            del t
            settle(dev)
        assert x.get()[0] == 3.0**6
        if backend == "sim":
            ballast = cg.empty(1 << 20, "uint8")  # x, this and two 16 MiB arrays: a third does not fit
            with cg.capture() as g:
                a = cg.ops.scale(2.0, x)
                b = cg.ops.scale(2.0, x)
                with pytest.raises(cg.OutOfMemoryError, match="during a capture") as info:
                    cg.ops.scale(2.0, x)
                assert "was emptied" not in str(info.value)
                del info
                cg.ops.add(a, b, out=x)
            g.close()
            del a, b, ballast


def test_condition_handles_do_not_accumulate(dev: cg.Device) -> None:
    sim = dev.backend.name == "sim"
    before = len(dev.backend._conditions.values) if sim else 0
    out = cg.zeros(1, "float32")
    for i in range(30):
        with cg.capture() as g:
            cond = g.condition(default=1)
            with g.if_then(cond):
                cg.ops.fill(out, float(i))
        g.replay()
        g.close()
    settle(dev)
    assert out.get()[0] == 29.0
    if sim:
        assert len(dev.backend._conditions.values) <= before + 1


def test_builder_child_survives_closing_its_graph(dev: cg.Device, rng: np.random.Generator) -> None:
    data = random_array(rng, 40, "float32")
    x = cg.asarray(data)
    inner = cg.capture(lambda: cg.ops.scale(2.0, x, out=x))
    bld = cg.GraphBuilder()
    bld.child(inner)
    g = bld.instantiate()
    inner.close()  # the driver copied the child graph into the node
    settle(dev)
    g.replay()
    np.testing.assert_allclose(x.get(), 2 * data, rtol=1e-6)


def test_set_arg_checks_values_against_the_node(dev: cg.Device, rng: np.random.Generator) -> None:
    x_h, y_h = random_array(rng, 8, "float32"), random_array(rng, 8, "float32")
    x, y = cg.asarray(x_h), cg.asarray(y_h)
    g = cg.capture(lambda: cg.ops.axpy(2.0, x, y))
    with pytest.raises(ValueError, match=r"recorded with an array of shape \(8,\)"):
        g.set_arg(0, "x", cg.zeros(2, "float32"))
    with pytest.raises(ValueError, match="'n' of 'cg_axpy' is fixed"):
        g.set_arg(0, "n", 100)
    with pytest.raises(TypeError, match="was recorded with an array"):
        g.set_arg(0, "y", 3.0)
    g.set_arg(g.nodes[0], "alpha", 0.5)  # the docs' example: real parameter names
    x2_h = random_array(rng, 8, "float32")
    g.set_arg(0, "x", cg.asarray(x2_h))
    g.replay()
    np.testing.assert_allclose(y.get(), y_h + 0.5 * x2_h, rtol=1e-6)


@pytest.mark.parametrize(
    ("grid", "error"),
    [
        ("12", TypeError),
        ((1.9,), TypeError),
        (1.0, TypeError),
        ([2, 1.0], TypeError),
        (True, TypeError),
        ((1, 1, 1, 1), ValueError),
    ],
)
def test_grid_and_block_take_ints_only(dev: cg.Device, grid: object, error: type) -> None:
    k = cg.Kernel('extern "C" __global__ void nop(float* p) {}', "nop", host=lambda p: None)
    x = cg.zeros(1, "float32")
    k.launch(1, 1, x)  # 1 seen first must not make 1.0 acceptable
    with pytest.raises(error):
        k.launch(grid, 1, x)
    with pytest.raises(error):
        k.launch(1, grid, x)


def test_bad_streams_are_type_errors(dev: cg.Device) -> None:
    k = cg.Kernel('extern "C" __global__ void nop(float* p) {}', "nop", host=lambda p: None)
    x = cg.zeros(1, "float32")
    s = cg.DeviceScalar(1.0)
    for call in (
        lambda: k.launch(1, 1, x, stream="s"),
        lambda: s.set(2.0, stream="s"),
        lambda: cg.capture_status("s"),
        lambda: x.get(stream="s"),
        lambda: cg.zeros(3, stream="s"),
        lambda: cg.capture(stream="s"),
        lambda: cg.ops.add(x, x, stream="s"),
        lambda: dev.is_capturing("s"),
    ):
        with pytest.raises(TypeError, match="Stream"):
            call()


def test_scalar_arguments_name_what_does_not_fit(dev: cg.Device) -> None:
    i = cg.zeros(4, "int32")
    with pytest.raises(ValueError, match="alpha 1099511627776 does not fit in int32"):
        cg.ops.axpy(2**40, i, i)
    cg.ops.preload_dtypes("float32")  # one dtype given as a string
    cg.ops.preload_dtypes(np.float64)


# threads and streams ----------------------------------------------------------------------------
def test_device_sync_from_another_thread_during_a_capture(dev: cg.Device) -> None:
    x = cg.ones(8, "float32")
    errors: list[BaseException] = []
    with cg.capture(mode="thread_local") as g:
        cg.ops.scale(2.0, x, out=x)
        t = threading.Thread(target=_catch, args=(errors, dev.synchronize))
        t.start()
        t.join()
        cg.ops.scale(2.0, x, out=x)  # this capture is still valid
    assert len(errors) == 1
    assert isinstance(errors[0], cg.CaptureError)
    message = str(errors[0])
    assert "Device.synchronize()" in message
    assert "test_core.py:" in message
    assert "being captured" in message
    g.replay()
    assert np.all(x.get() == 4)


def test_closing_a_capturing_stream_is_refused(dev: cg.Device) -> None:
    s = dev.create_stream()
    x = cg.ones(4, "float32", stream=s)
    s.synchronize()
    with cg.capture(stream=s) as g:
        cg.ops.fill(x, 2.0, stream=s)
        with pytest.raises(cg.CaptureError, match=r"Stream.close\(\).*end the capture first"):
            s.close()
    assert not s.closed
    g.replay(stream=s)
    s.synchronize()
    assert np.all(x.get(stream=s) == 2)
    g.close()
    s.close()
    assert s.closed


def test_current_stream_is_per_thread(dev: cg.Device) -> None:
    s = dev.create_stream()
    seen: list[cg.Stream] = []
    with s:
        assert cg.current_stream() is s
        t = threading.Thread(target=lambda: seen.append(cg.current_stream(dev)))
        t.start()
        t.join()
        with dev.stream:
            assert cg.current_stream() is dev.stream
        assert cg.current_stream() is s
    assert seen == [dev.stream]  # the other thread never saw s
    assert cg.current_stream() is dev.stream
    assert not s.closed
    s.close()


def test_a_body_does_not_capture_another_threads_work(dev: cg.Device) -> None:
    x, other = cg.zeros(1, "float32"), cg.zeros(1, "float32")
    errors: list[BaseException] = []
    with cg.capture() as g:
        cond = g.condition(default=1)
        with g.if_then(cond):
            cg.ops.fill(x, 1.0)  # the body's stream is current in this thread only
            t = threading.Thread(target=_catch, args=(errors, cg.ops.fill, other, 7.0))
            t.start()
            t.join()
    # the other thread's op went to its own current stream (the default one),
    # which this capture records: refused, never silently recorded
    assert len(errors) == 1
    assert isinstance(errors[0], cg.CaptureError)
    g.replay()
    assert x.get()[0] == 1.0
    assert other.get()[0] == 0.0


def test_while_loop_iteration_cap(dev: cg.Device) -> None:
    count, one = cg.zeros(1, "float32"), cg.ones(1, "float32")
    with cg.capture() as g:
        forever = g.condition(default=1)
        body = g.while_loop(forever, max_iterations=25)
        with body:
            cg.ops.add(count, one, out=count)  # never clears the condition
    for launch in (1, 2):
        g.replay()
        assert count.get()[0] == 25 * launch
        assert body.iterations is not None
        assert int(body.iterations.get()[0]) == 25
    with (
        pytest.raises(cg.CaptureError, match=r"1 condition\(s\) made at .*test_core.py:\d+ drive no"),
        cg.capture() as g2,
    ):
        cond = g2.condition()
        with pytest.raises(ValueError, match="max_iterations must be a positive int"):
            g2.while_loop(cond, max_iterations=0)
        cg.ops.fill(one, 1.0)
    assert cg.capture_status() == "none"
    with cg.capture() as g3:
        cond = g3.condition()
        with g3.if_then(cond):
            cg.ops.fill(one, 2.0)
        with pytest.raises(ValueError, match="already drives a conditional node"):
            g3.if_then(cond)


def test_sim_refuses_unused_conditions_like_the_driver(dev: cg.Device) -> None:
    """The driver check the capture layer protects against, seen directly."""
    s = dev.create_stream()
    backend, raw = dev.backend, s._raw
    backend.capture_begin(raw, "relaxed")
    backend.capture_node(raw, "condition", 0)
    backend.capture_node(raw, "empty")
    graph = backend.capture_end(raw)
    with pytest.raises(cg.CudaError, match="CUDA_ERROR_INVALID_VALUE"):
        backend.graph_instantiate(graph, False)
    backend.destroy(graph)
    s.close()


def test_builder_child_keeps_what_its_graph_used(dev: cg.Device, rng: np.random.Generator) -> None:
    data = random_array(rng, 4096, "float32")
    x, y = cg.asarray(data), cg.zeros(4096, "float32")
    with cg.capture() as inner:
        cg.ops.scale(2.0, x, out=y)
    bld = cg.GraphBuilder()
    bld.child(inner)
    g = bld.instantiate()
    inner.close()
    del inner, x
    settle(dev)
    z = cg.full(4096, 100.0, "float32")  # would take x's memory, were it freed
    g.replay()
    np.testing.assert_allclose(y.get(), 2 * data, rtol=1e-6)
    del z
    g.close()


def test_builder_host_node_runs_on_every_replay_with_nothing_else_holding_it(dev: cg.Device) -> None:
    seen: list[int] = []
    bld = cg.GraphBuilder()
    bld.host(lambda n: seen.append(n), 5)  # only the graph holds the function and callback
    g = bld.instantiate()
    del bld
    gc.collect()
    g.replay()
    g.replay()
    dev.synchronize()
    assert seen == [5, 5]
    g.close()


def test_closed_host_slot_stays_alive_for_a_graph_that_downloads_into_it(
    dev: cg.Device, rng: np.random.Generator
) -> None:
    slot = cg.HostSlot(64, "float32")
    x = cg.asarray(random_array(rng, 64, "float32"))
    with cg.capture() as g:
        slot.copy_from(x)
    slot.close()
    del slot
    settle(dev)
    others = [cg.HostSlot(64, "float32") for _ in range(4)]  # would reuse freed pinned memory
    g.replay()
    dev.synchronize()  # (sim: a download into freed pinned memory is a device fault)
    del others
    g.close()


def test_the_c_part_reads_only_declared_names() -> None:
    """Every Python name the C source reads is declared in _fastcall.pyi, the contract's one place.

    (Issue 27: no private attribute is read by name from compiled code
    outside the declared contract.) A name the C source spells out, as an
    attribute, a slot, a method or a keyword, must appear in the stub's table
    or among its declarations.
    """
    root = Path(__file__).resolve().parents[1] / "src" / "cudagraphs"
    source = (root / "_fastcall.c").read_text()
    declared = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", (root / "_fastcall.pyi").read_text()))
    named = set(re.findall(r'"(_?[a-z][a-z0-9_]*)"', source))
    assert named, "no name found in _fastcall.c: the pattern no longer matches its source"
    missing = sorted(named - declared)
    assert not missing, (
        f"_fastcall.c reads {missing}, which _fastcall.pyi does not declare: add them to its table"
    )


def _compiled_modules() -> list[str]:
    """The modules Cython compiles from their Python source (_config.COMPILED_MODULES, setup.py's list)."""
    from cudagraphs._config import COMPILED_MODULES

    return list(COMPILED_MODULES)


def test_each_compiled_module_has_its_declarations_and_runs_in_the_mode_asked() -> None:
    """Each module of _config.COMPILED_MODULES has its .pxd; CI's runs get what they ask for.

    With ``CUDAGRAPHS_EXPECT_PLAIN=1`` (the second run of ``make test``) every
    module is its ``.py``; with ``CUDAGRAPHS_REQUIRE_C=1`` (CI's build) and not
    plain, each module of COMPILED and the C part are built extension modules:
    a module dropped from the build, or a plain run that is not, fails here.
    """
    import importlib

    names = _compiled_modules()
    root = Path(cg.__file__).resolve().parent
    assert names, "setup.py compiles no module"
    for name in names:
        assert (root / f"{name}.py").is_file(), name
        assert (root / f"{name}.pxd").is_file(), f"{name} is compiled without its declarations"
    files = {
        name: importlib.import_module("cudagraphs." + name.replace("/", ".")).__file__ or "" for name in names
    }
    if os.environ.get("CUDAGRAPHS_EXPECT_PLAIN") == "1":
        assert all(f.endswith(".py") for f in files.values()), files
        from cudagraphs._config import compiled_part

        assert compiled_part() is None
    elif os.environ.get("CUDAGRAPHS_REQUIRE_C") == "1":
        assert not any(f.endswith(".py") for f in files.values()), files
        import cudagraphs._fastcall  # noqa: F401  (built: the import must not fail)
