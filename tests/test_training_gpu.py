"""Training through graphed callables (``grad=True``) and whole-step captures, against eager PyTorch.

Each test trains or differentiates the same model twice from the same
seed, eagerly and through cudagraphs, and compares losses, parameters and
gradients (within 1e-6); the refusals raise clear errors and never give a
wrong gradient.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

import cudagraphs as cg

pytestmark = pytest.mark.gpu

TOL = {"rtol": 1e-6, "atol": 1e-6}


@pytest.fixture
def cuda() -> Any:
    with cg.override(backend="cuda"):
        yield cg.Device(0)


def _torch() -> Any:
    return pytest.importorskip("torch")


def _mlp(torch: Any) -> Any:
    torch.manual_seed(0)
    nn = torch.nn
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 8)).cuda()


def _block(torch: Any) -> Any:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(
        d_model=32, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True
    )
    return torch.nn.Sequential(layer, torch.nn.Flatten(), torch.nn.Linear(6 * 32, 8)).cuda()


def _data(torch: Any, shape: tuple[int, ...], steps: int, seed: int = 1) -> list[tuple[Any, Any]]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return [
        (
            torch.randn(*shape, device="cuda", generator=gen),
            torch.randn(shape[0], 8, device="cuda", generator=gen),
        )
        for _ in range(steps)
    ]


def _optimizer(torch: Any, kind: str, params: Any) -> Any:
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    return torch.optim.Adam(params, lr=1e-3)


def _train(torch: Any, step: Any, model: Any, opt: Any, data: list[tuple[Any, Any]]) -> list[float]:
    losses = []
    for x, y in data:
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(step(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach().clone())
    torch.cuda.synchronize()
    return [float(v) for v in losses]


def _same_params(torch: Any, a: Any, b: Any) -> None:
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(p, q, **TOL, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("kind", ["sgd", "adam"])
@pytest.mark.parametrize("make", ["mlp", "block"])
def test_training_through_a_graphed_module_equals_eager(cuda: cg.Device, kind: str, make: str) -> None:
    torch = _torch()
    eager = _mlp(torch) if make == "mlp" else _block(torch)
    model = copy.deepcopy(eager)
    shape = (4, 16) if make == "mlp" else (4, 6, 32)
    data = _data(torch, shape, 20)
    want = _train(torch, eager, eager, _optimizer(torch, kind, eager.parameters()), data)
    f = cg.graphed(model, grad=True)
    got = _train(torch, f, model, _optimizer(torch, kind, model.parameters()), data)
    assert got == pytest.approx(want, rel=1e-6, abs=1e-6)
    _same_params(torch, eager, model)
    stats = f.stats()
    assert stats["captures"] == 1
    assert stats["hits"] == 19
    assert {kind for _, kind in stats["graphs"]} == {"forward", "backward"}


def test_the_backward_runs_in_the_graphs_pool_and_replays_the_same(cuda: cg.Device) -> None:
    """Inside a capture the backward runs on the capturing thread: its memory is the graph's pool.

    (On autograd's device thread its temporaries came from the general pool, handed to other
    tensors after the capture while every replay of the backward still used them.) Replayed
    twice on the same gradient, the backward graph gives the same gradients.
    """
    torch = _torch()
    f = cg.graphed(_mlp(torch), grad=True)
    x = torch.randn(4, 16, device="cuda")
    f(x).sum().backward()
    torch.cuda.synchronize()
    assert sum(s["total_size"] for s in f.pool.foreign["torch"].snapshot()) > 0
    step = next(iter(f._trainer.steps.values()))
    for g in step.grad_outs:
        if g is not None:
            g.fill_(1.0)
    runs = []
    for _ in range(2):
        step.backward.replay()
        torch.cuda.synchronize()
        churn = [torch.full((n,), float("nan"), device="cuda") for n in (64, 512, 4096, 32768) * 4]
        del churn
        runs.append([g.clone() for g in step.grads if g is not None])
    for a, b in zip(*runs):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_plain_function_with_params_and_input_grads_equals_eager(cuda: cg.Device) -> None:
    torch = _torch()
    gen = torch.Generator(device="cuda").manual_seed(3)
    w = torch.randn(16, 8, device="cuda", generator=gen, requires_grad=True)
    b = torch.randn(8, device="cuda", generator=gen, requires_grad=True)

    def fn(x: Any, scale: float) -> Any:
        h = torch.tanh(x @ w + b) * scale
        return {"h": h, "norm": (h * h).sum(dim=1)}

    f = cg.graphed(fn, grad=True, params=[w, b])
    for _ in range(3):
        x = torch.randn(5, 16, device="cuda", generator=gen, requires_grad=True)
        xe = x.detach().clone().requires_grad_(True)
        out = f(x, 0.5)
        assert out["h"].requires_grad
        assert out["h"].grad_fn is not None
        (out["h"].sum() + out["norm"].mean()).backward()
        gw, gb = w.grad.clone(), b.grad.clone()
        w.grad = b.grad = None
        e = fn(xe, 0.5)
        (e["h"].sum() + e["norm"].mean()).backward()
        torch.testing.assert_close(out["h"], e["h"], **TOL)
        torch.testing.assert_close(x.grad, xe.grad, **TOL)
        torch.testing.assert_close(gw, w.grad, **TOL)
        torch.testing.assert_close(gb, b.grad, **TOL)
        w.grad = b.grad = None
    assert f.stats()["captures"] == 1


def test_grad_accumulates_across_two_calls_before_zero_grad(cuda: cg.Device) -> None:
    torch = _torch()
    eager = _mlp(torch)
    model = copy.deepcopy(eager)
    (x1, y1), (x2, y2) = _data(torch, (4, 16), 2)
    f = cg.graphed(model, grad=True)
    for step, m in ((f, model), (eager, eager)):
        m.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(step(x1), y1).backward()
        torch.nn.functional.mse_loss(step(x2), y2).backward()  # accumulated into .grad
    for p, q in zip(eager.parameters(), model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, **TOL)
        assert q.grad.data_ptr() != p.grad.data_ptr()
    # and once more, .grad set (not None) before the first backward: accumulated onto it
    for step in (f, eager):
        torch.nn.functional.mse_loss(step(x2), y2).backward()
    for p, q in zip(eager.parameters(), model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, **TOL)


def test_buckets_each_train_correctly(cuda: cg.Device) -> None:
    torch = _torch()
    eager = _mlp(torch)
    model = copy.deepcopy(eager)
    f = cg.graphed(model, grad=True, buckets=[4, 8])
    gen = torch.Generator(device="cuda").manual_seed(5)
    for n in (3, 8, 5, 4, 1, 8):
        x = torch.randn(n, 16, device="cuda", generator=gen)
        y = torch.randn(n, 8, device="cuda", generator=gen)
        xg = x.clone().requires_grad_(True)
        xe = x.clone().requires_grad_(True)
        for step, m, inp in ((f, model, xg), (eager, eager, xe)):
            m.zero_grad(set_to_none=True)
            out = step(inp)
            assert tuple(out.shape) == (n, 8)
            torch.nn.functional.mse_loss(out, y).backward()
        torch.testing.assert_close(xg.grad, xe.grad, **TOL)
        for p, q in zip(eager.parameters(), model.parameters()):
            torch.testing.assert_close(q.grad, p.grad, **TOL)
    stats = f.stats()
    assert sorted(stats["graphs"]) == [(4, "backward"), (4, "forward"), (8, "backward"), (8, "forward")]


def test_capture_all_with_grad(cuda: cg.Device) -> None:
    torch = _torch()
    eager = _mlp(torch)
    model = copy.deepcopy(eager)
    f = cg.graphed(model, grad=True, buckets=[2, 4])
    x = torch.randn(4, 16, device="cuda", requires_grad=True)
    f.capture_all(x)
    assert f.stats()["captures"] == 2
    xe = x.detach().clone().requires_grad_(True)
    f(x).sum().backward()
    eager(xe).sum().backward()
    torch.testing.assert_close(x.grad, xe.grad, **TOL)


class _Scaled:
    @staticmethod
    def make(torch: Any) -> Any:
        class Scaled(torch.nn.Module):  # type: ignore[misc,name-defined]
            def __init__(self) -> None:
                super().__init__()
                self.lin = torch.nn.Linear(16, 8)

            def forward(self, x: Any) -> Any:
                return self.lin(x) * (2.0 if self.training else 0.5)

        torch.manual_seed(0)
        return Scaled().cuda()


def test_train_and_eval_modes_get_graphs_of_their_own(cuda: cg.Device) -> None:
    torch = _torch()
    eager = _Scaled.make(torch)
    model = copy.deepcopy(eager)
    f = cg.graphed(model, grad=True)
    x = torch.randn(4, 16, device="cuda")
    torch.testing.assert_close(f(x), eager(x), **TOL)
    model.eval()
    eager.eval()
    with torch.no_grad():
        torch.testing.assert_close(f(x), eager(x), **TOL)
    torch.testing.assert_close(f(x), eager(x), **TOL)  # eval mode, grad mode: a differentiable key
    model.train()
    eager.train()
    torch.testing.assert_close(f(x), eager(x), **TOL)
    assert f.stats()["captures"] == 3


def test_whole_step_capture_with_capturable_adam_equals_eager(cuda: cg.Device) -> None:
    torch = _torch()
    eager = _mlp(torch)
    model = copy.deepcopy(eager)
    data = _data(torch, (8, 16), 23)
    loss_fn = torch.nn.functional.mse_loss
    opt_e = torch.optim.Adam(eager.parameters(), lr=1e-3, capturable=True)
    want = _train(torch, eager, eager, opt_e, data)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, capturable=True)
    static_x, static_y = data[0][0].clone(), data[0][1].clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    got = []
    with torch.cuda.stream(side):  # PyTorch's warm-up recipe: eager steps on a side stream
        for x, y in data[:3]:
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            got.append(loss.detach().clone())
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    opt.zero_grad(set_to_none=True)
    with cg.capture() as g:
        static_loss = loss_fn(model(static_x), static_y)
        static_loss.backward()
        opt.step()
    for x, y in data[3:]:
        static_x.copy_(x)
        static_y.copy_(y)
        torch.cuda.synchronize()
        g.replay()
        g.stream.synchronize()
        got.append(static_loss.detach().clone())
    assert [float(v) for v in got] == pytest.approx(want, rel=1e-6, abs=1e-6)
    _same_params(torch, eager, model)


def test_whole_step_capture_through_a_graphed_module(cuda: cg.Device) -> None:
    """Inside another capture, a grad=True callable runs as it is: that capture records it."""
    torch = _torch()
    eager = _mlp(torch)
    model = copy.deepcopy(eager)
    f = cg.graphed(model, grad=True)
    data = _data(torch, (8, 16), 6)
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.05)
    want = _train(torch, eager, eager, opt_e, data)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    got = _train(torch, f, model, opt, data[:2])  # graphed steps, then the whole step captured
    static_x, static_y = data[2][0].clone(), data[2][1].clone()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    with cg.capture() as g:
        static_loss = torch.nn.functional.mse_loss(f(static_x), static_y)
        static_loss.backward()
        opt.step()
    for x, y in data[2:]:
        static_x.copy_(x)
        static_y.copy_(y)
        torch.cuda.synchronize()
        g.replay()
        g.stream.synchronize()
        got.append(float(static_loss))
    assert got == pytest.approx(want, rel=1e-6, abs=1e-6)
    _same_params(torch, eager, model)


# refusals ----------------------------------------------------------------------------------------
def test_double_backward_is_refused(cuda: cg.Device) -> None:
    torch = _torch()
    f = cg.graphed(_mlp(torch), grad=True)
    x = torch.randn(4, 16, device="cuda", requires_grad=True)
    out = f(x)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(out.sum(), x, create_graph=True)


def test_a_second_backward_needs_retain_graph_as_eagerly(cuda: cg.Device) -> None:
    torch = _torch()
    eager = _mlp(torch)
    model = copy.deepcopy(eager)
    f = cg.graphed(model, grad=True)
    x = torch.randn(4, 16, device="cuda")
    out = f(x).sum()
    out.backward()
    with pytest.raises(RuntimeError, match="second time"):
        out.backward()
    model.zero_grad(set_to_none=True)
    out = f(x).sum()
    out.backward(retain_graph=True)
    out.backward()  # twice: accumulated twice, as eagerly
    e = eager(x).sum()
    e.backward(retain_graph=True)
    e.backward()
    for p, q in zip(eager.parameters(), model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, **TOL)


def test_backward_after_a_later_call_is_refused(cuda: cg.Device) -> None:
    torch = _torch()
    f = cg.graphed(_mlp(torch), grad=True, buckets=[4, 8])
    first = f(torch.randn(4, 16, device="cuda"))
    f(torch.randn(8, 16, device="cuda"))  # another bucket: the pool is shared
    with pytest.raises(cg.StaleOutputError, match="after a later call"):
        first.sum().backward()
    again = f(torch.randn(4, 16, device="cuda"))
    again.sum().backward()  # (the newest call's backward is fine)


def test_requires_grad_flipping_between_calls_is_refused(cuda: cg.Device) -> None:
    torch = _torch()
    f = cg.graphed(_mlp(torch), grad=True)
    x = torch.randn(4, 16, device="cuda", requires_grad=True)
    f(x).sum().backward()
    with pytest.raises(ValueError, match="input 0 has requires_grad=False"):
        f(x.detach())
    model = _mlp(torch)
    g = cg.graphed(model, grad=True)
    g(x.detach()).sum().backward()
    next(model.parameters()).requires_grad_(False)
    with pytest.raises(ValueError, match="parameter 0 has requires_grad=False"):
        g(x.detach())


def test_a_forward_only_callable_refuses_inputs_that_require_grad(cuda: cg.Device) -> None:
    torch = _torch()
    f = cg.graphed(lambda a: a * 3)
    with pytest.raises(ValueError, match="grad=True"):
        f(torch.randn(4, device="cuda", requires_grad=True))
    with pytest.raises(ValueError, match="module's parameters require grad"):
        cg.graphed(_mlp(torch))(torch.randn(4, 16, device="cuda"))
    with torch.no_grad():
        f(torch.randn(4, device="cuda", requires_grad=True))  # no_grad: forward only is right


def test_a_replaced_parameter_is_refused(cuda: cg.Device) -> None:
    torch = _torch()
    model = _mlp(torch)
    f = cg.graphed(model, grad=True)
    x = torch.randn(4, 16, device="cuda")
    f(x).sum().backward()
    model[0].weight = torch.nn.Parameter(model[0].weight.detach().clone())
    with pytest.raises(cg.StaleParameterError):
        f(x)


@pytest.mark.parametrize("how", ["same memory", "a submodule", "data"])
def test_a_parameter_replaced_otherwise_is_refused(cuda: cg.Device, how: str) -> None:
    """A new Parameter on the old memory, a submodule replaced, or ``.data`` replaced.

    (Autograd would fill the old Parameter's ``.grad``; the parameters are not walked again
    until the module's tree changes; ``.data`` keeps the object on new memory.)
    """
    torch = _torch()
    model = _mlp(torch)
    f = cg.graphed(model, grad=True)
    x = torch.randn(4, 16, device="cuda")
    for _ in range(2):  # (the second call: the parameters from the first walk)
        f(x).sum().backward()
    if how == "same memory":
        model[0].weight = torch.nn.Parameter(model[0].weight.detach())
    elif how == "a submodule":
        model[2] = torch.nn.Linear(32, 32).cuda()
    else:
        model[0].weight.data = model[0].weight.detach().clone()
    with pytest.raises(cg.StaleParameterError):
        f(x)


def test_params_with_a_module_is_refused(cuda: cg.Device) -> None:
    torch = _torch()
    model = _mlp(torch)
    with pytest.raises(ValueError, match="plain function"):
        cg.graphed(model, grad=True, params=model.parameters())


def test_param_gradients_are_fresh_copies_with_unused_and_double_params(cuda: cg.Device) -> None:
    """The parameters' gradients: equal to eager, None where unused, never the graph's memory."""
    torch = _torch()

    class Mixed(torch.nn.Module):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(16, 8)
            self.scale = torch.nn.Parameter(torch.ones(8, dtype=torch.float64))
            self.unused = torch.nn.Parameter(torch.ones(3))

        def forward(self, x: Any) -> Any:
            return self.lin(x) * self.scale.float()

    torch.manual_seed(0)
    eager = Mixed().cuda()
    model = copy.deepcopy(eager)
    f = cg.graphed(model, grad=True)
    kept = []
    for x, y in _data(torch, (4, 16), 3):
        for step, m in ((f, model), (eager, eager)):
            m.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(step(x), y).backward()
        for p, q in zip(eager.parameters(), model.parameters()):
            if p.grad is None:
                assert q.grad is None
            else:
                torch.testing.assert_close(q.grad, p.grad, **TOL)
        assert model.unused.grad is None
        kept.append([(q.grad, q.grad.clone()) for q in model.parameters() if q.grad is not None])
    for grads in kept:  # a .grad kept from an earlier step is not overwritten by later replays
        for g, was in grads:
            assert torch.equal(g, was)
