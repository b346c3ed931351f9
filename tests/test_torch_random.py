"""PyTorch's and CuPy's random numbers inside captures: the logic that needs no GPU.

The GPU tests (``test_torch_random_gpu.py``) check the numbers with real
PyTorch. Here: the ``generators=`` option (checked the same way by
``cg.capture``, ``cg.graphed`` and ``GraphModule``, accepted and unused on
sim, where PyTorch is never routed); the order a capture keeps with its
generators' shadow (begun before the capture, ended after it whatever ends
it, called before each launch, kept only when the capture drew numbers;
refused when embedded); the shadow's own bookkeeping against a stand-in
PyTorch (offsets set back after the probe, locks released on errors); and
the refusals, named, of a generator not in capture mode and of CuPy's cuRAND.
"""

from __future__ import annotations

import contextlib
import sys
import types
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import cudagraphs as cg
from cudagraphs import _recording
from cudagraphs.interop import _torch_rng

TORCH_ERROR = "Attempt to increase offset for a CUDA generator not in capture mode."
CURAND_ERROR = "calling cuRAND API during stream capture is currently unsupported"
ACCEPTED = r"generators must be True or a list or tuple of torch.Generator\(device='cuda'\) objects"


# a stand-in PyTorch: generators with host offsets, a CUDAGraph that keeps their bookkeeping
class FakeGenerator:
    def __init__(self, index: int = 0) -> None:
        self.device = types.SimpleNamespace(type="cuda", index=index)
        self.offset = 0
        self.capturing = False
        self.intragraph = 0

    def get_offset(self) -> int:
        return self.offset

    def set_offset(self, offset: int) -> None:
        self.offset = offset

    def draw(self, n: int) -> None:
        """A random op on a capturing stream."""
        if not self.capturing:
            raise RuntimeError(TORCH_ERROR)
        self.intragraph += n


class FakeTorch(types.ModuleType):
    """Just what ``_torch_rng`` and the routing touch, with a log of the calls."""

    def __init__(self) -> None:
        super().__init__("torch")
        self.log: list[str] = []
        self.Generator = FakeGenerator
        self.Tensor = type("Tensor", (), {})
        self.device = lambda kind, index=None: (kind, index)
        # PyTorch's caching allocator: the pools it allocates to for captures underway
        # (beginAllocateToPool), and the MemPools that died while one was (each one an abort of
        # the process: ~MemPool empties its cache, which asserts that none is underway)
        self.underway: list[Any] = []
        self.aborts: list[Any] = []
        self.handles = 0

        def end_allocate_to_pool(index: int, pool: Any) -> None:
            if pool not in self.underway:
                raise RuntimeError("endAllocatePool: not currently recording to mempool_id")
            self.underway.remove(pool)

        self._C = types.SimpleNamespace(
            _cuda_getCurrentRawStream=lambda index: 7,
            _cuda_endAllocateToPool=end_allocate_to_pool,
            _cuda_releasePool=lambda index, pool: self.log.append(f"releasePool {pool}"),
        )
        self.is_grad_enabled = lambda: False  # (what the graphed call asks before a capture)
        torch = self
        default = FakeGenerator()

        class CUDAGraph:
            def __init__(self) -> None:
                self.gens = [default]
                self.increments: list[int] = []
                self.fail_end = False
                self.pool: Any = None

            def register_generator_state(self, g: FakeGenerator) -> None:
                self.gens.append(g)

            def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
                torch.log.append(f"capture_begin {capture_error_mode}")
                self.pool = pool if pool is not None else torch.cuda.graph_pool_handle()
                torch.underway.append(self.pool)  # (the allocator's beginAllocateToPool)
                for g in self.gens:
                    g.capturing, g.intragraph = True, 0

            def capture_end(self) -> None:
                torch.log.append("capture_end")
                if self.fail_end:  # (as PyTorch's: cudaStreamEndCapture failed, nothing after it ran)
                    raise RuntimeError("capture_end failed")
                torch._C._cuda_endAllocateToPool(0, self.pool)
                self.increments = [g.intragraph for g in self.gens]
                for g in self.gens:
                    g.capturing = False

            def replay(self) -> None:
                torch.log.append("replay")
                for g, inc in zip(self.gens, self.increments):
                    g.offset += inc

        @contextlib.contextmanager
        def stream(s: Any) -> Iterator[None]:
            torch.log.append(f"stream {s}")
            yield

        self.cuda = types.SimpleNamespace(
            default_generators=(default,),
            CUDAGraph=CUDAGraph,
            Stream=lambda device: "side",
            ExternalStream=lambda handle, device: f"external {handle}",
            default_stream=lambda index: "default",
            stream=stream,
            synchronize=lambda index: torch.log.append("synchronize"),
            is_available=lambda: True,
            graph_pool_handle=self._handle,
            MemPool=type("MemPool", (FakeMemPool,), {"torch": self}),
        )

    def _handle(self) -> tuple[int, int]:
        self.handles += 1
        return (0, self.handles)


