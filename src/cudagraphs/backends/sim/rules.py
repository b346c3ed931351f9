"""What the simulated driver refuses while a capture is active, and how it says so.

``RULES`` is the table of calls the driver refuses during a capture, one row
per call, checked against the driver by ``tests/test_rules.py``;
:func:`error` makes the :class:`~cudagraphs.CudaError` every refusal of the
simulator raises, with the driver's code and name.
"""

from __future__ import annotations

import dataclasses

from ..._errors import CudaError
from ..base import CUDA_ERROR_STREAM_CAPTURE_ISOLATION, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, ERROR_NAMES

__all__ = ["RULES", "Rule", "error"]


@dataclasses.dataclass(frozen=True)
class Rule:
    """One call the driver refuses while a capture is active.

    Attributes
    ----------
    call : str
        The driver call.
    target : str
        What it acts on, relative to the capture (``"the capturing stream"``,
        ``"another stream"``, ...).
    refused_in : tuple of str
        The capture modes, of a capture by the calling thread, in which the
        call is refused (it succeeds in the others).
    code : int
        The error code of a refusal.
    invalidates : bool
        Whether a refusal also invalidates that capture (ending it then fails
        with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED).
    other_refused_in : tuple of str
        The capture modes in which the same call made by *another* thread is
        refused.
    other_invalidates_in : tuple of str
        The capture modes in which that refusal invalidates the capture.
    """

    call: str
    target: str
    refused_in: tuple[str, ...]
    code: int
    invalidates: bool
    other_refused_in: tuple[str, ...] = ()
    other_invalidates_in: tuple[str, ...] = ()


_ALL, _UNSAFE, _GLOBAL = ("global", "thread_local", "relaxed"), ("global", "thread_local"), ("global",)
_NO = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
RULES: tuple[Rule, ...] = (
    Rule("cuStreamSynchronize", "the capturing stream", _ALL, _NO, True, _ALL, _ALL),
    Rule("cuStreamQuery", "the capturing stream", _ALL, _NO, True, _ALL, _ALL),
    Rule("cuCtxSynchronize", "the device", _ALL, _NO, True, _ALL, _ALL),
    Rule("cuStreamSynchronize", "another stream", _UNSAFE, _NO, True, _GLOBAL, _GLOBAL),
    Rule("cuEventSynchronize", "an event recorded before the capture", _UNSAFE, _NO, True, _GLOBAL, _GLOBAL),
    Rule("cuGraphExecDestroy", "another graph's executable", _UNSAFE, _NO, True, _GLOBAL, _GLOBAL),
    Rule("cuEventDestroy", "an event", (), _NO, False),
    Rule("cuStreamDestroy", "another stream", (), _NO, False),
    Rule("cuMemAllocFromPoolAsync", "another stream", _UNSAFE, _NO, True, _GLOBAL, _GLOBAL),
    Rule("cuMemFreeAsync", "another stream", _UNSAFE, _NO, True, _GLOBAL, _GLOBAL),
    Rule("cuMemHostAlloc", "host memory", _UNSAFE, _NO, True, _GLOBAL, _GLOBAL),
    Rule("cuMemFreeHost", "host memory", _UNSAFE, _NO, True, _GLOBAL, _GLOBAL),
    Rule("cuMemcpyHtoDAsync", "the capturing stream, from pageable memory", (), _NO, False),
    Rule("cuMemcpyDtoHAsync", "the capturing stream, to pageable memory", (), _NO, False),
    Rule("cuGraphLaunch", "the capturing stream", _ALL, _NO, True, _ALL, _ALL),
    Rule("cuGraphInstantiate", "another graph", _UNSAFE, _NO, True, _GLOBAL, _GLOBAL),
    Rule("cuModuleLoadData", "a new module (compiling and loading a kernel)", (), _NO, False),
    # measured on two H200s: a copy between devices staged by the driver is refused on a
    # capturing stream (the rows' test needs two devices)
    Rule("cuMemcpyPeerAsync", "the capturing stream", _ALL, _NO, True, _ALL, _ALL),
    # a wait may join two captured streams, never reach outside the capture (measured on an
    # H100: a capturing stream waiting for an event recorded on an uncaptured stream)
    Rule(
        "cuStreamWaitEvent",
        "an event recorded outside the capture",
        _ALL,
        CUDA_ERROR_STREAM_CAPTURE_ISOLATION,
        True,
        _ALL,
        _ALL,
    ),
)
"""What the simulated driver refuses while a capture is active, one row per call.

A call refused in ``global`` and ``thread_local`` mode only is an *unsafe
call* in CUDA's terms: it fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
and invalidates every capture on the device whose mode forbids it to the
calling thread (``global`` captures from any thread, ``thread_local``
captures from their own thread, ``relaxed`` captures never); a thread whose
capture mode was exchanged to ``relaxed`` may make unsafe calls. Every row is
checked against the driver by ``tests/test_rules.py`` on a GPU (measured on an
H100, driver 580: destroying events and other streams and copying pageable
memory are legal during a capture; the library still defers those releases
and refuses pageable copies in captures, for lifetime reasons of its own; a
device synchronize from any thread invalidates every capture on the device,
whatever its mode, which is why the library refuses it before the driver
sees it).
"""


def error(code: int, call: str, detail: str) -> CudaError:
    """The driver's error ``code`` for ``call``, saying what went wrong (``detail``)."""
    return CudaError(code, ERROR_NAMES[code], call, detail)
