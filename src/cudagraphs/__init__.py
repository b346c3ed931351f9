"""cudagraphs: CUDA graphs for any Python GPU code, safe and fast.

The public API is exactly ``__all__``. Importing never needs a GPU: the
``cuda`` backend loads cuda.core/cuda.bindings on first use, and without a GPU
everything runs on the ``sim`` backend, a CPU simulation of CUDA.
"""

from __future__ import annotations

from . import distributed, interop, ops, random
from ._allocator import AllocatorStats, Block, CachingAllocator
from ._array import (
    DeviceArray,
    as_strided,
    asarray,
    empty,
    empty_like,
    full,
    full_like,
    ones,
    zeros,
    zeros_like,
)
from ._builder import BuilderNode, GraphBuilder
from ._capture import capture, capture_status, is_capturing
from ._config import Settings, configure, override, settings
from ._control import Body, Condition
from ._device import (
    Device,
    Event,
    Stream,
    StreamLike,
    current_device,
    current_stream,
    device_count,
    enable_peer_access,
)
from ._dtypes import SUPPORTED as SUPPORTED_DTYPES
from ._errors import (
    BackendUnavailableError,
    BlasError,
    CaptureError,
    CaptureInvalidatedError,
    CollectiveTimeoutError,
    CudaError,
    CudaGraphsError,
    CudaGraphsWarning,
    DistributedError,
    FallbackWarning,
    GraphStateError,
    KernelCompileError,
    OutOfMemoryError,
    StaleOutputError,
    StaleParameterError,
    UpdateError,
)
from ._graph import Graph, GraphState, Node
from ._graph_module import GraphModule
from ._graphed_callable import GraphedCallable, GraphOutput, graphed
from ._kernel import Kernel, preload
from ._pool import GraphPool
from ._scalar import DeviceScalar, HostSlot
from ._transfer import PendingCopy
from .backends import is_cuda_available, resolve_name

__version__ = "0.1.0"

__all__ = [
    "SUPPORTED_DTYPES",
    "AllocatorStats",
    "BackendUnavailableError",
    "BlasError",
    "Block",
    "Body",
    "BuilderNode",
    "CachingAllocator",
    "CaptureError",
    "CaptureInvalidatedError",
    "CollectiveTimeoutError",
    "Condition",
    "CudaError",
    "CudaGraphsError",
    "CudaGraphsWarning",
    "Device",
    "DeviceArray",
    "DeviceScalar",
    "DistributedError",
    "Event",
    "FallbackWarning",
    "Graph",
    "GraphBuilder",
    "GraphModule",
    "GraphOutput",
    "GraphPool",
    "GraphState",
    "GraphStateError",
    "GraphedCallable",
    "HostSlot",
    "Kernel",
    "KernelCompileError",
    "Node",
    "OutOfMemoryError",
    "PendingCopy",
    "Settings",
    "StaleOutputError",
    "StaleParameterError",
    "Stream",
    "StreamLike",
    "UpdateError",
    "__version__",
    "as_strided",
    "asarray",
    "backend",
    "capture",
    "capture_status",
    "configure",
    "current_device",
    "current_stream",
    "device_count",
    "distributed",
    "empty",
    "empty_like",
    "enable_peer_access",
    "full",
    "full_like",
    "graphed",
    "interop",
    "is_capturing",
    "is_cuda_available",
    "ones",
    "ops",
    "override",
    "preload",
    "random",
    "settings",
    "zeros",
    "zeros_like",
]


def backend() -> str:
    """The name of the backend in use: ``"cuda"`` or ``"sim"``."""
    return resolve_name(None)
