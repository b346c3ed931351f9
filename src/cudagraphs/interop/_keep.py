"""Memory that other libraries' captured nodes use, kept alive as long as the graph.

cudagraphs keeps every array its own work uses in a capture. Kernels that
another library queued on the captured stream (PyTorch, CuPy, Triton, a
custom extension) are nodes cudagraphs did not record: their arguments are
read here from the graph itself, once the capture has ended. Every
8-byte-aligned word of each kernel parameter, and each copy's and memset's
addresses, is matched against the memory of the live arrays of every
library the program uses (one pass over the objects Python's collector
tracks: PyTorch's tensors, CuPy's arrays, cudagraphs' own arrays, and the
arrays of any library given to :func:`register`); what holds the memory of
each array so found (a tensor's storage, a CuPy memory object, a cudagraphs
block) is kept by the graph, so the library's allocator cannot hand that
memory to other code while the graph may still replay.

A word that is not an address but falls inside an array keeps that array
alive too (memory held longer, never a wrong result). Memory that no Python
object holds (a tensor that only a library's C++ code references) cannot be
kept, nor memory behind nodes whose parameters cannot be read (child graphs,
kernels given an 'extra' buffer).
"""

from __future__ import annotations

import bisect
import gc
import weakref
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from .._array import DeviceArray
from .._errors import CudaGraphsWarning
from .._recording import has_unrecorded, resolve_handles
from .._where import warn

__all__ = ["ArrayMemory", "foreign_memory", "register", "registered", "unregister"]


class ArrayMemory(Protocol):
    """What :func:`register` needs of a library: its array types and where their memory is."""

    name: str

    def array_types(self) -> tuple[type, ...]:
        """The classes of the library's device arrays (instances of subclasses count too)."""
        ...

    def memory_of(self, obj: Any) -> tuple[int, int, int, Any] | None:
        """``(device index, start, end, keeper)`` of the memory under one of its arrays, or None.

        ``keeper`` is the object that keeps the memory ``[start, end)``
        allocated while it lives (PyTorch: the tensor's storage); None where
        ``obj`` is not on a device or its memory cannot be read.
        """
        ...


class _Own:
    """cudagraphs' own arrays (another library may read one by its address)."""

    name = "cudagraphs"

    def array_types(self) -> tuple[type, ...]:
        return (DeviceArray,)

    def memory_of(self, obj: Any) -> tuple[int, int, int, Any] | None:
        block = obj._block
        if block is None:  # (a view of another library's memory: that library's array keeps it)
            return None
        return obj.device.index, block.ptr, block.ptr + max(block.nbytes, 1), block


_REGISTERED: list[ArrayMemory] = [_Own()]


def register(library: ArrayMemory) -> None:
    """Make cudagraphs keep the arrays of ``library`` that captured nodes use.

    PyTorch and CuPy are known already. A library of your own (a custom
    extension with its own allocator) registers an object with ``name``,
    ``array_types()`` and ``memory_of(obj)`` (see :class:`ArrayMemory`):
    from then on, a graph whose nodes use the memory of one of its live
    arrays keeps what ``memory_of`` names alive as long as the graph.

    Raises
    ------
    TypeError
        If ``library`` lacks one of those.
    """
    for attr in ("name", "array_types", "memory_of"):
        if not hasattr(library, attr):
            raise TypeError(
                f"register() takes an object with name, array_types() and memory_of(obj) "
                f"(see cudagraphs.interop.ArrayMemory); {type(library).__name__} has no {attr}"
            )
    if library not in _REGISTERED:
        _REGISTERED.append(library)


def unregister(library: ArrayMemory) -> None:
    """Forget a library given to :func:`register` (no error if it was not)."""
    if library in _REGISTERED and not isinstance(library, _Own):
        _REGISTERED.remove(library)


def registered(imported: Iterable[ArrayMemory]) -> list[ArrayMemory]:
    """The libraries whose arrays are looked at: those registered, then ``imported``."""
    return [*_REGISTERED, *(lib for lib in imported if lib not in _REGISTERED)]


_Span = tuple[int, int, Any, Any, Any]  # (start, end, keeper, the array, its library)


def _spans(libraries: list[ArrayMemory], device_index: int) -> list[_Span]:
    """Every live array of ``libraries`` on the device: ``(start, end, keeper, array, library)``, sorted."""
    kinds: dict[type, ArrayMemory | None] = {}
    wanted = [(lib, lib.array_types()) for lib in libraries]
    spans: dict[int, _Span] = {}
    for obj in gc.get_objects():
        t = type(obj)
        if t in kinds:
            lib = kinds[t]
        else:
            lib = kinds[t] = _library_for(t, wanted)
        if lib is None:
            continue
        try:
            found = lib.memory_of(obj)
        except Exception:  # (an object of the library's that has no readable memory)
            continue
        if found is None or found[0] != device_index:
            continue
        _, start, end, keeper = found
        if start and end > start and end - start > (spans.get(start, (0, 0))[1] - start):
            spans[start] = (start, end, keeper, obj, lib)  # (the widest memory starting there)
    return [spans[k] for k in sorted(spans)]  # (by start: each start is one key)


