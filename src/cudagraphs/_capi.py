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

from typing import Any

__all__ = [
    "CG_UNBOUND",
    "cg_api_load",
    "cg_graph_launch",
    "cg_issue",
    "cg_item",
    "cg_launch",
    "cg_lock_give",
    "cg_lock_take",
    "cg_nodes_add",
    "cg_nodes_new",
    "cg_nodes_set",
    "cg_tuple_new",
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


def cg_tuple_new(cls: type, items: tuple[Any, ...]) -> Any:
    """``tuple.__new__(cls, items)``: a NamedTuple made without its ``__new__``."""
    return tuple.__new__(cls, items)
