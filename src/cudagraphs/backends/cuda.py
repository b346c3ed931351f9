"""The ``cuda`` backend: real GPUs through cuda.core and cuda.bindings.

This is the only module that imports ``cuda.core``/``cuda.bindings``, and only
when the backend is first used, so importing cudagraphs never needs a GPU.

cuda.core compiles (NVRTC, with its on-disk program cache) and selects the
device's primary context; hot paths (launch, allocation, copies, events) call
``cuda.bindings.driver`` directly, because cuda.core's wrappers cost several
microseconds per call where the driver call costs about two.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._config import settings
from .._errors import BackendUnavailableError, CudaError, KernelCompileError, UpdateError
from . import base
from .base import DeviceProperties

__all__ = ["CudaBackend", "NvrtcUnavailable", "nvrtc_compile"]

CUDA_ERROR_INVALID_CONTEXT = 201
_drv: Any = None
_graph_launch: Any = None  # cuGraphLaunch, bound when the backend starts
_HOST_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_cuda_lib: Any = None


def _libcuda() -> Any:
    """The driver library (already loaded by cuda.bindings), for calls made through ctypes."""
    global _cuda_lib
    if _cuda_lib is None:
        lib = ctypes.CDLL("libcuda.so.1")
        lib.cuLaunchHostFunc.argtypes = [ctypes.c_void_p, _HOST_FN, ctypes.c_void_p]
        lib.cuLaunchHostFunc.restype = ctypes.c_int
        _cuda_lib = lib
    return _cuda_lib


class NvrtcUnavailable(RuntimeError):
    """NVRTC (the runtime compiler library) cannot be loaded here."""


def _driver() -> Any:
    global _drv
    if _drv is None:
        try:
            from cuda.bindings import driver
        except Exception as exc:  # ImportError, or a broken install
            raise BackendUnavailableError(
                f"the cuda backend needs cuda-bindings: {exc}. Install it with "
                "`pip install cuda-bindings cuda-core`, or use CUDAGRAPHS_BACKEND=sim"
            ) from exc
        _drv = driver
    return _drv


def _raise(err: Any, call: str, detail: str = "") -> None:
    drv = _driver()
    res, name = drv.cuGetErrorName(err)
    text = name.decode() if not res and name else f"CUresult {int(err)}"
    raise CudaError(int(err), text, call, detail)


def _check(result: tuple, call: str) -> Any:
    """Return the value(s) of a driver call, raising CudaError on failure."""
    if result[0]:
        _raise(result[0], call)
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


def nvrtc_compile(source: str, name: str, arch: str, options: Sequence[str]) -> bytes:
    """Compile CUDA C++ ``source`` to a cubin for ``arch`` through cuda.core.

    Results are cached on disk in ``CUDAGRAPHS_CACHE_DIR`` by cuda.core's
    program cache (keyed by source, options, target and NVRTC version).

    Raises
    ------
    KernelCompileError
        With NVRTC's log when the source does not compile.
    NvrtcUnavailable
        When NVRTC or cuda.core cannot be loaded.
    """
    try:
        from cuda.core import Program, ProgramOptions
        from cuda.core._utils.cuda_utils import NVRTCError
    except Exception as exc:
        raise NvrtcUnavailable(f"cuda.core is not importable: {exc}") from exc
    macros = [o[2:] for o in options if o.startswith("-D")]
    defines = [tuple(m.split("=", 1)) if "=" in m else m for m in macros]
    opts = ProgramOptions(
        name=f"{name}.cu", arch=arch, std="c++17", define_macro=defines or None
    )
    try:
        program = Program(source, "c++", opts)
    except Exception as exc:
        raise NvrtcUnavailable(f"NVRTC cannot be loaded: {exc}") from exc
    try:
        cache = _program_cache()
        code = program.compile("cubin", cache=cache) if cache else program.compile("cubin")
    except NVRTCError as exc:
        text = str(exc)
        log = text.split("compilation log:", 1)[-1]
        raise KernelCompileError(name, log) from None
    except Exception as exc:
        if "nvrtc" in type(exc).__name__.lower() or "DynamicLib" in type(exc).__name__:
            raise NvrtcUnavailable(f"NVRTC cannot be loaded: {exc}") from exc
        raise
    finally:
        program.close()
    return bytes(code.code)


_caches: dict[str, Any] = {}


def _program_cache() -> Any:
    path = str(settings().cache_dir / "kernels")
    cache = _caches.get(path)
    if cache is None:
        try:
            from cuda.core.utils import FileStreamProgramCache

            cache = FileStreamProgramCache(path)
        except OSError:  # read-only home: compile without a disk cache
            cache = False
        _caches[path] = cache
    return cache


_STRUCT_CODES = {
    "b": "b", "B": "B", "h": "h", "H": "H", "i": "i", "I": "I", "l": "q", "L": "Q",
    "q": "q", "Q": "Q", "f": "f", "d": "d", "e": "e", "?": "?",
}


class _Packer:
    """Packs kernel arguments into one buffer and a ``void*[]`` pointing into it.

    Each parameter sits at its natural alignment; the pointer array is built
    once, so a launch costs one ``struct.pack_into``.
    """

    __slots__ = ("fmt", "buf", "ptrs", "address", "lock")

    def __init__(self, params: Sequence[base.Param]) -> None:
        fmt, offsets, offset = "<", [], 0
        for p in params:
            size = p.dtype.itemsize
            align = 8 if p.dtype.kind == "V" else max(1, p.dtype.alignment)
            pad = -offset % align
            fmt += "x" * pad
            offset += pad
            offsets.append(offset)
            code = _STRUCT_CODES.get(p.dtype.char) if p.dtype.kind != "V" else None
            fmt += code if code and struct.calcsize(code) == size else f"{size}s"
            offset += size
        self.fmt = struct.Struct(fmt)
        self.buf = ctypes.create_string_buffer(max(offset, 8))
        base_addr = ctypes.addressof(self.buf)
        self.ptrs = (ctypes.c_void_p * max(len(params), 1))(
            *[base_addr + o for o in offsets]
        )
        self.address = ctypes.addressof(self.ptrs) if params else 0
        self.lock = threading.Lock()


class CudaBackend:
    """The CUDA driver primitives of :class:`~.base.Backend`."""

    name = "cuda"

    def __init__(self) -> None:
        drv = _driver()
        try:
            _check(drv.cuInit(0), "cuInit")
            count = _check(drv.cuDeviceGetCount(), "cuDeviceGetCount")
        except CudaError as exc:
            raise BackendUnavailableError(f"no usable CUDA driver: {exc}") from exc
        except Exception as exc:  # libcuda missing
            raise BackendUnavailableError(f"no CUDA driver on this machine: {exc}") from exc
        if count < 1:
            raise BackendUnavailableError("the CUDA driver reports no GPU")
        global _graph_launch
        _graph_launch = drv.cuGraphLaunch
        self._count = count
        self._lock = threading.Lock()
        self._ctx: dict[int, Any] = {}
        self._pools: dict[int, Any] = {}
        self._modules: list[Any] = []
        self._host: set[int] = set()
        self._bodies: dict[int, list[Any]] = {}  # conditional node -> its body graphs

    # devices ------------------------------------------------------------
    def device_count(self) -> int:
        return self._count

    def device_properties(self, ordinal: int) -> DeviceProperties:
        drv = _driver()
        dev = _check(drv.cuDeviceGet(ordinal), "cuDeviceGet")
        attr = drv.CUdevice_attribute
        get = lambda a: _check(drv.cuDeviceGetAttribute(a, dev), "cuDeviceGetAttribute")  # noqa: E731
        name = _check(drv.cuDeviceGetName(256, dev), "cuDeviceGetName")
        return DeviceProperties(
            name=name.split(b"\0", 1)[0].decode(),
            compute_capability=(
                get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
            ),
            total_memory=_check(drv.cuDeviceTotalMem(dev), "cuDeviceTotalMem"),
            multiprocessors=get(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
        )

    def activate(self, ordinal: int) -> None:
        """Make the device's primary context current on this thread."""
        if not 0 <= ordinal < self._count:
            raise BackendUnavailableError(
                f"CUDA device {ordinal} does not exist; this machine has {self._count}"
            )
        drv = _driver()
        with self._lock:
            ctx = self._ctx.get(ordinal)
            if ctx is None:
                from cuda.core import Device as CoreDevice

                CoreDevice(ordinal).set_current()  # retains the primary context
                ctx = _check(drv.cuCtxGetCurrent(), "cuCtxGetCurrent")
                self._ctx[ordinal] = ctx
                dev = _check(drv.cuDeviceGet(ordinal), "cuDeviceGet")
                self._pools[ordinal] = _check(
                    drv.cuDeviceGetDefaultMemPool(dev), "cuDeviceGetDefaultMemPool"
                )
        _check(drv.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    def _retry(self, err: Any, call: str, again: Callable[[], tuple]) -> tuple:
        """Recover from a thread with no current context, then call again."""
        if int(err) == CUDA_ERROR_INVALID_CONTEXT and self._ctx:
            _check(_driver().cuCtxSetCurrent(next(iter(self._ctx.values()))), "cuCtxSetCurrent")
            result = again()
            if not result[0]:
                return result
            err = result[0]
        _raise(err, call)
        raise AssertionError("unreachable")

    def device_synchronize(self, ordinal: int) -> None:
        drv = _driver()
        self.activate(ordinal)
        _check(drv.cuCtxSynchronize(), "cuCtxSynchronize")

    # streams and events -------------------------------------------------
    def stream_create(self, ordinal: int) -> Any:
        drv = _driver()
        self.activate(ordinal)
        return _check(
            drv.cuStreamCreate(drv.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate"
        )

    def stream_destroy(self, stream: Any) -> None:
        _check(_driver().cuStreamDestroy(stream), "cuStreamDestroy")

    def stream_address(self, stream: Any) -> int:
        return int(stream)

    def stream_from_address(self, address: int) -> Any:
        """A handle for a stream made elsewhere (1 and 2: legacy, per-thread)."""
        return _driver().CUstream(address)

    def stream_synchronize(self, stream: Any) -> None:
        _check(_driver().cuStreamSynchronize(stream), "cuStreamSynchronize")

    def stream_query(self, stream: Any) -> bool:
        (err,) = _driver().cuStreamQuery(stream)
        if err and int(err) != base.CUDA_ERROR_NOT_READY:
            _raise(err, "cuStreamQuery")
        return not err

    def stream_wait_event(self, stream: Any, event: Any) -> None:
        _check(_driver().cuStreamWaitEvent(stream, event, 0), "cuStreamWaitEvent")

    def event_create(self, ordinal: int, timing: bool) -> Any:
        drv = _driver()
        flags = 0 if timing else drv.CUevent_flags.CU_EVENT_DISABLE_TIMING
        result = drv.cuEventCreate(flags)
        if result[0]:
            result = self._retry(result[0], "cuEventCreate", lambda: drv.cuEventCreate(flags))
        return result[1]

    def event_destroy(self, event: Any) -> None:
        _check(_driver().cuEventDestroy(event), "cuEventDestroy")

    def event_record(self, event: Any, stream: Any) -> None:
        _check(_driver().cuEventRecord(event, stream), "cuEventRecord")

    def event_synchronize(self, event: Any) -> None:
        _check(_driver().cuEventSynchronize(event), "cuEventSynchronize")

    def event_query(self, event: Any) -> bool:
        (err,) = _driver().cuEventQuery(event)
        if err and int(err) != base.CUDA_ERROR_NOT_READY:
            _raise(err, "cuEventQuery")
        return not err

    def event_elapsed_ms(self, start: Any, end: Any) -> float:
        return float(_check(_driver().cuEventElapsedTime(start, end), "cuEventElapsedTime"))

    # memory -------------------------------------------------------------
    def mem_alloc(self, ordinal: int, nbytes: int, stream: Any) -> int:
        drv = _driver()
        pool = self._pools[ordinal]
        result = drv.cuMemAllocFromPoolAsync(nbytes, pool, stream)
        if result[0]:
            result = self._retry(
                result[0],
                "cuMemAllocFromPoolAsync",
                lambda: drv.cuMemAllocFromPoolAsync(nbytes, pool, stream),
            )
        return int(result[1])

    def mem_free(self, ptr: int, stream: Any) -> None:
        _check(_driver().cuMemFreeAsync(ptr, stream), "cuMemFreeAsync")

    def mem_trim(self, ordinal: int) -> None:
        _check(_driver().cuMemPoolTrimTo(self._pools[ordinal], 0), "cuMemPoolTrimTo")

    def mem_set_release_threshold(self, ordinal: int, nbytes: int) -> None:
        drv = _driver()
        _check(
            drv.cuMemPoolSetAttribute(
                self._pools[ordinal],
                drv.CUmemPool_attribute.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                drv.cuuint64_t(nbytes),
            ),
            "cuMemPoolSetAttribute",
        )

    def mem_info(self, ordinal: int) -> tuple[int, int]:
        self.activate(ordinal)
        free, total = _check(_driver().cuMemGetInfo(), "cuMemGetInfo")
        return int(free), int(total)

    def host_alloc(self, nbytes: int) -> tuple[int, np.ndarray]:
        drv = _driver()
        result = drv.cuMemHostAlloc(max(nbytes, 1), 0)
        if result[0]:
            result = self._retry(
                result[0], "cuMemHostAlloc", lambda: drv.cuMemHostAlloc(max(nbytes, 1), 0)
            )
        ptr = int(result[1])
        with self._lock:
            self._host.add(ptr)
        array = np.ctypeslib.as_array((ctypes.c_uint8 * max(nbytes, 1)).from_address(ptr))
        return ptr, array[:nbytes]

    def host_free(self, ptr: int) -> None:
        with self._lock:
            self._host.discard(ptr)
        _check(_driver().cuMemFreeHost(ptr), "cuMemFreeHost")

    # copies -------------------------------------------------------------
    def memcpy_htod(self, dst: int, src: np.ndarray, stream: Any) -> None:
        _check(
            _driver().cuMemcpyHtoDAsync(dst, src.ctypes.data, src.nbytes, stream),
            "cuMemcpyHtoDAsync",
        )

    def memcpy_dtoh(self, dst: np.ndarray, src: int, stream: Any) -> None:
        _check(
            _driver().cuMemcpyDtoHAsync(dst.ctypes.data, src, dst.nbytes, stream),
            "cuMemcpyDtoHAsync",
        )

    def memcpy_dtod(self, dst: int, src: int, nbytes: int, stream: Any) -> None:
        _check(_driver().cuMemcpyDtoDAsync(dst, src, nbytes, stream), "cuMemcpyDtoDAsync")

    def memset_d8(self, dst: int, value: int, nbytes: int, stream: Any) -> None:
        _check(_driver().cuMemsetD8Async(dst, value, nbytes, stream), "cuMemsetD8Async")

    # stream capture and graphs -----------------------------------------
    def capture_begin(self, stream: Any, mode: str) -> None:
        drv = _driver()
        _check(
            drv.cuStreamBeginCapture(stream, drv.CUstreamCaptureMode(base.CAPTURE_MODES.index(mode))),
            "cuStreamBeginCapture",
        )

    def capture_end(self, stream: Any) -> Any:
        return _check(_driver().cuStreamEndCapture(stream), "cuStreamEndCapture")

    def capture_status(self, stream: Any) -> str:
        status = _check(_driver().cuStreamIsCapturing(stream), "cuStreamIsCapturing")
        return ("none", "active", "invalidated")[int(status)]

    def capture_exchange_mode(self, mode: str) -> str:
        drv = _driver()
        old = _check(
            drv.cuThreadExchangeStreamCaptureMode(
                drv.CUstreamCaptureMode(base.CAPTURE_MODES.index(mode))
            ),
            "cuThreadExchangeStreamCaptureMode",
        )
        return base.CAPTURE_MODES[int(old)]

    def _capture_point(self, stream: Any) -> tuple[Any, list[Any]]:
        """(graph being captured into, current dependencies) of a capturing stream."""
        result = _check(_driver().cuStreamGetCaptureInfo(stream), "cuStreamGetCaptureInfo")
        graph, deps, count = result[2], result[3], int(result[-1])
        return graph, list(deps[:count]) if count else []

    def capture_condition(self, stream: Any, default: int) -> int:
        drv = _driver()
        graph, _ = self._capture_point(stream)
        ctx = _check(drv.cuCtxGetCurrent(), "cuCtxGetCurrent")
        assign_default = 1  # CU_GRAPH_COND_ASSIGN_DEFAULT: the default at each launch
        handle = _check(
            drv.cuGraphConditionalHandleCreate(graph, ctx, default, assign_default),
            "cuGraphConditionalHandleCreate",
        )
        return int(handle)

    def capture_conditional(self, stream: Any, kind: str, size: int, handle: int) -> list[Any]:
        drv = _driver()
        graph, deps = self._capture_point(stream)
        params = drv.CUgraphNodeParams()
        params.type = drv.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
        params.conditional.handle = drv.CUgraphConditionalHandle(handle)
        params.conditional.type = drv.CUgraphConditionalNodeType(base.CONDITIONAL_KINDS.index(kind))
        params.conditional.size = size
        params.conditional.ctx = _check(drv.cuCtxGetCurrent(), "cuCtxGetCurrent")
        node = _check(drv.cuGraphAddNode(graph, deps, None, len(deps), params), "cuGraphAddNode")
        bodies = list(params.conditional.phGraph_out[:size])
        self._bodies[int(node)] = bodies
        _check(
            drv.cuStreamUpdateCaptureDependencies(
                stream, [node], None, 1,
                drv.CUstreamUpdateCaptureDependencies_flags.CU_STREAM_SET_CAPTURE_DEPENDENCIES,
            ),
            "cuStreamUpdateCaptureDependencies",
        )
        return bodies

    def capture_to_body(self, stream: Any, body: Any, mode: str) -> None:
        drv = _driver()
        _check(
            drv.cuStreamBeginCaptureToGraph(
                stream, body, None, None, 0, drv.CUstreamCaptureMode(base.CAPTURE_MODES.index(mode))
            ),
            "cuStreamBeginCaptureToGraph",
        )

    def capture_dependencies(self, stream: Any) -> list[Any]:
        return self._capture_point(stream)[1]

    def capture_set_dependencies(self, stream: Any, nodes: Sequence[Any]) -> None:
        drv = _driver()
        _check(
            drv.cuStreamUpdateCaptureDependencies(
                stream, list(nodes), None, len(nodes),
                drv.CUstreamUpdateCaptureDependencies_flags.CU_STREAM_SET_CAPTURE_DEPENDENCIES,
            ),
            "cuStreamUpdateCaptureDependencies",
        )

    def capture_empty(self, stream: Any) -> None:
        graph, deps = self._capture_point(stream)
        node = _check(_driver().cuGraphAddEmptyNode(graph, deps, len(deps)), "cuGraphAddEmptyNode")
        self.capture_set_dependencies(stream, [node])

    def capture_child(self, stream: Any, child: Any) -> None:
        graph, deps = self._capture_point(stream)
        node = _check(
            _driver().cuGraphAddChildGraphNode(graph, deps, len(deps), child), "cuGraphAddChildGraphNode"
        )
        self.capture_set_dependencies(stream, [node])

    def capture_event_record(self, stream: Any, event: Any) -> None:
        drv = _driver()
        flag = drv.CUevent_record_flags.CU_EVENT_RECORD_EXTERNAL  # a node, not a capture join
        _check(drv.cuEventRecordWithFlags(event, stream, flag), "cuEventRecordWithFlags")

    def capture_event_wait(self, stream: Any, event: Any) -> None:
        drv = _driver()
        _check(drv.cuStreamWaitEvent(stream, event, drv.CUevent_wait_flags.CU_EVENT_WAIT_EXTERNAL),
               "cuStreamWaitEvent")

    def launch_host(self, stream: Any, fn: Callable[[], None]) -> object:
        """Queue ``fn()`` on the host after the stream's work (a host node when captured).

        Returns the C callback, which must stay alive as long as it may run.
        The driver is called through ctypes here: cuda.bindings wraps the
        callback in data it frees after the first call, which a host node
        that runs on every replay would then use after it was freed.
        """
        callback = _HOST_FN(lambda _: fn())
        err = _libcuda().cuLaunchHostFunc(ctypes.c_void_p(int(stream)), callback, None)
        if err:
            _raise(_driver().CUresult(err), "cuLaunchHostFunc")
        return callback

    def graph_node_count(self, graph: Any) -> int:
        return int(_check(_driver().cuGraphGetNodes(graph, 0), "cuGraphGetNodes")[1])

    def graph_nodes(self, graph: Any) -> list[tuple[str, str]]:
        drv = _driver()
        count = self.graph_node_count(graph)
        nodes, _ = _check(drv.cuGraphGetNodes(graph, count), "cuGraphGetNodes")
        out = []
        for node in nodes[:count]:
            kind = int(_check(drv.cuGraphNodeGetType(node), "cuGraphNodeGetType"))
            name = base.NODE_TYPES[kind] if kind < len(base.NODE_TYPES) else f"type{kind}"
            label = ""
            if name == "kernel":
                params = _check(drv.cuGraphKernelNodeGetParams(node), "cuGraphKernelNodeGetParams")
                res, fname = drv.cuFuncGetName(params.func)
                if not res and fname:
                    label = fname.decode() if isinstance(fname, bytes) else str(fname)
            out.append((name, label))
        return out

    def graph_edges(self, graph: Any) -> list[tuple[int, int]]:
        """(from, to) node indices, in the order of :meth:`graph_nodes`."""
        drv = _driver()
        count = self.graph_node_count(graph)
        nodes, _ = _check(drv.cuGraphGetNodes(graph, count), "cuGraphGetNodes")
        index = {int(n): i for i, n in enumerate(nodes[:count])}
        n_edges = int(_check(drv.cuGraphGetEdges(graph, 0), "cuGraphGetEdges")[-1])
        if not n_edges:
            return []
        result = _check(drv.cuGraphGetEdges(graph, n_edges), "cuGraphGetEdges")
        sources, targets = result[0], result[1]
        return [(index[int(a)], index[int(b)]) for a, b in zip(sources[:n_edges], targets[:n_edges])]

    def graph_bodies(self, graph: Any, index: int) -> list[Any]:
        """The body graphs of conditional node ``index`` (none for other nodes)."""
        # remembered when the node was made: this driver has no cuGraphNodeGetParams
        node = self.graph_node_handles(graph)[index]
        return list(self._bodies.get(int(node), ()))

    def graph_instantiate(self, graph: Any, auto_free: bool) -> Any:
        drv = _driver()
        flags = int(drv.CUgraphInstantiate_flags.CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH) if auto_free else 0
        return _check(drv.cuGraphInstantiate(graph, flags), "cuGraphInstantiate")

    def graph_exec_update(self, exec_: Any, graph: Any) -> None:
        drv = _driver()
        err, info = drv.cuGraphExecUpdate(exec_, graph)
        if not err:
            return
        if int(err) != int(drv.CUresult.CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE):
            _raise(err, "cuGraphExecUpdate")
        if info is None:  # cuda.bindings drops the result info when the call fails
            raise UpdateError(base.UPDATE_REASONS[1])
        result = int(info.result)
        reason = base.UPDATE_REASONS[result] if result < len(base.UPDATE_REASONS) else f"result {result}"
        node = None
        if info.errorNode is not None and int(info.errorNode):
            count = self.graph_node_count(graph)
            nodes, _ = _check(drv.cuGraphGetNodes(graph, count), "cuGraphGetNodes")
            wanted = int(info.errorNode)
            node = next((i for i, n in enumerate(nodes[:count]) if int(n) == wanted), None)
        raise UpdateError(reason, node)

    def graph_node_handles(self, graph: Any) -> list[Any]:
        count = self.graph_node_count(graph)
        nodes, _ = _check(_driver().cuGraphGetNodes(graph, count), "cuGraphGetNodes")
        return list(nodes[:count])

    def graph_exec_kernel_update(
        self, exec_: Any, node: Any, launcher: Any,
        grid: tuple[int, int, int], block: tuple[int, int, int], shared_mem: int,
        raw: Sequence[object], objs: Sequence[object],
    ) -> None:
        drv = _driver()
        params = drv.CUDA_KERNEL_NODE_PARAMS()
        params.func = launcher.fn
        params.gridDimX, params.gridDimY, params.gridDimZ = grid
        params.blockDimX, params.blockDimY, params.blockDimZ = block
        params.sharedMemBytes = shared_mem
        packer = launcher.packer
        with packer.lock:  # the driver copies the arguments before returning
            packer.fmt.pack_into(packer.buf, 0, *raw)
            params.kernelParams = packer.address
            _check(drv.cuGraphExecKernelNodeSetParams(exec_, node, params),
                   "cuGraphExecKernelNodeSetParams")

    def graph_exec_memcpy_update(self, exec_: Any, node: Any, dst: int, src: int, nbytes: int) -> None:
        drv = _driver()
        params = drv.CUDA_MEMCPY3D()
        device_memory = drv.CUmemorytype.CU_MEMORYTYPE_DEVICE
        params.srcMemoryType, params.srcDevice = device_memory, src
        params.dstMemoryType, params.dstDevice = device_memory, dst
        params.WidthInBytes, params.Height, params.Depth = nbytes, 1, 1
        ctx = _check(drv.cuCtxGetCurrent(), "cuCtxGetCurrent")
        _check(drv.cuGraphExecMemcpyNodeSetParams(exec_, node, params, ctx),
               "cuGraphExecMemcpyNodeSetParams")

    def graph_upload(self, exec_: Any, stream: Any) -> None:
        _check(_driver().cuGraphUpload(exec_, stream), "cuGraphUpload")

    @staticmethod
    def graph_launch(exec_: Any, stream: Any) -> None:
        # the replay hot path: a plain function, the driver call bound once
        (err,) = _graph_launch(exec_, stream)
        if err:
            _raise(err, "cuGraphLaunch")

    def graph_destroy(self, graph: Any) -> None:
        if self._bodies:
            self._forget_bodies(graph)
        _check(_driver().cuGraphDestroy(graph), "cuGraphDestroy")

    def _forget_bodies(self, graph: Any) -> None:
        for node in self.graph_node_handles(graph):
            for body in self._bodies.pop(int(node), ()):
                self._forget_bodies(body)

    def graph_exec_destroy(self, exec_: Any) -> None:
        _check(_driver().cuGraphExecDestroy(exec_), "cuGraphExecDestroy")

    # kernels ------------------------------------------------------------
    def arch(self, ordinal: int) -> str:
        major, minor = self.device_properties(ordinal).compute_capability
        return f"sm_{major}{minor}"

    def compile(self, source: str, name: str, arch: str, options: Sequence[str]) -> bytes:
        try:
            return nvrtc_compile(source, name, arch, options)
        except NvrtcUnavailable as exc:
            raise BackendUnavailableError(
                f"cannot compile kernel {name!r}: {exc}. Install NVRTC "
                "(`pip install nvidia-cuda-nvrtc`) or the CUDA toolkit"
            ) from exc

    def load_kernel(
        self,
        ordinal: int,
        image: bytes,
        name: str,
        params: Sequence[base.Param],
        host: Callable[..., object] | None,
    ) -> base.Launcher:
        drv = _driver()
        self.activate(ordinal)
        module = _check(drv.cuModuleLoadData(image), "cuModuleLoadData")
        with self._lock:
            self._modules.append(module)  # modules live as long as the process
        fn = _check(drv.cuModuleGetFunction(module, name.encode()), "cuModuleGetFunction")
        # the closure must hold the packer: its pointer array is what
        # ``address`` points at, and the driver reads it on every launch
        packer = _Packer(params)
        pack = packer.fmt.pack_into
        address = packer.address
        launch_kernel = drv.cuLaunchKernel
        retry = self._retry

        def launch(
            stream: Any,
            grid: tuple[int, int, int],
            block: tuple[int, int, int],
            shared_mem: int,
            raw: Sequence[object],
            objs: Sequence[object],
        ) -> None:
            gx, gy, gz = grid
            bx, by, bz = block
            with packer.lock:  # the driver copies the arguments before returning
                pack(packer.buf, 0, *raw)
                (err,) = launch_kernel(fn, gx, gy, gz, bx, by, bz, shared_mem, stream, address, 0)
                if err:
                    retry(
                        err,
                        f"cuLaunchKernel({name})",
                        lambda: launch_kernel(
                            fn, gx, gy, gz, bx, by, bz, shared_mem, stream, address, 0
                        ),
                    )

        launch.fn = fn  # type: ignore[attr-defined]  # for kernel-node updates
        launch.packer = packer  # type: ignore[attr-defined]
        return launch