def _library_for(t: type, wanted: list[tuple[ArrayMemory, tuple[type, ...]]]) -> ArrayMemory | None:
    """The library whose array types ``t`` is one of (a subclass counts), or None."""
    for lib, types in wanted:
        if issubclass(t, types):
            return lib
    return None


def _hits(spans: list[_Span], addresses: list[int], found: dict[int, Any]) -> list[int]:
    """Put the keepers of the spans holding ``addresses`` in ``found`` (by id); the addresses none holds."""
    starts = [s[0] for s in spans]
    widest = max((s[1] - s[0] for s in spans), default=0)
    missed = []
    for a in addresses:
        i = bisect.bisect_right(starts, a) - 1
        hit = False
        # spans may overlap (a tensor's storage inside a cudagraphs block): look back while a
        # span that starts there could still reach a
        while i >= 0 and a - spans[i][0] < widest:
            if a < spans[i][1]:
                keeper = spans[i][2]
                found[id(keeper)] = keeper
                hit = True
            i -= 1
        if not hit:
            missed.append(a)
    return missed


# what the last census found on each device: (start, end, weak reference to the array, its
# library), for the next capture (a census costs a pass over every object the collector tracks)
_LAST: dict[int, list[tuple[int, int, Any, Any]]] = {}


def _remember(device_index: int, spans: list[_Span]) -> None:
    """Keep weak references to the arrays a census found (those that take one)."""
    known = []
    for start, end, _keeper, obj, lib in spans:
        try:
            known.append((start, end, weakref.ref(obj), lib))
        except TypeError:  # (an array type without weak references: found again by the next census)
            continue
    _LAST[device_index] = known


def _recalled(device_index: int) -> list[_Span]:
    """The arrays the last census found that still live where they were (their keepers asked anew)."""
    out: list[_Span] = []
    for start, end, ref, lib in _LAST.get(device_index, ()):
        obj = ref()
        if obj is None:
            continue
        try:
            found = lib.memory_of(obj)
        except Exception:  # (its memory cannot be read any more)
            continue
        if found is not None and found[1] == start and found[2] == end:
            out.append((start, end, found[3], obj, lib))
    return out


def _outside(ranges: list[tuple[int, int]], addresses: list[int]) -> list[int]:
    """The addresses that none of ``ranges`` holds."""
    if not ranges:
        return addresses
    ranges = sorted(ranges)
    starts = [lo for lo, _ in ranges]
    out = []
    for a in addresses:
        i = bisect.bisect_right(starts, a) - 1
        if i < 0 or a >= ranges[i][1]:
            out.append(a)
    return out


def _device_memory(backend: Any, addresses: list[int]) -> list[int]:
    """The addresses that are device memory (each allocation asked of the driver once)."""
    last = (0, 0)  # (the allocation of the last address found: sorted, its addresses come together)
    out = []
    for a in addresses:
        if not last[0] <= a < last[1]:
            found = backend.memory_range(a)
            if found is None:
                continue
            last = found
        out.append(a)
    return out


def _warn_unseen(unseen: list[tuple[int, str]]) -> None:
    """Say which nodes of a new graph use memory cudagraphs cannot see, so cannot keep."""
    nodes = "; ".join(f"node {i}: {why}" for i, why in unseen[:3])
    if len(unseen) > 3:
        nodes += f"; and {len(unseen) - 3} more"
    warn(
        "the captured graph holds nodes of another library whose arguments cudagraphs cannot "
        f"read ({nodes}): the memory they use is not kept alive by the graph; keep what they use "
        "referenced as long as this graph replays",
        CudaGraphsWarning,
    )


def foreign_memory(
    device: Any,
    graph: Any,
    records: list[Any],
    imported: Iterable[ArrayMemory],
    owned: Callable[[], list[tuple[int, int]]],
) -> list[Any]:
    """What the graph must keep of the memory its unrecorded nodes use (what holds it).

    ``graph`` is the driver graph of a capture on ``device``; ``records`` are
    its top-level nodes cudagraphs recorded (their handles found here);
    ``imported`` the adapters of the libraries the program imported;
    ``owned()`` the memory the graph holds already (its pools' segments),
    asked only where the graph has nodes cudagraphs did not record.
    Nothing is looked at when every node of the graph is one of ``records``.
    The words left after the graph's own memory are first matched against
    the arrays the last census found that still live; only device memory
    none of them holds makes a new census (words that are not addresses are
    dropped by asking the driver).
    """
    backend = device.backend
    if not has_unrecorded(records, backend.graph_node_count(graph)):
        return []
    # (an embedded graph of cudagraphs' own is kept whole, its memory with it: not looked into)
    ours = {int(r.handle) for r in resolve_handles(backend, graph, records)}
    found, unseen = backend.graph_addresses(graph, ours)
    if unseen:
        _warn_unseen(unseen)
    addresses = _outside(owned(), sorted({a for _, used in found for a in used if a}))
    kept: dict[int, Any] = {}
    if addresses:
        addresses = _hits(_recalled(device.index), addresses, kept)
    if addresses:
        addresses = _device_memory(backend, addresses)
    if addresses:
        spans = _spans(registered(imported), device.index)
        _remember(device.index, spans)
        _hits(spans, addresses, kept)
    return list(kept.values())
