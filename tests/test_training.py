"""Graphed callables with ``grad=True``: what does not need PyTorch (options, the forward-only path).

The training itself (forward and backward graphs, ``.grad`` accumulation,
the refusals) is PyTorch's and runs on a GPU: tests/test_training_gpu.py.
Here, on each backend: the options ``grad`` and ``params`` are checked with
errors that name what is accepted, and a ``grad=True`` callable called
without anything that requires grad (cudagraphs arrays) is graphed as
without the option, buckets, stats and ``close()`` included.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import cudagraphs as cg


def _affine(x: cg.DeviceArray) -> cg.DeviceArray:
    return cg.ops.add(cg.ops.scale(2.0, x), x)


class _Tensorish:
    """Looks like a tensor to the option check (requires_grad, data_ptr)."""

    requires_grad = True

    def data_ptr(self) -> int:
        return 0


_BAD = [
    ({"grad": 1}, TypeError, r"grad must be a bool .*got 1"),
    ({"grad": "yes"}, TypeError, r"grad must be a bool"),
    ({"grad": None}, TypeError, r"grad must be a bool"),
    ({"grad": True, "params": 3}, TypeError, r"params must be None or an iterable of torch tensors"),
    ({"grad": True, "params": "w"}, TypeError, r"params must be None or an iterable of torch tensors"),
    ({"grad": True, "params": {"w": 1}}, TypeError, r"params must be None or an iterable"),
    ({"grad": True, "params": [1.0]}, TypeError, r"an element is a float"),
    ({"params": [_Tensorish()]}, ValueError, r"params= .* needs grad=True"),
]


def test_grad_refuses_a_stream(dev: cg.Device) -> None:
    with pytest.raises(ValueError, match="stream= is not accepted"):
        cg.graphed(_affine, device=dev, grad=True, stream=dev.create_stream())


@pytest.mark.parametrize(("bad", "error", "message"), _BAD)
def test_grad_options_are_checked(
    dev: cg.Device, bad: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        cg.graphed(_affine, device=dev, **bad)
    decorate = cg.graphed(device=dev, **bad)  # (checked when the function is given)
    with pytest.raises(error, match=message):
        decorate(_affine)


def test_params_accepts_any_iterable_of_tensors(dev: cg.Device) -> None:
    p = _Tensorish()
    f = cg.graphed(_affine, device=dev, grad=True, params=iter([p]))
    assert f._trainer is not None
    assert f._trainer.given == (p,)
    assert cg.graphed(_affine, device=dev)._trainer is None


def test_a_grad_callable_without_gradients_is_graphed_forward_only(dev: cg.Device) -> None:
    """Nothing requires grad (cudagraphs arrays): forward graphs, one per bucket, as without grad."""
    f = cg.graphed(_affine, device=dev, grad=True, buckets=[2, 4])
    rng = np.random.default_rng(0)
    for n in (3, 1, 4, 3):
        x = rng.random((n, 5), dtype=np.float32)
        out = f(cg.asarray(x, device=dev))
        np.testing.assert_allclose(out.get(), 3 * x, rtol=1e-6)
    stats = f.stats()
    assert stats["calls"] == 4
    assert stats["captures"] == 2
    assert stats["misses"] == 2
    assert sorted(stats["graphs"]) == [2, 4]
    kept = f(cg.asarray(np.ones((2, 5), np.float32), device=dev))
    f(cg.asarray(np.ones((2, 5), np.float32), device=dev))
    with pytest.raises(cg.StaleOutputError):  # (outputs expire as without grad)
        kept.get()
    f.close()
    assert f.stats()["captures"] == 0
    out = f(cg.asarray(np.ones((4, 5), np.float32), device=dev))
    np.testing.assert_allclose(out.get(), np.full((4, 5), 3.0, np.float32))


def test_a_grad_callable_without_buckets_and_capture_refusal(dev: cg.Device) -> None:
    def reads(x: cg.DeviceArray) -> cg.DeviceArray:
        x.get()
        return cg.ops.scale(2.0, x)

    f = cg.graphed(reads, device=dev, grad=True)
    with pytest.raises(cg.CaptureError):
        f(cg.ones(4, "float32", device=dev))
    g = cg.graphed(reads, device=dev, grad=True, fallback="eager")
    with pytest.warns(cg.FallbackWarning):
        out = g(cg.ones(4, "float32", device=dev))
    np.testing.assert_array_equal(out.get(), np.full(4, 2.0, np.float32))
    assert len(g.stats()["eager"]) == 1


def test_capture_all_of_a_grad_callable_captures_each_bucket(dev: cg.Device) -> None:
    f = cg.graphed(_affine, device=dev, grad=True, buckets=[1, 2, 4])
    f.capture_all(cg.ones((3, 2), "float32", device=dev))
    assert sorted(f.stats()["graphs"]) == [1, 2, 4]
    with pytest.raises(ValueError, match="needs buckets"):
        cg.graphed(_affine, device=dev, grad=True).capture_all(cg.ones((3, 2), "float32", device=dev))
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    np.testing.assert_allclose(f(cg.asarray(x, device=dev)).get(), 3 * x)
    assert f.stats()["misses"] == 0


class _Grad:
    """A static gradient as ``_training._copies`` sees it: a dtype, ``clone()``; how it was copied."""

    def __init__(self, dtype: str, how: str = "static") -> None:
        self.dtype, self.how = dtype, how

    def clone(self) -> _Grad:
        return _Grad(self.dtype, "clone")


class _FakeTorch:
    """The names ``_plan`` and ``_copies`` look up; ``_foreach_mul`` counts its calls."""

    float32, float64, float16, bfloat16, complex64 = "float32", "float64", "float16", "bfloat16", "complex64"

    def __init__(self) -> None:
        self.foreach_calls = 0

    def _foreach_mul(self, grads: list[_Grad], scalar: float) -> list[_Grad]:
        assert scalar == 1.0
        self.foreach_calls += 1
        return [_Grad(g.dtype, "foreach") for g in grads]


def _copied(grads: tuple[_Grad | None, ...], torch: _FakeTorch) -> list[Any]:
    from cudagraphs._training import _copies, _plan, _Step

    step = _Step(None)  # type: ignore[arg-type]  (only its gradients and plan are read)
    step.grads = (_Grad("float32"), *grads)  # (an input's gradient first: k=1)
    step.plan = _plan(step.grads[1:], torch)
    return _copies(step, 1, torch)


def test_param_gradients_are_copied_by_one_foreach_call() -> None:
    """Every parameter of a real floating dtype: one ``_foreach_mul`` by 1, no clone."""
    torch = _FakeTorch()
    grads = (_Grad("float32"), _Grad("bfloat16"), _Grad("float64"), _Grad("float16"))
    out = _copied(grads, torch)
    assert torch.foreach_calls == 1
    assert [(g.dtype, g.how) for g in out] == [(g.dtype, "foreach") for g in grads]


def test_unused_and_complex_param_gradients_keep_their_places() -> None:
    """None stays None (an unused parameter), a complex gradient is cloned, the rest multiplied."""
    torch = _FakeTorch()
    out = _copied((_Grad("float32"), None, _Grad("complex64"), _Grad("float16")), torch)
    assert torch.foreach_calls == 1
    assert out[1] is None
    assert [(g.dtype, g.how) for g in (out[0], out[2], out[3])] == [
        ("float32", "foreach"),
        ("complex64", "clone"),
        ("float16", "foreach"),
    ]
    torch = _FakeTorch()
    assert _copied((None, _Grad("complex64")), torch)[0] is None
    assert torch.foreach_calls == 0  # (nothing to multiply: no call)


class _Module:
    """The parts of ``torch.nn.Module`` that ``_training._Tree`` reads; ``walks`` counts walks."""

    walks = 0

    def __init__(self, *params: object, **children: _Module | None) -> None:
        self._parameters: dict[str, object] = {f"p{j}": p for j, p in enumerate(params)}
        self._modules: dict[str, _Module | None] = dict(children)

    def modules(self) -> Any:
        yield self
        for child in self._modules.values():
            if child is not None:
                yield from child.modules()

    def parameters(self) -> Any:
        _Module.walks += 1
        seen: set[int] = set()
        for m in self.modules():
            for p in m._parameters.values():
                if p is not None and id(p) not in seen:
                    seen.add(id(p))
                    yield p

    def named_parameters(self) -> None: ...

    def _named_members(self) -> None: ...

    def named_modules(self) -> None: ...


def _tree() -> tuple[Any, _Module, list[object]]:
    from cudagraphs._training import _Tree

    ps = [object() for _ in range(4)]
    root = _Module(ps[0], a=_Module(ps[1], ps[2]), b=_Module(ps[3], c=None))
    return _Tree(root, _Module), root, ps


def _walks(tree: Any, root: _Module) -> int:
    """How many walks the next ``tree.parameters()`` makes; checks its answer against a walk."""
    before = _Module.walks
    got = tree.parameters()
    made = _Module.walks - before
    assert got == tuple(root.parameters())
    return made


def test_a_modules_parameters_are_walked_once_while_its_tree_is_the_same() -> None:
    tree, root, ps = _tree()
    assert tree.parameters() == tuple(ps)
    for _ in range(3):
        assert _walks(tree, root) == 0
    root._modules["a"]._parameters["p0"] = ps[1]  # (the same object again: nothing changed)
    assert _walks(tree, root) == 0


@pytest.mark.parametrize(
    "change",
    [
        "replace a parameter",
        "remove a parameter",
        "add a parameter",
        "replace a submodule",
        "add a submodule",
        "remove a submodule",
        "replace a dictionary",
        "swap a class",
    ],
)
def test_a_changed_tree_is_walked_again(change: str) -> None:
    """Each change a walk would see is seen by the next call (which walks, then stands again)."""
    tree, root, ps = _tree()
    tree.parameters()
    a = root._modules["a"]
    assert a is not None
    if change == "replace a parameter":
        a._parameters["p1"] = object()
    elif change == "remove a parameter":
        del a._parameters["p0"]
    elif change == "add a parameter":
        a._parameters["extra"] = object()
    elif change == "replace a submodule":
        root._modules["a"] = _Module(object())
    elif change == "add a submodule":
        a._modules["d"] = _Module(object())
    elif change == "remove a submodule":
        del root._modules["b"]
    elif change == "replace a dictionary":
        a._parameters = {"p0": ps[1]}  # (the other one's first parameter alone)
    else:

        class Other(_Module):
            pass

        a.__class__ = Other
    assert _walks(tree, root) == 1
    assert _walks(tree, root) == 0


def test_a_module_class_that_walks_otherwise_is_walked_every_call() -> None:
    from cudagraphs._training import _Tree

    class Own(_Module):
        def parameters(self) -> Any:
            yield from super().parameters()

    root = _Module(object(), own=Own(object()))
    tree = _Tree(root, _Module)
    tree.parameters()
    assert _walks(tree, root) == 1
    assert _walks(tree, root) == 1
