"""PyTorch's random numbers inside cudagraphs' captures and graphed callables (GPU only).

PyTorch's design promises that a replayed graph draws exactly what the same
calls would draw eagerly, from the same generator offsets (the host offset
advances by what the capture drew at each replay). So after the same
``torch.manual_seed``, k replays equal k eager calls bit for bit, and graphs
sharing a generator replayed A, B, A equal the eager A, B, A. A graph that
drew nothing keeps no shadow; a failed capture leaves eager random numbers
usable; CuPy's cuRAND is refused by name.
"""

from __future__ import annotations

import re
import threading
from typing import Any

import pytest

import cudagraphs as cg
from cudagraphs.interop import _torch_rng

pytestmark = pytest.mark.gpu

N = 4096


@pytest.fixture
def cuda() -> Any:
    with cg.override(backend="cuda"):
        yield cg.Device(0)


@pytest.fixture
def torch(cuda: cg.Device) -> Any:
    return pytest.importorskip("torch")


def _draws(torch: Any, out: dict[str, Any], p: Any, x: Any, gen: Any = None) -> None:
    """rand, randn, randint, bernoulli, dropout and multinomial, written into ``out``."""
    out["rand"].copy_(torch.rand(N, device="cuda", generator=gen))
    out["randn"].copy_(torch.randn(N, device="cuda", generator=gen))
    out["randint"].copy_(torch.randint(0, 1000, (N,), device="cuda", generator=gen))
    out["bernoulli"].copy_(torch.bernoulli(torch.full((N,), 0.5, device="cuda"), generator=gen))
    out["multinomial"].copy_(torch.multinomial(p, 8, replacement=True, generator=gen))
    if gen is None:
        out["dropout"].copy_(torch.nn.functional.dropout(x, 0.5, training=True))


def _outs(torch: Any) -> dict[str, Any]:
    return {
        "rand": torch.empty(N, device="cuda"),
        "randn": torch.empty(N, device="cuda"),
        "randint": torch.empty(N, device="cuda", dtype=torch.int64),
        "bernoulli": torch.empty(N, device="cuda"),
        "multinomial": torch.empty(4, 8, device="cuda", dtype=torch.int64),
        "dropout": torch.empty(N, device="cuda"),
    }


def _snapshot(out: dict[str, Any]) -> dict[str, Any]:
    return {k: v.clone() for k, v in out.items()}


def _setup(torch: Any) -> tuple[dict[str, Any], Any, Any]:
    out = _outs(torch)
    p = torch.softmax(torch.arange(4 * 50, device="cuda", dtype=torch.float32).reshape(4, 50) / 10, -1)
    x = torch.ones(N, device="cuda")
    _draws(torch, out, p, x)  # warm up: every kernel loaded outside the capture
    torch.cuda.synchronize()
    return out, p, x


def test_each_replay_draws_new_numbers_equal_to_eager_after_the_same_seed(torch: Any) -> None:
    out, p, x = _setup(torch)
    with cg.capture(generators=True) as g:
        _draws(torch, out, p, x)
    assert g._rng is not None
    torch.manual_seed(123)
    replays = []
    for _ in range(3):
        g.replay()
        g.stream.synchronize()
        replays.append(_snapshot(out))
    offset_replayed = torch.cuda.default_generators[0].get_offset()
    assert not torch.equal(replays[0]["rand"], replays[1]["rand"])
    assert (replays[0]["rand"] != replays[1]["rand"]).float().mean() > 0.99
    for key in out:
        assert not torch.equal(replays[0][key], replays[1][key]), key
    torch.manual_seed(123)
    for k in range(3):
        _draws(torch, out, p, x)
        torch.cuda.synchronize()
        for key in out:
            assert torch.equal(out[key], replays[k][key]), (k, key)
    assert torch.cuda.default_generators[0].get_offset() == offset_replayed
    rand = replays[0]["rand"]
    assert 0.45 < float(rand.mean()) < 0.55
    assert float(rand.min()) >= 0.0
    assert float(rand.max()) < 1.0


