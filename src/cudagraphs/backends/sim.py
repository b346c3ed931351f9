"""The ``sim`` backend: a CPU simulation of a CUDA device, in numpy.

It is the living spec of the library's behaviour on machines without a GPU:

* device memory is a set of numpy byte buffers at stable fake addresses that
  are never reused, so a stale pointer fails loudly (``CUDA_ERROR_ILLEGAL_ADDRESS``)
  instead of silently reading someone else's data;
* fresh allocations are filled with a poison byte, as real device memory
  holds whatever was there before;
* work runs in stream order (each call completes before it returns, which is
  one legal schedule of CUDA's stream semantics), events complete when recorded;
* kernels run their host implementation on numpy views of device memory;
  kernel sources are still compiled with NVRTC when it is installed, so a
  syntax error fails here exactly as on a GPU;
* errors carry CUDA's result codes (invalid value, out of memory, ...).
"""

from __future__ import annotations

import bisect
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._config import settings
from .._errors import BackendUnavailableError, CudaError, UpdateError
from . import base
from .base import DeviceProperties

__all__ = ["SimBackend"]

POISON = 0xCD
_ALIGN = 512
_BASE_ADDRESS = 0x7F00_0000_0000
CUDA_ERROR_ILLEGAL_ADDRESS = 700
CUDA_ERROR_INVALID_HANDLE = 400
CUDA_ERROR_ILLEGAL_STATE = 401


def _error(code: int, call: str, detail: str) -> CudaError:
    names = {
        base.CUDA_ERROR_INVALID_VALUE: "CUDA_ERROR_INVALID_VALUE",
        base.CUDA_ERROR_OUT_OF_MEMORY: "CUDA_ERROR_OUT_OF_MEMORY",
        CUDA_ERROR_ILLEGAL_ADDRESS: "CUDA_ERROR_ILLEGAL_ADDRESS",
        CUDA_ERROR_INVALID_HANDLE: "CUDA_ERROR_INVALID_HANDLE",
        CUDA_ERROR_ILLEGAL_STATE: "CUDA_ERROR_ILLEGAL_STATE",
        base.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
        base.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
    }
    return CudaError(code, names[code], call, detail)


class _SimStream:
    __slots__ = ("address", "ordinal", "alive", "capture", "mode", "invalidated", "deps")

    def __init__(self, address: int, ordinal: int) -> None:
        self.address = address
        self.ordinal = ordinal
        self.alive = True
        self.capture: _SimGraph | None = None  # the graph being recorded
        self.mode = "thread_local"
        self.invalidated = False
        self.deps: list[int] = []  # what the next captured node depends on

    def record(self, kind: str, label: str, work: Callable[[], None]) -> int:
        """Add a node to the graph being captured, after the current dependencies.

        Nodes are kept in creation order, which is a valid order to run them
        in: a node only ever depends on earlier ones.
        """
        graph = self.capture
        assert graph is not None
        graph.nodes.append((kind, label, work))
        graph.deps.append(list(self.deps))
        index = len(graph.nodes) - 1
        self.deps = [index]
        return index


CONDITIONS: dict[int, int] = {}
"""Values of conditional handles; set by kernels' host code (cg.ops.set_condition)."""
_handles = itertools.count(1)


class _SimGraph:
    """A recorded graph: nodes in stream order (a chain, as one stream's capture)."""

    __slots__ = ("nodes", "deps", "bodies", "allocations", "conditions", "alive")

    def __init__(self) -> None:
        self.nodes: list[tuple[str, str, Callable[[], None]]] = []
        self.deps: list[list[int]] = []  # per node: the nodes it depends on
        self.bodies: dict[int, list[_SimGraph]] = {}  # conditional node -> its bodies
        self.allocations: list[int] = []  # graph-owned memory (mem_alloc nodes)
        self.conditions: list[tuple[int, int]] = []  # (handle, default) created in it
        self.alive = True

    def run(self) -> None:
        """One execution: conditions take their defaults, then the nodes run in order."""
        for handle, default in self.conditions:
            CONDITIONS[handle] = default
        for _, _, work in list(self.nodes):
            work()