class FakeMemPool:
    """A ``torch.cuda.MemPool``: its destruction while a capture is underway aborts the process."""

    torch: FakeTorch  # (each stand-in's MemPool is a subclass that names it)

    def __init__(self) -> None:
        weakref.finalize(self, FakeMemPool._died, self.torch)

    @staticmethod
    def _died(torch: FakeTorch) -> None:
        if torch.underway:
            torch.aborts.append(list(torch.underway))


@pytest.fixture
def torch(backend: str, monkeypatch: pytest.MonkeyPatch) -> FakeTorch:
    if backend == "cuda":  # (the real PyTorch routes a cuda capture: test_torch_random_gpu.py)
        pytest.skip("a stand-in for PyTorch, on sim: on a GPU the real one runs")
    fake = FakeTorch()
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setattr(_torch_rng, "_sides", {})
    monkeypatch.setattr(_torch_rng, "_verdict", [True, ""])
    return fake


# the option ---------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [5, "gen", [1], (object(),), {"a": 1}])
def test_bad_generators_are_a_type_error_naming_what_is_accepted(dev: cg.Device, bad: Any) -> None:
    with pytest.raises(TypeError, match=ACCEPTED):
        cg.capture(generators=bad)
    with pytest.raises(TypeError, match=ACCEPTED):
        cg.graphed(lambda x: x, generators=bad)
    with pytest.raises(TypeError, match=ACCEPTED):
        cg.GraphModule(lambda x: x, generators=bad)


def test_generators_are_accepted_and_unused_on_sim(dev: cg.Device, torch: FakeTorch) -> None:
    gen = FakeGenerator()
    x = cg.asarray(np.arange(8, dtype=np.float32))
    with cg.capture(generators=[gen, gen]) as g:
        cg.ops.scale(2.0, x, x)
    g.replay()
    np.testing.assert_allclose(x.get(), 2 * np.arange(8))
    assert g._rng is None
    assert torch.log == []
    f = cg.graphed(lambda a: cg.ops.scale(3.0, a), generators=(gen,))
    assert f.generators == (gen,)
    np.testing.assert_allclose(f(x).get(), 6 * np.arange(8))
    assert torch.log == []


def test_a_generator_of_another_device_is_refused(dev: cg.Device, torch: FakeTorch) -> None:
    fake_device = types.SimpleNamespace(
        index=0, backend=types.SimpleNamespace(capabilities=types.SimpleNamespace(shares_memory=True))
    )
    with pytest.raises(ValueError, match=r"is on cuda:1, the capture on device 0"):
        _torch_rng.begin(fake_device, [FakeGenerator(1)])


def test_only_a_capture_given_generators_touches_pytorchs(dev: cg.Device, torch: FakeTorch) -> None:
    """The option is off by default: no shadow, nothing of PyTorch's called; True: the default generator."""
    assert _torch_rng.check_generators(None) is None
    assert _torch_rng.check_generators(False) is None
    assert _torch_rng.check_generators(True) == ()

    class FakeDevice:  # (a device whose memory PyTorch could see, hashable as a Device is)
        index = 0
        backend = types.SimpleNamespace(capabilities=types.SimpleNamespace(shares_memory=True))

    fake_device = FakeDevice()
    assert _torch_rng.begin(fake_device, None) is None
    assert torch.log == []
    shadow = _torch_rng.begin(fake_device, ())
    assert shadow is not None
    assert shadow.generators == [torch.cuda.default_generators[0]]
    assert torch.log != []
    shadow.end()


# the order a capture keeps ------------------------------------------------------------------
class FakeShadow:
    """What ``_torch_rng.begin`` returns, recording when it is ended and called."""

    def __init__(self, drew: bool) -> None:
        self.drew = drew
        self.begun = cg.capture_status()  # none yet: before the driver's capture begins
        self.ended: list[str] = []
        self.calls: list[int] = []

    def end(self) -> bool:
        self.ended.append(cg.capture_status())  # the capture is over by then
        return self.drew

    def __call__(self, handle: int) -> None:
        self.calls.append(handle)


