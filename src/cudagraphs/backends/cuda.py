"""The ``cuda`` backend: real GPUs through cuda.core and cuda.bindings.

This is the only module that imports ``cuda.core``/``cuda.bindings``, and only
when the backend is first used, so importing cudagraphs never needs a GPU.

The backend retains each device's primary context for the process's life
(compiling is :mod:`cudagraphs._nvrtc`'s, through cuda.core); hot paths
(launch, allocation, copies, events) call ``cuda.bindings.driver``
directly, because cuda.core's wrappers cost several microseconds per call
where the driver call costs about two.
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .._config import compiled_part, settings
from .._errors import BackendUnavailableError, CudaError, UpdateError
from . import base
from .base import (
    CUDA_ERROR_OUT_OF_MEMORY,
    Capabilities,
    Copy,
    DeviceProperties,
    KernelLaunch,
    NodeInfo,
    move_words,
)

__all__ = ["CudaBackend"]

CUDA_ERROR_INVALID_CONTEXT = 201
CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704
_drv: Any = None
_graph_launch: Any = None  # cuGraphLaunch, bound when the backend starts
# the driver functions of the hot paths, by name: cudagraphs._fastcall's when it is
# built and enabled, else cuda.bindings' (bound when the backend starts)
_call: dict[str, Any] = {}
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
    try:  # (fast calls return plain ints; a newer driver may return codes unknown here)
        res, name = drv.cuGetErrorName(drv.CUresult(int(err)))
    except ValueError:
        res, name = 1, None
    text = name.decode() if not res and name else f"CUresult {int(err)}"
    raise CudaError(int(err), text, call, detail)


def _check(result: tuple[Any, ...], call: str) -> Any:
    """Return the value(s) of a driver call, raising CudaError on failure."""
    if result[0]:
        _raise(result[0], call)
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


_STRUCT_CODES = {
    "b": "b",
    "B": "B",
    "h": "h",
    "H": "H",
    "i": "i",
    "I": "I",
    "l": "q",
    "L": "Q",
    "q": "q",
    "Q": "Q",
    "f": "f",
    "d": "d",
    "e": "e",
    "?": "?",
}


_FAST = (
    "cuLaunchKernel",
    "cuGraphLaunch",
    "cuMemcpyDtoDAsync",
    "cuMemcpyHtoDAsync",
    "cuMemcpyDtoHAsync",
    "cuMemsetD8Async",
    "cuMemAllocFromPoolAsync",
    "cuMemFreeAsync",
    "cuEventRecord",
    "cuStreamWaitEvent",
)


_ABI_VERSION = 12000  # the CUDA version whose signatures _fastcall.c calls


def _bind_calls(drv: Any) -> dict[str, Any]:
    """The hot paths' driver functions by name: compiled fast calls where possible.

    ``cudagraphs._fastcall`` calls the driver's entry points at C's cost
    (cuda.bindings spends 1-2 µs a call); it gets them from
    ``cuGetProcAddress``, asked for the signatures it was written for.
    Without the module (not built), with ``CUDAGRAPHS_FASTCALL=0``, or when
    an entry point is missing, every call goes through cuda.bindings.
    """
    bindings = {name: getattr(drv, name) for name in _FAST}
    _fastcall = compiled_part()
    if not settings().fastcall or _fastcall is None:
        return bindings
    # each entry point in the calling convention of CUDA 12.0, which _fastcall.c declares
    # (a later driver's _v2 of a name must not be called with these arguments); the
    # default stream as cuda.bindings picks it (legacy, or per-thread when asked)
    version = _ABI_VERSION
    flags = drv.CUdriverProcAddress_flags
    per_thread = os.environ.get("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM", "0") not in ("", "0")
    default = (
        flags.CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
        if per_thread
        else flags.CU_GET_PROC_ADDRESS_DEFAULT
    )

    def bound(name: str) -> bool:
        """Bind ``name``'s entry point into the fast calls; False where the driver has none."""
        err, address, found = drv.cuGetProcAddress(name.encode(), version, default)
        if err or not address or int(found) != 0:  # CU_GET_PROC_ADDRESS_SUCCESS
            return False
        _fastcall.bind(name, int(address))
        return True

    if not all(map(bound, _FAST)):
        return bindings
    calls = {name: getattr(_fastcall, name) for name in _FAST}
    # node updates take a struct the fast call cannot share with cuda.bindings' (see
    # CudaBackend._prepare_node_params): only there when fast
    name = "cuGraphExecKernelNodeSetParams"
    if bound(name):
        calls[name] = getattr(_fastcall, name)
    # a 1-D device copy node's update, its struct made in C (in the current context)
    name = "cuGraphExecMemcpyNodeSetParams"
    if bound("cuCtxGetCurrent") and bound(name):
        calls[name] = getattr(_fastcall, name)
    return calls


