"""The ``cudagraphs`` command: ``doctor`` and ``demo``."""

from __future__ import annotations

import argparse
import importlib.metadata
import platform
import sys
import time
from collections.abc import Sequence

import numpy as np

__all__ = ["main"]


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def doctor() -> int:
    """Print what cudagraphs sees; exit non-zero only if something is broken."""
    import cudagraphs as cg

    print(f"cudagraphs {cg.__version__} on Python {platform.python_version()}")
    for dist in ("cuda-core", "cuda-bindings", "numpy", "nvidia-cuda-nvrtc", "ml_dtypes",
                 "cupy-cuda13x", "torch"):
        print(f"  {dist:18} {_version(dist)}")
    print(f"GPU available: {cg.is_cuda_available()}")
    print(f"backend in use: {cg.backend()}")
    print(f"kernel cache: {cg.settings().cache_dir}")
    try:
        dev = cg.Device(0)
        print(f"device 0: {dev.name}, compute capability {dev.compute_capability}, "
              f"{dev.total_memory / 2**30:.1f} GiB")
        x = cg.asarray(np.arange(4.0))
        cg.ops.scale(2.0, x, out=x)
        ok = bool(np.array_equal(x.get(), np.arange(4.0) * 2))
    except Exception as exc:  # doctor reports, it does not crash
        print(f"BROKEN: {type(exc).__name__}: {exc}")
        return 1
    print("self-check (scale on the device):", "ok" if ok else "WRONG RESULT")
    return 0 if ok else 1


def demo(steps: int = 200) -> int:
    """Run a launch-bound loop eagerly and as one graph, checked against numpy."""
    import cudagraphs as cg

    dev = cg.Device(0)
    sim = cg.backend() == "sim"
    print(f"backend: {cg.backend()}  device: {dev.name}")
    rng = np.random.default_rng(0)
    n = 1 << 12
    x_h = rng.standard_normal(n).astype(np.float32)
    y_h = rng.standard_normal(n).astype(np.float32)
    x, y = cg.asarray(x_h), cg.asarray(y_h)
    alpha = cg.DeviceScalar(0.001)
    cg.ops.preload(["float32"], dev)
    dev.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        cg.ops.axpy(alpha, x, y)
    dev.synchronize()
    eager = (time.perf_counter() - t0) / steps
    with cg.capture() as g:
        for _ in range(steps):
            cg.ops.axpy(alpha, x, y)
    g.upload()
    dev.synchronize()
    t0 = time.perf_counter()
    g.replay()
    dev.synchronize()
    graph = (time.perf_counter() - t0) / steps
    ref = y_h.copy()
    for _ in range(2 * steps):
        ref = (np.float32(0.001) * x_h + ref).astype(np.float32)
    err = float(np.max(np.abs(y.get() - ref)))
    ok = err < 1e-4
    note = "  (timings simulated on the CPU)" if sim else ""
    print(f"{steps} axpy kernels on {n} floats{note}")
    print(f"  eager launches : {eager * 1e6:8.2f} us per kernel")
    print(f"  one graph replay: {graph * 1e6:8.2f} us per kernel  ({eager / graph:.1f}x)")
    print(f"max |error| vs numpy: {err:.2e}  {'ok' if ok else 'MISMATCH'}")
    print(g.summary())
    s = dev.allocator.stats()
    print(f"allocator: {s.in_use} B in use, {s.reserved} B reserved, {s.hits} hits, {s.misses} misses")
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``cudagraphs`` console script."""
    parser = argparse.ArgumentParser(prog="cudagraphs", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("doctor", help="show backend, GPU, versions; self-check")
    p_demo = sub.add_parser("demo", help="eager vs graph on whatever backend answers")
    p_demo.add_argument("--steps", type=int, default=200)
    args = parser.parse_args(argv)
    if args.command == "doctor":
        return doctor()
    return demo(args.steps)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