def test_replays_are_reproducible_from_manual_seed(torch: Any) -> None:
    out, p, x = _setup(torch)
    with cg.capture(generators=True) as g:
        _draws(torch, out, p, x)

    def run(seed: int) -> list[Any]:
        torch.manual_seed(seed)
        got = []
        for _ in range(2):
            g.replay()
            g.stream.synchronize()
            got.append(out["randn"].clone())
        return got

    a, b, c = run(5), run(5), run(6)
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    assert not torch.equal(a[0], c[0])


def test_two_graphs_sharing_the_default_generator_replay_as_eager(torch: Any) -> None:
    a = torch.empty(N, device="cuda")
    b = torch.empty(2 * N, device="cuda")
    torch.rand(N, device="cuda")
    torch.randn(N, device="cuda")
    torch.cuda.synchronize()
    with cg.capture(generators=True) as ga:
        a.copy_(torch.rand(N, device="cuda"))
    with cg.capture(generators=True) as gb:
        b.copy_(torch.randn(2 * N, device="cuda"))
    torch.manual_seed(9)
    got = []
    for g, t in ((ga, a), (gb, b), (ga, a)):
        g.replay()
        g.stream.synchronize()
        got.append(t.clone())
    eager_between = torch.rand(16, device="cuda")
    torch.manual_seed(9)
    want = [torch.rand(N, device="cuda"), torch.randn(2 * N, device="cuda"), torch.rand(N, device="cuda")]
    assert all(torch.equal(u, v) for u, v in zip(got, want))
    assert torch.equal(eager_between, torch.rand(16, device="cuda"))  # eager continues the sequence


def test_a_user_generator_passed_by_the_option(torch: Any) -> None:
    gen = torch.Generator(device="cuda")
    gen.manual_seed(7)
    out = torch.empty(N, device="cuda")
    torch.rand(N, device="cuda", generator=gen)
    torch.cuda.synchronize()
    with cg.capture(generators=[gen]) as g:
        out.copy_(torch.rand(N, device="cuda", generator=gen))
    default_offset = torch.cuda.default_generators[0].get_offset()
    gen.manual_seed(7)
    got = []
    for _ in range(3):
        g.replay()
        g.stream.synchronize()
        got.append(out.clone())
    assert torch.cuda.default_generators[0].get_offset() == default_offset
    gen.manual_seed(7)
    want = [torch.rand(N, device="cuda", generator=gen) for _ in range(3)]
    assert all(torch.equal(u, v) for u, v in zip(got, want))
    assert not torch.equal(got[0], got[1])


def test_an_unregistered_user_generator_is_a_refusal_naming_the_option(torch: Any) -> None:
    gen = torch.Generator(device="cuda")
    out = torch.empty(N, device="cuda")
    with pytest.raises(cg.CaptureError, match=r"generators=\[gen") as info, cg.capture(generators=True):
        out.copy_(torch.rand(N, device="cuda", generator=gen))
    assert "not in capture mode" in str(info.value.__cause__)
    torch.rand(4, device="cuda", generator=gen)  # eager still works
    torch.rand(4, device="cuda")


def test_dropout_in_a_graphed_training_module_differs_per_call(torch: Any) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Dropout(0.5)).cuda().train()
    x = torch.randn(32, 64, device="cuda")
    with torch.no_grad():
        f = cg.graphed(model, copy_outputs=True, generators=True)
        a, b = f(x), f(x)
        torch.manual_seed(3)
        c = f(x)
        torch.manual_seed(3)
        want = model(x)
    assert not torch.equal(a, b)
    assert torch.equal(c == 0, want == 0)  # the same mask as eager after the same seed
    torch.testing.assert_close(c, want)  # (the matmul: cuBLAS may differ in the last bit)
    kept = (a != 0).float().mean()
    assert 0.4 < float(kept) < 0.6


def test_top_k_then_multinomial_sampling_graphed(torch: Any) -> None:
    def sample(logits: Any) -> Any:
        top, idx = torch.topk(logits, 16, dim=-1)
        choice = torch.multinomial(torch.softmax(top, -1), 1)
        return torch.gather(idx, -1, choice)

    logits = torch.randn(8, 1000, device="cuda")
    f = cg.graphed(sample, copy_outputs=True, generators=True)
    f(logits)  # warmed up and captured (their draws come before the seed)
    torch.manual_seed(11)
    got = [f(logits) for _ in range(4)]
    torch.manual_seed(11)
    want = [sample(logits) for _ in range(4)]
    assert all(torch.equal(u, v) for u, v in zip(got, want))
    assert len({tuple(t.flatten().tolist()) for t in got}) > 1
    top = set(torch.topk(logits, 16, dim=-1).indices.flatten().tolist())
    assert set(torch.cat(got).flatten().tolist()) <= top