@pytest.fixture
def shadows(monkeypatch: pytest.MonkeyPatch) -> list[tuple[FakeShadow, tuple[Any, ...]]]:
    made: list[tuple[FakeShadow, tuple[Any, ...]]] = []
    drew = [True]

    def begin(device: Any, generators: tuple[Any, ...]) -> FakeShadow:
        shadow = FakeShadow(drew[0])
        made.append((shadow, generators))
        return shadow

    monkeypatch.setattr(_torch_rng, "begin", begin)
    made.append((FakeShadow(True), ()))  # made[0].drew says what the next shadows draw
    made[0][0].calls = drew  # type: ignore[assignment]
    return made


def test_a_capture_that_drew_calls_its_shadow_before_each_replay(dev: cg.Device, shadows: Any) -> None:
    x = cg.asarray(np.ones(8, dtype=np.float32))
    with cg.capture(generators=True) as g:
        cg.ops.scale(2.0, x, x)
    shadow, _ = shadows[1]
    assert shadow.begun == "none"
    assert shadow.ended == ["none"]
    assert g._rng is shadow
    assert any(k is shadow for k in g._res.keep)  # kept as long as the executable
    g.replay()
    g.replay()
    other = dev.create_stream()
    other.wait(g.stream)
    g.replay(other)
    assert shadow.calls == [g.stream.handle, g.stream.handle, other.handle]
    assert g.replays == 3
    other.synchronize()
    np.testing.assert_allclose(x.get(), 8 * np.ones(8))
    with pytest.raises(cg.CaptureError, match="draws PyTorch random numbers"), cg.capture(generators=True):
        g.replay()
    g.close()
    assert g._rng is None


def test_a_capture_that_drew_nothing_keeps_no_shadow(dev: cg.Device, shadows: Any) -> None:
    shadows[0][0].calls[0] = False
    x = cg.asarray(np.ones(8, dtype=np.float32))
    with cg.capture(generators=True) as g:
        cg.ops.scale(2.0, x, x)
    shadow, _ = shadows[1]
    assert shadow.ended == ["none"]
    assert g._rng is None
    g.replay()
    assert shadow.calls == []


def test_a_failed_capture_ends_its_shadow_after_the_capture(dev: cg.Device, shadows: Any) -> None:
    x = cg.asarray(np.ones(8, dtype=np.float32))
    with pytest.raises(ValueError, match="mine"), cg.capture(generators=True):
        cg.ops.scale(2.0, x, x)
        raise ValueError("mine")
    shadow, _ = shadows[1]
    assert shadow.ended == ["none"]
    with cg.capture(generators=True) as g:  # the stream is usable
        cg.ops.scale(2.0, x, x)
    g.replay()
    np.testing.assert_allclose(x.get(), 2 * np.ones(8))


def test_a_capture_that_cannot_begin_ends_its_shadow(dev: cg.Device, shadows: Any) -> None:
    x = cg.asarray(np.ones(8, dtype=np.float32))
    with cg.capture(generators=True):
        cg.ops.scale(2.0, x, x)
        with pytest.raises(cg.CaptureError, match="already"), cg.capture(generators=True):
            pass
    inner = shadows[2][0]
    assert inner.ended == ["active"]  # (the outer capture is still going on then)
    assert shadows[1][0].ended == ["none"]


def test_graphed_callables_pass_their_generators_and_replay_the_shadow(
    dev: cg.Device, shadows: Any, torch: FakeTorch
) -> None:
    gen = FakeGenerator()
    f = cg.graphed(lambda a: cg.ops.scale(2.0, a), generators=[gen], warmup=0)
    x = cg.asarray(np.ones(8, dtype=np.float32))
    f(x)
    f(x)
    shadow, generators = shadows[1]
    assert generators == (gen,)
    assert len(shadow.calls) == 2


