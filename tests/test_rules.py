"""The driver's rules during a capture: every row of ``backends/sim/rules.py``'s ``RULES``.

Each row runs in each capture mode on every backend under test, through the
backend's primitives: a capture by this thread on a fresh stream, the call,
then whether it was refused (with which code) and whether the capture is
still valid. On a GPU this checks the table against the driver; on sim it
checks that the simulator follows its own table.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import cudagraphs as cg
from cudagraphs._errors import CudaError
from cudagraphs.backends.base import CAPTURE_MODES, Copy
from cudagraphs.backends.sim import RULES, Rule

_fresh = itertools.count()


class Case:
    """What one row's call needs, made before the capture begins, and undone after."""

    def __init__(self, dev: cg.Device) -> None:
        self.dev, self.b = dev, dev.backend
        b, i = self.b, dev.index
        self.s = b.stream_create(i)  # captured
        self.other = b.stream_create(i)
        self.spare = b.stream_create(i)  # destroyed by the cuStreamDestroy row
        self.event = b.event_create(i, False)
        b.event_record(self.event, self.other)
        self.spare_event = b.event_create(i, False)
        self.ptr = b.mem_alloc(i, 512, self.other)
        self.spare_ptr = b.mem_alloc(i, 512, self.other)
        self.host = b.host_alloc(4096)
        self.pageable = np.zeros(16, np.float32)
        x = cg.zeros(4, "float32")
        self.graph = cg.capture(lambda: cg.ops.fill(x, 1.0))
        self.x = x
        b.synchronize(i)
        self.made: list[tuple[str, Any]] = []  # what a call that succeeded made
        self.gone: set[str] = set()  # what a call that succeeded destroyed

    def call(self, rule: Rule) -> Callable[[], Any]:
        b, i, s = self.b, self.dev.index, self.s
        key = (rule.call, rule.target)

        def destroy(what: str, handle: Any) -> Callable[[], None]:
            def run() -> None:
                b.destroy(handle)
                self.gone.add(what)

            return run

        def free(what: str, fn: Callable[[], None]) -> Callable[[], None]:
            def run() -> None:
                fn()
                self.gone.add(what)

            return run

        calls: dict[tuple[str, str], Callable[[], Any]] = {
            ("cuStreamSynchronize", "the capturing stream"): lambda: b.synchronize(s),
            ("cuStreamQuery", "the capturing stream"): lambda: b.synchronize(s, block=False),
            ("cuCtxSynchronize", "the device"): lambda: b.synchronize(i),
            ("cuStreamSynchronize", "another stream"): lambda: b.synchronize(self.other),
            ("cuEventSynchronize", "an event recorded before the capture"): lambda: b.synchronize(self.event),
            ("cuGraphExecDestroy", "another graph's executable"): destroy("exec", self.graph._exec),
            ("cuEventDestroy", "an event"): destroy("event", self.spare_event),
            ("cuStreamDestroy", "another stream"): destroy("stream", self.spare),
            ("cuMemAllocFromPoolAsync", "another stream"): lambda: self.made.append(
                ("ptr", b.mem_alloc(i, 512, self.other))
            ),
            ("cuMemFreeAsync", "another stream"): free("ptr", lambda: b.mem_free(self.spare_ptr, self.other)),
            ("cuMemHostAlloc", "host memory"): lambda: self.made.append(("host", b.host_alloc(64))),
            ("cuMemFreeHost", "host memory"): free("host", lambda: b.host_free(self.host)),
            ("cuMemcpyHtoDAsync", "the capturing stream, from pageable memory"): lambda: b.memcpy(
                s, Copy(self.ptr, self.pageable.ctypes.data, 64, "htod")
            ),
            ("cuMemcpyDtoHAsync", "the capturing stream, to pageable memory"): lambda: b.memcpy(
                s, Copy(self.pageable.ctypes.data, self.ptr, 64, "dtoh")
            ),
            ("cuGraphLaunch", "the capturing stream"): lambda: b.graph_launch(self.graph._exec, s),
            ("cuStreamWaitEvent", "an event recorded outside the capture"): lambda: b.stream_wait_event(
                s, self.event
            ),
            ("cuGraphInstantiate", "another graph"): lambda: self.made.append(
                ("exec", b.graph_instantiate(self.graph._res.graph, False))
            ),
            ("cuMemcpyPeerAsync", "the capturing stream"): lambda: b.memcpy(
                s, Copy(self.peer_ptr(), self.ptr, 64, "peer")
            ),
            ("cuModuleLoadData", "a new module (compiling and loading a kernel)"): lambda: cg.Kernel(
                f'extern "C" __global__ void k{next(_fresh)}(float* p) {{ p[0] = 1; }}',
                f"k{next(_fresh) - 1}",
                host=lambda p: None,
            ).function(self.dev),
        }
        return calls[key]

    def peer_ptr(self) -> int:
        """Memory on a second device (made before the capture that uses it)."""
        return self._peer_ptr

    def prepare(self, rule: Rule) -> None:
        """What a row needs beyond one device: a second device's memory for a peer copy."""
        self._peer_ptr = 0
        if rule.call == "cuMemcpyPeerAsync":
            if cg.device_count() < 2:
                pytest.skip("a row between two devices: needs two GPUs")
            other = cg.Device(1)
            self._peer_ptr = self.b.mem_alloc(1, 512, other.stream._raw)
            self.b.synchronize(1)
            self.made.append(("peer", self._peer_ptr))

    def close(self) -> None:
        b, i = self.b, self.dev.index
        b.synchronize(i)
        for kind, handle in self.made:
            if kind == "exec":
                b.destroy(handle)
            elif kind == "peer":
                b.mem_free(handle, cg.Device(1).stream._raw)
                b.synchronize(1)
            else:
                (b.host_free if kind == "host" else lambda p: b.mem_free(p, self.other))(handle)
        if "exec" in self.gone:
            self.graph._exec = self.graph._res.exec = None  # the row destroyed it
        self.graph.close()
        b.mem_free(self.ptr, self.other)
        if "ptr" not in self.gone:
            b.mem_free(self.spare_ptr, self.other)
        if "host" not in self.gone:
            b.host_free(self.host)
        for what, handle in (("event", self.spare_event), ("stream", self.spare)):
            if what not in self.gone:
                b.destroy(handle)
        b.synchronize(i)
        for handle in (self.event, self.s, self.other):
            b.destroy(handle)


