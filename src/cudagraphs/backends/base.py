"""The backend interface: the primitives every backend implements.

A backend only does primitives on opaque handles; everything above it (the
one submission path in :mod:`cudagraphs._recording`, the public wrappers)
validates arguments, keeps ownership and applies the capture rules. Adding a
backend is adding one module that implements :class:`Backend`.

Kernel arguments reach a backend as a :class:`KernelLaunch`: typed values,
one per parameter, and for pointer parameters the view of device memory the
argument described (:class:`ArrayArg`), never the user's objects.

Failures are raised as :class:`cudagraphs.CudaError` with the driver's code
and name; the ``sim`` backend raises the same codes as CUDA would.

Two contracts reach past the primitives, for a backend that runs work on
the host (``sim``): a kernel's host implementation that must act on the
device running it (set a conditional handle, as ``cudaGraphSetConditional``)
is a :class:`ContextualHost`, called with that device's :class:`HostContext`;
a simulated communicator (``capabilities.collectives == "simulated"``) queues
work that waits at a :class:`Rendezvous` through :class:`SimulatedCollectives`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Generator, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from .._errors import CudaError

__all__ = [
    "ArrayArg",
    "Backend",
    "Capabilities",
    "ContextualHost",
    "Copy",
    "DeviceProperties",
    "HostContext",
    "KernelLaunch",
    "NodeInfo",
    "Param",
    "Rendezvous",
    "SimulatedCollectives",
    "Waiting",
    "move_words",
    "words",
]

Handle = Any
"""An opaque stream, event, graph, executable graph, node or function handle."""

# Driver result codes both backends raise (values of CUresult).
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_INVALID_DEVICE = 101
CUDA_ERROR_PEER_ACCESS_UNSUPPORTED = 217
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_INVALID_HANDLE = 400
CUDA_ERROR_ILLEGAL_STATE = 401
CUDA_ERROR_NOT_FOUND = 500
CUDA_ERROR_NOT_READY = 600
CUDA_ERROR_ILLEGAL_ADDRESS = 700
CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701
CUDA_ERROR_MISALIGNED_ADDRESS = 716
CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900
CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901
CUDA_ERROR_STREAM_CAPTURE_MERGE = 902
CUDA_ERROR_STREAM_CAPTURE_UNJOINED = 904
CUDA_ERROR_STREAM_CAPTURE_ISOLATION = 905
ERROR_NAMES = {
    CUDA_ERROR_INVALID_VALUE: "CUDA_ERROR_INVALID_VALUE",
    CUDA_ERROR_INVALID_DEVICE: "CUDA_ERROR_INVALID_DEVICE",
    CUDA_ERROR_PEER_ACCESS_UNSUPPORTED: "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
    CUDA_ERROR_OUT_OF_MEMORY: "CUDA_ERROR_OUT_OF_MEMORY",
    CUDA_ERROR_INVALID_HANDLE: "CUDA_ERROR_INVALID_HANDLE",
    CUDA_ERROR_ILLEGAL_STATE: "CUDA_ERROR_ILLEGAL_STATE",
    CUDA_ERROR_NOT_FOUND: "CUDA_ERROR_NOT_FOUND",
    CUDA_ERROR_NOT_READY: "CUDA_ERROR_NOT_READY",
    CUDA_ERROR_ILLEGAL_ADDRESS: "CUDA_ERROR_ILLEGAL_ADDRESS",
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
    CUDA_ERROR_MISALIGNED_ADDRESS: "CUDA_ERROR_MISALIGNED_ADDRESS",
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
    CUDA_ERROR_STREAM_CAPTURE_MERGE: "CUDA_ERROR_STREAM_CAPTURE_MERGE",
    CUDA_ERROR_STREAM_CAPTURE_UNJOINED: "CUDA_ERROR_STREAM_CAPTURE_UNJOINED",
    CUDA_ERROR_STREAM_CAPTURE_ISOLATION: "CUDA_ERROR_STREAM_CAPTURE_ISOLATION",
}

ELAPSED_TIME_ERRORS = {
    CUDA_ERROR_INVALID_HANDLE: "both events must be created with timing=True and recorded",
    CUDA_ERROR_NOT_READY: "an event's work has not completed yet: synchronize the end event "
    "(end.synchronize()) before asking for the time between them",
}
"""What ``cuEventElapsedTime``'s failures mean, as both backends say it."""