def test_a_graph_without_random_numbers_keeps_no_shadow(torch: Any) -> None:
    x = torch.randn(N, device="cuda")
    out = torch.empty(N, device="cuda")
    before = torch.cuda.default_generators[0].get_offset()
    with cg.capture(generators=True) as g:
        out.copy_(x * 2)
    assert g._rng is None
    g.replay()
    g.stream.synchronize()
    assert torch.cuda.default_generators[0].get_offset() == before
    torch.testing.assert_close(out, x * 2)


def test_a_failed_capture_leaves_eager_random_numbers_usable(torch: Any) -> None:
    out = torch.empty(N, device="cuda")
    torch.rand(N, device="cuda")
    with pytest.raises(ValueError, match="half-way"), cg.capture(generators=True):
        out.copy_(torch.rand(N, device="cuda"))
        raise ValueError("half-way")
    torch.manual_seed(1)
    a = torch.rand(N, device="cuda")
    torch.manual_seed(1)
    assert torch.equal(a, torch.rand(N, device="cuda"))
    with pytest.raises(cg.CaptureError), cg.capture(generators=True):  # a refusal (a host read) after drawing
        out.copy_(torch.rand(N, device="cuda"))
        out.sum().item()
    torch.rand(N, device="cuda")
    with cg.capture(generators=True) as g:  # and the next capture works
        out.copy_(torch.rand(N, device="cuda"))
    g.replay()
    g.stream.synchronize()


def test_an_rng_graph_cannot_be_embedded(torch: Any) -> None:
    out = torch.empty(N, device="cuda")
    torch.rand(N, device="cuda")
    with cg.capture(generators=True) as g:
        out.copy_(torch.rand(N, device="cuda"))
    with pytest.raises(cg.CaptureError, match="draws PyTorch random numbers"), cg.capture(generators=True):
        g.replay()


def test_cupy_random_is_refused_by_name(cuda: cg.Device) -> None:
    cp = pytest.importorskip("cupy")
    cp.random.rand(4)
    with pytest.raises(cg.CaptureError, match=r"CuPy refused a random-number call") as info, cg.capture():
        cp.random.rand(1024)
    assert isinstance(info.value.__cause__, NotImplementedError)
    cp.random.rand(4)


def test_a_torch_that_fails_the_self_test_refuses_by_version(
    torch: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_torch_rng, "_verdict", [False, "RuntimeError: a stand-in reason"])
    out = torch.empty(N, device="cuda")
    torch.rand(N, device="cuda")
    refusal = re.escape(f"PyTorch {torch.__version__}'s generators")
    with pytest.raises(cg.CaptureError, match=refusal), cg.capture(generators=True):
        out.copy_(torch.rand(N, device="cuda"))
    torch.rand(N, device="cuda")  # eager still works


def test_captures_in_two_threads_are_serialized_and_replay_as_eager(torch: Any) -> None:
    outs = [torch.empty(N, device="cuda"), torch.empty(N, device="cuda")]
    graphs: list[Any] = [None, None]
    torch.rand(N, device="cuda")
    torch.cuda.synchronize()

    errors: list[BaseException] = []

    def capture(i: int) -> None:
        try:
            with cg.capture(generators=True) as g:  # (the backend setting is the process's)
                outs[i].copy_(torch.rand(N, device="cuda"))
            graphs[i] = g
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=capture, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert all(g is not None and g._rng is not None for g in graphs)
    torch.manual_seed(4)
    got = []
    for i in (0, 1, 0):
        graphs[i].replay()
        graphs[i].stream.synchronize()
        got.append(outs[i].clone())
    torch.manual_seed(4)
    want = [torch.rand(N, device="cuda") for _ in range(3)]
    assert all(torch.equal(u, v) for u, v in zip(got, want))
