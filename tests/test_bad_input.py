"""Bad input to the public API: a clear error of the right type, never a crash, hang or leak.

Issue 26 items 11 and 12. The sweep calls every public callable (``cg.__all__``,
``cg.ops``, ``cg.random`` and the methods of the public classes) once with
valid arguments, then with each argument in turn replaced by a bad value:
None, a string, a negative int, a huge int (2**70), a float and a bare
object. Every call must return, or raise ``TypeError``, ``ValueError``,
``IndexError`` or a :class:`cudagraphs.CudaGraphsError`; never
``AttributeError``, ``KeyError``, ``OverflowError``, nor run for long. After
each callable's calls the device must still compute right and hold no
capture. A public callable missing from the table fails the coverage test:
add it (or say in ``SKIPPED`` why it is not swept).
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import signal
from collections.abc import Callable, Iterator
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import cudagraphs as cg
import cudagraphs.random as cgr

ALLOWED = (TypeError, ValueError, IndexError, cg.CudaGraphsError)
BAD: list[tuple[str, Any]] = [
    ("None", None),
    ("str", "x"),
    ("negative", -1),
    ("huge", 2**70),
    ("float", 1.5),
    ("object", object()),
]
LIMIT_S = 20  # one call: a sweep call that takes longer hangs (warmup=2**70 did)

N = 8
SOURCE = """
extern "C" __global__ void cg_test_twice(float* x, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (x && i < n) x[i] *= 2.0f;  // (None is a NULL pointer: an argument the launch takes)
}
"""


def _twice(x: np.ndarray | None, n: Any) -> None:
    if x is not None:
        x[: int(n)] *= 2


class Env:
    """Fresh valid arguments for one call (made on first use)."""

    def __init__(self, dev: cg.Device, tmp: Path) -> None:
        self.dev, self.tmp = dev, tmp
        self.data = np.random.default_rng(5).standard_normal(N).astype(np.float32)
        self.raw_blocks: list[int] = []  # (given back at close if a call did not)

    @cached_property
    def x(self) -> cg.DeviceArray:
        return cg.asarray(self.data, device=self.dev)

    @cached_property
    def y(self) -> cg.DeviceArray:
        return cg.asarray(self.data + 1, device=self.dev)

    @cached_property
    def i(self) -> cg.DeviceArray:
        return cg.zeros(N, "int32", device=self.dev)

    @cached_property
    def s(self) -> cg.Stream:
        return self.dev.create_stream()

    @cached_property
    def event(self) -> cg.Event:
        return cg.Event(self.dev).record(self.dev.current_stream())

    @cached_property
    def kernel(self) -> cg.Kernel:
        return cg.Kernel(
            SOURCE, "cg_test_twice", _twice, signature=["float32*", "int64"], defines={"CG_TEST_SCALE": "2"}
        )

    @cached_property
    def graph(self) -> cg.Graph:
        x, y = self.x, self.y
        with cg.capture(device=self.dev) as g:
            cg.ops.scale(2.0, x, out=y)
        return g

    @cached_property
    def other_graph(self) -> cg.Graph:
        x, y = self.x, self.y
        with cg.capture(device=self.dev, instantiate=False) as g:
            cg.ops.scale(3.0, x, out=y)
        return g

    @cached_property
    def builder(self) -> cg.GraphBuilder:
        return cg.GraphBuilder(device=self.dev)

    @cached_property
    def slot(self) -> cg.HostSlot:
        return cg.HostSlot(N, "float32", device=self.dev)

    @cached_property
    def scalar(self) -> cg.DeviceScalar:
        return cg.DeviceScalar(2.0, device=self.dev)

    @cached_property
    def gen(self) -> cgr.Generator:
        return cgr.Generator(7, device=self.dev)

    @cached_property
    def pool(self) -> cg.GraphPool:
        return cg.GraphPool(self.dev)

    @cached_property
    def graphed(self) -> cg.GraphedCallable:
        return cg.graphed(lambda a: cg.ops.scale(2.0, a), buckets=[8, 16], device=self.dev, warmup=0)

    @cached_property
    def module(self) -> cg.GraphModule:
        return cg.GraphModule(lambda a, w: cg.ops.add(a, w), params={"w": self.y}, warmup=0, device=self.dev)

    @cached_property
    def raw_block(self) -> int:
        ptr: int = self.dev.allocator.raw_malloc(100)
        self.raw_blocks.append(ptr)
        return ptr

    def raw_stream(self) -> Any:
        return self.dev.backend.stream_create(self.dev.index)

    def close(self) -> None:
        if "builder" in self.__dict__:
            self.builder.close()
        self.dev.synchronize()  # (what the calls queued has run: then their memory goes)
        for ptr in self.raw_blocks:
            with contextlib.suppress(ValueError):  # (unless the valid call gave it back)
                self.dev.allocator.raw_free(ptr)
        for name in ("graph", "other_graph", "graphed", "slot", "s"):
            if name in self.__dict__:
                self.__dict__[name].close()


Call = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]


# wrappers: calls whose bad arguments show only when the result is used ------------------------
def _graphed_call(e: Env) -> Callable[..., Any]:
    def call(fn: Any, **kw: Any) -> Any:
        f = cg.graphed(fn, **kw)
        return f(e.x) if callable(f) else f

    return call


def _override(**kw: Any) -> None:
    with cg.override(**kw):
        pass


def _in_capture(e: Env, method: str) -> Callable[..., Any]:
    """``g.<method>(*args)`` inside a capture; "COND" stands for a condition of that graph."""

    def call(*args: Any, **kw: Any) -> None:
        with cg.capture(device=e.dev) as g:
            if method == "condition":
                made: Any = g.if_then(g.condition(*args, **kw))
            else:
                cond = g.condition(default=0)
                made = getattr(g, method)(*[cond if a == "COND" else a for a in args], **kw)
            for body in made if isinstance(made, (list, tuple)) else [made]:
                with body:
                    cg.ops.fill(e.y, 1.0)
            cg.ops.fill(e.x, 1.0)

    return call


def _set_condition(e: Env) -> Callable[..., Any]:
    def call(cond: Any, flag: Any, **kw: Any) -> None:
        with cg.capture(device=e.dev) as g:
            real = g.condition(default=0)
            cg.ops.set_condition(real if cond == "COND" else cond, flag, **kw)
            with g.if_then(real):
                cg.ops.fill(e.y, 1.0)

    return call


def _builder_body(e: Env, method: str) -> Callable[..., Any]:
    def call(*args: Any, **kw: Any) -> None:
        b = e.builder
        cond = b.condition()
        made = getattr(b, method)(*[cond if a == "COND" else a for a in args], **kw)
        for body in made if isinstance(made, (list, tuple)) else [made]:
            with body:
                cg.ops.fill(e.y, 1.0)

    return call


def _elapsed(e: Env) -> Callable[..., Any]:
    start = cg.Event(e.dev, timing=True).record(e.s)

    def call(end: Any) -> float:
        e.s.synchronize()
        return start.elapsed_ms(end)

    return call


def _getitem(x: cg.DeviceArray, key: Any) -> Any:
    return x[key]


def _setitem(x: cg.DeviceArray, key: Any, value: Any) -> None:
    x[key] = value


def _alloc_free(e: Env) -> Callable[..., Any]:
    def call(shape: Any, dtype: Any) -> None:
        t, node = e.builder.alloc(shape, dtype)
        e.builder.free(t, after=[node])

    return call


# the table: each public callable with valid arguments ---------------------------------------
SPECS: dict[str, Callable[[Env], Call]] = {
    # cudagraphs
    "AllocatorStats": lambda e: (cg.AllocatorStats, (0, 0, 0, 0, 0, 0, 0), {}),
    "CachingAllocator": lambda e: (cg.CachingAllocator, (e.dev,), {}),
    "Device": lambda e: (cg.Device, (e.dev.index, e.dev.backend_name), {}),
    "DeviceScalar": lambda e: (cg.DeviceScalar, (1.5, "float32"), {"device": e.dev}),
    "Event": lambda e: (cg.Event, (e.dev, True), {}),
    "GraphBuilder": lambda e: (
        lambda **kw: cg.GraphBuilder(**kw).close(),
        (),
        {"device": e.dev, "pool": e.pool},
    ),
    "GraphModule": lambda e: (
        lambda *a, **kw: cg.GraphModule(*a, **kw)(e.x),
        (lambda a, w: cg.ops.add(a, w),),
        {"params": {"w": e.y}, "warmup": 0, "device": e.dev, "mode": "thread_local", "dim": 0},
    ),
    "GraphPool": lambda e: (cg.GraphPool, (e.dev,), {}),
    "GraphedCallable": lambda e: (
        _graphed_call(e),
        (lambda a: cg.ops.scale(2.0, a),),
        {"warmup": 1, "dim": 0, "buckets": [8, 16], "mode": "thread_local", "device": e.dev, "pad_value": 0},
    ),
    "HostSlot": lambda e: (cg.HostSlot, ((2, 4), "float32"), {"device": e.dev}),
    "Kernel": lambda e: (
        cg.Kernel,
        (SOURCE, "cg_test_twice", _twice),
        {"signature": ["float32*", "int64"], "defines": {"CG_TEST_SCALE": 2}},
    ),
    "PendingCopy": lambda e: (lambda *a: cg.PendingCopy(*a).result(), (e.x, e.s), {}),
    "Settings": lambda e: (
        cg.Settings,
        (),
        {"backend": "sim", "sim_devices": 1, "sim_seed": 3, "fastcall": True},
    ),
    "Stream": lambda e: (cg.Stream, (e.dev, e.raw_stream(), False), {}),
    "as_strided": lambda e: (cg.as_strided, (e.x, (2, 2), (8, 4)), {"offset": 4}),
    "asarray": lambda e: (cg.asarray, (e.data, "float32"), {"device": e.dev, "stream": e.s}),
    "backend": lambda e: (cg.backend, (), {}),
    "capture": lambda e: (
        cg.capture,
        (lambda a: cg.ops.scale(2.0, a, stream=e.s), e.x),
        {"device": e.dev, "stream": e.s, "mode": "thread_local", "pool": e.pool, "alloc": "pool"},
    ),
    "capture_status": lambda e: (cg.capture_status, (e.s,), {}),
    "configure": lambda e: (cg.configure, (), {"sim_seed": 11}),
    "current_device": lambda e: (cg.current_device, (), {}),
    "current_stream": lambda e: (cg.current_stream, (e.dev,), {}),
    "device_count": lambda e: (cg.device_count, (e.dev.backend_name,), {}),
    "empty": lambda e: (cg.empty, (N, "float32"), {"device": e.dev, "stream": e.s}),
    "empty_like": lambda e: (cg.empty_like, (e.x, "float64"), {"device": e.dev, "stream": e.s}),
    "enable_peer_access": lambda e: (cg.enable_peer_access, ([e.dev],), {}),
    "full": lambda e: (cg.full, ((2, 4), 3.0, "float32"), {"device": e.dev, "stream": e.s}),
    "full_like": lambda e: (cg.full_like, (e.x, 3.0, "float64"), {"device": e.dev, "stream": e.s}),
    "graphed": lambda e: (
        _graphed_call(e),
        (lambda a: cg.ops.scale(2.0, a),),
        {"warmup": 2, "copy_outputs": True, "device": e.dev, "pool": e.pool},
    ),
    "is_capturing": lambda e: (cg.is_capturing, (e.s,), {}),
    "is_cuda_available": lambda e: (cg.is_cuda_available, (), {}),
    "ones": lambda e: (cg.ones, (N, "int64"), {"device": e.dev, "stream": e.s}),
    "override": lambda e: (_override, (), {"sim_seed": 12}),
    "preload": lambda e: (cg.preload, ([e.kernel], e.dev), {}),
    "settings": lambda e: (cg.settings, (), {}),
    "zeros": lambda e: (cg.zeros, ((2, 4), "float32"), {"device": e.dev, "stream": e.s}),
    "zeros_like": lambda e: (cg.zeros_like, (e.x, "int32"), {"device": e.dev, "stream": e.s}),
    # cudagraphs.ops
    "ops.add": lambda e: (cg.ops.add, (e.x, e.y, e.y), {"stream": e.s}),
    "ops.axpy": lambda e: (cg.ops.axpy, (2.0, e.x, e.y), {"stream": e.s}),
    "ops.condition_kernel": lambda e: (cg.ops.condition_kernel, ("cg_set_condition", "int32"), {}),
    "ops.copy": lambda e: (cg.ops.copy, (e.y, e.x), {"stream": e.s}),
    "ops.elementwise_kernel": lambda e: (cg.ops.elementwise_kernel, ("cg_add", "float32"), {}),
    "ops.fill": lambda e: (cg.ops.fill, (e.x, 2.0), {"stream": e.s}),
    "ops.preload_dtypes": lambda e: (cg.ops.preload_dtypes, (["float32"], e.dev), {}),
    "ops.scale": lambda e: (cg.ops.scale, (2.0, e.x, e.y), {"stream": e.s}),
    "ops.set_condition": lambda e: (_set_condition(e), ("COND", e.i), {}),
    # cudagraphs.random
    "random.Generator": lambda e: (cgr.Generator, (3,), {"device": e.dev, "stream": e.s}),
    "random.default_generator": lambda e: (cgr.default_generator, (e.dev,), {}),
    "random.normal": lambda e: (cgr.normal, (e.x, 0.0, 1.0), {"generator": e.gen, "stream": e.s}),
    "random.philox4x32_10": lambda e: (cgr.philox4x32_10, ([1, 2, 3, 4], [5, 6]), {}),
    "random.randint": lambda e: (cgr.randint, (e.i, 0, 10), {"generator": e.gen, "stream": e.s}),
    "random.seed": lambda e: (cgr.seed, (3,), {}),
    "random.uniform": lambda e: (cgr.uniform, (e.x, -1.0, 1.0), {"generator": e.gen, "stream": e.s}),
    # methods
    "Device.can_access_peer": lambda e: (e.dev.can_access_peer, (e.dev,), {}),
    "Device.create_event": lambda e: (e.dev.create_event, (True,), {}),
    "Device.create_stream": lambda e: (e.dev.create_stream, (), {}),
    "Device.current_stream": lambda e: (e.dev.current_stream, (), {}),
    "Device.enable_peer_access": lambda e: (e.dev.enable_peer_access, (e.dev,), {}),  # (EXPECT)
    "Device.external_stream": lambda e: (e.dev.external_stream, (e.s,), {}),
    "Device.is_capturing": lambda e: (e.dev.is_capturing, (e.s,), {}),
    "Device.mem_info": lambda e: (e.dev.mem_info, (), {}),
    "Device.synchronize": lambda e: (e.dev.synchronize, (), {}),
    "Stream.close": lambda e: (e.dev.create_stream().close, (), {}),
    "Stream.query": lambda e: (e.s.query, (), {}),
    "Stream.record": lambda e: (e.s.record, (cg.Event(e.dev),), {}),
    "Stream.synchronize": lambda e: (e.s.synchronize, (), {}),
    "Stream.wait": lambda e: (e.s.wait, (e.event,), {}),
    "Event.close": lambda e: (cg.Event(e.dev).close, (), {}),
    "Event.elapsed_ms": lambda e: (_elapsed(e), (cg.Event(e.dev, timing=True).record(e.s),), {}),
    "Event.query": lambda e: (e.event.query, (), {}),
    "Event.record": lambda e: (cg.Event(e.dev).record, (e.s,), {}),
    "Event.synchronize": lambda e: (e.event.synchronize, (), {}),
    "DeviceArray.__getitem__": lambda e: (_getitem, (e.x, (slice(1, None), None)), {}),
    "DeviceArray.__setitem__": lambda e: (_setitem, (e.x, slice(0, 2), 3.0), {}),
    "DeviceArray.copy": lambda e: (e.x.copy, (), {"stream": e.s}),
    "DeviceArray.get": lambda e: (e.x.get, (), {"stream": e.s}),
    "DeviceArray.get_async": lambda e: (lambda **kw: e.x.get_async(**kw).result(), (), {"stream": e.s}),
    "DeviceArray.ravel": lambda e: (e.x.ravel, (), {}),
    "DeviceArray.record_stream": lambda e: (e.x.record_stream, (e.s,), {}),
    "DeviceArray.reshape": lambda e: (e.x.reshape, (2, 4), {}),
    "DeviceArray.set": lambda e: (e.x.set, (e.data * 3,), {"stream": e.s}),
    "DeviceArray.transpose": lambda e: (e.x.reshape(2, 4).transpose, (1, 0), {}),
    "Block.use_on": lambda e: (e.x._block.use_on, (e.s,), {}),
    "Graph.close": lambda e: (e.graph.close, (), {}),
    "Graph.condition": lambda e: (_in_capture(e, "condition"), (1,), {}),
    "Graph.if_else": lambda e: (_in_capture(e, "if_else"), ("COND",), {}),
    "Graph.if_then": lambda e: (_in_capture(e, "if_then"), ("COND",), {}),
    "Graph.instantiate": lambda e: (e.other_graph.instantiate, (), {}),
    "Graph.keep": lambda e: (e.graph.keep, (e.y, "anything"), {}),
    "Graph.rebind": lambda e: (e.graph.rebind, (e.y, cg.zeros(N, "float32", device=e.dev)), {}),
    "Graph.replay": lambda e: (e.graph.replay, (e.s,), {}),
    "Graph.repoint": lambda e: (e.graph.repoint, (e.y, cg.zeros(N, "float32", device=e.dev)), {}),
    "Graph.save": lambda e: (e.graph.save, (e.tmp / "g.dot",), {}),
    "Graph.set_arg": lambda e: (e.graph.set_arg, (0, "alpha", 3.0), {}),
    "Graph.summary": lambda e: (e.graph.summary, (), {}),
    "Graph.switch": lambda e: (_in_capture(e, "switch"), ("COND", 2), {}),
    "Graph.to_dot": lambda e: (e.graph.to_dot, (), {}),
    "Graph.update": lambda e: (e.graph.update, (e.other_graph,), {}),
    "Graph.upload": lambda e: (e.graph.upload, (e.s,), {}),
    "Graph.while_loop": lambda e: (_in_capture(e, "while_loop"), ("COND",), {"max_iterations": 3}),
    "GraphBuilder.alloc": lambda e: (_alloc_free(e), (N, "float32"), {}),
    "GraphBuilder.child": lambda e: (e.builder.child, (e.graph,), {"after": [e.builder.empty()]}),
    "GraphBuilder.close": lambda e: (e.builder.close, (), {}),
    "GraphBuilder.condition": lambda e: (lambda d: e.builder.if_then(e.builder.condition(d)), (1,), {}),
    "GraphBuilder.empty": lambda e: (e.builder.empty, (), {"after": [e.builder.empty()]}),
    "GraphBuilder.event_record": lambda e: (e.builder.event_record, (cg.Event(e.dev),), {"after": []}),
    "GraphBuilder.event_wait": lambda e: (e.builder.event_wait, (e.event,), {"after": []}),
    "GraphBuilder.fill": lambda e: (e.builder.fill, (e.x, 2.0), {"after": []}),
    "GraphBuilder.free": lambda e: (e.builder.free, (e.builder.alloc(N, "float32")[0],), {}),
    "GraphBuilder.host": lambda e: (e.builder.host, (print, "host node"), {"after": []}),
    "GraphBuilder.if_else": lambda e: (_builder_body(e, "if_else"), ("COND",), {"after": []}),
    "GraphBuilder.if_then": lambda e: (_builder_body(e, "if_then"), ("COND",), {"after": []}),
    "GraphBuilder.instantiate": lambda e: (
        lambda: (e.builder.fill(e.x, 1.0), e.builder.instantiate()),
        (),
        {},
    ),
    "GraphBuilder.join": lambda e: (e.builder.join, (e.builder.empty(), e.builder.empty()), {}),
    "GraphBuilder.launch": lambda e: (
        e.builder.launch,
        (e.kernel, 1, N, e.x, N),
        {"after": [], "shared_mem": 0},
    ),
    "GraphBuilder.memcpy": lambda e: (e.builder.memcpy, (e.y, e.x), {"after": []}),
    "GraphBuilder.memset": lambda e: (e.builder.memset, (e.i, 0), {"after": []}),
    "GraphBuilder.switch": lambda e: (_builder_body(e, "switch"), ("COND", 2), {"after": []}),
    "GraphBuilder.while_loop": lambda e: (_builder_body(e, "while_loop"), ("COND",), {"after": []}),
    "CachingAllocator.empty_cache": lambda e: (e.dev.allocator.empty_cache, (), {}),
    "CachingAllocator.is_capturing": lambda e: (e.dev.allocator.is_capturing, (e.s,), {}),
    "CachingAllocator.malloc": lambda e: (e.dev.allocator.malloc, (100,), {"stream": e.s}),
    "CachingAllocator.raw_free": lambda e: (e.dev.allocator.raw_free, (e.raw_block,), {"streams": [e.s]}),
    "CachingAllocator.reset_peak": lambda e: (e.dev.allocator.reset_peak, (), {}),
    "CachingAllocator.stats": lambda e: (e.dev.allocator.stats, (), {}),
    "HostSlot.close": lambda e: (e.slot.close, (), {}),
    "HostSlot.copy_from": lambda e: (e.slot.copy_from, (e.x,), {"stream": e.s}),
    "HostSlot.copy_to": lambda e: (e.slot.copy_to, (e.x,), {"stream": e.s}),
    "DeviceScalar.set": lambda e: (e.scalar.set, (4.0,), {"stream": e.s}),
    "DeviceScalar.get": lambda e: (e.scalar.get, (), {"stream": e.s}),
    "Kernel.function": lambda e: (e.kernel.function, (e.dev,), {}),
    "Kernel.launch": lambda e: (
        e.kernel.launch,
        (1, N, e.x, N),
        {"stream": e.s, "shared_mem": 0, "device": e.dev},
    ),
    "Generator.get_state": lambda e: (e.gen.get_state, (), {"stream": e.s}),
    "Generator.manual_seed": lambda e: (e.gen.manual_seed, (5,), {"stream": e.s}),
    "Generator.normal": lambda e: (e.gen.normal, (e.x, 0.0, 2.0), {"stream": e.s}),
    "Generator.randint": lambda e: (e.gen.randint, (e.i, -5, 5), {"stream": e.s}),
    "Generator.seed": lambda e: (e.gen.seed, (5,), {"stream": e.s}),
    "Generator.set_state": lambda e: (e.gen.set_state, ((5, 8),), {"stream": e.s}),
    "Generator.uniform": lambda e: (e.gen.uniform, (e.x, 0.0, 2.0), {"stream": e.s}),
    "GraphedCallable.__call__": lambda e: (e.graphed, (e.x,), {}),
    "GraphedCallable.capture_all": lambda e: (e.graphed.capture_all, (e.x,), {}),
    "GraphedCallable.close": lambda e: (e.graphed.close, (), {}),
    "GraphedCallable.stats": lambda e: (e.graphed.stats, (), {}),
    "GraphModule.__call__": lambda e: (e.module, (e.x,), {}),
    "GraphModule.parameters": lambda e: (e.module.parameters, (), {}),
    "GraphModule.refresh": lambda e: (e.module.refresh, (), {}),
    "PendingCopy.done": lambda e: (e.x.get_async().done, (), {}),
    "PendingCopy.result": lambda e: (e.x.get_async().result, (), {}),
}

# what a valid call raises where one device cannot make it succeed (the sweep still runs)
EXPECT = {"Device.enable_peer_access": ValueError}  # (a device with itself: refused, rightly)

# public names not swept, and why
SKIPPED = {
    "Body": "made by conditional nodes only; swept through Graph/GraphBuilder while_loop/if_then/...",
    "BuilderNode": "made by GraphBuilder only; swept through after= of the builder's methods",
    "Condition": "made by g.condition() only; swept through Graph.condition",
    "Block": "made by the allocator only; its method use_on is swept",
    "DeviceArray": "not constructed directly (TypeError); its methods are swept",
    "Graph": "not constructed directly; made by capture / GraphBuilder, its methods are swept",
    "GraphOutput": "made by graphed callables only; a DeviceArray (its methods are swept)",
    "GraphState": "an enum",
    "Node": "a read-only description from Graph.nodes",
    "CachingAllocator.raw_malloc": "the raw form of malloc, which is swept",
    "CachingAllocator.release": "BlockOwner protocol: called by a Block's release",
    "CachingAllocator.segment": "graph pools' protocol (GraphPool)",
    "CachingAllocator.free_segment": "graph pools' protocol (GraphPool)",
    "Device.spare_stream": "capture machinery's stream pool",
    "Device.return_spare_stream": "capture machinery's stream pool",
    "GraphPool.acquire": "capture protocol (CaptureSession)",
    "GraphPool.ranges": "takes no arguments (what a capture's keep-alive sets aside)",
    "StreamLike": "a Protocol (typing only): every stream= is swept with a bad stream",
    "GraphPool.allocate": "capture protocol (CaptureSession)",
    "GraphPool.drop": "capture protocol (CaptureSession)",
    "GraphPool.release": "capture protocol (CaptureSession)",
    "Kernel.enqueue": "takes arguments Kernel.launch already checked (documented)",
    "GraphModule.compute": "the user's override point",
    "GraphModule.forward": "GraphModule.__call__, swept",
    "ops.matmul": "swept in tests/test_matmul.py (needs the blas extra on cuda)",
    "DeviceScalar.copy": "DeviceArray.copy, swept",
    "DeviceScalar.get_async": "DeviceArray.get_async, swept",
    "DeviceScalar.ravel": "DeviceArray.ravel, swept",
    "DeviceScalar.record_stream": "DeviceArray.record_stream, swept",
    "DeviceScalar.reshape": "DeviceArray.reshape, swept",
    "DeviceScalar.transpose": "DeviceArray.transpose, swept",
}

CLASSES = [
    cg.Device,
    cg.Stream,
    cg.Event,
    cg.DeviceArray,
    cg.Block,
    cg.Graph,
    cg.GraphBuilder,
    cg.CachingAllocator,
    cg.HostSlot,
    cg.DeviceScalar,
    cg.Kernel,
    cg.GraphPool,
    cgr.Generator,
    cg.GraphedCallable,
    cg.GraphModule,
    cg.PendingCopy,
]


def public_callables() -> set[str]:
    """Every public callable name the sweep must cover (or skip with a reason)."""
    names = set()
    for prefix, module in (("", cg), ("ops.", cg.ops), ("random.", cgr)):
        for n in module.__all__:
            obj = getattr(module, n)
            if inspect.ismodule(obj) or not callable(obj):
                continue
            if inspect.isclass(obj) and issubclass(obj, BaseException):
                continue
            names.add(prefix + n if prefix != "random." or n != "Generator" else "random.Generator")
    for cls in CLASSES:
        for n, v in vars(cls).items():
            if not n.startswith("_") and (inspect.isfunction(v) or inspect.ismethoddescriptor(v)):
                names.add(f"{cls.__name__}.{n}")
    return names


def test_every_public_callable_is_swept() -> None:
    missing = sorted(public_callables() - set(SPECS) - set(SKIPPED))
    assert not missing, f"add these to SPECS (or to SKIPPED, saying why): {missing}"


@contextlib.contextmanager
def deadline(what: str) -> Iterator[None]:
    """Fail a call that runs longer than LIMIT_S (a hang), instead of hanging the suite."""

    def expired(*_: object) -> None:
        raise TimeoutError(f"{what} ran for more than {LIMIT_S} s")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(LIMIT_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _slots(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[int | str]:
    return [*range(len(args)), *kwargs]


def _with(args: tuple[Any, ...], kwargs: dict[str, Any], slot: int | str, value: Any) -> Call:
    a, k = list(args), dict(kwargs)
    if isinstance(slot, int):
        a[slot] = value
    else:
        k[slot] = value
    return (lambda: None, tuple(a), k)


def _call(dev: cg.Device, tmp: Path, name: str, slot: int | str | None, value: Any) -> BaseException | None:
    env = Env(dev, tmp)
    try:
        with cg.override():  # (configure() and seed() calls are undone)
            fn, args, kwargs = SPECS[name](env)
            if slot is not None:
                _, args, kwargs = _with(args, kwargs, slot, value)
            with deadline(f"{name} with {slot}={value!r}"):
                fn(*args, **kwargs)
        return None
    except BaseException as exc:
        return exc
    finally:
        with contextlib.suppress(Exception):
            env.close()


def _device_still_works(dev: cg.Device) -> None:
    gc.collect()  # (finalizers of what the calls made: a Stream owning a built-in one, ...)
    data = np.random.default_rng(9).standard_normal(64).astype(np.float32)
    x = cg.asarray(data, device=dev)
    out = cg.full(64, np.nan, "float32", device=dev)
    cg.ops.scale(3.0, x, out=out)
    np.testing.assert_allclose(out.get(), 3 * data, rtol=1e-6)
    assert not dev.captures
    assert cg.capture_status(dev.stream) == "none"


@pytest.mark.parametrize("name", sorted(SPECS))
def test_bad_arguments_raise_clear_errors(device: cg.Device, tmp_path: Path, name: str) -> None:
    """Issue 26 item 12: each bad argument is a TypeError/ValueError/IndexError or ours, at once."""
    valid = _call(device, tmp_path, name, None, None)
    if name in EXPECT:
        assert isinstance(valid, EXPECT[name]), valid
    else:
        assert valid is None, f"{name} with valid arguments raised {type(valid).__name__}: {valid}"
    env = Env(device, tmp_path)
    slots = _slots(*SPECS[name](env)[1:])
    env.close()
    del env
    wrong = []
    for slot in slots:
        for label, bad in BAD:
            exc = _call(device, tmp_path, name, slot, bad)
            if (exc is not None and not isinstance(exc, ALLOWED)) or isinstance(exc, OverflowError):
                wrong.append(f"{name}: argument {slot} = {label}: {type(exc).__name__}: {exc}")
    gc.collect()
    _device_still_works(device)
    assert not wrong, "\n".join(wrong)


# item 11: device= is one rule everywhere -------------------------------------------------------
DEVICE_TAKERS: dict[str, Callable[[Any], Any]] = {
    "Event": lambda d: cg.Event(d),
    "GraphBuilder": lambda d: cg.GraphBuilder(device=d).close(),
    "current_stream": lambda d: cg.current_stream(d),
    "preload": lambda d: cg.preload([], d),
    "ops.preload_dtypes": lambda d: cg.ops.preload_dtypes([], device=d),
    "CachingAllocator": lambda d: cg.CachingAllocator(d),
    "GraphPool": lambda d: cg.GraphPool(d),
    "capture": lambda d: cg.capture(lambda: cg.ops.fill(cg.zeros(2), 1.0), device=d),
    "graphed": lambda d: cg.graphed(lambda a: a, device=d),
    "empty": lambda d: cg.empty(2, device=d),
    "HostSlot": lambda d: cg.HostSlot(2, device=d),
    "DeviceScalar": lambda d: cg.DeviceScalar(1.0, device=d),
    "random.Generator": lambda d: cgr.Generator(1, device=d),
    "random.default_generator": lambda d: cgr.default_generator(d),
}


@pytest.mark.parametrize("name", sorted(DEVICE_TAKERS))
def test_device_argument_is_one_rule_everywhere(device: cg.Device, name: str) -> None:
    """Issue 26 item 11: an index, a numpy integer and a Device name the same device.

    Bad values are a TypeError (wrong type) or ValueError (negative) naming the argument.
    """
    take = DEVICE_TAKERS[name]
    for same in (device, device.index, np.int64(device.index)):
        take(same)
    for bad in ("0", 1.5, True, object()):
        with pytest.raises(TypeError, match=r"device must be a cudagraphs Device, a device index"):
            take(bad)
    with pytest.raises(ValueError, match="non-negative"):
        take(-1)
    with pytest.raises(cg.BackendUnavailableError, match="does not exist"):
        take(2**70)


# item 12: the reported cases, each naming what is wrong ------------------------------------------
def _builder_launch(bad: Any) -> None:
    with cg.GraphBuilder() as b:  # (closed by the error)
        b.launch(bad, 1, 1)


REPORTED: dict[str, tuple[Callable[[cg.Device], Any], type[Exception], str]] = {
    "Kernel(defines=3)": (
        lambda d: cg.Kernel(SOURCE, "cg_test_twice", defines=3),
        TypeError,
        "defines must be a mapping",
    ),
    "Kernel(defines={1: 2})": (
        lambda d: cg.Kernel(SOURCE, "cg_test_twice", defines={1: "2"}),
        ValueError,
        "macro name",
    ),
    "PendingCopy(x=3)": (
        lambda d: cg.PendingCopy(3),
        TypeError,
        "PendingCopy: x must be a cudagraphs DeviceArray",
    ),
    "Stream.record(event=3)": (lambda d: d.stream.record(3), TypeError, "event must be an Event"),
    "GraphBuilder.launch(kernel=3)": (_builder_launch, TypeError, "kernel must be a cudagraphs Kernel"),
    "malloc(stream=3)": (lambda d: d.allocator.malloc(8, stream=3), TypeError, "malloc: stream must be"),
    "malloc(nbytes=-1)": (lambda d: d.allocator.malloc(-1), ValueError, "malloc: nbytes must be >= 0"),
    "elementwise_kernel(dtype=str)": (
        lambda d: cg.ops.elementwise_kernel("cg_add", "bool"),
        TypeError,
        "cg_add takes",
    ),
    "elementwise_kernel(name=3)": (
        lambda d: cg.ops.elementwise_kernel(3, "float32"),
        TypeError,
        "name must be a str",
    ),
    "elementwise_kernel(name=?)": (
        lambda d: cg.ops.elementwise_kernel("cg_nope", "float32"),
        ValueError,
        "no built-in",
    ),
    "condition_kernel(name=?)": (
        lambda d: cg.ops.condition_kernel("cg_nope", "int32"),
        ValueError,
        "no built-in",
    ),
    "condition_kernel(dtype=?)": (
        lambda d: cg.ops.condition_kernel("cg_loop_guard", "int32"),
        TypeError,
        "takes flags",
    ),
    "philox4x32_10(counter=2**70)": (
        lambda d: cgr.philox4x32_10([2**70, 0, 0, 0], [0, 0]),
        ValueError,
        "counter holds values out of 0..2",
    ),
    "philox4x32_10(key=-1)": (
        lambda d: cgr.philox4x32_10([0] * 4, [-1, 0]),
        ValueError,
        "key holds values out of",
    ),
    "HostSlot(2**70)": (lambda d: cg.HostSlot(2**70), ValueError, "more than any host can pin"),
    "graphed(warmup=2**70)": (
        lambda d: cg.graphed(lambda a: a, warmup=2**70),
        ValueError,
        r"warmup must be in 0\.\.1000",
    ),
    "graphed(warmup=1.5)": (
        lambda d: cg.graphed(lambda a: a, warmup=1.5),
        TypeError,
        "warmup must be an int",
    ),
    "Stream(default, owned=True)": (
        lambda d: cg.Stream(d, d.stream._raw, owned=True),
        ValueError,
        "built-in stream",
    ),
    "Stream(legacy default stream, owned=True)": (
        lambda d: cg.Stream(d, 1, owned=True),
        ValueError,
        "built-in stream",
    ),
    "Stream(copy stream, owned=True)": (
        lambda d: cg.Stream(d, d.copy_stream._raw, owned=True),
        ValueError,
        "owned=True would destroy it",
    ),
    "Event.elapsed_ms(end=3)": (lambda d: cg.Event(d, timing=True).elapsed_ms(3), TypeError, "end must be"),
}


@pytest.mark.parametrize("case", sorted(REPORTED))
def test_reported_bad_inputs_name_the_argument(device: cg.Device, case: str) -> None:
    """Issue 26 item 12: the cases the issue lists raise TypeError/ValueError saying what is wrong."""
    call, error, match = REPORTED[case]
    with pytest.raises(error, match=match):
        call(device)
    gc.collect()
    _device_still_works(device)  # (a Stream owning the default stream would destroy it here)
