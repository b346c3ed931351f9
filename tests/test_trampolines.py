"""The compiled paths' driver calls through the C part's trampolines (``_fastcall_api.h``).

Where the package is built, the compiled modules call the driver through
the C part's entry points (bound by the cuda backend) without a Python call:
``Graph.replay`` launches its executable through ``cuGraphLaunch``. Here a
fake entry point records what it is given, on any backend: the compiled
path must launch exactly what the backend's own launch would (the
executable, the stream), count what it launched, and leave every other case
(another stream, a captured one, a closed one, a driver error) to the same
checks as the backend's path.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from conftest import compiled_part_or_skip

import cudagraphs as cg
from cudagraphs import _graph

fast = compiled_part_or_skip()
if _graph.__file__.endswith(".py"):  # (the C part built, the modules not: no trampoline is called)
    pytest.skip("the modules are not compiled", allow_module_level=True)

FAKE_EXEC = 0xE0E0
_KEEP: list[object] = []


@pytest.fixture
def graph_launch(backend: str) -> Iterator[tuple[list[tuple[int, int]], list[int]]]:
    """A fake cuGraphLaunch recording (exec, stream), returning result[0]."""
    cg.Device(0)
    before = fast.bound("cuGraphLaunch")
    seen: list[tuple[int, int]] = []
    result = [0]

    def launch(exec_: int, stream: int) -> int:
        seen.append((exec_, stream))
        return result[0]

    cb = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(launch)
    _KEEP.append(cb)
    fast.bind("cuGraphLaunch", ctypes.cast(cb, ctypes.c_void_p).value)
    yield seen, result
    fast.bind("cuGraphLaunch", before)


@contextlib.contextmanager
def fake_exec_graph() -> Iterator[tuple[cg.DeviceArray, cg.Graph]]:
    """A one-node graph (filling ``x`` with 1) whose fast launch is the fake's executable.

    Its real executable stays: the backend's own launch (the fallback) runs it.
    """
    x = cg.zeros(4)
    with cg.capture() as g:
        cg.ops.fill(x, 1.0)
    fast_exec = g._fast_exec
    g._fast_exec = FAKE_EXEC
    try:
        yield x, g
    finally:
        g._fast_exec = fast_exec


def test_replay_launches_through_the_trampoline_on_its_stream(graph_launch: Any, backend: str) -> None:
    seen, _ = graph_launch
    with fake_exec_graph() as (x, g):
        g.replay()
        g.replay(g.stream)
        g.replay(stream=None)
        with g.stream:
            g.replay()
        assert seen == [(FAKE_EXEC, g.stream.handle)] * 4
        assert g.replays == 4
        np.testing.assert_array_equal(x.get(), 0)  # (the fake ran nothing)


def test_replay_on_another_stream_is_checked_then_launched_there(graph_launch: Any, backend: str) -> None:
    seen, _ = graph_launch
    with fake_exec_graph() as (_x, g):
        other = g.device.create_stream()
        g.replay(other)
        assert other in g._res.streams  # (kept alive with the graph)
        assert seen == [(FAKE_EXEC, other.handle)]
        with cg.capture(stream=other):  # a captured stream: embedded, not launched
            g.replay(other)
        assert len(seen) == 1
        other.synchronize()
        other.close()
        with pytest.raises(ValueError, match="closed"):
            g.replay(other)
        assert len(seen) == 1
        with pytest.raises(TypeError, match="Stream"):
            g.replay(7)  # type: ignore[arg-type]
        assert g.replays == 1


def test_a_refused_fast_launch_is_made_again_by_the_backend_which_reports_it(
    graph_launch: Any, backend: str
) -> None:
    """A driver error from the trampoline queued nothing: the backend's launch runs, or raises."""
    seen, result = graph_launch
    with fake_exec_graph() as (x, g):
        result[0] = 1  # CUDA_ERROR_INVALID_VALUE
        if backend == "cuda":  # (there the backend's launch is the bound fake too: it raises)
            with pytest.raises(cg.CudaError, match="cuGraphLaunch"):
                g.replay()
            assert g.replays == 0
        else:  # (the simulator's launch runs the real graph)
            g.replay()
            assert g.replays == 1
            np.testing.assert_array_equal(x.get(), 1)
        assert seen[0] == (FAKE_EXEC, g.stream.handle)


def test_the_replay_count_is_read_after_the_launch(graph_launch: Any, backend: str) -> None:
    """A count made meanwhile (another thread; here the fake driver) is not lost."""
    seen, _ = graph_launch
    with fake_exec_graph() as (_x, g):

        def other_thread_counts(e: int, s: int) -> int:
            g.replays = 5
            seen.append((e, s))
            return 0

        cb = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(other_thread_counts)
        _KEEP.append(cb)
        fast.bind("cuGraphLaunch", ctypes.cast(cb, ctypes.c_void_p).value)
        g.replay()
        assert g.replays == 6


def test_a_closed_or_broken_graph_has_no_fast_executable(backend: str) -> None:
    x = cg.zeros(4)
    with cg.capture() as g:
        cg.ops.fill(x, 1.0)
    expected = int(g._exec) if g.device.backend.fastcall else 0
    assert g._fast_exec == expected
    g._unusable(lambda: RuntimeError("gone"))
    assert g._fast_exec == 0
    with pytest.raises(RuntimeError, match="gone"):
        g.replay()
    with cg.capture() as h:
        cg.ops.fill(x, 2.0)
    h.close()
    assert h._fast_exec == 0
    with pytest.raises(cg.GraphStateError):
        h.replay()


@pytest.mark.gpu
def test_on_the_gpu_replays_launch_through_the_trampoline(backend: str) -> None:
    if backend != "cuda":
        pytest.skip("the cuda backend binds the driver's entry points")
    dev = cg.Device(0)
    if not dev.backend.fastcall:
        pytest.skip("the fast calls are not bound here")
    x = cg.zeros(4)
    with cg.capture() as g:
        cg.ops.add(x, cg.full(4, 1.0), out=x)
    assert g._fast_exec == int(g._exec) != 0
    for _ in range(5):
        g.replay()
    np.testing.assert_array_equal(x.get(), 5)
