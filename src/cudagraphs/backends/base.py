"""The backend interface: the primitives every backend implements.

A backend only does primitives on opaque handles; the public wrappers in
``cudagraphs`` validate arguments, keep ownership and translate errors.
Adding a backend is adding one module that implements :class:`Backend`.

Failures are raised as :class:`cudagraphs.CudaError` with the driver's code
and name (the ``sim`` backend raises the same codes as CUDA would).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = ["Backend", "DeviceProperties", "Launcher", "Param"]

Handle = Any
"""An opaque stream, event or function handle owned by a backend."""

# Driver result codes both backends raise (values of CUresult).
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_NOT_READY = 600
CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900
CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901

CAPTURE_MODES = ("global", "thread_local", "relaxed")
NODE_TYPES = (
    "kernel", "memcpy", "memset", "host", "child", "empty", "event_wait", "event_record",
    "semaphore_signal", "semaphore_wait", "mem_alloc", "mem_free", "batch_mem_op",
    "conditional",
)
"""Node type names, in the order of CUDA's ``CUgraphNodeType``."""

CONDITIONAL_KINDS = ("if", "while", "switch")
"""Conditional node types, in the order of ``CUgraphConditionalNodeType``."""

UPDATE_REASONS = (
    "the update succeeded",
    "the driver refused the update",
    "the topology changed (node count or dependencies differ)",
    "a node's type changed",
    "a kernel node's function changed",
    "a node's parameters changed in a way that cannot be updated",
    "a node's type or configuration cannot be updated",
    "a kernel node's function changed in an unsupported way",
    "a node's attributes changed",
)
"""Why a whole-graph update failed, in the order of ``CUgraphExecUpdateResult``."""


@dataclasses.dataclass(frozen=True)
class DeviceProperties:
    """What a backend reports about one device."""

    name: str
    compute_capability: tuple[int, int]
    total_memory: int
    multiprocessors: int


@dataclasses.dataclass(frozen=True)
class Param:
    """One kernel parameter.

    Attributes
    ----------
    name : str
        The parameter's name in the kernel source (``"arg3"`` when unknown).
    dtype : numpy.dtype
        The type passed by value; ``uint64`` for pointers, a void dtype for
        structs passed by value.
    pointer : bool
        Whether the parameter is a device pointer.
    pointee : numpy.dtype or None
        For pointers, the element type (``None`` for ``void*``/``char*``).
    """

    name: str
    dtype: np.dtype
    pointer: bool = False
    pointee: np.dtype | None = None


class Launcher(Protocol):
    """A loaded kernel, ready to launch.

    ``raw`` holds one value per kernel parameter: device addresses as ints,
    scalars as Python/numpy numbers, by-value structs as ``bytes``.
    ``objs`` holds the arguments as the user passed them after validation
    (arrays, scalars); backends that run kernels on the host use these.
    """

    def __call__(
        self,
        stream: Handle,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_mem: int,
        raw: Sequence[object],
        objs: Sequence[object],
    ) -> None: ...


