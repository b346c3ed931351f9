"""Input staging of graphed callables: static input buffers and the copies into them.

A graph reads its inputs from static buffers, allocated when its key is
first called. Each call copies its inputs there (:meth:`Staging.stage`): with
buckets, into the rows of the bucket the size along ``dim`` rounds up to
(:meth:`Staging.bucket`), the padding rows filled; the buffers of one key's
buckets are views of one buffer of the largest bucket
(:meth:`Staging.static_inputs`). Without buckets, the copies are the graph's
own first nodes (:meth:`Staging.record_copies`), pointed at each call's
inputs when their addresses change (:meth:`Staging.point`).

This module is compiled by Cython from this source where the package is
built (``_staging.pxd`` declares :class:`Input`, :class:`Entry` and
:class:`Staging` extension types with typed fields: a graphed call reads
them as C fields; docs/architecture.md, "The compiled part"), and runs as
plain Python where not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

try:
    import cython
except ImportError:  # (run as Python where Cython is not installed: nothing is compiled)
    from types import SimpleNamespace

    cython = SimpleNamespace(compiled=False)

from ._array import DeviceArray, empty, foreign_view
from ._builtin_kernels import copy_view, fill_value, fill_view
from ._device import Device, Stream
from ._errors import CudaError
from ._recording import Work, submit, submit_parts
from .backends.base import CUDA_ERROR_INVALID_VALUE, Copy

if TYPE_CHECKING:
    from ._graph import Graph

__all__ = ["Entry", "Input", "Staging", "array_of", "first_rows", "new_input"]

_tuple_new = tuple.__new__  # (named tuples built in C: the repeat path)


class Input:
    """One array argument as it came in (made by :func:`new_input`)."""

    __slots__ = ("contiguous", "dtype", "lib", "obj", "ptr", "shape")

    obj: Any
    lib: Any  # the interop Library, or None for cudagraphs arrays
    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype
    contiguous: bool

    def __repr__(self) -> str:
        return f"Input(lib={self.lib}, ptr={self.ptr:#x}, shape={self.shape}, dtype={self.dtype})"


def new_input(
    obj: Any, lib: Any, ptr: int, shape: tuple[int, ...], dtype: np.dtype, contiguous: bool
) -> Input:
    """An :class:`Input` with every field set (compiled: allocated without a call of the class)."""
    i = Input.__new__(Input)
    i.obj, i.lib, i.ptr, i.shape, i.dtype, i.contiguous = obj, lib, ptr, shape, dtype, contiguous
    return i


def array_of(i: Input, device: Device) -> DeviceArray:
    """The input as a cudagraphs array (a zero-copy view of another library's)."""
    obj = i.obj
    if isinstance(obj, DeviceArray):
        return obj
    view = foreign_view(obj, device)
    assert view is not None
    return view


def first_rows(shape: tuple[int, ...], dim: int, size: int) -> tuple[slice | int, ...]:
    """The index of the first ``size`` rows along ``dim`` of an array of ``shape``."""
    return (slice(None),) * dim + (slice(0, size),)


class Entry:
    """One captured graph of a graphed callable: its key's static inputs and outputs.

    A key whose capture was refused under ``fallback="eager"`` has an entry
    without a graph, whose ``eager`` is the refusal's message.
    """

    __slots__ = (
        "bucket",
        "copies",
        "eager",
        "graph",
        "held",
        "hits",
        "memory",
        "out_libs",
        "out_spec",
        "outs",
        "scratch",
        "sources",
        "static",
    )

    def __init__(self, bucket: int | None, inputs: int) -> None:
        self.bucket = bucket
        # per input, where the graph copies it itself (its first nodes): the copy's record
        # index, the address it copies from now, the input there (kept alive: a direct replay
        # reads it), a dense buffer for a strided input; None for an input copied by each call
        self.copies: list[int | None] = [None] * inputs
        self.sources: list[int | None] = [None] * inputs
        self.held: list[Any] = [None] * inputs
        self.scratch: list[DeviceArray | None] = [None] * inputs
        self.graph: Graph | None = None
        self.static: list[DeviceArray] = []  # the graph's input buffers (bucket-sized)
        self.out_spec: Any = None
        self.outs: list[Any] = []  # the static outputs (as fn returned them)
        self.out_libs: list[Any] = []  # the library of each output (None: cudagraphs)
        self.hits = 0
        self.memory = 0  # bytes the capture added to the cudagraphs pool
        self.eager: str | None = None  # why the key runs eagerly (its capture was refused), if so


class Staging:
    """The static inputs of one graphed callable's graphs, and the copies into them.

    Attributes
    ----------
    device : Device
    buckets : tuple of int or None
    dim : int
        The padded dimension.
    pad_value : number or None
        What padding rows are filled with (None: left as they are).
    buffers : dict
        The static input buffers of each key family, shared by its buckets.
    """

    __slots__ = ("buckets", "buffers", "device", "dim", "pad_value")

    def __init__(self, device: Device, buckets: tuple[int, ...] | None, dim: int, pad_value: Any) -> None:
        self.device = device
        self.buckets = buckets
        self.dim = dim
        self.pad_value = pad_value
        self.buffers: dict[Any, list[DeviceArray]] = {}  # static inputs, shared across buckets

    def shape(self, shape: tuple[int, ...], bucket: int | None) -> tuple[int, ...]:
        if bucket is None:
            return shape
        d = self.dim
        return (*shape[:d], bucket, *shape[d + 1 :])

    def bucket(self, ins: list[Input]) -> tuple[int | None, int | None]:
        """(the true size along ``dim``, its bucket), or (None, None) without buckets."""
        buckets = self.buckets
        if buckets is None or not ins:
            return None, None
        d = self.dim
        sizes = {i.shape[d] if len(i.shape) > d else None for i in ins}
        if len(sizes) != 1 or None in sizes:
            shapes = ", ".join(str(i.shape) for i in ins)
            raise ValueError(
                f"graphed with buckets: every array input is padded along dimension {d}, so "
                f"they must all have it, of one size; got shapes {shapes}. Pass arrays that "
                "are not batched (weights) through a closure or a GraphModule"
            )
        n = sizes.pop()
        assert n is not None
        for b in buckets:
            if b >= n:
                return n, b
        raise ValueError(
            f"graphed: size {n} along dimension {d} is larger than the largest bucket "
            f"({buckets[-1]}); add a bucket of at least {n}"
        )

    def stage(
        self, entry: Entry, ins: list[Input], n: int | None, bucket: int | None, stream: Stream
    ) -> None:
        """Copy the inputs into the entry's static buffers and fill the padding.

        The inputs the graph copies itself are not copied here: their copy
        nodes are pointed at them when their address changed.
        """
        copies = entry.copies
        static = entry.static
        for j in range(len(ins)):  # (an index loop: compiled, no iterator objects)
            i = ins[j]
            if copies[j] is not None and self.point(entry, j, i, stream):
                continue
            self.copy_in(static[j], i, n, bucket, stream)

    def copy_in(self, dst: DeviceArray, i: Input, n: int | None, bucket: int | None, stream: Stream) -> None:
        """Copy input ``i`` into its static buffer ``dst`` on ``stream`` (and fill the padding)."""
        part = dst[first_rows(dst.shape, self.dim, n)] if n is not None and n != bucket else dst
        if i.contiguous and part.is_contiguous:
            nbytes = part.nbytes
            if nbytes:
                copy = _tuple_new(Copy, (part.ptr, i.ptr, nbytes, "dtod"))
                backend = dst.device.backend  # (the work passed by its parts: none made)
                submit_parts(stream, "memcpy", backend.memcpy, copy, (i.obj,), (part,), (), "", None, None)
        else:
            copy_view(part, array_of(i, dst.device), stream)
        if n is not None and n != bucket and self.pad_value is not None:
            d = self.dim
            pad = dst[(slice(None),) * d + (slice(n, bucket),)]
            fill_view(pad, fill_value("graphed padding", dst.dtype, self.pad_value), stream)

    def point(self, entry: Entry, j: int, i: Input, stream: Stream) -> bool:
        """Make input ``j``'s copy node read ``i`` (a dense copy of it, if it is strided).

        The driver moves a copy node only within one kind of memory: the
        stream-ordered pool's (cudagraphs arrays) or other device memory
        (PyTorch's and CuPy's allocators). Where ``i`` is of the other kind,
        the node is switched off for good and False returned: the caller then
        copies the input eagerly, as every later call will. The callable's
        lock is held.
        """
        src, held = i.ptr, i.obj
        if not i.contiguous:  # the node copies dense bytes: from a dense copy made now
            dense = entry.scratch[j]
            if dense is None:
                dense = entry.scratch[j] = empty(i.shape, i.dtype, device=self.device, stream=stream)
            copy_view(dense, array_of(i, self.device), stream)
            src, held = dense.ptr, dense
        if src != entry.sources[j]:
            graph, node = entry.graph, entry.copies[j]
            assert graph is not None
            assert node is not None
            try:
                graph._point_copy(node, src)
            except CudaError as exc:
                if exc.code != CUDA_ERROR_INVALID_VALUE:
                    raise
                graph._point_copy(node, None)  # (switched off)
                entry.copies[j] = entry.sources[j] = entry.held[j] = entry.scratch[j] = None
                return False
            entry.sources[j] = src
        entry.held[j] = held  # (the next call, or a direct replay of the graph, reads it)
        return True

    def record_copies(self, entry: Entry, ins: list[Input], stream: Stream) -> None:
        """Record the input copies as the first nodes of the graph captured on ``stream``.

        Each call then replays them, from the address of that call's input
        (see :meth:`_point`): no copy is queued per call, and none is changed
        while the input stays at the same address. Only graphs without
        buckets (the whole input is copied) and outside other captures do so.
        """
        rec = stream._recording
        assert rec is not None
        backend = self.device.backend
        for j, (dst, i) in enumerate(zip(entry.static, ins)):
            if not (i.contiguous and dst.is_contiguous and dst.nbytes):
                continue
            copy = _tuple_new(Copy, (dst.ptr, i.ptr, dst.nbytes, "dtod"))
            index = len(rec.nodes)  # (the first nodes: every record before is top-level)
            src = array_of(i, self.device)  # (what the record says the node reads)
            submit(stream, Work("memcpy", backend.memcpy, copy, (src,), (dst,), (i.obj,), "", copy))
            entry.copies[j], entry.sources[j], entry.held[j] = index, i.ptr, i.obj

    def static_inputs(self, spec: Any, ins: list[Input], bucket: int | None) -> list[DeviceArray]:
        """Static input buffers for a key: views of buffers shared by all its buckets."""
        if bucket is None:
            return [empty(i.shape, i.dtype, device=self.device) for i in ins]
        assert self.buckets is not None
        family = (spec, tuple([(i.dtype, self.shape(i.shape, 0)) for i in ins]))
        buffers = self.buffers.get(family)
        if buffers is None:
            top = self.buckets[-1]
            buffers = [empty(self.shape(i.shape, top), i.dtype, device=self.device) for i in ins]
            self.buffers[family] = buffers
        return [b[first_rows(b.shape, self.dim, bucket)] for b in buffers]