# PyTorch's allocator: no MemPool dies while it counts a capture underway ----------------------
@pytest.fixture
def real_shadows(torch: FakeTorch, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Captures on sim get real shadows against the stand-in PyTorch (on sim none is made)."""
    made: list[Any] = []

    def begin(device: Any, generators: tuple[Any, ...]) -> Any:
        shadow = _torch_rng.Shadow(torch, 0, generators or ())
        shadow._begin(synchronize=False)
        made.append(shadow)
        return shadow

    monkeypatch.setattr(_torch_rng, "begin", begin)
    return made


def test_no_mempool_dies_while_a_shadow_is_open(dev: cg.Device, torch: FakeTorch, real_shadows: Any) -> None:
    """The loop of test_interop_gpu's LOOP: each graph's pool, and its MemPool, die in the next capture.

    The release queued then ran as the driver's capture ended (Recording's
    drain), while the shadow was still open: on a GPU, PyTorch aborted.
    """
    x = cg.asarray(np.ones(8, dtype=np.float32))
    for _ in range(3):
        with cg.capture(generators=True) as g:  # (the previous g, its pool and its MemPool die here)
            g.pool.foreign["torch"] = torch.cuda.MemPool()  # (kept as interop.torch.route keeps it)
            cg.ops.scale(2.0, x, x)
        g.replay()
        g.close()
    del g
    cg.Device(0).synchronize()  # (a safe point: what is still queued runs)
    assert len(real_shadows) == 3
    assert torch.underway == []
    assert torch.aborts == []
    np.testing.assert_allclose(x.get(), 8 * np.ones(8))


def test_releases_wait_for_an_open_shadow(torch: FakeTorch) -> None:
    ran: list[int] = []
    shadow = _torch_rng.begin(_device(), ())
    assert shadow is not None
    try:
        _recording.release(None, ran.append, 1)  # (another thread's, say: no capture of ours is active)
        assert ran == []
    finally:
        shadow.end()
    assert ran == [1]
    _recording.release(None, ran.append, 2)
    assert ran == [1, 2]


# the refusals -------------------------------------------------------------------------------
def test_a_generator_not_in_capture_mode_is_a_named_refusal(dev: cg.Device) -> None:
    x = cg.asarray(np.ones(8, dtype=np.float32))
    with pytest.raises(cg.CaptureError) as info, cg.capture(generators=True):
        cg.ops.scale(2.0, x, x)
        FakeGenerator().draw(4)
    text = str(info.value)
    assert "PyTorch refused a random-number call" in text
    assert "generators=True" in text
    assert f"{__file__}:" in text
    assert isinstance(info.value.__cause__, RuntimeError)
    assert cg.capture_status() == "none"


def test_a_torch_that_fails_the_self_test_is_named_with_its_version(
    dev: cg.Device, torch: FakeTorch, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_torch_rng, "_verdict", [False, "RuntimeError: could not find the CUDAGraph"])
    torch.__version__ = "2.13.0"  # type: ignore[attr-defined]
    refused = r"PyTorch 2\.13\.0's generators .*self-test: RuntimeError"
    with pytest.raises(cg.CaptureError, match=refused), cg.capture(generators=True):
        cg.ops.scale(2.0, cg.asarray(np.ones(4, dtype=np.float32)))
        FakeGenerator().draw(4)


def test_cupy_random_is_a_named_refusal(dev: cg.Device) -> None:
    x = cg.asarray(np.ones(8, dtype=np.float32))
    refused = r"CuPy refused a random-number call .*cg\.random"
    with pytest.raises(cg.CaptureError, match=refused) as info, cg.capture(generators=True):
        cg.ops.scale(2.0, x, x)
        raise NotImplementedError(CURAND_ERROR)
    assert isinstance(info.value.__cause__, NotImplementedError)


def test_a_refused_random_call_falls_back_to_eager(dev: cg.Device) -> None:
    calls = []

    def fn(a: cg.DeviceArray) -> cg.DeviceArray:
        calls.append(cg.is_capturing())
        if cg.is_capturing():
            FakeGenerator().draw(4)
        return cg.ops.scale(2.0, a)

    f = cg.graphed(fn, fallback="eager", warmup=0)
    x = cg.asarray(np.ones(8, dtype=np.float32))
    with pytest.warns(cg.FallbackWarning, match="random-number call"):
        np.testing.assert_allclose(f(x).get(), 2 * np.ones(8))
    np.testing.assert_allclose(f(x).get(), 2 * np.ones(8))
    assert calls == [True, False, False]


# the shadow's own bookkeeping ---------------------------------------------------------------
class _Device:
    """A device of a backend whose memory PyTorch sees (or not)."""

    def __init__(self, shares: bool) -> None:
        self.index = 0
        self.backend = types.SimpleNamespace(capabilities=types.SimpleNamespace(shares_memory=shares))


def _device(shares: bool = True) -> Any:
    return _Device(shares)


def test_the_shadow_begins_before_and_ends_after_and_sets_the_offsets_back(torch: FakeTorch) -> None:
    default = torch.cuda.default_generators[0]
    gen = FakeGenerator()
    default.offset, gen.offset = 40, 8
    shadow = _torch_rng.begin(_device(), (gen,))
    assert shadow is not None
    assert torch.log == ["synchronize", "stream side", "capture_begin relaxed"]
    assert default.capturing
    assert gen.capturing
    default.draw(4)
    gen.draw(12)
    assert shadow.end() is True
    assert (default.offset, gen.offset) == (40, 8)  # the probe's replay, undone
    assert not default.capturing
    assert not gen.capturing
    assert shadow.end() is False  # (idempotent)
    shadow(7)  # on PyTorch's current stream: no stream switch
    assert (default.offset, gen.offset) == (44, 20)
    shadow(9)
    assert torch.log[-2:] == ["stream external 9", "replay"]
    assert all(lock.acquire(blocking=False) for lock in shadow.locks)


def test_a_shadow_that_drew_nothing_says_so(torch: FakeTorch) -> None:
    shadow = _torch_rng.begin(_device(), ())
    assert shadow is not None
    assert shadow.end() is False


def test_a_shadow_whose_end_fails_ends_pytorchs_capture_and_releases_its_locks(torch: FakeTorch) -> None:
    """Its capture invalidated (a device-wide synchronize in the captured code), capture_end fails.

    PyTorch then left its allocator's capture underway (every MemPool dying
    later would abort the process) and the generators in capture mode.
    """
    gen = FakeGenerator()
    shadow = _torch_rng.begin(_device(), (gen,))
    assert shadow is not None
    failed = shadow.graph
    failed.fail_end = True
    ran: list[int] = []
    _recording.release(None, ran.append, 1)
    with pytest.raises(RuntimeError, match="capture_end failed"):
        shadow.end()
    assert torch.underway == []
    assert f"releasePool {failed.pool}" in torch.log
    default = torch.cuda.default_generators[0]
    assert not default.capturing
    assert not gen.capturing
    assert shadow.graph is not failed
    assert ran == [1]  # (the releases held meanwhile ran)
    assert all(lock.acquire(blocking=False) for lock in shadow.locks)
    assert _torch_rng._open_here() == []
    for lock in shadow.locks:
        lock.release()


def test_a_failed_capture_raises_its_own_error_when_the_shadow_fails_too(
    dev: cg.Device, torch: FakeTorch, real_shadows: Any
) -> None:
    x = cg.asarray(np.ones(8, dtype=np.float32))
    with pytest.raises(ValueError, match="mine"), cg.capture(generators=True) as g:
        g.pool.foreign["torch"] = torch.cuda.MemPool()
        cg.ops.scale(2.0, x, x)
        real_shadows[0].graph.fail_end = True  # (invalidated with the capture)
        raise ValueError("mine")
    del g
    cg.Device(0).synchronize()
    assert torch.underway == []
    assert torch.aborts == []
    with cg.capture(generators=True) as g:  # the next capture works
        cg.ops.scale(2.0, x, x)
    g.replay()
    np.testing.assert_allclose(x.get(), 2 * np.ones(8))


def test_no_shadow_without_routing_or_when_the_self_test_failed(
    torch: FakeTorch, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _torch_rng.begin(_device(shares=False), ()) is None
    monkeypatch.setattr(_torch_rng, "_verdict", [False, "no"])
    assert _torch_rng.begin(_device(), ()) is None
    assert torch.log == []


def test_a_shadow_inside_an_open_shadow_is_not_made(torch: FakeTorch) -> None:
    outer = _torch_rng.begin(_device(), ())
    assert outer is not None
    assert _torch_rng.begin(_device(), ()) is None
    outer.end()


def test_an_update_takes_the_sources_shadow(dev: cg.Device, shadows: Any) -> None:
    x = cg.asarray(np.ones(8, dtype=np.float32))
    with cg.capture(generators=True) as g:
        cg.ops.scale(2.0, x, x)
    with cg.capture(instantiate=False, generators=True) as source:
        cg.ops.scale(3.0, x, x)
    first, second = shadows[1][0], shadows[2][0]
    assert g._rng is first
    g.update(source)
    assert g._rng is second
    assert any(k is second for k in g._res.keep)
    assert source._rng is None
    g.replay()
    assert second.calls == [g.stream.handle]
    assert first.calls == []
    np.testing.assert_allclose(x.get(), 3 * np.ones(8))
