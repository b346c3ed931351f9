"""Shared fixtures: every test that takes ``backend`` runs once per backend.

``CUDAGRAPHS_TEST_BACKENDS`` (default ``sim``) lists the backends, e.g.
``cuda,sim`` on a GPU machine, so one suite proves the two agree. A backend
named there that cannot run fails the tests loudly instead of skipping.
"""

from __future__ import annotations

import gc
import importlib
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import cudagraphs as cg

BACKENDS = [b.strip() for b in os.environ.get("CUDAGRAPHS_TEST_BACKENDS", "sim").split(",") if b.strip()]

# the simulator runs several streams' queues in an order drawn from this seed: it varies
# from run to run unless CUDAGRAPHS_SIM_SEED fixes it, and the report header prints it
if not os.environ.get("CUDAGRAPHS_SIM_SEED"):
    cg.configure(sim_seed=int.from_bytes(os.urandom(2), "little"))
SIM_SEED = cg.settings().sim_seed


def pytest_report_header(config: pytest.Config) -> str:
    return (
        f"cudagraphs sim seed: {SIM_SEED} (replay this run's stream interleavings with "
        f"CUDAGRAPHS_SIM_SEED={SIM_SEED})"
    )


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed and "[sim" in report.nodeid:
        report.sections.append(
            ("cudagraphs", f"sim seed {SIM_SEED}: rerun with CUDAGRAPHS_SIM_SEED={SIM_SEED}")
        )


@pytest.fixture(autouse=True, scope="module")
def _earlier_objects_frozen(request: pytest.FixtureRequest) -> Iterator[None]:
    """Keep the objects alive before a test file out of its tests' garbage collections.

    The tests collect garbage often (the ``backend`` fixture after each test,
    ``settle``, the checks of memory in use), and each full collection walks
    every object the process tracks: pytest's, the imports' (cuda.core's) and
    what the files run before in this worker left, some 80,000 objects: most
    of the suite's time went there (gc.collect was 65% of it). ``gc.freeze``
    moves them out of the collector's view for the file; what its tests make
    is collected as before. At the file's end they are unfrozen, and a check
    makes sure that no object of cudagraphs (or of the tests' stand-in
    libraries) among them turned garbage meanwhile: one a collection of the
    file would have reached, and whose release it would have run.

    (Frozen objects are not in ``gc.get_objects()`` either: the census of
    other libraries' arrays, ``interop._keep``, sees the arrays a file's tests
    make, not those made before the file, which no test uses; ``live_blocks``
    lists the blocks made by the file's tests.)

    Where a test of an earlier file failed, the check only warns: pytest
    keeps that failure's traceback (``sys.last_traceback``: its frames, and
    the objects they held) until a later failure replaces it, so they turn
    garbage during this file without any fault of its tests (seen on a GPU
    run: a failed soak test's graph and records, flagged by the file after it).
    """
    failed_before = request.session.testsfailed
    importlib.import_module("cuda.core")  # (what the first kernel compile imports: frozen too)
    gc.collect()
    gc.freeze()
    yield
    gc.collect()  # what the file's tests left, as ever
    gc.unfreeze()
    hidden = frozen_garbage()
    why = (
        f"objects of {_WATCHED} alive before this file turned garbage while frozen (the file's "
        f"collections did not reach them: see _earlier_objects_frozen): {hidden}"
    )
    if hidden and failed_before:
        warnings.warn(f"{why} (not failed: an earlier failure's traceback may have held them)", stacklevel=1)
        return
    assert not hidden, why


_WATCHED = ("cudagraphs", "foreign_lib", "_fake_library")  # (what holds device memory or handles)


def frozen_garbage() -> list[str]:
    """The objects of ``_WATCHED`` modules a full collection finds garbage now (the next one frees them)."""
    gc.set_debug(gc.DEBUG_SAVEALL)  # (what turned garbage while frozen goes to gc.garbage)
    try:
        gc.collect()
        found = [o for o in gc.garbage if str(type(o).__module__).startswith(_WATCHED)]
        return [_safe_repr(o) for o in found]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def _safe_repr(o: object) -> str:
    try:
        return repr(o)[:100]
    except Exception:  # (an object half torn down)
        return f"<{type(o).__qualname__}>"


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Iterator[str]:
    """The backend under test, made the current one for the test's duration."""
    name = request.param
    if name == "cuda" and not cg.is_cuda_available():
        pytest.fail("CUDAGRAPHS_TEST_BACKENDS names cuda but no GPU answers")
    with cg.override(backend=name):
        yield name
        gc.collect()