class _KernelNodeParams(ctypes.Structure):
    """The driver's ``CUDA_KERNEL_NODE_PARAMS_v2``, for the fast node-update call."""

    _fields_ = [
        ("func", ctypes.c_void_p),
        ("gridDimX", ctypes.c_uint),
        ("gridDimY", ctypes.c_uint),
        ("gridDimZ", ctypes.c_uint),
        ("blockDimX", ctypes.c_uint),
        ("blockDimY", ctypes.c_uint),
        ("blockDimZ", ctypes.c_uint),
        ("sharedMemBytes", ctypes.c_uint),
        ("kernelParams", ctypes.c_void_p),
        ("extra", ctypes.c_void_p),
        ("kern", ctypes.c_void_p),
        ("ctx", ctypes.c_void_p),
    ]


class _Packer:
    """Packs kernel arguments into one buffer and a ``void*[]`` pointing into it.

    Each parameter sits at its natural alignment; the pointer array is built
    once, so a launch costs one ``struct.pack_into``.
    """

    __slots__ = ("address", "buf", "fmt", "lock", "offsets", "ptrs")

    def __init__(self, params: Sequence[base.Param]) -> None:
        offsets = base.param_offsets(params)
        fmt, offset = "<", 0
        for p, at in zip(params, offsets):
            size = p.dtype.itemsize
            fmt += "x" * (at - offset)
            code = _STRUCT_CODES.get(p.dtype.char) if p.dtype.kind != "V" else None
            fmt += code if code and struct.calcsize(code) == size else f"{size}s"
            offset = at + size
        self.fmt = struct.Struct(fmt)
        self.offsets = offsets
        self.buf = ctypes.create_string_buffer(max(offset, 8))
        base_addr = ctypes.addressof(self.buf)
        self.ptrs = (ctypes.c_void_p * max(len(params), 1))(*[base_addr + o for o in offsets])
        self.address = ctypes.addressof(self.ptrs) if params else 0
        self.lock = threading.Lock()


class _Function:
    """A loaded kernel: the driver function, its argument packer, its device.

    The launch path reads everything it needs from here (the driver call and
    the packer's buffer bound once): a launch is one ``pack_into`` and one
    ``cuLaunchKernel``.
    """

    __slots__ = ("address", "buf", "call", "fn", "handle", "lock", "name", "ordinal", "pack", "packer")

    def __init__(self, fn: Any, packer: _Packer, name: str, ordinal: int) -> None:
        self.fn, self.packer, self.name, self.ordinal = fn, packer, name, ordinal
        self.pack, self.buf, self.address = packer.fmt.pack_into, packer.buf, packer.address
        self.lock = packer.lock
        self.call = _call["cuLaunchKernel"]
        # what the launch call takes: an int for the fast call, the handle for cuda.bindings
        self.handle = int(fn) if self.call is not _driver().cuLaunchKernel else fn

    def __int__(self) -> int:
        """The CUfunction's address (a handle converts with int())."""
        return int(self.fn)


_MEMCPY = {"htod": "cuMemcpyHtoDAsync", "dtoh": "cuMemcpyDtoHAsync", "dtod": "cuMemcpyDtoDAsync"}


