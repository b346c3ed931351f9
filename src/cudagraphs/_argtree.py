"""Argument trees of graphed callables: nested arguments flattened to arrays and a spec.

A call's arguments (tuples, lists, dicts, named tuples, nested) are
flattened into their device arrays, the leaves (cudagraphs, PyTorch, CuPy,
anything with ``__cuda_array_interface__`` or CUDA DLPack), and a spec: the
tree with each array replaced by :data:`LEAF` and every other leaf kept as
it is (it must be hashable: the spec is part of the graph's key).
:func:`unflatten` builds the tree again from a spec and arrays (the static
inputs a function is captured on, the outputs it returned).

This module is compiled by Cython from this source where the package is
built (``_argtree.pxd``: a graphed call's spec and its result's tree are C
calls), and runs as plain Python where not.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from . import interop
from ._array import DeviceArray

__all__ = [
    "ARRAY_TYPES",
    "LEAF",
    "flatten",
    "foreign_view_possible",
    "in_host_memory",
    "positional_spec",
    "unflatten",
]

LEAF = ("array",)  # the place of an array in a flattened argument tree
_LEAF = LEAF  # (compiled, a C global: unflatten reads it on every call)


def _is_array(obj: Any) -> bool:
    if isinstance(obj, DeviceArray):
        ARRAY_TYPES.add(type(obj))
        return True
    if isinstance(obj, (int, float, str, bytes, bool, type(None), np.ndarray, np.generic)):
        return False
    if interop.library_of(obj) is not None:
        ARRAY_TYPES.add(type(obj))
        return True
    if getattr(obj, "is_cuda", True) is False:  # a PyTorch tensor in host memory
        raise in_host_memory(obj)
    return foreign_view_possible(obj)


def in_host_memory(obj: Any) -> TypeError:
    """The error for another library's array in host memory given as an input."""
    return TypeError(
        f"graphed: a {type(obj).__name__} in host memory; graphs read device memory: "
        "move it to the GPU first (PyTorch: .cuda())"
    )


def foreign_view_possible(obj: Any) -> bool:
    """Whether ``obj`` speaks ``__cuda_array_interface__`` or CUDA DLPack."""
    try:
        if getattr(obj, "__cuda_array_interface__", None) is not None:
            return True
    except Exception:  # (a host tensor's property may raise anything)
        return False
    kind = getattr(obj, "__dlpack_device__", None)
    try:
        return kind is not None and kind()[0] == 2
    except Exception:
        return False


ARRAY_TYPES: set[type] = set()  # types seen to be device arrays (a fast path for calls)


def positional_spec(n: int) -> Any:
    """What :func:`flatten` gives for ``n`` positional arrays and no keyword (the same object each time)."""
    global _POSITIONAL
    specs = _POSITIONAL
    if n >= len(specs):  # (two threads may both extend it: one's is kept, equal to the other's)
        more = [flatten((tuple([_SPEC_ARRAY] * k), {}), []) for k in range(len(specs), n + 1)]
        specs = _POSITIONAL = specs + tuple(more)
    return specs[n]


_POSITIONAL: tuple[Any, ...] = ()  # positional_spec's answers, by n


class _SpecArray:  # a stand-in array, only for positional_spec
    pass


_SPEC_ARRAY = _SpecArray()


def flatten(obj: Any, leaves: list[Any]) -> Any:
    """The tree of ``obj`` with arrays replaced by ``LEAF``; arrays appended to ``leaves``."""
    t = type(obj)
    if t is tuple or t is list:
        return (t, tuple([flatten(x, leaves) for x in obj]))
    if t is dict:
        return (dict, tuple(obj), tuple([flatten(v, leaves) for v in obj.values()]))
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a named tuple
        return (t, tuple([flatten(x, leaves) for x in obj]))
    if obj is _SPEC_ARRAY or _is_array(obj):
        leaves.append(obj)
        return LEAF
    try:
        hash(obj)
    except TypeError:
        raise TypeError(
            f"graphed: an argument of type {t.__name__} is neither a device array nor "
            "hashable; other arguments are part of the graph's key: pass numbers, strings, "
            "tuples, or arrays (a host numpy array must go to the device first)"
        ) from None
    return ("static", t, obj)


def unflatten(spec: Any, leaves: list[Any]) -> Any:
    """The tree of ``spec`` with its arrays taken from ``leaves``, in order."""
    if spec is _LEAF:  # (the common result: one array)
        return leaves[0]
    return _tree(spec, iter(leaves))


def _tree(spec: Any, leaves: Iterator[Any]) -> Any:
    if spec is _LEAF:
        return next(leaves)
    kind = spec[0]
    if kind == "static":
        return spec[2]
    if kind is dict:
        return dict(zip(spec[1], [_tree(s, leaves) for s in spec[2]]))
    items = [_tree(s, leaves) for s in spec[1]]
    if kind is tuple or kind is list:
        return kind(items)
    return kind(*items)  # a named tuple