@runtime_checkable
class Backend(Protocol):
    """The primitives a backend provides (all on opaque handles)."""

    name: str

    # devices
    def device_count(self) -> int: ...
    def device_properties(self, ordinal: int) -> DeviceProperties: ...
    def activate(self, ordinal: int) -> None: ...
    def device_synchronize(self, ordinal: int) -> None: ...

    # streams and events
    def stream_create(self, ordinal: int) -> Handle: ...
    def stream_destroy(self, stream: Handle) -> None: ...
    def stream_address(self, stream: Handle) -> int: ...
    def stream_from_address(self, address: int) -> Handle: ...
    def stream_synchronize(self, stream: Handle) -> None: ...
    def stream_query(self, stream: Handle) -> bool: ...
    def stream_wait_event(self, stream: Handle, event: Handle) -> None: ...
    def event_create(self, ordinal: int, timing: bool) -> Handle: ...
    def event_destroy(self, event: Handle) -> None: ...
    def event_record(self, event: Handle, stream: Handle) -> None: ...
    def event_synchronize(self, event: Handle) -> None: ...
    def event_query(self, event: Handle) -> bool: ...
    def event_elapsed_ms(self, start: Handle, end: Handle) -> float: ...

    # memory
    def mem_alloc(self, ordinal: int, nbytes: int, stream: Handle) -> int: ...
    def mem_free(self, ptr: int, stream: Handle) -> None: ...
    def mem_trim(self, ordinal: int) -> None: ...
    def mem_set_release_threshold(self, ordinal: int, nbytes: int) -> None: ...
    def mem_info(self, ordinal: int) -> tuple[int, int]: ...
    def host_alloc(self, nbytes: int) -> tuple[int, np.ndarray]: ...
    def host_free(self, ptr: int) -> None: ...

    # copies (host side is a C-contiguous uint8 numpy array)
    def memcpy_htod(self, dst: int, src: np.ndarray, stream: Handle) -> None: ...
    def memcpy_dtoh(self, dst: np.ndarray, src: int, stream: Handle) -> None: ...
    def memcpy_dtod(self, dst: int, src: int, nbytes: int, stream: Handle) -> None: ...
    def memset_d8(self, dst: int, value: int, nbytes: int, stream: Handle) -> None: ...

    # stream capture and graphs (a graph is a DAG; an exec its instance)
    def capture_begin(self, stream: Handle, mode: str) -> None: ...
    def capture_end(self, stream: Handle) -> Handle: ...
    def capture_status(self, stream: Handle) -> str: ...
    def capture_exchange_mode(self, mode: str) -> str: ...
    # conditional nodes, added at the current point of a capture
    def capture_condition(self, stream: Handle, default: int) -> int: ...
    def capture_conditional(self, stream: Handle, kind: str, size: int, handle: int) -> list[Handle]: ...
    def capture_to_body(self, stream: Handle, body: Handle, mode: str) -> None: ...
    # explicit dependencies and node kinds only explicit graphs need
    def capture_dependencies(self, stream: Handle) -> list[Handle]: ...
    def capture_set_dependencies(self, stream: Handle, nodes: Sequence[Handle]) -> None: ...
    def capture_empty(self, stream: Handle) -> None: ...
    def capture_child(self, stream: Handle, graph: Handle) -> None: ...
    def capture_event_record(self, stream: Handle, event: Handle) -> None: ...
    def capture_event_wait(self, stream: Handle, event: Handle) -> None: ...
    def launch_host(self, stream: Handle, fn: Callable[[], None]) -> object: ...
    def graph_node_count(self, graph: Handle) -> int: ...
    def graph_node_handles(self, graph: Handle) -> list[Handle]: ...
    def graph_nodes(self, graph: Handle) -> list[tuple[str, str]]: ...
    def graph_edges(self, graph: Handle) -> list[tuple[int, int]]: ...
    def graph_bodies(self, graph: Handle, index: int) -> list[Handle]: ...
    def graph_instantiate(self, graph: Handle, auto_free: bool) -> Handle: ...
    def graph_exec_update(self, exec_: Handle, graph: Handle) -> None: ...
    def graph_exec_kernel_update(
        self, exec_: Handle, node: Handle, launcher: Launcher,
        grid: tuple[int, int, int], block: tuple[int, int, int], shared_mem: int,
        raw: Sequence[object], objs: Sequence[object],
    ) -> None: ...
    def graph_upload(self, exec_: Handle, stream: Handle) -> None: ...
    def graph_launch(self, exec_: Handle, stream: Handle) -> None: ...
    def graph_destroy(self, graph: Handle) -> None: ...
    def graph_exec_destroy(self, exec_: Handle) -> None: ...

    # kernels
    def arch(self, ordinal: int) -> str: ...
    def compile(self, source: str, name: str, arch: str, options: Sequence[str]) -> bytes: ...
    def load_kernel(
        self,
        ordinal: int,
        image: bytes,
        name: str,
        params: Sequence[Param],
        host: Callable[..., object] | None,
    ) -> Launcher: ...