class CudaBackend:
    """The CUDA driver primitives of :class:`~.base.Backend`."""

    name = "cuda"
    capabilities = Capabilities(shares_memory=True, runs_host_code=False, needs_compiled_code=True)

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
        _call.clear()
        _call.update(_bind_calls(drv))
        _graph_launch = _call["cuGraphLaunch"]
        # (a graph launched by graph_launch replays through the C part's cuGraphLaunch then)
        self.fastcall = _call["cuGraphLaunch"] is not drv.cuGraphLaunch
        self._count: int = int(count)
        self._lock = threading.Lock()
        self._ctx: dict[int, Any] = {}
        self._pools: dict[int, Any] = {}
        self._modules: list[Any] = []
        self._bodies: dict[int, tuple[Any, ...]] = {}  # conditional node -> its body graphs
        self._node_params: dict[tuple[Any, ...], tuple[Any, ...]] = {}  # see _prepare_node_params
        self._types = (drv.CUgraphExec, drv.CUgraph, drv.CUevent, drv.CUstream)

    # devices ------------------------------------------------------------
    def device_count(self) -> int:
        return self._count

    def device_properties(self, ordinal: int) -> DeviceProperties:
        drv = _driver()
        dev = _check(drv.cuDeviceGet(ordinal), "cuDeviceGet")
        attr = drv.CUdevice_attribute

        def get(a: Any) -> int:
            return int(_check(drv.cuDeviceGetAttribute(a, dev), "cuDeviceGetAttribute"))

        name = _check(drv.cuDeviceGetName(256, dev), "cuDeviceGetName")
        return DeviceProperties(
            name=name.split(b"\0", 1)[0].decode(),
            compute_capability=(
                get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
            ),
            total_memory=_check(drv.cuDeviceTotalMem(dev), "cuDeviceTotalMem"),
            multiprocessors=get(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
            peers=tuple(
                i
                for i in range(self._count)
                if i != ordinal
                and _check(
                    drv.cuDeviceCanAccessPeer(dev, _check(drv.cuDeviceGet(i), "cuDeviceGet")),
                    "cuDeviceCanAccessPeer",
                )
            ),
        )

    def _context_of(self, ptr: int) -> Any:
        """Make the primary context of ``ptr``'s device current on this thread; return it.

        For calls that take the thread's current context (a copy node's
        update), from a thread that never made one current: the driver
        crashes on a NULL context.
        """
        drv = _driver()
        attr = drv.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL  # (pool memory has no context)
        self.activate(int(_check(drv.cuPointerGetAttribute(attr, ptr), "cuPointerGetAttribute")))
        return _check(drv.cuCtxGetCurrent(), "cuCtxGetCurrent")

    def activate(self, ordinal: int, peer: int | None = None) -> None:
        """Make the device's primary context current on this thread (and reach ``peer``'s memory)."""
        if peer is not None:
            self._enable_peer_access(ordinal, peer)
            return
        if not 0 <= ordinal < self._count:
            raise BackendUnavailableError(
                f"CUDA device {ordinal} does not exist; this machine has {self._count}"
            )
        drv = _driver()
        with self._lock:
            ctx = self._ctx.get(ordinal)
            if ctx is None:
                # the backend retains the primary context itself, for the process's life:
                # a retain made through cuda.core is cached per thread and released when that
                # thread ends, which destroys the context for every thread if it was the
                # first to use the device (measured on an H100: CONTEXT_IS_DESTROYED after
                # the first Device(0) was made by a worker thread that then ended)
                dev = _check(drv.cuDeviceGet(ordinal), "cuDeviceGet")
                ctx = _check(drv.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
                self._ctx[ordinal] = ctx
                self._pools[ordinal] = _check(drv.cuDeviceGetDefaultMemPool(dev), "cuDeviceGetDefaultMemPool")
        _check(drv.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    def _enable_peer_access(self, ordinal: int, peer: int) -> None:
        drv = _driver()
        self.activate(peer)  # (its context and pool exist from here)
        self.activate(ordinal)
        (err,) = drv.cuCtxEnablePeerAccess(self._ctx[peer], 0)
        if err and int(err) != CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED:
            _raise(err, "cuCtxEnablePeerAccess")
        # the stream-ordered pool's memory is not covered by the context's access (measured
        # on two H200s: copies between two pools failed with CUDA_ERROR_INVALID_VALUE)
        desc = drv.CUmemAccessDesc()
        desc.location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        desc.location.id = ordinal
        desc.flags = drv.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        _check(drv.cuMemPoolSetAccess(self._pools[peer], [desc], 1), "cuMemPoolSetAccess")

    def _retry(
        self, err: Any, call: str, again: Callable[[], tuple[Any, ...]], ordinal: int | None
    ) -> tuple[Any, ...]:
        """Recover from a thread with no current context (that device's), then call again."""
        if int(err) == CUDA_ERROR_INVALID_CONTEXT and self._ctx:
            ctx = self._ctx.get(ordinal) if ordinal is not None else next(iter(self._ctx.values()))
            if ctx is not None:
                _check(_driver().cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
                result = again()
                if not result[0]:
                    return result
                err = result[0]
        _raise(err, call)
        raise AssertionError("unreachable")

    # streams and events -------------------------------------------------
    def stream_create(self, ordinal: int, address: int | None = None) -> Any:
        drv = _driver()
        if address is not None:  # a stream made elsewhere (1, 2: legacy, per-thread)
            return drv.CUstream(address)
        self.activate(ordinal)
        return _check(drv.cuStreamCreate(drv.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")

    def stream_device(self, address: int) -> int:
        drv = _driver()
        ctx = _check(drv.cuStreamGetCtx(drv.CUstream(address)), "cuStreamGetCtx")
        with self._lock:
            known = [o for o, c in self._ctx.items() if int(c) == int(ctx)]
        if known:  # (a primary context: the one every library shares, retained here)
            return known[0]
        _check(drv.cuCtxPushCurrent(ctx), "cuCtxPushCurrent")
        try:
            return int(_check(drv.cuCtxGetDevice(), "cuCtxGetDevice"))
        finally:
            _check(drv.cuCtxPopCurrent(), "cuCtxPopCurrent")

    def event_create(self, ordinal: int, timing: bool) -> Any:
        drv = _driver()
        flags = 0 if timing else drv.CUevent_flags.CU_EVENT_DISABLE_TIMING
        if self._count > 1:  # an event belongs to the context current when it is made
            self.activate(ordinal)
        result = drv.cuEventCreate(flags)
        if result[0]:
            result = self._retry(result[0], "cuEventCreate", lambda: drv.cuEventCreate(flags), ordinal)
        return result[1]

    def destroy(self, handle: Any) -> None:
        drv = _driver()
        exec_t, graph_t, event_t, stream_t = self._types
        if isinstance(handle, exec_t):
            _check(drv.cuGraphExecDestroy(handle), "cuGraphExecDestroy")
        elif isinstance(handle, graph_t):
            if self._bodies:
                self._forget_bodies(handle)
            _check(drv.cuGraphDestroy(handle), "cuGraphDestroy")
        elif isinstance(handle, event_t):
            _check(drv.cuEventDestroy(handle), "cuEventDestroy")
        elif isinstance(handle, stream_t):
            _check(drv.cuStreamDestroy(handle), "cuStreamDestroy")
        else:
            raise TypeError(f"cannot destroy {handle!r}")

    def synchronize(self, target: Any, block: bool = True) -> bool:
        drv = _driver()
        if isinstance(target, int):
            self.activate(target)
            _check(drv.cuCtxSynchronize(), "cuCtxSynchronize")
            return True
        is_event = isinstance(target, self._types[2])
        if block:
            if is_event:
                _check(drv.cuEventSynchronize(target), "cuEventSynchronize")
            else:
                _check(drv.cuStreamSynchronize(target), "cuStreamSynchronize")
            return True
        (err,) = drv.cuEventQuery(target) if is_event else drv.cuStreamQuery(target)
        if err and int(err) != base.CUDA_ERROR_NOT_READY:
            _raise(err, "cuEventQuery" if is_event else "cuStreamQuery")
        return not err

    def event_record(self, event: Any, stream: Any, external: bool = False) -> None:
        drv = _driver()
        if external:  # a node of the graph being captured, not a capture join
            flag = drv.CUevent_record_flags.CU_EVENT_RECORD_EXTERNAL
            _check(drv.cuEventRecordWithFlags(event, stream, flag), "cuEventRecordWithFlags")
        else:
            _check(_call["cuEventRecord"](event, stream), "cuEventRecord")

    def stream_wait_event(self, stream: Any, event: Any, external: bool = False) -> None:
        drv = _driver()
        flags = int(drv.CUevent_wait_flags.CU_EVENT_WAIT_EXTERNAL) if external else 0
        _check(_call["cuStreamWaitEvent"](stream, event, flags), "cuStreamWaitEvent")

    def event_elapsed_ms(self, start: Any, end: Any) -> float:
        err, ms = _driver().cuEventElapsedTime(start, end)
        if err:
            _raise(err, "cuEventElapsedTime", base.ELAPSED_TIME_ERRORS.get(int(err), ""))
        return float(ms)

    # memory -------------------------------------------------------------
    def mem_alloc(self, ordinal: int, nbytes: int, stream: Any) -> int:
        drv = _driver()
        if nbytes >= 1 << 64:  # (no size_t holds it: the driver's answer for any size it cannot serve)
            _raise(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAlloc" if stream is None else "cuMemAllocFromPoolAsync")
        if stream is None:  # outside the pool: cuMemAlloc
            self.activate(ordinal)
            found = drv.cuMemAlloc(max(nbytes, 1))
            if found[0]:
                found = self._retry(found[0], "cuMemAlloc", lambda: drv.cuMemAlloc(max(nbytes, 1)), ordinal)
            return int(found[1])
        pool = self._pools[ordinal]
        result = _call["cuMemAllocFromPoolAsync"](nbytes, pool, stream)
        if result[0]:
            result = self._retry(
                result[0],
                "cuMemAllocFromPoolAsync",
                lambda: drv.cuMemAllocFromPoolAsync(nbytes, pool, stream),
                ordinal,
            )
        return int(result[1])

    def mem_free(self, ptr: int, stream: Any) -> None:
        if stream is None:
            _check(_driver().cuMemFree(ptr), "cuMemFree")
            return
        _check(_call["cuMemFreeAsync"](ptr, stream), "cuMemFreeAsync")

    def mem_pool(
        self, ordinal: int, release_threshold: int | None = None, trim: bool = False
    ) -> tuple[int, int]:
        drv = _driver()
        self.activate(ordinal)
        pool = self._pools[ordinal]
        if release_threshold is not None:
            _check(
                drv.cuMemPoolSetAttribute(
                    pool,
                    drv.CUmemPool_attribute.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                    drv.cuuint64_t(release_threshold),
                ),
                "cuMemPoolSetAttribute",
            )
        if trim:
            _check(drv.cuMemPoolTrimTo(pool, 0), "cuMemPoolTrimTo")
        free, total = _check(drv.cuMemGetInfo(), "cuMemGetInfo")
        return int(free), int(total)

    def host_alloc(self, nbytes: int) -> int:
        drv = _driver()
        # portable: pinned for every context, not only the current one (measured on two H200s:
        # a copy to device 1 from memory pinned while device 0 was current failed)
        flags = drv.CU_MEMHOSTALLOC_PORTABLE
        result = drv.cuMemHostAlloc(max(nbytes, 1), flags)
        if result[0]:
            result = self._retry(
                result[0], "cuMemHostAlloc", lambda: drv.cuMemHostAlloc(max(nbytes, 1), flags), None
            )
        return int(result[1])

    def host_free(self, ptr: int) -> None:
        _check(_driver().cuMemFreeHost(ptr), "cuMemFreeHost")

    def memcpy(self, stream: Any, copy: Copy) -> None:
        dst, src, nbytes, kind = copy
        if kind == "peer":
            self._memcpy_peer(stream, dst, src, nbytes)
            return
        if self._count > 1:
            self._stream_context(stream)
        call = _MEMCPY[kind]
        _check(_call[call](dst, src, nbytes, stream), call)

    def _stream_context(self, stream: Any) -> None:
        """Make ``stream``'s context current (a process with several devices).

        The driver checks a copy's addresses against the current context, not
        the stream's (measured on two H200s: a copy to device 1's memory on
        device 1's stream failed with CUDA_ERROR_INVALID_VALUE while device
        0's context was current); launches, events and captures need not.
        """
        drv = _driver()
        ctx = _check(drv.cuStreamGetCtx(stream), "cuStreamGetCtx")
        if int(ctx) != int(_check(drv.cuCtxGetCurrent(), "cuCtxGetCurrent")):
            _check(drv.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    def _memcpy_peer(self, stream: Any, dst: int, src: int, nbytes: int) -> None:
        """A copy between two devices' memory without peer access, staged by the driver."""
        drv = _driver()
        ctx = []
        for ptr in (dst, src):
            i = self._owner(ptr)
            self.activate(i)
            ctx.append(self._ctx[i])
        self._stream_context(stream)
        _check(drv.cuMemcpyPeerAsync(dst, ctx[0], src, ctx[1], nbytes, stream), "cuMemcpyPeerAsync")

    def _owner(self, ptr: int) -> int:
        """The device whose memory ``ptr`` is.

        A pool's memory is told by its pool: the driver reports device 0 and
        no context for pool memory of any device (measured on two H200s).
        """
        drv = _driver()
        attr = drv.CUpointer_attribute
        err, pool = drv.cuPointerGetAttribute(attr.CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, ptr)
        if not err and int(pool):
            for i, known in self._pools.items():
                if int(known) == int(pool):
                    return i
        found = drv.cuPointerGetAttribute(attr.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr)
        return int(_check(found, "cuPointerGetAttribute"))

    def memset(self, dst: int, value: int, nbytes: int, stream: Any) -> None:
        _check(_call["cuMemsetD8Async"](dst, value, nbytes, stream), "cuMemsetD8Async")

    # kernels --------------------------------------------------------------
    def load_kernel(
        self,
        ordinal: int,
        image: bytes | None,
        name: str,
        params: Sequence[base.Param],
        host: Callable[..., object] | None,
    ) -> _Function:
        drv = _driver()
        if image is None:
            raise BackendUnavailableError(f"kernel {name!r} was not compiled (NVRTC is missing)")
        self.activate(ordinal)
        module = _check(drv.cuModuleLoadData(image), "cuModuleLoadData")
        with self._lock:
            self._modules.append(module)  # modules live as long as the process
        fn = _check(drv.cuModuleGetFunction(module, name.encode()), "cuModuleGetFunction")
        return _Function(fn, _Packer(params), name, ordinal)

    def launch(self, stream: Any, launch: KernelLaunch) -> None:
        f, (gx, gy, gz), (bx, by, bz), shared_mem, values, _ = launch  # (the hot path)
        with f.lock:  # the driver copies the arguments before returning
            f.pack(f.buf, 0, *values)
            (err,) = f.call(f.handle, gx, gy, gz, bx, by, bz, shared_mem, stream, f.address, 0)
            if err:
                self._retry(
                    err,
                    f"cuLaunchKernel({f.name})",
                    lambda: f.call(f.handle, gx, gy, gz, bx, by, bz, shared_mem, stream, f.address, 0),
                    f.ordinal,
                )

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

    # stream capture ---------------------------------------------------------
    def capture_begin(self, stream: Any, mode: str, graph: Any = None) -> None:
        drv = _driver()
        cmode = drv.CUstreamCaptureMode(base.CAPTURE_MODES.index(mode))
        if graph is None:
            _check(drv.cuStreamBeginCapture(stream, cmode), "cuStreamBeginCapture")
        else:
            _check(
                drv.cuStreamBeginCaptureToGraph(stream, graph, None, None, 0, cmode),
                "cuStreamBeginCaptureToGraph",
            )

    def capture_end(self, stream: Any) -> Any:
        return _check(_driver().cuStreamEndCapture(stream), "cuStreamEndCapture")

    def _capture_point(self, stream: Any) -> tuple[int, Any, list[Any]]:
        """(status, graph being captured into, current dependencies) of a stream."""
        result = _check(_driver().cuStreamGetCaptureInfo(stream), "cuStreamGetCaptureInfo")
        status, graph, deps, count = int(result[0]), result[2], result[3], int(result[-1])
        return status, graph, (list(deps[:count]) if count else [])

    def capture_info(self, stream: Any) -> tuple[str, list[Any]]:
        # the common question is "is it capturing?": cuStreamIsCapturing builds
        # no Python objects for a graph and dependencies
        drv = _driver()
        if not int(_check(drv.cuStreamIsCapturing(stream), "cuStreamIsCapturing")):
            return "none", []
        status, _, deps = self._capture_point(stream)
        return ("none", "active", "invalidated")[status], deps

    def _set_dependencies(self, stream: Any, nodes: Sequence[Any]) -> None:
        drv = _driver()
        _check(
            drv.cuStreamUpdateCaptureDependencies(
                stream,
                list(nodes),
                None,
                len(nodes),
                drv.CUstreamUpdateCaptureDependencies_flags.CU_STREAM_SET_CAPTURE_DEPENDENCIES,
            ),
            "cuStreamUpdateCaptureDependencies",
        )

    def capture_exchange_mode(self, mode: str) -> str:
        drv = _driver()
        old = _check(
            drv.cuThreadExchangeStreamCaptureMode(drv.CUstreamCaptureMode(base.CAPTURE_MODES.index(mode))),
            "cuThreadExchangeStreamCaptureMode",
        )
        return base.CAPTURE_MODES[int(old)]

    def capture_node(self, stream: Any, kind: str, *args: Any) -> Any:
        drv = _driver()
        if kind == "dependencies":
            self._set_dependencies(stream, args[0])
            return None
        _, graph, deps = self._capture_point(stream)
        if kind == "condition":
            (default,) = args
            ctx = _check(drv.cuCtxGetCurrent(), "cuCtxGetCurrent")
            assign_default = 1  # CU_GRAPH_COND_ASSIGN_DEFAULT: the default at each launch
            return int(
                _check(
                    drv.cuGraphConditionalHandleCreate(graph, ctx, default, assign_default),
                    "cuGraphConditionalHandleCreate",
                )
            )
        if kind == "empty":
            node = _check(drv.cuGraphAddEmptyNode(graph, deps, len(deps)), "cuGraphAddEmptyNode")
        elif kind == "child":  # the driver copies the child graph into the node
            node = _check(
                drv.cuGraphAddChildGraphNode(graph, deps, len(deps), args[0]), "cuGraphAddChildGraphNode"
            )
        elif kind == "conditional":
            cond_kind, size, handle = args
            params = drv.CUgraphNodeParams()
            params.type = drv.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
            params.conditional.handle = drv.CUgraphConditionalHandle(handle)
            params.conditional.type = drv.CUgraphConditionalNodeType(base.CONDITIONAL_KINDS.index(cond_kind))
            params.conditional.size = size
            params.conditional.ctx = _check(drv.cuCtxGetCurrent(), "cuCtxGetCurrent")
            node = _check(drv.cuGraphAddNode(graph, deps, None, len(deps), params), "cuGraphAddNode")
            bodies = list(params.conditional.phGraph_out[:size])
            # remembered now: this driver has no cuGraphNodeGetParams to read them back
            self._bodies[int(node)] = tuple(bodies)
            self._set_dependencies(stream, [node])
            return node, bodies
        else:
            raise ValueError(f"unknown node kind {kind!r}")
        self._set_dependencies(stream, [node])
        return node

    # graphs -----------------------------------------------------------------
    def _graph_nodes(self, graph: Any) -> list[Any]:
        drv = _driver()
        count = self.graph_node_count(graph)
        if not count:
            return []
        nodes, _ = _check(drv.cuGraphGetNodes(graph, count), "cuGraphGetNodes")
        return list(nodes[:count])

    @staticmethod
    def graph_node_count(graph: Any) -> int:
        return int(_check(_driver().cuGraphGetNodes(graph, 0), "cuGraphGetNodes")[1])

    def graph_topology(
        self, graph: Any, details: bool = True
    ) -> tuple[list[NodeInfo], list[tuple[int, int]]]:
        drv = _driver()
        handles = self._graph_nodes(graph)
        if not details:
            return [NodeInfo(n, "", "", ()) for n in handles], []
        out = []
        for node in handles:
            kind = int(_check(drv.cuGraphNodeGetType(node), "cuGraphNodeGetType"))
            name = base.NODE_TYPES[kind] if kind < len(base.NODE_TYPES) else f"type{kind}"
            label = ""
            if name == "kernel":
                params = _check(drv.cuGraphKernelNodeGetParams(node), "cuGraphKernelNodeGetParams")
                res, fname = drv.cuFuncGetName(params.func)
                if not res and fname:
                    label = fname.decode() if isinstance(fname, bytes) else str(fname)
            out.append(NodeInfo(node, name, label, self._bodies.get(int(node), ())))
        index = {int(n): i for i, n in enumerate(handles)}
        n_edges = int(_check(drv.cuGraphGetEdges(graph, 0), "cuGraphGetEdges")[-1])
        edges: list[tuple[int, int]] = []
        if n_edges:
            result = _check(drv.cuGraphGetEdges(graph, n_edges), "cuGraphGetEdges")
            edges = [(index[int(a)], index[int(b)]) for a, b in zip(result[0][:n_edges], result[1][:n_edges])]
        return out, edges

    def _forget_bodies(self, graph: Any) -> None:
        for node in self._graph_nodes(graph):
            for body in self._bodies.pop(int(node), ()):
                self._forget_bodies(body)

    def graph_instantiate(self, graph: Any, auto_free: bool) -> Any:
        drv = _driver()
        flags = (
            int(drv.CUgraphInstantiate_flags.CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)
            if auto_free
            else 0
        )
        result = drv.cuGraphInstantiate(graph, flags)
        if result[0]:  # (a thread that never used the device has no current context)
            result = self._retry(
                result[0], "cuGraphInstantiate", lambda: drv.cuGraphInstantiate(graph, flags), None
            )
        return result[1]

    def _prepare_node_params(
        self, function: _Function, grid: tuple[int, int, int], block: tuple[int, int, int], shared_mem: int
    ) -> tuple[Any, ...]:
        """(set-params call, its struct, what keeps that alive) for kernel nodes of one launch shape.

        Made once per kernel and shape (node updates of one graph share
        them): the struct points at the kernel's argument buffer, which each
        update packs anew. The fast call takes the struct's address (a
        ``CUDA_KERNEL_NODE_PARAMS_v2`` made by ctypes), cuda.bindings its own.
        """
        drv = _driver()
        fast = _call.get("cuGraphExecKernelNodeSetParams")
        if fast is not None:
            c = _KernelNodeParams(
                int(function.fn), *grid, *block, shared_mem, function.address, None, None, None
            )
            prepared: tuple[Any, ...] = (fast, ctypes.addressof(c), c)  # (the struct kept alive)
        else:
            p = drv.CUDA_KERNEL_NODE_PARAMS()
            p.func = function.fn
            p.gridDimX, p.gridDimY, p.gridDimZ = grid
            p.blockDimX, p.blockDimY, p.blockDimZ = block
            p.sharedMemBytes = shared_mem
            p.kernelParams = function.address
            prepared = (drv.cuGraphExecKernelNodeSetParams, p, None)
        if len(self._node_params) >= 256:  # shapes of many kernels: start again
            self._node_params.clear()
        self._node_params[function, grid, block, shared_mem] = prepared
        return prepared

    def graph_update(self, exec_: Any, target: Any, params: KernelLaunch | Copy | bool | None = None) -> None:
        if type(params) is bool:
            flag = 1 if params else 0
            _check(_driver().cuGraphNodeSetEnabled(exec_, target, flag), "cuGraphNodeSetEnabled")
            return
        drv = _driver()

        if type(params) is KernelLaunch:
            function, grid, block, shared_mem, values, _ = params
            key = (function, grid, block, shared_mem)
            prepared = self._node_params.get(key)
            if prepared is None:
                prepared = self._prepare_node_params(*key)
            set_params, p, _ = prepared
            with function.lock:  # the driver copies the arguments before returning
                function.pack(function.buf, 0, *values)
                (err,) = set_params(exec_, target, p)
            if err:
                _raise(err, "cuGraphExecKernelNodeSetParams")
            return
        if isinstance(params, Copy):
            fast = _call.get("cuGraphExecMemcpyNodeSetParams")
            if fast is not None and params.kind == "dtod":  # (in C: a graphed call's input, per call)
                (err,) = fast(exec_, target, params.dst, params.src, params.nbytes)
                if err == CUDA_ERROR_INVALID_CONTEXT:  # a thread with no current context
                    self._context_of(params.dst)
                    (err,) = fast(exec_, target, params.dst, params.src, params.nbytes)
                if err:
                    _raise(err, "cuGraphExecMemcpyNodeSetParams")
                return
            p = drv.CUDA_MEMCPY3D()
            device_memory = drv.CUmemorytype.CU_MEMORYTYPE_DEVICE
            p.srcMemoryType, p.srcDevice = device_memory, params.src
            p.dstMemoryType, p.dstDevice = device_memory, params.dst
            p.WidthInBytes, p.Height, p.Depth = params.nbytes, 1, 1
            ctx = _check(drv.cuCtxGetCurrent(), "cuCtxGetCurrent")
            if not int(ctx):
                ctx = self._context_of(params.dst)
            _check(
                drv.cuGraphExecMemcpyNodeSetParams(exec_, target, p, ctx), "cuGraphExecMemcpyNodeSetParams"
            )
            return
        err, info = drv.cuGraphExecUpdate(exec_, target)
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
            wanted = int(info.errorNode)
            node = next((i for i, n in enumerate(self._graph_nodes(target)) if int(n) == wanted), None)
        raise UpdateError(reason, node)

    def _foreign_nodes(self, graph: Any, skip: set[int]) -> Iterator[tuple[int, str, Any, Any, Any]]:
        """Each node of ``graph`` not in ``skip`` that may use memory: ``(index, kind, node, params, data)``.

        ``kind`` is ``"kernel"`` (``data``: the bytes of each parameter),
        ``"memcpy"`` or ``"memset"`` (``data``: the addresses it uses), or
        ``"unseen"`` (``data``: why its parameters cannot be read: a kernel
        whose parameters are in an 'extra' buffer, child graphs, conditional
        nodes). Nodes that use no memory (empty, host, events, graph memory
        nodes) are left out.
        """
        drv = _driver()
        types = drv.CUgraphNodeType
        kernel_type, memcpy_type, memset_type = (
            int(types.CU_GRAPH_NODE_TYPE_KERNEL),
            int(types.CU_GRAPH_NODE_TYPE_MEMCPY),
            int(types.CU_GRAPH_NODE_TYPE_MEMSET),
        )
        plain = {int(getattr(types, n)) for n in ("CU_GRAPH_NODE_TYPE_EMPTY", "CU_GRAPH_NODE_TYPE_HOST")}
        plain |= {
            int(getattr(types, n))
            for n in (
                "CU_GRAPH_NODE_TYPE_EVENT_RECORD",
                "CU_GRAPH_NODE_TYPE_WAIT_EVENT",
                "CU_GRAPH_NODE_TYPE_MEM_ALLOC",
                "CU_GRAPH_NODE_TYPE_MEM_FREE",
            )
            if hasattr(types, n)
        }
        for i, node in enumerate(self._graph_nodes(graph)):
            if int(node) in skip:
                continue
            kind = int(_check(drv.cuGraphNodeGetType(node), "cuGraphNodeGetType"))
            if kind == kernel_type:
                params = _check(drv.cuGraphKernelNodeGetParams(node), "cuGraphKernelNodeGetParams")
                values = self._kernel_values(params)
                if values is None:
                    yield i, "unseen", node, params, "a kernel whose parameters are in an 'extra' buffer"
                else:
                    yield i, "kernel", node, params, values
            elif kind == memcpy_type:
                p = _check(drv.cuGraphMemcpyNodeGetParams(node), "cuGraphMemcpyNodeGetParams")
                yield i, "memcpy", node, p, (int(p.srcDevice), int(p.dstDevice))
            elif kind == memset_type:
                p = _check(drv.cuGraphMemsetNodeGetParams(node), "cuGraphMemsetNodeGetParams")
                yield i, "memset", node, p, (int(p.dst),)
            elif kind not in plain:
                name = base.NODE_TYPES[kind] if kind < len(base.NODE_TYPES) else str(kind)
                yield i, "unseen", node, None, f"a {name} node, inside which cudagraphs cannot see"

    def graph_addresses(
        self, graph: Any, skip: set[int]
    ) -> tuple[list[tuple[int, list[int]]], list[tuple[int, str]]]:
        found: list[tuple[int, list[int]]] = []
        unseen: list[tuple[int, str]] = []
        for i, kind, _node, _params, data in self._foreign_nodes(graph, skip):
            if kind == "unseen":
                unseen.append((i, data))
            elif kind == "kernel":
                found.append((i, [w for v in data for w in base.words(v)]))
            else:
                found.append((i, list(data)))
        return found, unseen

    def graph_repoint(
        self,
        exec_: Any,
        graph: Any,
        moves: Sequence[tuple[int, int, int]],
        skip: set[int],
        patch: bool,
    ) -> list[int]:
        def used(address: int) -> bool:
            return any(lo <= address < hi for lo, hi, _ in moves)

        hits: list[int] = []
        changes: list[tuple[Any, Any, list[bytes]]] = []
        for i, kind, node, params, data in self._foreign_nodes(graph, skip):
            if kind == "kernel":
                if any(len(v) == 128 for v in data):
                    # a CUtensorMap (TMA descriptor) encodes its address: cudagraphs cannot move it
                    raise UpdateError(
                        f"node {i} (a kernel of another library) takes a 128-byte parameter, which may "
                        "be a tensor map whose address cudagraphs cannot read: capture again",
                        i,
                    )
                moved = [move_words(v, moves) for v in data]
                if any(m is not None for m in moved):
                    hits.append(i)
                    changes.append((node, params, [m if m is not None else v for m, v in zip(moved, data)]))
            elif kind == "unseen":
                raise UpdateError(f"node {i} ({data}) may use the memory: capture again", i)
            elif any(used(a) for a in data):
                raise UpdateError(f"node {i} ({kind}) uses the memory: capture again", i)
        if patch:
            for node, params, values in changes:
                buffers = [ctypes.create_string_buffer(v, max(len(v), 1)) for v in values]
                pointers = (ctypes.c_void_p * max(len(buffers), 1))(*[ctypes.addressof(b) for b in buffers])
                params.kernelParams = ctypes.addressof(pointers)
                params.extra = 0
                _check(
                    _driver().cuGraphExecKernelNodeSetParams(exec_, node, params),
                    "cuGraphExecKernelNodeSetParams",
                )
        return hits

    @staticmethod
    def _kernel_values(params: Any) -> list[bytes] | None:
        """The bytes of each parameter of a kernel node (sizes from cuFuncGetParamInfo).

        None where they are in an 'extra' buffer, which cudagraphs cannot read.
        """
        drv = _driver()
        pointer = int(params.kernelParams or 0)
        if not pointer:
            return None
        func = params.func
        info = drv.cuFuncGetParamInfo
        if not int(func or 0) and int(getattr(params, "kern", 0) or 0):
            func, info = params.kern, drv.cuKernelGetParamInfo
        values: list[bytes] = []
        while True:
            err, _offset, size = info(func, len(values))
            if err:
                break
            address = ctypes.c_void_p.from_address(pointer + 8 * len(values)).value
            values.append(ctypes.string_at(address, int(size)) if address else b"")
        return values

    @staticmethod
    def memory_range(ptr: int) -> tuple[int, int] | None:
        err, base, size = _driver().cuMemGetAddressRange(ptr)
        if err:  # (not device memory: CUDA_ERROR_NOT_FOUND, or an invalid value)
            return None
        return int(base), int(base) + int(size)

    @staticmethod
    def graph_launch(exec_: Any, stream: Any, upload: bool = False) -> None:
        # the replay hot path: a plain function, the driver call bound once
        if upload:
            _check(_driver().cuGraphUpload(exec_, stream), "cuGraphUpload")
            return
        (err,) = _graph_launch(exec_, stream)
        if err:
            _raise(err, "cuGraphLaunch")
