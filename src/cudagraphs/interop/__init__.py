"""Other libraries inside cudagraphs' captures: PyTorch and CuPy.

While cudagraphs captures a stream, each supported library that the program
has imported is *routed* for the capturing thread (:func:`route`):

* its current stream is the captured stream, so the library's kernels land
  in the graph (``torch.cuda.stream``/``cupy.cuda.ExternalStream``);
* its allocations go to memory the graph owns: PyTorch's to a
  ``torch.cuda.MemPool`` made for the capture (``torch.cuda.use_mem_pool``),
  CuPy's to the capture's own :class:`~cudagraphs.GraphPool`
  (``cupy.cuda.using_allocator``). The graph keeps that memory, so the
  library's caching allocator can never hand a block the graph still uses
  to other code.

A library is never imported here: one that the program has not imported is
not routed (nothing of it can run in the capture). Each adapter
(:class:`Library`) also converts arrays both ways without copies and names
the library's current stream, which graphed callables use.

PyTorch's random numbers drawn in a capture given ``generators=`` advance
its generators at every replay (:mod:`._torch_rng`: a graph that drew them
keeps a shadow ``torch.cuda.CUDAGraph`` whose replay advances them before
each launch; without the option such a draw is refused); CuPy's cuRAND host
API is refused.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from . import cupy as _cupy
from . import torch as _torch
from ._keep import ArrayMemory, foreign_memory, register, unregister

__all__ = [
    "ArrayMemory",
    "Library",
    "Routing",
    "keep_foreign",
    "libraries",
    "library_of",
    "register",
    "route",
    "unregister",
]


class Library(Protocol):
    """What cudagraphs needs from another array library (see :mod:`.torch`, :mod:`.cupy`)."""

    name: str
    module: str  # the top-level module name, looked up in sys.modules

    def owns(self, obj: object) -> bool:
        """Whether ``obj`` is one of this library's device arrays."""
        ...

    def route(
        self,
        device: Any,
        stream_handle: int,
        allocate: Callable[[int], Any] | None,
        keep: list[Any],
        shared: dict[str, Any],
    ) -> contextlib.AbstractContextManager[Any]:
        """The context routing the library's stream and allocations into a capture.

        ``allocate(nbytes)`` returns a device array of the capture's memory
        (None: route the stream only); what must live as long as the graph
        is appended to ``keep``; ``shared`` holds the library's pool shared
        by every capture into one :class:`~cudagraphs.GraphPool`.
        """
        ...

    def describe(self, obj: Any) -> tuple[int, tuple[int, ...], Any, bool, int]:
        """(address, shape, numpy dtype, C-contiguous, device index) of one of its arrays."""
        ...

    def view(self, array: Any) -> Any:
        """A zero-copy view of a cudagraphs DeviceArray as this library's array."""
        ...

    def array_types(self) -> tuple[type, ...]:
        """The classes of the library's device arrays."""
        ...

    def memory_of(self, obj: Any) -> tuple[int, int, int, Any] | None:
        """``(device index, start, end, keeper)`` of one of its arrays' memory (see :class:`ArrayMemory`)."""
        ...

    def pool_memory(self, obj: Any) -> list[tuple[int, int]] | None:
        """The memory of one of its pools that a graph holds (``[(start, end)]``), or None."""
        ...

    def current_stream(self, device_index: int) -> int:
        """The driver handle of the library's current stream on that device."""
        ...


class Routing:
    """Open routings of one capture; :meth:`close` ends them, :attr:`keep` outlives them."""

    def __init__(self) -> None:
        self.stack = contextlib.ExitStack()
        self.keep: list[Any] = []

    def close(self) -> None:
        """End every routing (idempotent)."""
        self.stack.close()


def libraries() -> Iterator[Library]:
    """The supported libraries the program has imported."""
    for lib in (_torch.ADAPTER, _cupy.ADAPTER):
        if lib.module in sys.modules:
            yield lib


_BY_TYPE: dict[type, Library | None] = {}  # what library_of found for each type


def library_of(obj: object) -> Library | None:
    """The library ``obj`` (a device array) belongs to, or None (cudagraphs' own or unknown)."""
    t = type(obj)
    try:
        lib = _BY_TYPE[t]
    except KeyError:
        lib = next((lib for lib in libraries() if lib.owns(obj)), None)
        if lib is not None:
            _BY_TYPE[t] = lib  # (a library's array type stays its; others are asked again)
        return lib
    return lib if lib is not None and lib.owns(obj) else None


_gc_lock = threading.Lock()
_gc_pauses = [0, False]  # captures that paused the cyclic collector; whether it was on before


@contextlib.contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while another library is routed into a capture.

    A cycle that holds another library's arrays, collected during a capture,
    frees them through that library's allocator, which may call the driver in
    ways the capture forbids (measured: PyTorch then aborts the process).
    ``torch.cuda.graph`` runs ``gc.collect()`` before capturing for the same
    reason; pausing the collector costs nothing. Reference counting still
    frees what the captured code drops; nested and concurrent captures share
    one pause.
    """
    with _gc_lock:
        if _gc_pauses[0] == 0:
            _gc_pauses[1] = gc.isenabled()
            gc.disable()
        _gc_pauses[0] += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pauses[0] -= 1
            if _gc_pauses[0] == 0 and _gc_pauses[1]:
                gc.enable()


def route(
    device: Any, stream: Any, allocate: Callable[[int], Any] | None, shared: dict[str, Any] | None = None
) -> Routing:
    """Route every imported library to ``stream`` on ``device`` (for a capture of it).

    ``allocate`` gives the capture's memory to libraries that allocate
    through a callback (None: route the streams only, for eager work);
    ``shared`` is the capture pool's ``foreign`` dict, where libraries with
    pools of their own keep the one every capture into that pool shares.
    Nothing is routed on a backend whose memory other libraries cannot see
    (``sim``). If a routing fails half-way, the ones opened are closed and
    the error raised.
    """
    routing = Routing()
    if not device.backend.capabilities.shares_memory:
        return routing
    try:
        if allocate is not None and any(True for _ in libraries()):
            routing.stack.enter_context(_no_cyclic_gc())
        for lib in libraries():
            context = lib.route(
                device, stream.handle, allocate, routing.keep, {} if shared is None else shared
            )
            routing.stack.enter_context(context)
    except BaseException:
        routing.close()
        raise
    return routing


def keep_foreign(device: Any, graph: Any, records: list[Any], keep: list[Any], pools: list[Any]) -> list[Any]:
    """What a captured ``graph`` must keep of the memory other libraries' nodes in it use.

    See :mod:`cudagraphs.interop._keep`: the graph's nodes that are not
    among ``records`` (cudagraphs' own, top-level) are read, and the live
    arrays of the imported and registered libraries whose memory they use
    are found; the result lists what holds that memory. The
    memory the graph holds already is not looked for: its ``pools``
    (GraphPools) and the libraries' pools among what it ``keep``s.
    """
    libs = list(libraries())

    def owned() -> list[tuple[int, int]]:  # (asked only where the graph has others' nodes)
        held = [r for pool in pools for r in pool.ranges()]
        for obj in keep:
            for lib in libs:
                found = lib.pool_memory(obj)
                if found is not None:
                    held.extend(found)
                    break
        return held

    return foreign_memory(device, graph, records, libs, owned)