def _end(b: Any, s: Any) -> str:
    """The capture's status, then end it (destroying a graph it made)."""
    status: str = b.capture_info(s)[0]
    try:
        graph = b.capture_end(s)
    except CudaError:
        return status  # an invalidated capture ends with an error: nothing to destroy
    b.destroy(graph)
    return status


@pytest.fixture
def case(dev: cg.Device, backend: str) -> Iterator[Case]:
    # (sim: a second simulated device for the rows between two devices; GPUs have what they have)
    with cg.override(**({"sim_devices": 2} if backend == "sim" else {})):
        c = Case(dev)
        yield c
        c.close()


@pytest.mark.parametrize("mode", CAPTURE_MODES)
@pytest.mark.parametrize("rule", RULES, ids=lambda r: f"{r.call}({r.target})")
def test_the_driver_refuses_what_the_table_says(case: Case, rule: Rule, mode: str) -> None:
    b, s = case.b, case.s
    case.prepare(rule)
    call = case.call(rule)
    b.capture_begin(s, mode)
    error: CudaError | None = None
    try:
        call()
    except CudaError as exc:
        error = exc
    status = _end(b, s)
    refused = mode in rule.refused_in
    if refused:
        where = f"{rule.call} on {rule.target} in a {mode} capture"
        assert error is not None, f"{where}: expected code {rule.code}, it succeeded"
        assert error.code == rule.code, f"{where}: expected code {rule.code}, got {error!r}"
        assert status == ("invalidated" if rule.invalidates else "active"), (
            f"{rule.call} on {rule.target} in a {mode} capture left it {status}"
        )
    else:
        assert error is None, f"{rule.call} on {rule.target} in a {mode} capture: {error!r}"
        assert status == "active", f"{rule.call} on {rule.target} in a {mode} capture left it {status}"


@pytest.mark.parametrize("mode", CAPTURE_MODES)
@pytest.mark.parametrize("rule", RULES, ids=lambda r: f"{r.call}({r.target})")
def test_the_same_call_from_another_thread(case: Case, rule: Rule, mode: str) -> None:
    """What another thread's call does to this thread's capture (``other_*`` columns)."""
    b, s = case.b, case.s
    case.prepare(rule)
    call = case.call(rule)
    b.capture_begin(s, mode)
    errors: list[BaseException] = []

    def other() -> None:
        try:
            call()
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    status = _end(b, s)
    error = errors[0] if errors else None
    where = f"{rule.call} on {rule.target} from another thread during a {mode} capture"
    if mode in rule.other_refused_in:
        assert isinstance(error, CudaError), f"{where}: {error!r}"
        assert error.code == rule.code, f"{where}: {error!r}"
    else:
        assert error is None, f"{where}: {error!r}"
    expected = "invalidated" if mode in rule.other_invalidates_in else "active"
    assert status == expected, f"{where} left it {status}"


def test_the_docs_show_the_tables_as_they_are() -> None:
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root / "scripts"))
    from rules_table import faults_table, rules_table

    page = (root / "docs" / "simulator.md").read_text()
    assert rules_table() in page, "regenerate with scripts/rules_table.py"
    assert faults_table() in page, "regenerate with scripts/rules_table.py"