@pytest.fixture
def device(backend: str) -> Iterator[cg.Device]:
    """Device 0 of the backend under test, idle."""
    dev = cg.Device(0)
    dev.synchronize()
    yield dev
    reset = getattr(dev.backend, "reset", None)  # sim: a device fault of this test ends here
    if reset is not None:
        reset()


@pytest.fixture
def dev(device: cg.Device) -> cg.Device:
    """The device under test with the float32 and int32 built-in kernels compiled.

    Tests then do not compile on first use inside their captures (the kernels
    are cached for the process: the cost is paid once). A test file that
    needs more dtypes adds a fixture of its own on top of this one.
    """
    cg.ops.preload_dtypes(["float32", "int32"], device)
    return device


@pytest.fixture
def distinct_addresses(device: cg.Device) -> Iterator[cg.Device]:
    """The simulated device, giving every allocation a new address (no reuse).

    For tests that check that touching freed memory is caught: as on a GPU,
    the simulator otherwise gives a freed address to the next allocation that
    fits, and a stale pointer then reads its new owner's bytes.
    """
    if device.backend.name != "sim":
        pytest.skip("only the simulator can be kept from reusing addresses")
    device.backend.reuse_addresses = False
    try:
        yield device
    finally:
        device.backend.reuse_addresses = True


def cuda_device_count() -> int:
    """GPUs the ``cuda`` backend sees when it is under test, else 0."""
    if "cuda" not in BACKENDS or not cg.is_cuda_available():
        return 0
    return cg.device_count("cuda")


# several devices: sim with 2 and 4 simulated ones (CI), cuda where it has 2 or more
MULTI = [("sim", 2), ("sim", 4)] + ([("cuda", cuda_device_count())] if cuda_device_count() >= 2 else [])


@pytest.fixture(params=MULTI, ids=[f"{b}-{n}" for b, n in MULTI])
def devices(request: pytest.FixtureRequest) -> Iterator[list[cg.Device]]:
    """Every device of the backend under test (sim: that many simulated ones), idle."""
    name, n = request.param
    overrides = {"sim_devices": n} if name == "sim" else {}
    with cg.override(backend=name, **overrides):
        devs = [cg.Device(i) for i in range(n)]
        for d in devs:
            d.synchronize()
            if name == "sim":  # (devices outlive an override: each test starts with no peers)
                d._peers.clear()
                d.backend._peers.clear()
        yield devs
        for d in devs:
            d.synchronize()


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


