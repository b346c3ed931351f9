"""cg.random: Philox4x32-10 with its state on the device, eager and across graph replays.

Every draw is checked against the numpy reference (``_random.reference``),
which is what the sim backend runs and what the CUDA kernel must match: bit
for bit for uniform and randint, to rounding for normal (the GPU's log and
sincospi may differ from the host's in a double's last bits). Outputs are
poisoned before every draw. The CUDA source itself is also compiled as C++
on the host (where a compiler is) and run against the same reference.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import cudagraphs as cg
from cudagraphs import _random
from cudagraphs import random as cgr
from cudagraphs._builtin_kernels import layout

FLOATS = list(cgr.FLOAT_DTYPES)
INTS = list(cgr.INT_DTYPES)
VIEWS: dict[str, Callable[[Any], Any]] = {
    "contiguous": lambda a: a,
    "strided": lambda a: a[::2, 1::3],
    "reversed": lambda a: a[::-1],
    "transposed": lambda a: a.T,
}
# (kind, dtype, a, b): the draws the tests make
CASES = [("uniform", d, -2.5, 4.0) for d in FLOATS]
CASES += [("normal", d, 1.5, 3.0) for d in FLOATS]
CASES += [("randint", d, -7, 1000) for d in INTS]
CASE_IDS = [f"{k}-{d}" for k, d, _, _ in CASES]
# normal values: the GPU's transcendental functions may round differently in the last place
NORMAL_RTOL = {"float16": 1e-3, "bfloat16": 8e-3, "float32": 2e-6, "float64": 1e-12}


def _dtype(name: str) -> np.dtype:
    return cg.SUPPORTED_DTYPES[name]


def _poison(shape: tuple[int, ...], dtype: str) -> cg.DeviceArray:
    dt = _dtype(dtype)
    value = -12345 if dt.kind in "iu" else np.nan
    return cg.full(shape, value, dt)


def _draw(gen: cgr.Generator, kind: str, out: cg.DeviceArray, a: Any, b: Any, **kw: Any) -> cg.DeviceArray:
    result: cg.DeviceArray = getattr(gen, kind)(out, a, b, **kw)
    return result


def _assert_matches(kind: str, got: np.ndarray, expect: np.ndarray, std: float = 3.0) -> None:
    """Bit for bit, except normal values: to rounding (relative, and absolute at ``std``'s scale)."""
    assert got.dtype == expect.dtype
    assert got.shape == expect.shape
    if kind == "normal":
        g64, e64 = got.astype(np.float64), expect.astype(np.float64)
        rtol = NORMAL_RTOL[got.dtype.name]
        np.testing.assert_allclose(g64, e64, rtol=rtol, atol=rtol * std)
    else:
        np.testing.assert_array_equal(got.view(f"u{got.itemsize}"), expect.view(f"u{expect.itemsize}"))


# Philox itself ------------------------------------------------------------------------------
def test_philox_known_answers() -> None:
    """Random123's kat_vectors, the three philox4x32 10 lines."""
    counters = [[0, 0, 0, 0], [0xFFFFFFFF] * 4, [0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344]]
    keys = [[0, 0], [0xFFFFFFFF] * 2, [0xA4093822, 0x299F31D0]]
    expect = [
        [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8],
        [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD],
        [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1],
    ]
    for c, k, e in zip(counters, keys, expect):
        assert cgr.philox4x32_10(c, k).tolist() == e
    batch = cgr.philox4x32_10(np.array(counters[:1] * 3), keys[0])
    assert batch.shape == (3, 4)
    assert (batch == expect[0]).all()


def test_reference_uses_counter_offset_plus_i_over_k() -> None:
    """Element i of a float32 draw is word i % 4 of counter offset + i // 4 (the documented mapping)."""
    seed, offset = 0x0123456789ABCDEF, 2**32 - 2  # the counter carries into its upper word
    u = _random.reference("uniform", (12,), "float32", seed, offset, 0.0, 1.0)
    counters = np.array([[(offset + j) & 0xFFFFFFFF, (offset + j) >> 32, 0, 0] for j in range(3)])
    words = cgr.philox4x32_10(counters, [seed & 0xFFFFFFFF, seed >> 32]).reshape(-1)
    np.testing.assert_array_equal(u, (words >> 8).astype(np.float32) * np.float32(2**-24))


# draws against the reference ------------------------------------------------------------------
@pytest.mark.parametrize(("kind", "dtype", "a", "b"), CASES, ids=CASE_IDS)
@pytest.mark.parametrize("view", VIEWS)
def test_draw_matches_reference(backend: str, kind: str, dtype: str, a: Any, b: Any, view: str) -> None:
    pick = VIEWS[view]
    seed, offset = 0xDEADBEEF12345678, 2**32 - 5  # counters cross into their upper word
    gen = cgr.Generator(seed)
    gen.set_state((seed, offset))
    base = _poison((10, 12), dtype)
    out = pick(base)
    assert _draw(gen, kind, out, a, b) is out
    got = base.get()
    expect = _poison((10, 12), dtype).get()
    pick(expect)[...] = _random.reference(kind, out.shape, dtype, seed, offset, a, b)
    _assert_matches(kind, got, expect)
    assert gen.get_state() == (seed, offset + _random.counters(kind, out.size, dtype))


@pytest.mark.parametrize(("kind", "dtype", "a", "b"), CASES, ids=CASE_IDS)
def test_odd_sizes_and_scalars(backend: str, kind: str, dtype: str, a: Any, b: Any) -> None:
    gen = cgr.Generator(3)
    offset = 0
    for shape in [(), (1,), (3,), (5,), (7,), (0,), (1, 0)]:
        out = _poison(shape, dtype)
        _draw(gen, kind, out, a, b)
        _assert_matches(kind, out.get(), _random.reference(kind, shape, dtype, 3, offset, a, b))
        offset += _random.counters(kind, out.size, dtype)
        assert gen.get_state() == (3, offset)


@pytest.mark.parametrize("dtype", FLOATS)
def test_uniform_never_reaches_high(backend: str, dtype: str) -> None:
    # in float16, u >= 1 - 2**-12 rounds up to 1.0 (one draw in 4096): such a draw becomes top,
    # the largest value below high, which so gets 1.5 times the draws of its neighbours
    out = _poison((100_000,), dtype)
    cgr.Generator(11).uniform(out)
    h = out.get()
    top = {"float16": 1 - 2**-11, "bfloat16": 1 - 2**-8, "float32": 1 - 2**-24, "float64": 1 - 2**-53}
    assert h.min() >= 0
    assert h.max() < 1
    if dtype in ("float16", "bfloat16"):
        assert (h == top[dtype]).sum() > 1.25 * 100_000 * (1 - top[dtype])  # 1.5 expected
        assert (h == 0).sum() < 5  # they did not go to low


def test_randint_full_range(backend: str) -> None:
    for dtype, lo, hi in [("int32", -(2**31), 2**31), ("int64", -(2**63), 2**63)]:
        out = _poison((1000,), dtype)
        cgr.Generator(5).randint(out, lo, hi)
        got = out.get()
        np.testing.assert_array_equal(got, _random.reference("randint", (1000,), dtype, 5, 0, lo, hi))
        assert got.min() < -(2 ** (8 * got.itemsize - 3))
        assert got.max() > 2 ** (8 * got.itemsize - 3)


def test_normal_extremes_round_like_numpy(backend: str) -> None:
    # tiny and huge values: float16 subnormals and overflow to inf go through the kernel's own rounding
    for std in (1e-6, 4e4):
        out = _poison((4000,), "float16")
        cgr.Generator(8).normal(out, 0.0, std)
        expect = _random.reference("normal", (4000,), "float16", 8, 0, 0.0, std)
        _assert_matches("normal", out.get(), expect, std)
    assert np.isinf(out.get()).any()


# seeds and state ----------------------------------------------------------------------------
def test_same_seed_same_numbers_other_seed_others(backend: str) -> None:
    draws = []
    for s in (42, 42, 43):
        x = _poison((1000,), "float32")
        cgr.Generator(s).normal(x)
        draws.append(x.get())
    np.testing.assert_array_equal(draws[0], draws[1])
    assert (draws[0] != draws[2]).mean() > 0.99


def test_successive_draws_differ_and_continue_the_stream(backend: str) -> None:
    gen = cgr.Generator(9)
    x, y = _poison((64,), "float64"), _poison((64,), "float64")
    gen.uniform(x)
    gen.uniform(y)
    assert not np.intersect1d(x.get(), y.get()).size
    whole = _random.reference("uniform", (128,), "float64", 9, 0, 0.0, 1.0)
    np.testing.assert_array_equal(np.concatenate([x.get(), y.get()]), whole)


def test_seed_get_state_set_state(backend: str) -> None:
    gen = cgr.Generator()
    assert gen.get_state() == (0, 0)
    x = _poison((8,), "float32")
    gen.uniform(x)
    first = x.get()
    assert gen.seed(0) is gen
    assert gen.get_state() == (0, 0)
    gen.uniform(x)
    np.testing.assert_array_equal(x.get(), first)
    state = gen.get_state()
    gen.uniform(x)
    second = x.get()
    gen.manual_seed(2**64 - 1)
    assert gen.get_state() == (2**64 - 1, 0)
    gen.set_state(state)
    gen.uniform(x)
    np.testing.assert_array_equal(x.get(), second)


def test_seed_is_stream_ordered(backend: str, device: cg.Device) -> None:
    s = device.create_stream()
    gen = cgr.Generator(1)
    s.wait(device.current_stream())  # the generator was seeded there
    x, y = _poison((16,), "float32"), _poison((16,), "float32")
    gen.uniform(x, stream=s)
    gen.seed(2, stream=s)  # after the first draw, before the second
    gen.uniform(y, stream=s)
    assert gen.get_state(stream=s) == (2, 4)
    np.testing.assert_array_equal(x.get(stream=s), _random.reference("uniform", (16,), "float32", 1, 0, 0, 1))
    np.testing.assert_array_equal(y.get(stream=s), _random.reference("uniform", (16,), "float32", 2, 0, 0, 1))


def test_a_generator_dropped_after_a_draw_on_another_stream_keeps_its_state_for_that_draw(
    backend: str, device: cg.Device
) -> None:
    """The state is declared used on the draw's stream (record_stream): its memory waits for it."""
    s = device.create_stream()
    gen = cgr.Generator(9)  # its state is allocated and seeded on the current stream
    state = gen._state.ptr
    x = _poison((256,), "float32")
    s.wait(device.current_stream())
    gen.uniform(x, stream=s)  # reads the state when s runs
    del gen  # the state's block goes back to the current stream's cache
    junk = cg.empty(2, "uint64")  # the same size class on the same stream: that block
    assert junk.ptr == state
    junk.set(np.array([2**63 + 12345, 2**40 + 7], np.uint64))  # must not land before the draw
    device.current_stream().synchronize()  # (on sim: runs this stream alone, unless it waits on s)
    expect = _random.reference("uniform", (256,), "float32", 9, 0, 0, 1)
    np.testing.assert_array_equal(x.get(stream=s), expect)
    s.close()


@pytest.fixture
def fresh_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """No default generator exists yet, and cg.random.seed was never called."""
    monkeypatch.setattr(_random, "_DEFAULTS", {})
    monkeypatch.setattr(_random, "_INITIAL", [0])


def test_module_functions_use_the_default_generator(
    backend: str, device: cg.Device, fresh_defaults: None
) -> None:
    x = _poison((3,), "float32")
    cgr.uniform(x)  # made on first use, with seed 0
    np.testing.assert_array_equal(x.get(), _random.reference("uniform", (3,), "float32", 0, 0, 0, 1))
    cgr.seed(77)
    assert cgr.default_generator(device) is cgr.default_generator() is cgr.default_generator(0)
    assert cgr.default_generator().get_state() == (77, 0)
    x, k = _poison((5, 6), "float32"), _poison((9,), "int64")
    assert cgr.uniform(x, -1, 1) is x
    cgr.randint(k, 0, 3)
    np.testing.assert_array_equal(x.get(), _random.reference("uniform", (5, 6), "float32", 77, 0, -1, 1))
    np.testing.assert_array_equal(k.get(), _random.reference("randint", (9,), "int64", 77, 8, 0, 3))
    mine = cgr.Generator(5)
    cgr.normal(x, 2.0, 0.5, generator=mine)  # another generator: the default one does not move
    expect = _random.reference("normal", (5, 6), "float32", 5, 0, 2.0, 0.5)
    _assert_matches("normal", x.get(), expect, 0.5)
    assert cgr.default_generator().get_state() == (77, 13)
    cgr.seed(77)
    cgr.uniform(x, -1, 1)
    np.testing.assert_array_equal(x.get(), _random.reference("uniform", (5, 6), "float32", 77, 0, -1, 1))


def test_a_new_default_generator_is_seeded_on_the_draws_stream(
    backend: str, device: cg.Device, fresh_defaults: None
) -> None:
    cgr.seed(5)  # no default generator yet: the first draw makes one, with seed 5
    s = device.create_stream()
    x = _poison((64,), "float32")
    s.wait(device.current_stream())  # x was poisoned there; nothing else orders s
    cgr.uniform(x, stream=s)
    np.testing.assert_array_equal(x.get(stream=s), _random.reference("uniform", (64,), "float32", 5, 0, 0, 1))
    assert cgr.default_generator().get_state(stream=s) == (5, 16)


# graphs ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("kind", "dtype", "a", "b"), CASES, ids=CASE_IDS)
def test_replays_draw_new_numbers(backend: str, kind: str, dtype: str, a: Any, b: Any) -> None:
    gen = cgr.Generator(1234)
    out = _poison((33, 5), dtype)
    view = out[::-1, 1:]  # a strided output in the graph too
    with cg.capture(alloc="forbid") as g:  # draws allocate nothing
        _draw(gen, kind, view, a, b)
    assert gen.get_state() == (1234, 0)  # capturing runs nothing
    c = _random.counters(kind, view.size, dtype)
    seen = []
    for r in range(4):
        cg.ops.fill(out, -1 if dtype in INTS else np.nan)  # poison between replays
        g.replay()
        got = out.get()
        expect = np.full(out.shape, -1 if dtype in INTS else np.nan, _dtype(dtype))
        expect[::-1, 1:] = _random.reference(kind, view.shape, dtype, 1234, r * c, a, b)
        _assert_matches(kind, got, expect)
        seen.append(got[::-1, 1:])
    assert gen.get_state() == (1234, 4 * c)
    for i in range(4):
        for j in range(i):
            assert (seen[i] != seen[j]).mean() > 0.5


def test_eager_sequence_equals_captured_sequence_replayed(backend: str) -> None:
    def step(gen: cgr.Generator, xs: list[cg.DeviceArray]) -> None:
        gen.uniform(xs[0], -1.0, 1.0)
        gen.normal(xs[1], 3.0, 2.0)
        gen.randint(xs[2][::2], 0, 6)
        gen.normal(xs[3])

    def outputs() -> list[cg.DeviceArray]:
        return [
            _poison((300,), "float32"),
            _poison((7, 3), "float64"),
            _poison((20,), "int32"),
            _poison((5,), FLOATS[0]),
        ]

    eager_gen, xs = cgr.Generator(2024), outputs()
    eager = []
    for _ in range(3):
        for x in xs:
            x.set(-9 if x.dtype.kind == "i" else np.nan)
        step(eager_gen, xs)
        eager.append([x.get() for x in xs])
    graph_gen, ys = cgr.Generator(2024), outputs()
    with cg.capture(alloc="forbid") as g:
        step(graph_gen, ys)
    for r in range(3):
        for y in ys:
            y.set(-9 if y.dtype.kind == "i" else np.nan)
        g.replay()
        for got, want in zip([y.get() for y in ys], eager[r]):
            np.testing.assert_array_equal(got, want)
    assert graph_gen.get_state() == eager_gen.get_state()
    # an eager draw after the replays continues where they left off
    eager_gen.uniform(xs[0])
    graph_gen.uniform(ys[0])
    np.testing.assert_array_equal(xs[0].get(), ys[0].get())


def test_seeding_between_replays_restarts_them(backend: str) -> None:
    gen = cgr.Generator(6)
    x = _poison((10,), "float32")
    with cg.capture() as g:
        gen.uniform(x)
    g.replay()
    first = x.get()
    g.replay()
    assert (x.get() != first).all()
    gen.seed(6)  # stream-ordered before the next replay
    g.replay()
    np.testing.assert_array_equal(x.get(), first)


def test_graph_keeps_the_state_alive(backend: str) -> None:
    gen = cgr.Generator(31)
    x = _poison((10,), "float32")
    with cg.capture() as g:
        gen.uniform(x)
    del gen
    g.replay()
    g.replay()
    np.testing.assert_array_equal(x.get(), _random.reference("uniform", (10,), "float32", 31, 3, 0, 1))


def test_seeding_and_reading_inside_a_capture_are_refused(backend: str) -> None:
    gen = cgr.Generator(1)
    x = _poison((4,), "float32")
    reseed = r"seeding a Generator .* every replay would draw the same"
    with pytest.raises(cg.CaptureError, match=reseed), cg.capture():
        gen.uniform(x)
        gen.seed(2)
    creating = r"creating a Generator inside a capture.*create it before"
    with pytest.raises(cg.CaptureError, match=creating), cg.capture():
        cgr.Generator(3)
    with pytest.raises(cg.CaptureError, match=r"get\(\)"), cg.capture():
        gen.get_state()
    assert gen.get_state() == (1, 0)  # nothing of the failed captures ran


def test_first_use_of_the_default_generator_inside_a_capture(
    backend: str, device: cg.Device, fresh_defaults: None
) -> None:
    x = _poison((4,), "float32")
    first_use = r"default generator .* cg.random.default_generator\(\)"
    with pytest.raises(cg.CaptureError, match=first_use), cg.capture():
        cgr.uniform(x)
    assert not _random._DEFAULTS
    cgr.default_generator()  # made before the capture: then captured draws work
    with cg.capture() as g:
        cgr.uniform(x)
    g.replay()
    np.testing.assert_array_equal(x.get(), _random.reference("uniform", (4,), "float32", 0, 0, 0, 1))


# statistics -------------------------------------------------------------------------------
N = 1_000_000


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_uniform_moments(backend: str, dtype: str) -> None:
    x = _poison((N,), dtype)
    cgr.Generator(100).uniform(x, -2.0, 3.0)
    h = x.get().astype(np.float64)
    assert h.min() >= -2.0
    assert h.max() < 3.0
    se = 5 / np.sqrt(12 * N)  # standard error of the mean
    assert abs(h.mean() - 0.5) < 5 * se
    assert abs(h.var() - 25 / 12) < 5 * 25 / 12 * np.sqrt(0.8 / N)
    counts = np.histogram(h, bins=50, range=(-2, 3))[0]
    assert _chi2(counts, np.full(50, N / 50)) < _chi2_limit(49)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_normal_moments(backend: str, dtype: str) -> None:
    x = _poison((N,), dtype)
    cgr.Generator(101).normal(x, -1.0, 2.0)
    h = x.get().astype(np.float64)
    assert np.isfinite(h).all()
    assert abs(h.mean() + 1.0) < 5 * 2.0 / np.sqrt(N)
    assert abs(h.var() - 4.0) < 5 * 4.0 * np.sqrt(2 / N)
    z = (h + 1.0) / 2.0
    assert abs(np.mean(z**3)) < 5 * np.sqrt(15 / N)  # skewness
    assert abs(np.mean(z**4) - 3) < 5 * np.sqrt(96 / N)  # kurtosis
    assert abs((np.abs(z) < 1).mean() - 0.6826894921370859) < 5 * np.sqrt(0.22 / N)


@pytest.mark.parametrize("dtype", INTS)
def test_randint_buckets(backend: str, dtype: str) -> None:
    k = _poison((N,), dtype)
    cgr.Generator(102).randint(k, -3, 14)
    h = k.get()
    assert h.min() == -3
    assert h.max() == 13
    counts = np.bincount(h + 3, minlength=17)
    assert counts.size == 17
    assert _chi2(counts, np.full(17, N / 17)) < _chi2_limit(16)
    assert (np.abs(counts - N / 17) < 5 * np.sqrt(N / 17)).all()


def _chi2(counts: np.ndarray, expect: np.ndarray) -> float:
    return float(((counts - expect) ** 2 / expect).sum())


def _chi2_limit(dof: int) -> float:
    return dof + 5 * np.sqrt(2 * dof)  # five sigma above the mean


# arguments ----------------------------------------------------------------------------------
def _bad_calls() -> list[tuple[str, Callable[[cgr.Generator, dict[str, Any]], Any], type, str]]:
    return [
        (
            "not an array",
            lambda g, a: g.uniform(np.zeros(3)),
            TypeError,
            "out must be a cudagraphs DeviceArray",
        ),
        ("int uniform", lambda g, a: g.uniform(a["i4"]), TypeError, r"uniform writes float16.*got a int32"),
        ("int normal", lambda g, a: g.normal(a["i4"]), TypeError, r"normal writes .*float64 arrays"),
        ("float randint", lambda g, a: g.randint(a["f4"], 0, 2), TypeError, r"randint writes int32, int64"),
        ("uint8 randint", lambda g, a: g.randint(a["u1"], 0, 2), TypeError, r"got a uint8 array"),
        ("low >= high", lambda g, a: g.uniform(a["f4"], 1.0, 1.0), ValueError, "low must be less than high"),
        ("reversed", lambda g, a: g.uniform(a["f4"], 2, 1), ValueError, "low must be less than high"),
        ("string low", lambda g, a: g.uniform(a["f4"], "0", 1), TypeError, "low must be a real number"),
        ("bool high", lambda g, a: g.uniform(a["f4"], 0, True), TypeError, "high must be a real number"),
        ("inf", lambda g, a: g.uniform(a["f4"], 0, np.inf), ValueError, "high must be finite"),
        ("nan mean", lambda g, a: g.normal(a["f4"], np.nan), ValueError, "mean must be finite"),
        ("huge int", lambda g, a: g.normal(a["f4"], 0, 10**400), ValueError, "std must be finite"),
        ("too wide", lambda g, a: g.uniform(a["f4"], -3e38, 3e38), ValueError, "overflows float32"),
        ("beyond f16", lambda g, a: g.uniform(a["f2"], 0, 1e5), ValueError, "do not both fit in float16"),
        ("same f16", lambda g, a: g.uniform(a["f2"], 1.0, 1.0001), ValueError, "round to the same float16"),
        ("std < 0", lambda g, a: g.normal(a["f4"], 0, -1), ValueError, "std must be >= 0"),
        ("float bound", lambda g, a: g.randint(a["i4"], 0.5, 3), TypeError, "low must be an integer"),
        ("int high <= low", lambda g, a: g.randint(a["i4"], 3, 3), ValueError, r"high is exclusive"),
        (
            "int32 range",
            lambda g, a: g.randint(a["i4"], 0, 2**31 + 1),
            ValueError,
            r"out of the range of int32",
        ),
        ("int64 range", lambda g, a: g.randint(a["i8"], -(2**63) - 1, 0), ValueError, "out of the range"),
        ("overlap", lambda g, a: g.uniform(a["bcast"]), ValueError, "overlapping elements"),
        (
            "stream",
            lambda g, a: g.uniform(a["f4"], stream=0),
            TypeError,
            "stream must be a cudagraphs Stream",
        ),
        ("seed -1", lambda g, a: g.seed(-1), ValueError, r"seed must be in \[0, 2\*\*64\)"),
        ("seed 2**64", lambda g, a: cgr.Generator(2**64), ValueError, r"must be in \[0, 2\*\*64\)"),
        ("seed float", lambda g, a: g.seed(1.5), TypeError, "seed must be an integer"),
        ("set_state", lambda g, a: g.set_state(5), TypeError, r"set_state takes \(seed, offset\)"),
        ("offset", lambda g, a: g.set_state((1, -2)), ValueError, "offset must be in"),
        ("generator", lambda g, a: cgr.uniform(a["f4"], generator=3), TypeError, "generator must be a"),
        ("module out", lambda g, a: cgr.normal([1.0]), TypeError, "out must be a cudagraphs DeviceArray"),
        ("module seed", lambda g, a: cgr.seed("1"), TypeError, "seed must be an integer"),
    ]


BAD = _bad_calls()


@pytest.mark.parametrize(("call", "exc", "message"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_arguments(backend: str, call: Callable[..., Any], exc: type, message: str) -> None:
    gen = cgr.Generator(1)
    f4 = _poison((4,), "float32")
    arrays = {
        "f4": f4,
        "f2": _poison((4,), "float16"),
        "i4": _poison((4,), "int32"),
        "i8": _poison((4,), "int64"),
        "u1": cg.zeros(4, "uint8"),
        "bcast": cg.as_strided(f4, (3, 4), (0, 4)),
    }
    with pytest.raises(exc, match=message):
        call(gen, arrays)
    assert gen.get_state() == (1, 0)  # a refused draw moves nothing
    assert np.isnan(f4.get()).all()


def test_out_on_another_device_is_refused() -> None:
    with cg.override(backend="sim", sim_devices=2):
        gen = cgr.Generator(device=0)
        x = cg.empty(4, "float32", device=1)
        with pytest.raises(ValueError, match=r"out is on .* but the generator on"):
            gen.uniform(x)
        assert gen.device is cg.Device(0)
        assert "Generator on sim:0" in repr(gen)


# the CUDA source, compiled as C++ on the host --------------------------------------------------
SHIM = r"""
#include <cmath>
#include <cstring>
#define __global__
#define __device__
#define __forceinline__ inline
struct cg_dim3 { unsigned x, y, z; };
extern "C" { cg_dim3 blockIdx, threadIdx, blockDim, gridDim; }
static inline unsigned __umulhi(unsigned a, unsigned b) {
    return (unsigned)(((unsigned long long)a * b) >> 32);
}
static inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
static inline float __fmul_rn(float a, float b) { return a * b; }  // -ffp-contract=off: never fused
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline void sincospi(double x, double* s, double* c) {
    *s = std::sin(M_PI * x);
    *c = std::cos(M_PI * x);
}
"""
EXTRA_FLOAT = r"""
extern "C" void h_round(const float* in, unsigned short* out, long long n, int bf16) {
    for (long long i = 0; i < n; ++i) out[i] = bf16 ? cg_bf16_bits(in[i]) : cg_f16_bits(in[i]);
}
extern "C" void h_f16_value(const unsigned short* in, float* out, long long n) {
    for (long long i = 0; i < n; ++i) out[i] = cg_f16_value(in[i]);
}
"""
BUILDS = {
    "float16": "-DCG_T=unsigned short|-DCG_ACC=float|-DCG_STORE=1",
    "bfloat16": "-DCG_T=unsigned short|-DCG_ACC=float|-DCG_STORE=2",
    "float32": "-DCG_T=float|-DCG_ACC=float|-DCG_STORE=0",
    "float64": "-DCG_T=double|-DCG_ACC=double|-DCG_STORE=0",
    "int32": "-DCG_T=int|-DCG_RANDINT=1",
    "int64": "-DCG_T=long long|-DCG_RANDINT=1",
}


class Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


class Layout(ctypes.Structure):
    _fields_ = [
        ("ndim", ctypes.c_longlong),
        ("shape", ctypes.c_longlong * 8),
        ("strides", (ctypes.c_longlong * 8) * 3),
    ]


@pytest.fixture(scope="module")
def host_kernels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ctypes.CDLL]:
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler to build the CUDA source for the host")
    tmp = tmp_path_factory.mktemp("random_cu")
    source = Path(_random.__file__).parent / "ops" / "kernels" / "random.cu"

    def build(name: str) -> tuple[str, Path]:
        flags = BUILDS[name].split("|")
        cpp = tmp / f"{name}.cpp"
        extra = "" if "RANDINT" in BUILDS[name] else EXTRA_FLOAT
        cpp.write_text(f'{SHIM}\n#include "{source}"\n{extra}')
        lib = tmp / f"{name}.so"
        cmd = [
            cxx,
            "-std=c++17",
            "-O1",
            "-ffp-contract=off",
            "-fPIC",
            "-shared",
            *flags,
            str(cpp),
            "-o",
            str(lib),
        ]
        run = subprocess.run(cmd, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        return name, lib

    with ThreadPoolExecutor(len(BUILDS)) as pool:
        libs = dict(pool.map(build, BUILDS))
    return {name: ctypes.CDLL(str(lib)) for name, lib in libs.items()}


def _run_host_kernel(
    lib: ctypes.CDLL, name: str, grid: int, block: int, args: list[Any], argtypes: list[Any]
) -> None:
    fn = getattr(lib, name)
    fn.argtypes, fn.restype = argtypes, None
    Dim3.in_dll(lib, "gridDim").x, Dim3.in_dll(lib, "blockDim").x = grid, block
    for b in range(grid):
        for t in range(block):
            Dim3.in_dll(lib, "blockIdx").x, Dim3.in_dll(lib, "threadIdx").x = b, t
            fn(*args)


@pytest.mark.parametrize(("kind", "dtype", "a", "b"), CASES, ids=CASE_IDS)
@pytest.mark.parametrize("strided", [False, True])
def test_cuda_source_matches_reference(
    host_kernels: dict[str, ctypes.CDLL], kind: str, dtype: str, a: Any, b: Any, strided: bool
) -> None:
    """The kernel of random.cu, run as C++ on any grid, gives what the reference gives."""
    lib = host_kernels[dtype]
    dt = _dtype(dtype)
    seed, offset = 0xFEEDFACECAFEBEEF, 2**32 - 3
    draw = _random._DRAWS[kind](dt, a, b)
    acc = ctypes.c_double if dtype == "float64" else ctypes.c_float
    by_value: list[Any] = (
        [ctypes.c_longlong, ctypes.c_ulonglong] if kind == "randint" else [acc] * len(draw.args)
    )
    shape = (13, 7)
    for grid, block in [(1, 1), (3, 7), (2, 64)]:
        state = np.array([seed, offset], np.uint64)
        if strided:
            base = np.zeros((26, 7), dt)
            out = base[1::2].T  # every other row, transposed: the kernel writes through the Layout
            ptr = out.__array_interface__["data"][0]
            lay = Layout.from_buffer_copy(layout(out.shape, out))
            args = [ptr, state.ctypes.data, out.size, *draw.args, lay]
            types = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong, *by_value, Layout]
        else:
            out = np.zeros(shape, dt)
            args = [out.ctypes.data, state.ctypes.data, out.size, *draw.args]
            types = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong, *by_value]
        name = f"cg_rand_{kind}" + ("_strided" if strided else "")
        _run_host_kernel(lib, name, grid, block, args, types)
        _assert_matches(kind, out.copy(), _random.reference(kind, out.shape, dtype, seed, offset, a, b))
        if strided:
            assert not base[::2].view(f"u{dt.itemsize}").any()
    if kind != "randint":  # the state kernels live in the float builds
        state = np.array([seed, offset], np.uint64)
        _run_host_kernel(
            lib, "cg_philox_advance", 2, 3, [state.ctypes.data, 5], [ctypes.c_void_p, ctypes.c_ulonglong]
        )
        assert state.tolist() == [seed, offset + 5]
        _run_host_kernel(
            lib,
            "cg_philox_set",
            1,
            2,
            [state.ctypes.data, 7, 9],
            [ctypes.c_void_p] + [ctypes.c_ulonglong] * 2,
        )
        assert state.tolist() == [7, 9]


@pytest.mark.parametrize("fmt", ["float16", "bfloat16"])
def test_cuda_source_rounds_to_16_bits_like_numpy(host_kernels: dict[str, ctypes.CDLL], fmt: str) -> None:
    hi = np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)
    lo = np.array(
        [0, 1, 0x0FFF, 0x1000, 0x1001, 0x2000, 0x3000, 0x4000, 0x7FFF, 0x8000, 0x8001, 0xFFFF], np.uint32
    )
    bits = (hi[:, None] | lo[None, :]).reshape(-1)
    values = bits.view(np.float32)
    got = np.empty(values.size, np.uint16)
    lib = host_kernels[fmt]
    lib.h_round(
        values.ctypes.data_as(ctypes.c_void_p),
        got.ctypes.data_as(ctypes.c_void_p),
        ctypes.c_longlong(values.size),
        ctypes.c_int(fmt == "bfloat16"),
    )
    with np.errstate(over="ignore", invalid="ignore"):
        expect = values.astype(_dtype(fmt)).view(np.uint16)
    nan = np.isnan(values)
    np.testing.assert_array_equal(got[~nan], expect[~nan])
    assert np.isnan(got[nan].view(_dtype(fmt)).astype(np.float32)).all()
    if fmt == "float16":
        halves = np.arange(1 << 16, dtype=np.uint16)
        back = np.empty(halves.size, np.float32)
        lib.h_f16_value(
            halves.ctypes.data_as(ctypes.c_void_p),
            back.ctypes.data_as(ctypes.c_void_p),
            ctypes.c_longlong(halves.size),
        )
        expect_back = halves.view(np.float16).astype(np.float32)
        finite = np.isfinite(expect_back) | np.isinf(expect_back)
        np.testing.assert_array_equal(back[finite], expect_back[finite])
