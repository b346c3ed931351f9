"""Threads, each on its own stream: eager ops, captures and replays give numpy's numbers.

The driver serves threads; so must the simulator (one lock around its
primitives and its scheduler). Run on every backend under test, so the GPU
run proves the two agree.
"""

from __future__ import annotations

import gc
import threading

import numpy as np
from conftest import live_blocks, random_array

import cudagraphs as cg
from cudagraphs import _recording

THREADS, ROUNDS = 8, 30


def _rounds(dev: cg.Device, backend: str, seed: int, errors: list[str]) -> None:
    """One thread's work: every result is checked against numpy."""
    rng = np.random.default_rng(seed)
    with cg.override(backend=backend):
        s = dev.create_stream()
        for r in range(ROUNDS):
            a_h, b_h = random_array(rng, 257, "float32"), random_array(rng, 257, "float32")
            x, y = cg.asarray(a_h, stream=s), cg.asarray(b_h, stream=s)
            cg.ops.axpy(2.0, x, y, stream=s)  # eager
            cg.ops.scale(0.5, y[::2], out=y[::2], stream=s)
            ref = 2 * a_h + b_h
            ref[::2] *= np.float32(0.5)
            got = y.get(stream=s)
            if not np.allclose(got, ref, rtol=1e-5):
                errors.append(f"thread {seed} round {r}: eager result wrong")
            with cg.capture(stream=s) as g:  # captured: runs nothing
                cg.ops.axpy(0.25, x, y, stream=s)
                tmp = cg.empty(257, "float32", stream=s)  # the graph's pool
                cg.ops.scale(3.0, y, out=tmp, stream=s)
                cg.ops.axpy(1.0, tmp, y, stream=s)
            if not np.array_equal(y.get(stream=s), got):
                errors.append(f"thread {seed} round {r}: the capture ran work")
            for _ in range(1 + r % 3):
                g.replay(stream=s)
                ref = 4 * (ref + np.float32(0.25) * a_h)
            if not np.allclose(y.get(stream=s), ref, rtol=1e-4):
                errors.append(f"thread {seed} round {r}: replayed result wrong")
            if r % 2:
                g.close()
            del g, tmp, x, y
            if r % 10 == 0:
                gc.collect()
        s.synchronize()
        s.close()


def test_threads_on_their_own_streams(dev: cg.Device, backend: str) -> None:
    gc.collect()
    before = dev.allocator.stats().in_use
    errors: list[str] = []

    def run(seed: int) -> None:
        try:
            _rounds(dev, backend, seed, errors)
        except BaseException as exc:  # reported below, with the thread
            errors.append(f"thread {seed}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=run, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, f"{len(errors)} failures: {errors[:5]}"
    dev.synchronize()
    gc.collect()
    cg.empty(1, "float32")  # a safe point: what finalizers queued runs
    dev.synchronize()
    assert dev.allocator.stats().in_use == before, live_blocks(dev)


def test_a_capture_begins_after_the_releases_that_run(dev: cg.Device, backend: str) -> None:
    """A release begun with no capture active (it may synchronize any stream) ends first.

    Had another thread begun capturing one of the streams it synchronizes,
    the synchronize would have broken that capture.
    """
    started, finish = threading.Event(), threading.Event()
    order: list[str] = []

    def slow_release() -> None:
        started.set()
        finish.wait(10)
        order.append("released")

    releaser = threading.Thread(target=lambda: _recording.release(dev, slow_release))
    releaser.start()
    assert started.wait(10)
    x = cg.zeros(16, "float32")
    s = dev.create_stream()
    s.wait(dev.stream)
    graphs: list[cg.Graph] = []

    def capture() -> None:
        with cg.override(backend=backend), cg.capture(stream=s) as g:
            order.append("capturing")
            cg.ops.fill(x, 3.0, stream=s)
        graphs.append(g)

    capturer = threading.Thread(target=capture)
    capturer.start()
    capturer.join(0.5)
    waited = capturer.is_alive()
    finish.set()
    releaser.join(10)
    capturer.join(10)
    assert waited, "the capture began while a release ran"
    assert order == ["released", "capturing"]
    graphs[0].replay(stream=s)
    np.testing.assert_array_equal(x.get(stream=s), np.full(16, 3.0, np.float32))
    graphs[0].close()
    s.close()
