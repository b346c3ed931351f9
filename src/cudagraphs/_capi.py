"""The plain-Python forms of ``_capi.pxd``'s C functions, for the modules run as Python.

A compiled module calls the C part's trampolines and a few C primitives
through ``_capi.pxd`` (docs/architecture.md, "The compiled part"); where the
same module runs as plain Python (no compiler, or ``scripts/plain_tree.py``)
it imports these instead (``if not cython.compiled: from ._capi import ...``).
Each does what its C form does, at Python's cost; a trampoline answers
:data:`CG_UNBOUND` (no driver entry point here), and its caller then takes
the backend's primitive.
"""

from __future__ import annotations

from threading import get_ident as _get_ident
from typing import Any

__all__ = [
    "CG_UNBOUND",
    "cg_api_load",
    "cg_first_difference",
    "cg_first_none",
    "cg_first_not_none",
    "cg_graph_launch",
    "cg_issue",
    "cg_item",
    "cg_launch",
    "cg_lock_give",
    "cg_lock_take",
    "cg_mix",
    "cg_nodes_add",
    "cg_nodes_new",
    "cg_nodes_set",
    "cg_pop",
    "cg_put",
    "cg_replaced_where",
    "cg_thread_ident",
    "cg_tuple6",
    "cg_type_in",
    "cg_types_in",
    "cg_values",
]

CG_UNBOUND = -2  # what a trampoline answers where no driver entry point is bound


def cg_api_load(capsule: Any) -> None:
    """Take the C part's functions from its capsule (compiled modules only)."""


def cg_lock_take(lock: Any, blocking: bool) -> bool:
    """``lock.acquire(blocking)``."""
    return lock.acquire(blocking)  # type: ignore[no-any-return]


def cg_lock_give(lock: Any) -> None:
    """``lock.release()``."""
    lock.release()


def cg_graph_launch(exec_: int, stream: int) -> int:
    """The C part's cuGraphLaunch: not here (the backend's launch runs instead)."""
    return CG_UNBOUND


def cg_issue(issue: Any, stream: int, arg: Any) -> int:
    """The C part's issue of a kernel's launch: not here (the caller calls ``issue`` itself)."""
    return CG_UNBOUND


def cg_launch(
    packer: Any, function: int, grid: Any, block: Any, shared: int, stream: int, values: tuple[Any, ...]
) -> int:
    """The C part's launch of a kernel through its Packer: not here (the caller submits a Work)."""
    return CG_UNBOUND


def cg_nodes_new(exec_: int, expected: int) -> Any:
    """The C part's batch of kernel nodes' parameters: none here (the caller sets each node itself)."""
    return None


def cg_nodes_add(
    batch: Any,
    packer: Any,
    node: int,
    function: int,
    grid: Any,
    block: Any,
    shared: int,
    values: tuple[Any, ...],
) -> int:
    """A kernel node's parameters packed into the C part's batch: not here (the backend sets the node)."""
    return CG_UNBOUND


def cg_nodes_set(batch: Any) -> int:
    """The C part's cuGraphExecKernelNodeSetParams of a batch: none set here."""
    return 0


def cg_item(t: Any, i: int) -> Any:
    """``t[i]``: item ``i`` of a tuple or NamedTuple."""
    return t[i]


def _borrow(t: Any, k: int) -> Any:
    """Item ``k`` of tuple ``t`` (TypeError where ``t`` is not a tuple, IndexError where it has none)."""
    if not isinstance(t, tuple):
        raise TypeError(f"a tuple was expected, got {type(t).__name__}")
    return t[k]


def cg_first_difference(mine: list[Any], theirs: list[Any], k1: int, k2: int) -> int:
    """The first index where two lists of tuples differ in item ``k1`` or ``k2``, or -1.

    Items are compared by identity first, then with ``==``; a list that ends
    first differs there.
    """
    n = min(len(mine), len(theirs))
    for i in range(n):
        a, b = mine[i], theirs[i]
        for k in (k1, k2):
            x, y = _borrow(a, k), _borrow(b, k)
            if x is not y and x != y:
                return i
    return -1 if len(mine) == len(theirs) else n


def cg_first_not_none(items: list[Any], k: int) -> int:
    """The first index of a list of tuples whose item ``k`` is not None, or -1."""
    return _scan_none(items, k, False)


def cg_first_none(items: list[Any], k: int) -> int:
    """The first index of a list of tuples whose item ``k`` is None, or -1."""
    return _scan_none(items, k, True)


def _scan_none(items: list[Any], k: int, none: bool) -> int:
    for i, t in enumerate(items):
        if (_borrow(t, k) is None) is none:
            return i
    return -1


def cg_type_in(obj: Any, types: list[type]) -> bool:
    """Whether the type of ``obj`` is one of ``types``, by identity."""
    t = type(obj)
    for e in types:  # noqa: SIM110
        if t is e:
            return True
    return False


def cg_types_in(objs: Any, types: list[type]) -> bool:
    """Whether the type of one of ``objs`` (an iterable) is one of ``types``, by identity."""
    for a in objs:  # noqa: SIM110
        if cg_type_in(a, types):
            return True
    return False


def cg_mix(h: int, a: Any, b: Any) -> int:
    """The signature of the pairs before (``h``) and then ``(a, b)``, by identity (64 bits)."""
    h = ((h ^ id(a)) * 0x9E3779B97F4A7C15) & _MASK64
    h = ((h ^ id(b)) * 0xC2B2AE3D27D4EB4F) & _MASK64
    return h ^ (h >> 29)


_MASK64 = (1 << 64) - 1


def cg_pop(items: list[Any]) -> Any:
    """``items.pop()`` (compiled: the list's storage kept, not shrunk)."""
    return items.pop()


def cg_values(n: int) -> list[Any]:
    """The values of one launch, to fill with :func:`cg_put` (compiled: a tuple of ``n`` empty slots)."""
    if n < 0:
        raise ValueError("cg_values: a negative length")
    return [None] * n


def cg_put(values: list[Any], i: int, value: Any) -> None:
    """Set item ``i`` of ``values`` (from :func:`cg_values`; compiled: each slot once)."""
    if not 0 <= i < len(values):
        raise ValueError("cg_put: not an empty slot of a tuple from cg_values")
    values[i] = value


def cg_thread_ident() -> int:
    """The calling thread's identifier, as :func:`threading.get_ident` gives it (compiled: a C integer)."""
    return _get_ident()


def cg_tuple6(cls: type, a: Any, b: Any, c: Any, d: Any, e: Any, f: Any) -> Any:
    """``tuple.__new__(cls, (a, b, c, d, e, f))``: a NamedTuple of six made without its ``__new__``."""
    return tuple.__new__(cls, (a, b, c, d, e, f))


def cg_replaced_where(values: tuple[Any, ...], views: tuple[Any, ...], key: Any, new: Any) -> tuple[Any, ...]:
    """A copy of ``values`` with item ``j`` ``new`` wherever ``views[j]`` is ``key``; else ``values``.

    Views are compared by identity first, then with ``==`` (a None view
    never matches).
    """
    if len(views) != len(values):
        raise ValueError("values and views differ in length")
    hits = [j for j, v in enumerate(views) if v is key or (v is not None and v == key)]
    if not hits:
        return values
    out = list(values)
    for j in hits:
        out[j] = new
    return tuple(out)