def random_array(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Random data of any supported dtype (never zeros)."""
    dt = np.dtype(dtype)
    if dt.kind == "f" or dt.name == "bfloat16":
        return rng.standard_normal(shape).astype(dt)
    if dt.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)
    if dt.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    info = np.iinfo(dt)
    return rng.integers(max(info.min, -1000), min(info.max, 1000), shape).astype(dt)


def nvrtc_available(device: cg.Device) -> bool:
    """Whether kernel sources are compiled on this backend (always on cuda)."""
    if device.backend.name == "cuda":
        return True
    cg.preload([cg.ops.elementwise_kernel("cg_add", np.dtype("float32"))], device)
    from cudagraphs import _nvrtc

    return bool(_nvrtc.available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked ``gpu`` unless the cuda backend is under test."""
    if "cuda" in BACKENDS:
        return
    skip = pytest.mark.skip(reason="GPU test: set CUDAGRAPHS_TEST_BACKENDS=cuda,sim on a GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def settle(dev: cg.Device) -> cg.AllocatorStats:
    """The allocator's counters once nothing pending can change them (idle device, no capture).

    A check of memory in use must not depend on how fast the device runs (under
    compute-sanitizer it runs many times slower): wait for the work queued on
    every stream of the device, collect garbage, and run the releases deferred
    to a safe point (a synchronize and ``stats()`` are ones); twice, as a
    release may let go of what holds other blocks.
    """
    for _ in range(2):
        gc.collect()
        dev.synchronize()
    return dev.allocator.stats()


def live_blocks(dev: cg.Device) -> str:
    """Who holds the device's live blocks (for the message of a failed memory check)."""
    from cudagraphs import _allocator

    def name(o: object) -> str:
        if type(o).__name__ == "frame":
            return f"frame {o.f_code.co_name} ({o.f_code.co_filename.rsplit('/', 1)[-1]}:{o.f_lineno})"  # type: ignore[attr-defined]
        return type(o).__name__

    lines = []
    for block in [o for o in gc.get_objects() if type(o) is _allocator.Block]:
        if block.device is not dev:
            continue
        holders = [h for h in gc.get_referrers(block) if not isinstance(h, _allocator._BlockRef)]
        for h in holders[:3]:
            up = gc.get_referrers(h)
            lines.append(
                f"block 0x{block.ptr:x} ({block.nbytes} B) <- {name(h)} <- {[name(u) for u in up][:6]}"
            )
            frames = [u for u in up if type(u).__name__ == "frame"]
            if frames:  # what keeps a finished frame alive: a traceback of an exception?
                lines.append("  " + _frame_owner(frames))
    return "\n".join(lines[:60]) or "no live block"


def _frame_owner(frames: list) -> str:
    import types

    wanted = {id(f) for f in frames}
    tbs = [o for o in gc.get_objects() if isinstance(o, types.TracebackType)]
    hit = [tb for tb in tbs if id(tb.tb_frame) in wanted]
    found = []
    for o in gc.get_objects():
        if isinstance(o, BaseException):
            tb = o.__traceback__
            while tb is not None:
                if any(tb is h for h in hit):
                    found.append(f"{type(o).__name__}: {str(o)[:160]}")
                    break
                tb = tb.tb_next
    stacks = [f.f_code.co_name for f in frames]
    inner = _innermost(frames[0])
    held, unseen = _holders(inner)
    return (
        f"frames {stacks}: held by exceptions {found[:3]}; innermost live frame "
        f"{inner.f_code.co_name} ({inner.f_code.co_filename}:{inner.f_lineno}) held by {held[:4]} "
        f"and by {unseen} reference(s) that no object the collector tracks holds (C code, the "
        "interpreter's exception state, or a leaked count)"
    )


def _innermost(frame: Any) -> Any:
    """The innermost finished frame below ``frame`` (frames link outward, through ``f_back``).

    No closure here names a frame: its cell would be one more holder, this
    diagnostic's own.
    """
    for _ in range(30):
        deeper = None
        for r in gc.get_referrers(frame):
            if type(r).__name__ == "frame" and r.f_back is frame:
                deeper = r
        if deeper is None:
            return frame
        frame = deeper
    return frame


def _holders(obj: Any) -> tuple[list[str], int]:
    """What tracked objects hold ``obj``, and how many of its references none of them holds.

    The second count is ``obj``'s reference count less the references the
    tracked holders make and the three this diagnostic makes (the caller's
    local, this call's argument, ``sys.getrefcount``'s).
    """
    held, seen, r, x = [], 0, None, None
    for r in gc.get_referrers(obj):
        for x in gc.get_referents(r):
            if x is obj:
                seen += 1
        if type(r) is list and len(r) < 50:
            held.append(f"list of {len(r)} ({[type(y).__name__ for y in r][:5]})")
        else:
            held.append(f"{type(r).__name__} {r!r:.100}")
    del r, x
    return held, sys.getrefcount(obj) - seen - 3


def call_while_held(lock: Any, fn: Callable[[], Any]) -> Any:
    """Call ``fn`` in another thread while a third holds ``lock``; return its result.

    Checks that the call waits for the lock (it has not returned 0.2 s after
    it began) and returns once the holder lets go.
    """
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(10)
    done: list[Any] = []
    caller = threading.Thread(target=lambda: done.append(fn()))
    caller.start()
    time.sleep(0.2)
    waited = not done
    release.set()
    holder.join(10)
    caller.join(10)
    assert waited, "the call did not wait for the lock"
    assert done, "the call did not return after the lock was let go"
    return done[0]


def compiled_part_or_skip() -> Any:
    """The C part (``cudagraphs._fastcall``), or a skip of the calling test module.

    Skipped where it is not built, and where ``CUDAGRAPHS_FASTCALL=0`` kept it
    from loading (CI's second run of the suite, in which every path is Python's).
    """
    from cudagraphs._config import compiled_part

    fast = compiled_part()
    if fast is None:
        pytest.skip(
            "the C part is not built (`pip install -e .` builds it) or CUDAGRAPHS_FASTCALL=0 turned it off",
            allow_module_level=True,
        )
    return fast


def needs_matmul(device: cg.Device) -> None:
    """Skip where ``cg.ops.matmul`` cannot run: the cuda backend without nvmath-python (extra ``blas``)."""
    from cudagraphs import _blas

    if device.backend.name == "cuda" and not _blas.available():
        pytest.skip(f"cg.ops.matmul on cuda needs nvmath-python: {_blas.INSTALL_HINT}")


@pytest.fixture(scope="session")
def plain_python_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A PYTHONPATH on which cudagraphs is the package as plain Python (no compiled file).

    A copy of ``src/cudagraphs`` without its built modules, made by
    ``scripts/plain_tree.py`` (what CI's plain-Python run of the suite uses).
    """
    import importlib.util

    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("plain_tree", root / "scripts" / "plain_tree.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.plain_tree(tmp_path_factory.mktemp("plain")))
