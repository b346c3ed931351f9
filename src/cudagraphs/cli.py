"""The ``cudagraphs`` command: ``doctor``, ``demo``, ``bench`` and ``show``."""

from __future__ import annotations

import argparse
import importlib.metadata
import platform
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["main"]


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def compiled_modules() -> list[str]:
    """The modules of ``_config.COMPILED_MODULES`` that run compiled here (the others run as Python)."""
    import importlib

    from cudagraphs._config import COMPILED_MODULES

    names = []
    for name in COMPILED_MODULES:
        module = importlib.import_module("cudagraphs." + name.replace("/", "."))
        if not (module.__file__ or "").endswith(".py"):
            names.append(module.__name__)
    return names


def doctor() -> int:
    """Print what cudagraphs sees; exit non-zero only if something is broken."""
    import cudagraphs as cg

    print(f"cudagraphs {cg.__version__} on Python {platform.python_version()}")
    for dist in (
        "cuda-core",
        "cuda-bindings",
        "numpy",
        "nvidia-cuda-nvrtc",
        "ml_dtypes",
        "cupy-cuda13x",
        "torch",
        "nccl4py",
        "nvidia-nccl-cu13",
    ):
        print(f"  {dist:18} {_version(dist)}")
    print(f"GPU available: {cg.is_cuda_available()}")
    if cg.is_cuda_available():
        from cuda.bindings import driver

        err, version = driver.cuDriverGetVersion()
        if not err:
            print(f"CUDA driver: {version // 1000}.{version % 1000 // 10}")
    print(f"backend in use: {cg.backend()}")
    print(f"kernel cache: {cg.settings().cache_dir}")
    try:
        from cudagraphs import _fastcall  # noqa: F401
        from cudagraphs._config import compiled_part

        built = "built"
        if compiled_part() is None:
            built += ", turned off (CUDAGRAPHS_FASTCALL=0 at import: its paths are Python's)"
    except ImportError:
        built = "not built (its paths are Python's: the driver is called through cuda.bindings)"
    from cudagraphs._config import COMPILED_MODULES

    compiled = compiled_modules()
    print(
        f"modules compiled from their Python source: {len(compiled)} of {len(COMPILED_MODULES)}"
        + (f" ({', '.join(compiled)})" if compiled else " (plain Python: no compiler at install)")
    )
    try:
        dev = cg.Device(0)
        if cg.backend() == "cuda":
            built += ", in use" if getattr(dev.backend, "fastcall", False) else ", not in use"
        print(f"fast driver calls (cudagraphs._fastcall): {built}")
        print(
            f"device 0: {dev.name}, compute capability {dev.compute_capability}, "
            f"{dev.total_memory / 2**30:.1f} GiB"
        )
        x = cg.asarray(np.arange(4.0))
        cg.ops.scale(2.0, x, out=x)
        ok = bool(np.array_equal(x.get(), np.arange(4.0) * 2))
        _devices(cg)
    except Exception as exc:  # doctor reports, it does not crash
        print(f"BROKEN: {type(exc).__name__}: {exc}")
        return 1
    print("self-check (scale on the device):", "ok" if ok else "WRONG RESULT")
    return 0 if ok else 1


def _devices(cg: Any) -> None:
    """Print the devices after the first and which can reach which (peer access)."""
    count = cg.device_count()
    print(f"devices: {count}")
    if count < 2:
        return
    devs = [cg.Device(i) for i in range(count)]
    for dev in devs[1:]:
        print(f"device {dev.index}: {dev.name}, compute capability {dev.compute_capability}")
    print("peer paths (row reaches column; ops.copy enables them, cg.enable_peer_access() all):")
    print("      " + "".join(f"{d.index:>6}" for d in devs))
    for a in devs:
        row = "".join(
            "     -"
            if a is b
            else "    on"
            if b in a.peers
            else "    ok"
            if a.can_access_peer(b)
            else "    no"
            for b in devs
        )
        print(f"  {a.index:>4}{row}")


