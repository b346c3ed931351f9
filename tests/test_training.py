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
