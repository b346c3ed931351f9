"""The C primitives of ``_capi.pxd`` answer as their plain-Python forms in ``_capi.py`` do.

The compiled modules call the C forms (where built); the same modules run as
plain Python call the forms in ``_capi.py``. Each is reached here through the
module function that calls it, on random data, and compared with the Python
form: in the compiled run of the suite this checks the C loop, in the plain
run the Python one, against the same expectations.
"""

from __future__ import annotations

import random
from typing import Any, NamedTuple

import pytest

from cudagraphs import _capi, _recording, _update
from cudagraphs._graphed_callable import GraphOutput


class Rec(NamedTuple):
    handle: Any
    kind: str
    name: str


def _records(rnd: random.Random, n: int) -> list[Rec]:
    # ("axpy" twice: the same text in two objects)
    kinds, names = ["kernel", "memcpy", "child"], ["inc", "axpy", "".join(["ax", "py"])]
    return [Rec(None, rnd.choice(kinds), rnd.choice(names)) for _ in range(n)]


def _first_difference_by_hand(a: list[Any], b: list[Any], k1: int, k2: int) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x[k1] != y[k1] or x[k2] != y[k2]:
            return i
    return -1 if len(a) == len(b) else min(len(a), len(b))


@pytest.mark.parametrize("seed", range(20))
def test_first_difference_on_random_records(seed: int) -> None:
    rnd = random.Random(seed)
    mine = _records(rnd, rnd.randrange(0, 60))
    theirs = [Rec(r.handle, r.kind, str(r.name)) for r in mine]  # equal, mostly other objects
    if mine and rnd.random() < 0.7:  # change one node's kind or name, or cut the list
        i = rnd.randrange(len(mine))
        what = rnd.choice(["kind", "name", "cut"])
        if what == "cut":
            theirs = theirs[:i]
        else:
            theirs[i] = theirs[i]._replace(**{what: "other"})
    expected = _first_difference_by_hand(mine, theirs, 1, 2)
    assert _update._first_difference(mine, theirs, 1, 2) == expected
    assert _capi.cg_first_difference(mine, theirs, 1, 2) == expected
    assert _update._first_difference(theirs, mine, 1, 2) == expected  # (either side may be longer)
    # a trace's plain pairs compare as records do
    pairs = [(r.kind, r.name) for r in theirs]
    assert _update._first_difference([(r.kind, r.name) for r in mine], pairs, 0, 1) == expected


def test_first_difference_raises_for_items_that_are_not_tuples() -> None:
    with pytest.raises(TypeError):
        _update._first_difference([["kernel", "inc"]], [("kernel", "inc")], 0, 1)
    with pytest.raises(IndexError):
        _update._first_difference([("kernel",)], [("kernel", "inc")], 0, 1)


class Boom:
    def __eq__(self, other: object) -> bool:
        raise ValueError("no comparison")

    __hash__ = object.__hash__


def test_first_difference_passes_on_a_comparison_that_raises() -> None:
    with pytest.raises(ValueError, match="no comparison"):
        _update._first_difference([("kernel", Boom())], [("kernel", Boom())], 0, 1)


@pytest.mark.parametrize("seed", range(10))
def test_has_handles_finds_the_first_handle(seed: int) -> None:
    rnd = random.Random(seed)
    records = _records(rnd, rnd.randrange(0, 40))
    at = rnd.randrange(len(records)) if records and rnd.random() < 0.6 else -1
    if at >= 0:
        records[at] = records[at]._replace(handle=1234 + at)
    assert _capi.cg_first_not_none(records, 0) == at
    assert _update._has_handles(records) is (at >= 0)
    # (and the first record without one: resolve_handles returns records that all have one as is)
    with_handles = [r._replace(handle=9000 + i) for i, r in enumerate(records)]
    gap = rnd.randrange(len(records)) if records and rnd.random() < 0.6 else -1
    if gap >= 0:
        with_handles[gap] = with_handles[gap]._replace(handle=None)
    assert _capi.cg_first_none(with_handles, 0) == gap
    if gap < 0:
        assert _recording.resolve_handles(None, None, with_handles) is with_handles


@pytest.mark.parametrize("seed", range(10))
def test_has_unrecorded_counts_every_node_but_child_graphs(seed: int) -> None:
    rnd = random.Random(seed)
    records = _records(rnd, rnd.randrange(0, 40))
    recorded = len(records) - sum(r.kind == "child" for r in records)
    assert not _recording.has_unrecorded(records, recorded)
    assert _recording.has_unrecorded(records, recorded + 1)  # a node nobody recorded


class _Plain:
    ptr = 99


def test_types_in_and_address(dev: Any) -> None:
    """The plain forms of the type scans, and ``address`` (compiled: through the C ``cg_type_in``).

    (The C ``cg_types_in`` is reached through the launch's scan for expiring
    arrays: test_launcher's test of an expiring output fails without it.)
    """
    import cudagraphs as cg

    x = cg.zeros(4, "float32", device=dev)
    expiring = [GraphOutput]
    assert not _capi.cg_types_in((x, 1, 2.0), expiring)
    assert not _capi.cg_types_in([x, None], expiring)
    assert _capi.cg_types_in(iter([1, x]), [type(x)])  # (any iterable)
    assert not _capi.cg_types_in(iter([1, x]), expiring)
    assert not _capi.cg_type_in(x, expiring)
    assert _capi.cg_type_in(x, [type(x)])
    assert _capi.cg_types_in([1, x], [type(x)])
    # an array's address is its field; another object's, its ptr attribute
    assert _recording.address(x) == x.ptr
    assert _recording.address(_Plain()) == 99
    with pytest.raises(AttributeError):
        _recording.address(object())


def test_the_address_of_an_expired_graph_output_is_refused(dev: Any) -> None:
    """``address`` reads an array's field, except for a type that expires: a stale output raises."""
    import cudagraphs as cg

    f = cg.graphed(lambda u: cg.ops.scale(2.0, u), device=dev)
    a = cg.ones(8, "float32", device=dev)
    first = f(a)
    assert type(first) is GraphOutput
    assert _recording.address(first) == first.ptr  # (valid until the next call)
    f(a)
    f(a)  # (the repeat call: first is stale now)
    with pytest.raises(cg.StaleOutputError):
        _recording.address(first)


def test_the_view_of_an_expired_graph_output_is_refused(dev: Any) -> None:
    """``view_of`` reads an array's cached view, except for a type that expires: a stale output raises."""
    import cudagraphs as cg

    f = cg.graphed(lambda u: cg.ops.scale(2.0, u), device=dev)
    a = cg.ones(8, "float32", device=dev)
    first = f(a)
    spec = _recording.view_of(first)  # (valid until the next call: its view is cached now)
    assert spec is first._arg
    assert spec.ptr == first.ptr
    assert _recording.view_of(a) is a._view_spec()  # (a plain array: its cached view)
    f(a)
    f(a)  # (the repeat call: first is stale now)
    with pytest.raises(cg.StaleOutputError):
        _recording.view_of(first)