def show(target: str | None, example: str | None, out: str | None) -> int:
    """Capture ``FILE.py:function`` (called with no arguments) or a demo graph; save its picture."""
    import importlib.util
    import shutil
    from pathlib import Path

    import cudagraphs as cg
    from cudagraphs._picture import check_destination
    from cudagraphs.demo import EXAMPLES

    if example is not None:
        if example not in EXAMPLES:
            print(f"unknown example {example!r}; choose from {', '.join(EXAMPLES)}", file=sys.stderr)
            return 2
        name = example
    else:
        if not target or ":" not in target:
            print("show needs FILE.py:function or --example NAME", file=sys.stderr)
            return 2
        path, name = target.rsplit(":", 1)
    destination = Path(out) if out else Path(f"{name}.{'svg' if shutil.which('dot') else 'dot'}")
    try:  # (before any capture: a bad --out is said at once, not after the work)
        check_destination(destination)
    except (ValueError, RuntimeError) as exc:
        print(f"show --out: {exc}", file=sys.stderr)
        return 2
    if example is not None:
        cg.ops.preload_dtypes(["float32", "float64", "int32"])
        graph = EXAMPLES[example](cg.Device(0))
    else:
        func_name = name
        spec = importlib.util.spec_from_file_location("cudagraphs_show_target", path)
        if spec is None or spec.loader is None or not Path(path).is_file():
            print(f"cannot load {path!r}: no such Python file", file=sys.stderr)
            return 2
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        fn = getattr(module, func_name, None)
        if not callable(fn):
            print(f"{path} has no function {func_name!r}", file=sys.stderr)
            return 2
        graph = cg.capture(fn)
    graph.save(destination)
    print(graph.summary())
    print(f"wrote {destination}")
    return 0


def _out_dir_problem(out: str) -> str | None:
    """Why ``out`` cannot be the directory bench writes its files into (made now), or None."""
    from pathlib import Path

    try:
        Path(out).mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        return "exists and is not a directory: give a directory for bench.json, bench.md and the plots"
    except OSError as exc:
        return f"cannot make the directory ({exc.strerror or exc})"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``cudagraphs`` console script."""
    parser = argparse.ArgumentParser(prog="cudagraphs", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("doctor", help="show backend, GPU, versions; self-check")
    sub.add_parser("demo", help="the flagship demo: eager vs graph, checked against numpy")
    p_bench = sub.add_parser("bench", help="benchmarks against raw CUDA C and the Python peers")
    p_bench.add_argument("--quick", action="store_true", help="a one-minute run")
    p_bench.add_argument("--out", help="directory for bench.json, bench.md and PNG plots")
    p_bench.add_argument(
        "--devices",
        action="store_true",
        help="several devices instead: a data-parallel step and all-reduce latency (NCCL, PyTorch)",
    )
    p_show = sub.add_parser("show", help="capture a function or a demo graph and save its picture")
    p_show.add_argument("target", nargs="?", help="FILE.py:function (called with no arguments)")
    p_show.add_argument("--example", help="a demo graph: jacobi or mlp")
    p_show.add_argument("--out", help="picture file (.svg/.png/.pdf with Graphviz, or .dot)")
    args = parser.parse_args(argv)
    if args.command == "doctor":
        return doctor()
    if args.command == "demo":
        from .demo import main as demo_main

        return demo_main()
    if args.command == "bench":
        from .bench.multigpu import main as devices_main
        from .bench.runner import main as bench_main

        if args.out:
            problem = _out_dir_problem(args.out)
            if problem:  # (said before the benchmark runs, not after)
                print(f"bench --out {args.out}: {problem}", file=sys.stderr)
                return 2
        run = devices_main if args.devices else bench_main
        return run((["--quick"] if args.quick else []) + (["--out", args.out] if args.out else []))
    return show(args.target, args.example, args.out)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
