"""The error hierarchy of cudagraphs.

::

    CudaGraphsError
    ├── BackendUnavailableError      the asked-for backend cannot run here
    ├── CudaError(code, name)        a driver call failed
    ├── CaptureError                 illegal work during stream capture
    │   └── CaptureInvalidatedError  the driver invalidated the capture
    ├── UpdateError(reason, node)    an executable graph could not be updated
    ├── GraphStateError              (also a RuntimeError) a graph used in a state that forbids it
    ├── KernelCompileError(log)      NVRTC rejected a kernel's source
    ├── OutOfMemoryError             (also a MemoryError) the device is full
    └── DistributedError             a communicator failed (NCCL, or ranks that disagree)
        └── CollectiveTimeoutError   (also a TimeoutError) a rank never joined

Bad arguments raise the built-in ``TypeError``/``ValueError``/``IndexError``
with what was given and what is accepted.

Warnings::

    CudaGraphsWarning                (a UserWarning)
    └── FallbackWarning              a graphed callable runs a key eagerly: its capture was refused
"""

from __future__ import annotations

__all__ = [
    "BackendUnavailableError",
    "BlasError",
    "CaptureError",
    "CaptureInvalidatedError",
    "CollectiveTimeoutError",
    "CudaError",
    "CudaGraphsError",
    "CudaGraphsWarning",
    "DistributedError",
    "FallbackWarning",
    "GraphStateError",
    "KernelCompileError",
    "OutOfMemoryError",
    "StaleOutputError",
    "StaleParameterError",
    "UpdateError",
]


class CudaGraphsError(Exception):
    """Base class of every error raised by cudagraphs itself."""


class CudaGraphsWarning(UserWarning):
    """Base class of every warning cudagraphs gives."""


class FallbackWarning(CudaGraphsWarning):
    """A graphed callable made with ``fallback="eager"`` runs a key eagerly: its capture was refused.

    Given once per key, with the refusal's message (the call and the line
    that broke the capture); ``stats()["eager"]`` keeps it.
    """


class BackendUnavailableError(CudaGraphsError):
    """The requested backend cannot be used on this machine."""


class CudaError(CudaGraphsError):
    """A CUDA driver call failed.

    Parameters
    ----------
    code : int
        The driver's ``CUresult`` value.
    name : str
        The symbolic name, e.g. ``"CUDA_ERROR_INVALID_VALUE"``.
    call : str
        The driver call that failed.
    detail : str, optional
        What the library was doing, and what to do about it.
    """

    def __init__(self, code: int, name: str, call: str, detail: str = "") -> None:
        self.code = int(code)
        self.name = name
        self.call = call
        self.detail = detail
        text = f"{call} failed with {name} ({self.code})"
        super().__init__(f"{text}: {detail}" if detail else text)


class CaptureError(CudaGraphsError):
    """Work that is illegal while a stream is being captured."""


class CaptureInvalidatedError(CaptureError):
    """The driver invalidated the capture (e.g. a synchronizing call)."""


class GraphStateError(CudaGraphsError, RuntimeError):
    """A graph was used in a state that forbids it: closed, consumed by an update, failed, not instantiated.

    The message names the operation and the state, and what to do instead.
    """


class StaleOutputError(CudaGraphsError, RuntimeError):
    """An output of a graphed callable was used after a later call overwrote it."""


class StaleParameterError(CudaGraphsError, RuntimeError):
    """A GraphModule's parameter was replaced since its graphs were captured."""


class UpdateError(CudaGraphsError):
    """An executable graph could not be updated from another graph.

    Parameters
    ----------
    reason : str
        The driver's reason for refusing the update.
    node : object, optional
        The node that could not be updated, when the driver names one.
    """

    def __init__(self, reason: str, node: object = None) -> None:
        self.reason = reason
        self.node = node
        where = f" at node {node!r}" if node is not None else ""
        super().__init__(f"graph update refused: {reason}{where}")


class KernelCompileError(CudaGraphsError):
    """NVRTC rejected a kernel's source; ``log`` holds the compiler's log."""

    def __init__(self, kernel: str, log: str) -> None:
        self.kernel = kernel
        self.log = log
        lines = log.strip().splitlines()
        shown = "\n".join(lines[:_LOG_LINES])
        more = len(lines) - _LOG_LINES
        tail = f"\n... {more} more lines in the exception's .log" if more > 0 else ""
        super().__init__(f"kernel {kernel!r} failed to compile; NVRTC log:\n{shown}{tail}")


_LOG_LINES = 30


class OutOfMemoryError(CudaGraphsError, MemoryError):
    """A device allocation failed even after the cache was emptied.

    Attributes
    ----------
    requested, in_use, reserved, limit : int
        Bytes asked for, bytes held by live arrays, bytes held by the
        allocator (live + cached), and the device's total memory.

    The message says what was tried before giving up and what to do.
    """

    def __init__(
        self,
        device: int,
        requested: int,
        in_use: int,
        reserved: int,
        limit: int,
        note: str = "The cache was emptied and the pool trimmed before giving up: free "
        "arrays you no longer need or allocate less.",
    ) -> None:
        self.device = device
        self.requested = requested
        self.in_use = in_use
        self.reserved = reserved
        self.limit = limit
        super().__init__(
            f"out of memory on device {device}: tried to allocate "
            f"{_fmt(requested)}; {_fmt(in_use)} in use by live arrays, "
            f"{_fmt(reserved)} reserved by cudagraphs, device total {_fmt(limit)}. {note}"
        )


class DistributedError(CudaGraphsError):
    """A communicator failed: NCCL reported an error, or the ranks disagree."""


class CollectiveTimeoutError(DistributedError, TimeoutError):
    """A rank never joined a communicator or a collective within the timeout.

    On a GPU the collective's streams would wait forever; the communicator
    is aborted before this is raised, so the streams can finish.
    """


def _fmt(nbytes: int) -> str:
    """Format a byte count for error messages (``"1.50 GiB (1610612736 B)"``)."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit} ({nbytes} B)"
    return f"{nbytes} B"


class BlasError(CudaGraphsError, RuntimeError):
    """A cuBLASLt call failed.

    Parameters
    ----------
    call : str
        The cuBLASLt function, e.g. ``"cublasLtMatmul"``.
    status : int or None
        Its ``cublasStatus_t`` (None when the binding did not say).
    detail : str
        The status in words, the problem, and what to do.
    """

    def __init__(self, call: str, status: int | None, detail: str) -> None:
        self.call = call
        self.status = status
        super().__init__(f"{call} failed: {detail}")