class _SimExec:
    """An instantiated graph: its own copy of the node list, as in CUDA."""

    __slots__ = ("nodes", "conditions", "alive")

    def __init__(self, graph: _SimGraph) -> None:
        self.nodes = list(graph.nodes)
        self.conditions = list(graph.conditions)
        self.alive = True


class _SimEvent:
    __slots__ = ("timing", "time", "recorded", "alive")

    def __init__(self, timing: bool) -> None:
        self.timing = timing
        self.time = 0.0
        self.recorded = False
        self.alive = True


class _Memory:
    """All simulated device allocations of the process (addresses are global)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.starts: list[int] = []
        self.buffers: dict[int, np.ndarray] = {}
        self.owner: dict[int, tuple[int, int]] = {}  # start -> (device ordinal, bytes)
        self.used: dict[int, int] = {}  # ordinal -> bytes
        self.next = _BASE_ADDRESS

    def alloc(self, ordinal: int, nbytes: int, limit: int) -> int:
        with self.lock:
            used = self.used.get(ordinal, 0)
            if used + nbytes > limit:
                raise _error(
                    base.CUDA_ERROR_OUT_OF_MEMORY,
                    "cuMemAllocFromPoolAsync",
                    f"{nbytes} B requested, {limit - used} B free on sim device {ordinal}",
                )
            start = self.next
            self.next += max(_ALIGN, -(-nbytes // _ALIGN) * _ALIGN)
            buf = np.empty(max(nbytes, 1), dtype=np.uint8)
            buf.fill(POISON)
            bisect.insort(self.starts, start)
            self.buffers[start] = buf
            self.owner[start] = (ordinal, nbytes)
            self.used[ordinal] = used + nbytes
            return start

    def free(self, ptr: int) -> None:
        with self.lock:
            if self.buffers.pop(ptr, None) is None:
                raise _error(
                    base.CUDA_ERROR_INVALID_VALUE,
                    "cuMemFreeAsync",
                    f"0x{ptr:x} is not the start of a live allocation",
                )
            self.starts.pop(bisect.bisect_left(self.starts, ptr))
            ordinal, nbytes = self.owner.pop(ptr)
            self.used[ordinal] -= nbytes

    def resolve(self, ptr: int, nbytes: int, call: str) -> tuple[np.ndarray, int]:
        """Return (buffer, offset) holding ``[ptr, ptr + nbytes)``."""
        i = bisect.bisect_right(self.starts, ptr) - 1
        if i >= 0:
            start = self.starts[i]
            buf = self.buffers[start]
            off = ptr - start
            if off + nbytes <= buf.nbytes:
                return buf, off
        raise _error(
            CUDA_ERROR_ILLEGAL_ADDRESS,
            call,
            f"[0x{ptr:x}, +{nbytes}) is not inside a live sim allocation "
            "(freed memory or an out-of-bounds pointer)",
        )


class SimBackend:
    """CPU simulation of the CUDA primitives in :class:`~.base.Backend`."""

    name = "sim"

    def __init__(self) -> None:
        self._memory = _Memory()
        self._host: dict[int, np.ndarray] = {}
        self._addresses = itertools.count(0x5000, 0x10)
        self._compiler: bool | None = None
        self._lock = threading.Lock()
        self._capturing: set[_SimStream] = set()
        self._thread = threading.local()  # this thread's capture-mode setting

    # devices ------------------------------------------------------------
    def device_count(self) -> int:
        return settings().sim_devices

    def device_properties(self, ordinal: int) -> DeviceProperties:
        return DeviceProperties(
            name="cudagraphs sim device",
            compute_capability=(9, 0),
            total_memory=settings().sim_memory_mb << 20,
            multiprocessors=132,
        )

    def activate(self, ordinal: int) -> None:
        if not 0 <= ordinal < self.device_count():
            raise BackendUnavailableError(
                f"sim device {ordinal} does not exist; there are "
                f"{self.device_count()} (set CUDAGRAPHS_SIM_DEVICES for more)"
            )

    def device_synchronize(self, ordinal: int) -> None:
        blocked = self._blocking_captures(ordinal)
        if blocked:
            self._unsupported(blocked, "cuCtxSynchronize")

    # streams and events -------------------------------------------------
    def stream_create(self, ordinal: int) -> _SimStream:
        return _SimStream(next(self._addresses), ordinal)

    def stream_destroy(self, stream: _SimStream) -> None:
        self._live(stream, "cuStreamDestroy").alive = False

    def stream_address(self, stream: _SimStream) -> int:
        return stream.address

    def stream_from_address(self, address: int) -> _SimStream:
        return _SimStream(address, 0)

    def stream_synchronize(self, stream: _SimStream) -> None:
        self._live(stream, "cuStreamSynchronize")
        if stream.capture is not None:
            self._unsupported([stream], "cuStreamSynchronize")

    def stream_query(self, stream: _SimStream) -> bool:
        self._live(stream, "cuStreamQuery")
        if stream.capture is not None:
            self._unsupported([stream], "cuStreamQuery")
        return True

    def stream_wait_event(self, stream: _SimStream, event: _SimEvent) -> None:
        self._live(stream, "cuStreamWaitEvent")
        self._live(event, "cuStreamWaitEvent")

    def event_create(self, ordinal: int, timing: bool) -> _SimEvent:
        return _SimEvent(timing)

    def event_destroy(self, event: _SimEvent) -> None:
        self._live(event, "cuEventDestroy").alive = False

    def event_record(self, event: _SimEvent, stream: _SimStream) -> None:
        self._live(stream, "cuEventRecord")
        self._live(event, "cuEventRecord")
        event.recorded = True
        event.time = time.perf_counter()

    def event_synchronize(self, event: _SimEvent) -> None:
        self._live(event, "cuEventSynchronize")

    def event_query(self, event: _SimEvent) -> bool:
        self._live(event, "cuEventQuery")
        return True

    def event_elapsed_ms(self, start: _SimEvent, end: _SimEvent) -> float:
        for ev in (start, end):
            self._live(ev, "cuEventElapsedTime")
            if not ev.timing or not ev.recorded:
                raise _error(
                    CUDA_ERROR_INVALID_HANDLE,
                    "cuEventElapsedTime",
                    "both events must be created with timing=True and recorded",
                )
        return (end.time - start.time) * 1e3

    def _submit(
        self, stream: _SimStream, call: str, kind: str, label: str, work: Callable[[], None]
    ) -> None:
        """Run ``work`` now, or record it as a node when ``stream`` is capturing."""
        self._live(stream, call)
        if stream.capture is None:
            work()
        elif not stream.invalidated:
            stream.record(kind, label, work)

    def _unsupported(self, streams: list[_SimStream], call: str) -> None:
        """What CUDA does for an illegal call during capture: invalidate, then fail."""
        for st in streams:
            st.invalidated = True
        raise _error(
            base.CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, call,
            "operation not permitted when stream is capturing",
        )

    def _blocking_captures(self, ordinal: int) -> list[_SimStream]:
        """Captures a synchronizing call from this thread would break."""
        return [st for st in self._capturing
                if st.ordinal == ordinal and st.mode != "relaxed"
                and getattr(self._thread, "mode", "global") != "relaxed"]

    @staticmethod
    def _live(obj: Any, call: str) -> Any:
        if not getattr(obj, "alive", False):
            raise _error(CUDA_ERROR_INVALID_HANDLE, call, f"{obj!r} is destroyed")
        return obj

    # memory -------------------------------------------------------------
    def mem_alloc(self, ordinal: int, nbytes: int, stream: _SimStream) -> int:
        self._live(stream, "cuMemAllocFromPoolAsync")
        limit = self.device_properties(ordinal).total_memory
        ptr = self._memory.alloc(ordinal, nbytes, limit)
        if stream.capture is not None:  # a mem_alloc node: the graph owns it
            stream.capture.allocations.append(ptr)
            stream.record("mem_alloc", "", lambda: None)
        return ptr

    def mem_free(self, ptr: int, stream: _SimStream) -> None:
        graph = stream.capture
        if graph is not None and ptr in graph.allocations:
            stream.record("mem_free", "", lambda: None)  # freed with the graph
            return
        self._memory.free(ptr)

    def mem_trim(self, ordinal: int) -> None:
        return None

    def mem_set_release_threshold(self, ordinal: int, nbytes: int) -> None:
        return None

    def mem_info(self, ordinal: int) -> tuple[int, int]:
        total = self.device_properties(ordinal).total_memory
        return total - self._memory.used.get(ordinal, 0), total

    def host_alloc(self, nbytes: int) -> tuple[int, np.ndarray]:
        arr = np.empty(max(nbytes, 1), dtype=np.uint8)
        ptr = arr.ctypes.data
        with self._lock:
            self._host[ptr] = arr
        return ptr, arr[:nbytes]

    def host_free(self, ptr: int) -> None:
        with self._lock:
            if self._host.pop(ptr, None) is None:
                raise _error(
                    base.CUDA_ERROR_INVALID_VALUE, "cuMemFreeHost", f"0x{ptr:x} not pinned"
                )

    # copies -------------------------------------------------------------
    def _is_pinned(self, array: np.ndarray) -> bool:
        addr = array.ctypes.data
        with self._lock:
            return any(p <= addr and addr + array.nbytes <= p + h.nbytes for p, h in self._host.items())

    def memcpy_htod(self, dst: int, src: np.ndarray, stream: _SimStream) -> None:
        call = "cuMemcpyHtoDAsync"
        if stream.capture is not None and not self._is_pinned(src):
            self._unsupported([stream], call)  # a graph cannot re-read pageable memory
        buf, off = self._memory.resolve(dst, src.nbytes, call)
        flat = src.reshape(-1).view(np.uint8)

        def work() -> None:
            buf[off : off + flat.nbytes] = flat  # reads the host memory when it runs

        self._submit(stream, call, "memcpy", "", work)

    def memcpy_dtoh(self, dst: np.ndarray, src: int, stream: _SimStream) -> None:
        call = "cuMemcpyDtoHAsync"
        if stream.capture is not None and not self._is_pinned(dst):
            self._unsupported([stream], call)
        buf, off = self._memory.resolve(src, dst.nbytes, call)
        flat = dst.reshape(-1).view(np.uint8)

        def work() -> None:
            flat[...] = buf[off : off + flat.nbytes]

        self._submit(stream, call, "memcpy", "", work)

    def memcpy_dtod(self, dst: int, src: int, nbytes: int, stream: _SimStream) -> None:
        self._submit(stream, "cuMemcpyDtoDAsync", "memcpy", "", self._dtod(dst, src, nbytes))

    def _dtod(self, dst: int, src: int, nbytes: int) -> Callable[[], None]:
        call = "cuMemcpyDtoDAsync"
        sbuf, soff = self._memory.resolve(src, nbytes, call)
        dbuf, doff = self._memory.resolve(dst, nbytes, call)

        def work() -> None:
            # through a temporary: CUDA's memcpy on overlapping ranges is
            # undefined, the simulation picks memmove semantics
            dbuf[doff : doff + nbytes] = sbuf[soff : soff + nbytes].copy()

        return work

    def memset_d8(self, dst: int, value: int, nbytes: int, stream: _SimStream) -> None:
        call = "cuMemsetD8Async"
        buf, off = self._memory.resolve(dst, nbytes, call)

        def work() -> None:
            buf[off : off + nbytes] = value

        self._submit(stream, call, "memset", "", work)

    def view(
        self, ptr: int, shape: tuple[int, ...], strides: tuple[int, ...], dtype: np.dtype
    ) -> np.ndarray:
        """A writable numpy view of simulated device memory."""
        if not shape or 0 not in shape:
            lo = sum(s * (n - 1) for s, n in zip(strides, shape) if s < 0)
            hi = sum(s * (n - 1) for s, n in zip(strides, shape) if s > 0) + dtype.itemsize
        else:
            lo, hi = 0, 0
        buf, off = self._memory.resolve(ptr + lo, hi - lo, "kernel access")
        return np.ndarray(shape, dtype, buffer=buf, offset=off - lo, strides=strides)

    # stream capture and graphs -----------------------------------------
    def capture_begin(self, stream: _SimStream, mode: str) -> None:
        self._live(stream, "cuStreamBeginCapture")
        if stream.capture is not None:
            raise _error(CUDA_ERROR_ILLEGAL_STATE, "cuStreamBeginCapture", "stream is already capturing")
        stream.capture = _SimGraph()
        stream.deps = []
        stream.mode = mode
        stream.invalidated = False
        self._capturing.add(stream)

    def capture_end(self, stream: _SimStream) -> _SimGraph:
        self._live(stream, "cuStreamEndCapture")
        graph = stream.capture
        if graph is None:
            raise _error(CUDA_ERROR_ILLEGAL_STATE, "cuStreamEndCapture", "stream is not capturing")
        stream.capture = None
        self._capturing.discard(stream)
        if stream.invalidated:
            stream.invalidated = False
            self.graph_destroy(graph)
            raise _error(
                base.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "cuStreamEndCapture",
                "the capture was invalidated by an earlier illegal call",
            )
        return graph

    def capture_status(self, stream: _SimStream) -> str:
        self._live(stream, "cuStreamIsCapturing")
        if stream.capture is None:
            return "none"
        return "invalidated" if stream.invalidated else "active"

    def capture_exchange_mode(self, mode: str) -> str:
        old = getattr(self._thread, "mode", "global")
        self._thread.mode = mode
        return old

    def capture_condition(self, stream: _SimStream, default: int) -> int:
        graph = stream.capture
        if graph is None:
            raise _error(CUDA_ERROR_ILLEGAL_STATE, "cuGraphConditionalHandleCreate", "stream is not capturing")
        handle = next(_handles)
        graph.conditions.append((handle, default))
        CONDITIONS[handle] = default
        return handle

    def capture_conditional(self, stream: _SimStream, kind: str, size: int, handle: int) -> list[_SimGraph]:
        graph = stream.capture
        if graph is None:
            raise _error(CUDA_ERROR_ILLEGAL_STATE, "cuGraphAddNode", "stream is not capturing")
        bodies = [_SimGraph() for _ in range(size)]

        def work() -> None:  # CUDA's semantics of the three node types
            if kind == "while":
                while CONDITIONS.get(handle, 0):
                    bodies[0].run()
            elif kind == "if":
                if CONDITIONS.get(handle, 0):
                    bodies[0].run()
                elif size == 2:
                    bodies[1].run()
            else:
                index = CONDITIONS.get(handle, 0)
                if 0 <= index < size:  # out of range: no branch runs
                    bodies[index].run()

        index = stream.record("conditional", "", work)
        graph.bodies[index] = bodies
        return bodies

    def capture_to_body(self, stream: _SimStream, body: _SimGraph, mode: str) -> None:
        self.capture_begin(stream, mode)
        assert stream.capture is not None
        stream.capture = body  # record straight into the body graph

    def capture_dependencies(self, stream: _SimStream) -> list[int]:
        self._live(stream, "cuStreamGetCaptureInfo")
        return list(stream.deps)

    def capture_set_dependencies(self, stream: _SimStream, nodes: Sequence[int]) -> None:
        self._live(stream, "cuStreamUpdateCaptureDependencies")
        if stream.capture is None:
            raise _error(CUDA_ERROR_ILLEGAL_STATE, "cuStreamUpdateCaptureDependencies",
                         "stream is not capturing")
        stream.deps = list(nodes)

    def capture_empty(self, stream: _SimStream) -> None:
        stream.record("empty", "", lambda: None)

    def capture_child(self, stream: _SimStream, child: _SimGraph) -> None:
        self._live(child, "cuGraphAddChildGraphNode")
        stream.record("child", "", child.run)

    def capture_event_record(self, stream: _SimStream, event: _SimEvent) -> None:
        def work() -> None:
            event.recorded = True
            event.time = time.perf_counter()

        self._submit(stream, "cuEventRecordWithFlags", "event_record", "", work)

    def capture_event_wait(self, stream: _SimStream, event: _SimEvent) -> None:
        self._submit(stream, "cuStreamWaitEvent", "event_wait", "", lambda: None)

    def launch_host(self, stream: _SimStream, fn: Callable[[], None]) -> object:
        self._submit(stream, "cuLaunchHostFunc", "host", "", fn)
        return fn

    def graph_node_count(self, graph: _SimGraph) -> int:
        return len(self._live(graph, "cuGraphGetNodes").nodes)

    def graph_nodes(self, graph: _SimGraph) -> list[tuple[str, str]]:
        self._live(graph, "cuGraphGetNodes")
        return [(kind, label) for kind, label, _ in graph.nodes]

    def graph_edges(self, graph: _SimGraph) -> list[tuple[int, int]]:
        # one stream's capture is a chain
        self._live(graph, "cuGraphGetEdges")
        return [(d, i) for i, deps in enumerate(graph.deps) for d in deps]

    def graph_bodies(self, graph: _SimGraph, index: int) -> list[_SimGraph]:
        return list(self._live(graph, "cuGraphNodeGetParams").bodies.get(index, []))

    def graph_instantiate(self, graph: _SimGraph, auto_free: bool) -> _SimExec:
        self._live(graph, "cuGraphInstantiate")
        return _SimExec(graph)

    def graph_exec_update(self, exec_: _SimExec, graph: _SimGraph) -> None:
        """CUDA's checks, then the new nodes: exec keeps the old ones on failure."""
        self._live(exec_, "cuGraphExecUpdate")
        self._live(graph, "cuGraphExecUpdate")
        old, new = exec_.nodes, graph.nodes
        if len(old) != len(new):
            raise UpdateError(base.UPDATE_REASONS[2], min(len(old), len(new)))
        for i, ((kind_a, _, _), (kind_b, _, _)) in enumerate(zip(old, new)):
            if kind_a != kind_b:
                raise UpdateError(base.UPDATE_REASONS[3], i)
        exec_.nodes = list(new)

    def graph_node_handles(self, graph: _SimGraph) -> list[int]:
        return list(range(len(self._live(graph, "cuGraphGetNodes").nodes)))

    def graph_exec_kernel_update(
        self, exec_: _SimExec, index: int, launcher: Any,
        grid: tuple[int, int, int], block: tuple[int, int, int], shared_mem: int,
        raw: Sequence[object], objs: Sequence[object],
    ) -> None:
        self._live(exec_, "cuGraphExecKernelNodeSetParams")
        kind, label, _ = exec_.nodes[index]
        if kind != "kernel":
            raise _error(base.CUDA_ERROR_INVALID_VALUE, "cuGraphExecKernelNodeSetParams",
                         f"node {index} is a {kind} node")
        exec_.nodes[index] = (kind, label, launcher.make_work(raw, objs))

    def graph_exec_memcpy_update(self, exec_: _SimExec, index: int, dst: int, src: int, nbytes: int) -> None:
        self._live(exec_, "cuGraphExecMemcpyNodeSetParams")
        kind, label, _ = exec_.nodes[index]
        if kind != "memcpy":
            raise _error(base.CUDA_ERROR_INVALID_VALUE, "cuGraphExecMemcpyNodeSetParams",
                         f"node {index} is a {kind} node")
        exec_.nodes[index] = (kind, label, self._dtod(dst, src, nbytes))

    def graph_upload(self, exec_: _SimExec, stream: _SimStream) -> None:
        self._live(exec_, "cuGraphUpload")
        self._live(stream, "cuGraphUpload")

    def graph_launch(self, exec_: _SimExec, stream: _SimStream) -> None:
        self._live(exec_, "cuGraphLaunch")
        nodes, conditions = exec_.nodes, exec_.conditions

        def work() -> None:
            for handle, default in conditions:
                CONDITIONS[handle] = default
            for _, _, run in list(nodes):
                run()

        self._submit(stream, "cuGraphLaunch", "child", "", work)

    def graph_destroy(self, graph: _SimGraph) -> None:
        self._live(graph, "cuGraphDestroy").alive = False
        graph.nodes.clear()
        graph.deps.clear()
        for ptr in graph.allocations:
            if ptr in self._memory.buffers:
                self._memory.free(ptr)
        graph.allocations.clear()

    def graph_exec_destroy(self, exec_: _SimExec) -> None:
        self._live(exec_, "cuGraphExecDestroy").alive = False
        exec_.nodes.clear()

    # kernels ------------------------------------------------------------
    def arch(self, ordinal: int) -> str:
        major, minor = self.device_properties(ordinal).compute_capability
        return f"sm_{major}{minor}"

    def compile(self, source: str, name: str, arch: str, options: Sequence[str]) -> bytes:
        """Check the source with NVRTC when it is installed; return a marker."""
        if self._compiler is not False:
            from . import cuda

            try:
                cuda.nvrtc_compile(source, name, arch, options)
                self._compiler = True
            except cuda.NvrtcUnavailable:
                self._compiler = False
        return b"sim:" + name.encode()

    @property
    def compiler_available(self) -> bool | None:
        """Whether NVRTC checked the last kernel (None before any compile)."""
        return self._compiler

    def load_kernel(
        self,
        ordinal: int,
        image: bytes,
        name: str,
        params: Sequence[base.Param],
        host: Callable[..., object] | None,
    ) -> base.Launcher:
        view = self.view
        resolve = self._memory.resolve
        submit = self._submit

        def make_work(raw: Sequence[object], objs: Sequence[object]) -> Callable[[], None]:
            """The kernel run as one closure: what a launch queues or a node holds."""
            assert host is not None
            # what a GPU gets: addresses and values, not the arrays themselves
            # (a recorded launch must not keep them alive)
            specs = [o._view_spec() if hasattr(o, "_view_spec") else None for o in objs]
            raw = list(raw)

            def work() -> None:
                # views are made when the kernel runs, from the addresses
                # given at launch, as a GPU reads its parameters
                args = []
                for spec, value, p in zip(specs, raw, params):
                    if not p.pointer:
                        if isinstance(value, bytes):
                            args.append(np.frombuffer(value, dtype=p.dtype)[0])
                        else:
                            args.append(p.dtype.type(value))
                    elif spec is not None:
                        args.append(view(*spec))
                    elif value:
                        buf, off = resolve(int(value), 0, "kernel access")
                        args.append(buf[off:])
                    else:
                        args.append(None)
                host(*args)

            return work

        def launch(
            stream: _SimStream,
            grid: tuple[int, int, int],
            block: tuple[int, int, int],
            shared_mem: int,
            raw: Sequence[object],
            objs: Sequence[object],
        ) -> None:
            if host is None:
                raise BackendUnavailableError(
                    f"kernel {name!r} has no host implementation, so it cannot run "
                    "on the sim backend: pass host=<numpy function> to cg.Kernel, "
                    "or run on the cuda backend"
                )
            submit(stream, "cuLaunchKernel", "kernel", name, make_work(raw, objs))

        launch.make_work = make_work  # type: ignore[attr-defined]
        return launch