CAPTURE_MODES = ("global", "thread_local", "relaxed")
NODE_TYPES = (
    "kernel",
    "memcpy",
    "memset",
    "host",
    "child",
    "empty",
    "event_wait",
    "event_record",
    "semaphore_signal",
    "semaphore_wait",
    "mem_alloc",
    "mem_free",
    "batch_mem_op",
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
    peers: tuple[int, ...] = ()  # the devices it has a peer path to (peer access can be enabled)

    @property
    def arch(self) -> str:
        """The NVRTC target, e.g. ``"sm_90"``."""
        major, minor = self.compute_capability
        return f"sm_{major}{minor}"


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What a backend can do, for the layers above (no backend-name checks).

    Attributes
    ----------
    shares_memory : bool
        Device memory is real GPU memory other libraries can use
        (``__cuda_array_interface__``, DLPack).
    runs_host_code : bool
        Kernels run their numpy host implementation (the simulator).
    needs_compiled_code : bool
        Kernels cannot run without a compiled image (NVRTC is required).
    collectives : str
        The engine of :mod:`cudagraphs.distributed`: ``"nccl"`` (NCCL through
        nccl4py) or ``"simulated"`` (the simulator's in-process communicator).
    """

    shares_memory: bool
    runs_host_code: bool
    needs_compiled_code: bool
    collectives: str = "nccl"


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
        For pointers, the element type (``None`` for ``void*``).
    """

    name: str
    dtype: np.dtype
    pointer: bool = False
    pointee: np.dtype | None = None


class ArrayArg(NamedTuple):
    """The device memory a pointer argument describes: what the kernel sees.

    The device gets ``ptr``; a backend that runs kernels on the host builds a
    view of ``shape``/``strides``/``dtype`` at ``ptr`` when the kernel runs.
    """

    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: np.dtype


class KernelLaunch(NamedTuple):
    """One kernel launch: the loaded function, its configuration and arguments.

    ``values`` has one entry per parameter: addresses (int) for pointers,
    Python numbers for scalars, ``bytes`` for structs. ``views`` has, per
    parameter, the :class:`ArrayArg` a pointer argument came from (or None).
    """

    function: Handle
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int
    values: tuple[Any, ...]
    views: tuple[ArrayArg | None, ...]


class Copy(NamedTuple):
    """One copy of ``nbytes`` bytes; ``kind`` is ``"htod"``, ``"dtoh"``, ``"dtod"`` or ``"peer"``.

    Addresses are device addresses, or host addresses on the host side. A
    ``"dtod"`` copy may join two devices' memory once peer access is enabled
    between them (:meth:`Backend.activate` with ``peer``); a ``"peer"`` copy
    joins two devices without it, staged by the driver, and cannot be
    captured.
    """

    dst: int
    src: int
    nbytes: int
    kind: str


class NodeInfo(NamedTuple):
    """One node of a graph: its handle, type name, kernel name, body graphs."""

    handle: Handle
    type: str
    name: str
    bodies: tuple[Handle, ...]


def param_offsets(params: Sequence[Param]) -> tuple[int, ...]:
    """The byte offset of each kernel parameter in the argument buffer.

    Each parameter sits at its natural alignment (structs passed by value at
    8), as the CUDA ABI lays them out; the cuda backend packs there, and the
    C launch path (``cudagraphs._fastcall.Launcher``) too.
    """
    offsets, offset = [], 0
    for p in params:
        align = 8 if p.dtype.kind == "V" else max(1, p.dtype.alignment)
        offset += -offset % align
        offsets.append(offset)
        offset += p.dtype.itemsize
    return tuple(offsets)


def words(data: bytes) -> list[int]:
    """The 8-byte-aligned little-endian words of a parameter's bytes: where addresses are."""
    n = len(data) // 8
    return [int(w) for w in np.frombuffer(data, dtype="<u8", count=n)] if n else []


def move_words(data: bytes, moves: Sequence[tuple[int, int, int]]) -> bytes | None:
    """``data`` with every 8-byte-aligned word in a moved range moved, or None if none is.

    ``moves`` are ``(lo, hi, delta)`` (see :meth:`Backend.graph_repoint`);
    words are little-endian unsigned 64-bit values, as addresses in kernel
    parameters are.
    """
    n = len(data) // 8
    if not n:
        return None
    words = np.frombuffer(data, dtype="<u8", count=n)
    out = None
    for lo, hi, delta in moves:
        hit = (words >= lo) & (words < hi)
        if hit.any():
            if out is None:
                out = words.copy()
            out[hit] = words[hit] + np.uint64(delta % (1 << 64))  # (wraps: a negative delta)
    if out is None:
        return None
    return bytes(out.tobytes()) + data[n * 8 :]


class HostContext(Protocol):
    """What a kernel's host implementation may ask of the device that runs it.

    A backend that runs kernels on the host (``capabilities.runs_host_code``)
    hands its own to every :class:`ContextualHost` it runs, so that host code
    acts on the simulated device running it, never on another one.
    """

    def set_conditional(self, handle: int, value: int) -> None:
        """``cudaGraphSetConditional``: set conditional ``handle`` to ``value`` (as 32 bits)."""


class ContextualHost:
    """A kernel's host implementation that takes the running device's context first.

    Given as ``host`` to :meth:`Backend.load_kernel` (through
    :class:`cudagraphs.Kernel`), it is called as ``fn(context, *args)``,
    ``context`` the :class:`HostContext` of the device that runs the kernel;
    a plain callable gets the arguments only. Backends that do not run host
    code ignore it, as any ``host``.
    """

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[..., object]) -> None:
        self.fn = fn

    def __call__(self, context: HostContext, *args: Any) -> object:
        """Run the host implementation with ``context`` and the launch's arguments."""
        return self.fn(context, *args)


class Rendezvous:
    """Work of several streams that completes only together.

    (A collective of a simulated communicator.) Work queued through
    :meth:`SimulatedCollectives.queue_work` may yield one: its stream stops
    there while the other streams run, until it is :attr:`done`; when no
    stream can run to complete it, :meth:`stuck` is raised (on a GPU, the
    streams would hang).
    """

    done: bool = False
    #: Set where work of another process can complete it (a collective with
    #: ranks in other processes): how many seconds a wait for the host waits
    #: for that work before it gives up (from when the host starts waiting).
    patience: float | None = None

    def poll(self) -> bool:
        """Whether it is done, taking in what other processes handed in."""
        return self.done

    def describe(self) -> str:
        """What it still waits for (for the error when nothing else can run)."""
        return "work of other streams"

    def stuck(self) -> BaseException:
        """The error raised when no stream can run to complete it (on a GPU: a hang)."""
        code, detail = CUDA_ERROR_ILLEGAL_STATE, f"waits forever for {self.describe()}"
        return CudaError(code, ERROR_NAMES[code], "cuStreamSynchronize", detail)


Waiting = Generator[Rendezvous, None, None]
"""Work that may stop until rendezvous are done (what queued work may return)."""


@runtime_checkable
class Backend(Protocol):
    """The primitives a backend provides (all on opaque handles).

    Every primitive raises :class:`~cudagraphs.CudaError` with the driver's
    code when the driver refuses it. ``destroy`` and ``synchronize`` take any
    of the handles the others return.
    """

    name: str
    capabilities: Capabilities
    # the compiled fast calls are bound: kernels loaded here may be launched by
    # cudagraphs._fastcall.Launcher, through int(handle) (their CUfunction address)
    fastcall: bool

    # devices
    def device_count(self) -> int:
        """How many devices there are."""

    def device_properties(self, ordinal: int) -> DeviceProperties:
        """What device ``ordinal`` is."""

    def activate(self, ordinal: int, peer: int | None = None) -> None:
        """Make device ``ordinal``'s context current on this thread.

        With ``peer``, also let that context reach device ``peer``'s memory
        (its allocations and its pool; idempotent): ``peer`` must be in
        ``device_properties(ordinal).peers``. Copies of kind ``"dtod"``
        between two devices' memory need it, as kernels reading another
        device's memory do; a copy of kind ``"peer"`` does not (the driver
        stages it, and cannot capture it).
        """

    # streams and events
    def stream_create(self, ordinal: int, address: int | None = None) -> Handle:
        """A new non-blocking stream, or the stream at ``address`` made elsewhere."""

    def stream_device(self, address: int) -> int:
        """The ordinal of the device whose context the stream at ``address`` belongs to.

        (``cuStreamGetCtx``'s device.) A handle the driver does not know
        raises CudaError (``CUDA_ERROR_INVALID_HANDLE``, or
        ``CUDA_ERROR_INVALID_CONTEXT``).
        """

    def event_create(self, ordinal: int, timing: bool) -> Handle:
        """A new event (``timing``: it can measure elapsed time)."""

    def destroy(self, handle: Handle) -> None:
        """Destroy a stream, event, graph or executable graph."""

    def synchronize(self, target: Handle, block: bool = True) -> bool:
        """Wait for a device (its ordinal), stream or event; ``block=False`` only asks if done."""

    def event_record(self, event: Handle, stream: Handle, external: bool = False) -> None:
        """Record ``event`` at this point of ``stream`` (``external``: as a graph node)."""

    def stream_wait_event(self, stream: Handle, event: Handle, external: bool = False) -> None:
        """Make later work on ``stream`` wait for ``event`` (``external``: as a graph node)."""

    def event_elapsed_ms(self, start: Handle, end: Handle) -> float:
        """Milliseconds between two completed timing events."""

    # memory
    def mem_alloc(self, ordinal: int, nbytes: int, stream: Handle | None) -> int:
        """Device memory, in order on ``stream`` (a graph allocation while it is captured).

        ``stream`` None: memory outside the stream-ordered pool (``cuMemAlloc``,
        synchronous), as PyTorch's and CuPy's allocators take it; a copy node
        captured reading one kind cannot be moved to the other (see
        :meth:`graph_update`).
        """

    def mem_free(self, ptr: int, stream: Handle | None) -> None:
        """Free memory from :meth:`mem_alloc`, in order on ``stream`` (None: ``cuMemFree``)."""

    def mem_pool(
        self, ordinal: int, release_threshold: int | None = None, trim: bool = False
    ) -> tuple[int, int]:
        """Set up the device's memory pool; returns (free, total) bytes of the device."""

    def host_alloc(self, nbytes: int) -> int:
        """Pinned host memory."""

    def host_free(self, ptr: int) -> None:
        """Free pinned host memory from :meth:`host_alloc`."""

    def memcpy(self, stream: Handle, copy: Copy) -> None:
        """Queue a copy on ``stream``."""

    def memset(self, dst: int, value: int, nbytes: int, stream: Handle) -> None:
        """Queue setting ``nbytes`` bytes at ``dst`` to ``value`` on ``stream``."""

    # work
    def load_kernel(
        self,
        ordinal: int,
        image: bytes | None,
        name: str,
        params: Sequence[Param],
        host: Callable[..., object] | None,
    ) -> Handle:
        """Load kernel ``name`` from a compiled ``image`` (``host``: its numpy version)."""

    def launch(self, stream: Handle, launch: KernelLaunch) -> None:
        """Queue a kernel launch on ``stream``."""

    def launch_host(self, stream: Handle, fn: Callable[[], None]) -> object:
        """Queue ``fn()`` on ``stream``; the result must live as long as ``fn`` may run."""

    # stream capture
    def capture_begin(self, stream: Handle, mode: str, graph: Handle = None) -> None:
        """Start capturing ``stream`` in ``mode`` (into ``graph``: a conditional body)."""

    def capture_end(self, stream: Handle) -> Handle:
        """End the capture of ``stream``; returns the captured graph."""

    def capture_info(self, stream: Handle) -> tuple[str, list[Handle]]:
        """(``"none"``, ``"active"`` or ``"invalidated"``, the capture's current dependencies)."""

    def capture_exchange_mode(self, mode: str) -> str:
        """Set this thread's capture mode; returns the previous one."""

    def capture_node(self, stream: Handle, kind: str, *args: Any) -> Any:
        """Change the capture at its current point.

        ``"empty"``, ``"child"`` (graph) and ``"conditional"`` (kind, size,
        handle) add a node; ``"condition"`` (default) makes a conditional
        handle; ``"dependencies"`` (nodes) sets the capture point.
        """

    # graphs
    def graph_topology(
        self, graph: Handle, details: bool = True
    ) -> tuple[list[NodeInfo], list[tuple[int, int]]]:
        """The nodes of ``graph`` and its edges (without details: node handles only)."""

    def graph_node_count(self, graph: Handle) -> int:
        """How many top-level nodes ``graph`` has (``cuGraphGetNodes`` asked for the count only).

        What every capture's end asks (whether other libraries added nodes),
        without making an object per node.
        """

    def graph_instantiate(self, graph: Handle, auto_free: bool) -> Handle:
        """An executable graph (``auto_free``: graph memory freed at each relaunch)."""

    def graph_update(
        self, exec_: Handle, target: Handle, params: KernelLaunch | Copy | bool | None = None
    ) -> None:
        """Update ``exec_``: from the graph ``target``, or node ``target`` to ``params``.

        ``params`` a bool switches node ``target`` on or off (kernel, memset
        and copy nodes: ``cuGraphNodeSetEnabled``).

        A copy node's new addresses must be memory of the kinds it copied at
        instantiation: stream-ordered pool memory (:meth:`mem_alloc`) and
        other device memory (:meth:`mem_alloc` without a stream) cannot replace each
        other (CUDA_ERROR_INVALID_VALUE; measured on an H100, CUDA 13 driver).
        """

    def graph_repoint(
        self,
        exec_: Handle,
        graph: Handle,
        moves: Sequence[tuple[int, int, int]],
        skip: set[int],
        patch: bool,
    ) -> list[int]:
        """Find, and with ``patch`` move, addresses in the nodes of ``graph`` not in ``skip``.

        ``moves`` are ``(lo, hi, delta)``: an address in ``[lo, hi)`` of a
        node's parameters *as recorded in* ``graph`` becomes ``address +
        delta`` in ``exec_`` (every 8-byte-aligned word of each kernel
        parameter is looked at, so pointers inside structs move too).
        ``skip`` holds the ``int`` handles of nodes not to look at. Returns
        the indices (in ``graph_topology`` order) of the kernel nodes that
        use a moved range.

        Raises
        ------
        UpdateError
            If a node that is not a kernel (a copy, a memset) uses a moved
            range, or a node's parameters cannot be seen (child graphs,
            conditional nodes); nothing is changed then.
        """

    def graph_addresses(
        self, graph: Handle, skip: set[int]
    ) -> tuple[list[tuple[int, list[int]]], list[tuple[int, str]]]:
        """What the nodes of ``graph`` not in ``skip`` may address: ``(found, unseen)``.

        ``found`` holds, per node that uses memory, its index (in
        ``graph_topology`` order) and the values that may be addresses: every
        8-byte-aligned word of each kernel parameter (see :func:`words`), a
        copy's source and destination, a memset's destination. ``unseen``
        holds ``(index, why)`` for nodes whose parameters cannot be read
        (child graphs, conditional nodes, kernels given an 'extra' buffer).
        ``skip`` holds the ``int`` handles of nodes not to look at.
        """

    def graph_launch(self, exec_: Handle, stream: Handle, upload: bool = False) -> None:
        """Queue a launch of ``exec_`` on ``stream`` (``upload``: only upload it)."""

    def memory_range(self, ptr: int) -> tuple[int, int] | None:
        """``(start, end)`` of the device allocation holding address ``ptr``, or None if none does.

        (``cuMemGetAddressRange``: a whole allocation of the driver, such as a
        caching allocator's segment, not one array in it.)
        """


class SimulatedCollectives(Backend, Protocol):
    """A backend whose communicator is simulated (``capabilities.collectives == "simulated"``).

    What :mod:`cudagraphs.distributed`'s simulated engine asks of it beyond
    the primitives: work that waits for other streams' work, and the bytes of
    device memory for the host to read and write when that work runs.
    """

    def queue_work(self, stream: Handle, call: str, label: str, work: Callable[[], Waiting | None]) -> None:
        """Queue ``work`` on ``stream`` (a kernel node ``label`` when it is capturing).

        ``work`` may return a :data:`Waiting` generator of the
        :class:`Rendezvous` it waits on; ``call`` names the driver call in errors.
        """

    def start(self, stream: Handle) -> None:
        """Run ``stream``'s queued work now, up to work that waits (a GPU starts it once queued).

        What the work raises is raised where the host next waits for or
        queries the stream, not here.
        """

    def device_bytes(self, ptr: int, nbytes: int, call: str) -> np.ndarray:
        """The device memory ``[ptr, ptr + nbytes)`` as a writable uint8 view."""
