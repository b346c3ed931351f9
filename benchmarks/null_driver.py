"""The host side of each hot path, timed without a GPU: the driver replaced by a no-op.

A launch on a GPU costs the driver's 2-4 µs plus the library's host code;
only the second is ours to change, and on a machine without a GPU nothing
measures it. Here the simulator's backend stands in for the cuda backend
(``fastcall`` on, so the compiled paths run as they run on a GPU), its
launches and replays do nothing, and every driver entry point the compiled
part calls is bound to one C function that returns 0 (compiled here with the
system's C compiler). What is left per call is the host code of the library:
argument checks, the capture state, packing, the trampoline. (Node updates
are not timed here: the no-op launch records no node in the simulator's
graph for them to find.)

Usage (from the repository root; the tree on PYTHONPATH is measured)::

    PYTHONPATH=src python benchmarks/null_driver.py [ROUNDS] [CALLS]
    PYTHONPATH=src python benchmarks/null_driver.py instructions [NAME ...]
    PYTHONPATH=src python benchmarks/null_driver.py profile|profile-self NAME

The first prints one line per hot path: the median of ROUNDS timings of
CALLS calls, in µs per call (they move by 10% and more between processes on
a shared machine). The second counts the instructions each call executes,
under valgrind's callgrind: two runs of 2,000 and 42,000 calls after the
same setup (10 and 410 captures), the difference divided by the calls between
(the setup's own count moves by about 0.5%, 5 million instructions, from run
to run: 40,000 calls make that 125 a call); those counts hardly move, so
two trees compare closely (NAME: a prefix of a row's name; default all).
The third lists the functions one call of row NAME runs, by instructions per
call, inclusive of what they call (``profile``) or their own (``profile-self``).
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import cudagraphs as cg
from cudagraphs import _nvrtc, backends
from cudagraphs._config import compiled_part
from cudagraphs.backends.sim import SimBackend
from cudagraphs.backends.sim.kernels import SimFunction

TINY = 'extern "C" __global__ void inc(float* p) { p[0] += 1.0f; }'


def _noop_address() -> int:
    """The address of ``int cg_null(void) { return 0; }``, compiled and loaded here."""
    folder = tempfile.mkdtemp(prefix="cg-null-")
    source, library = os.path.join(folder, "null.c"), os.path.join(folder, "null.so")
    with open(source, "w") as f:
        f.write("int cg_null(void) { return 0; }\n")
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", library, source], check=True)
    lib = ctypes.CDLL(library)
    _noop_address.lib = lib  # type: ignore[attr-defined]  # (kept loaded)
    return ctypes.cast(lib.cg_null, ctypes.c_void_p).value or 0


class NullFunction(SimFunction):
    """A loaded kernel with a CUfunction address, as the cuda backend's (one that is never called)."""

    __slots__ = ("handle",)

    def __int__(self) -> int:
        return self.handle  # type: ignore[no-any-return]


class NullBackend(SimBackend):
    """The simulator, with the cuda backend's fast calls on and a driver that does nothing."""

    fastcall = True
    # (kernels run nowhere: as on the cuda backend, an uncaptured launch describes no views)
    capabilities = dataclasses.replace(SimBackend.capabilities, runs_host_code=False)

    def load_kernel(self, ordinal: int, image: Any, name: str, params: Any, host: Any) -> Any:
        fn = NullFunction(name, params, host)
        fn.handle = 0x1000 + id(fn) % 0x100000
        return fn

    def launch(self, stream: Any, launch: Any) -> None:
        return None

    @staticmethod
    def graph_launch(exec_: Any, stream: Any, upload: bool = False) -> None:
        return None  # (a plain function, as the cuda backend's)


def install() -> None:
    """Make the null backend the simulator's, and bind every fast call to the no-op."""
    fast = compiled_part()
    if fast is None:
        sys.exit("the compiled part is not built: nothing to measure here")
    address = _noop_address()
    for name in fast.names():
        fast.bind(name, address)
    backends._instances["sim"] = NullBackend()  # (before the first Device)

    def no_compiler(*args: Any) -> bytes:  # (nothing runs the code: no NVRTC, no cuda.core)
        raise _nvrtc.NvrtcUnavailable("not needed here")

    _nvrtc.compile_cubin = no_compiler
    # (a no-op launch records no node in the simulator's graph: nothing for the keep-alive to read)
    import cudagraphs.interop as interop

    interop.foreign_memory = lambda *args: []
    if hasattr(fast, "fast_graph_launch"):  # (a tree before issue 27's replay: its C replay's launch)
        fast.fast_graph_launch(NullBackend.graph_launch)


def workloads() -> dict[str, Callable[[], Any]]:
    dev = cg.Device(0)
    k = cg.Kernel(TINY, "inc", host=lambda p: None)
    cg.preload([k], dev)
    x, z = cg.zeros(1, "float32"), cg.zeros(1, "float32")
    cg.ops.add(x, z, out=x)
    with cg.capture() as g:
        for _ in range(10):
            k.launch(1, 1, x)
    g.upload()

    def step(a: Any) -> Any:
        k.launch(1, 1, a)
        return a

    f = cg.graphed(step)
    a = cg.zeros(1, "float32")
    for _ in range(3):
        f(a)

    def capture100() -> None:
        with cg.capture() as c:
            for _ in range(100):
                k.launch(1, 1, x)
        c.close()

    work: dict[str, Callable[[], Any]] = {
        "Kernel.launch": lambda: k.launch(1, 1, x),
        "ops.add": lambda: cg.ops.add(x, z, out=x),
        "cg.empty": lambda: cg.empty(128, "float32"),
        "Graph.replay": g.replay,
        "graphed call": lambda: f(a),
        "capture 100 (per launch)": capture100,
    }
    work["__keep__"] = lambda: (g, f)  # (kept alive with the table)
    return work


def _callgrind(name: str, calls: int, out: str) -> str:
    """Run ``calls`` calls of row ``name`` under callgrind (its profile written to ``out``); its report."""
    return subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            sys.executable,
            __file__,
            "run",
            name,
            str(calls),
        ],
        capture_output=True,
        text=True,
        check=True,
        # (the same dictionaries in both runs; numpy's BLAS threads, which spin, off)
        env={**os.environ, "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1"},
    ).stderr


def _instructions(names: list[str]) -> None:
    """Per-call instruction counts under callgrind (see the module's docstring)."""
    import re

    rows = [n for n in _ROWS if not names or any(n.startswith(x) for x in names)]
    for name in rows:
        counts = []
        few, many = (10, 410) if name.startswith("capture") else (2000, 42000)
        for calls in (few, many):
            out = _callgrind(name, calls, "/dev/null")
            counts.append(int(re.search(r"Collected : (\d+)", out).group(1)))  # type: ignore[union-attr]
        per = (counts[1] - counts[0]) / (many - few) / (100 if name.startswith("capture") else 1)
        print(f"{name:26s} {per:10.0f} instructions")


def _annotated(name: str, calls: int, inclusive: bool) -> dict[str, int]:
    """Instructions per function (inclusive or self) of one run of ``calls`` calls of row ``name``."""
    import re

    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "callgrind.out")
        _callgrind(name, calls, out)
        how = f"--inclusive={'yes' if inclusive else 'no'}"  # (--auto=no: no source lines among them)
        text = subprocess.run(
            ["callgrind_annotate", "--auto=no", how, "--threshold=100", out],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    found: dict[str, int] = {}
    for line in text.splitlines():
        m = re.match(r"\s*([\d,]+) \([ \d.]+%\)\s+(\S+)", line)
        if m:
            fn = m.group(2).rsplit("/", 1)[-1]
            found[fn] = found.get(fn, 0) + int(m.group(1).replace(",", ""))
    return found


def _profile(name: str, inclusive: bool) -> None:
    """The functions each call of row ``name`` runs, by instructions per call (two runs' difference)."""
    few, many = (10, 110) if name.startswith("capture") else (2000, 22000)
    a, b = _annotated(name, few, inclusive), _annotated(name, many, inclusive)
    per = {fn: (b.get(fn, 0) - a.get(fn, 0)) / (many - few) for fn in b}
    for fn, n in sorted(per.items(), key=lambda kv: -kv[1])[:40]:
        if n >= 5:
            print(f"{n:10.0f}  {fn}")


_ROWS = ["Kernel.launch", "ops.add", "cg.empty", "Graph.replay", "graphed call", "capture 100 (per launch)"]


def main(argv: list[str]) -> None:
    if argv[:1] == ["instructions"]:
        _instructions(argv[1:])
        return
    if argv[:1] in (["profile"], ["profile-self"]):
        _profile(argv[1], inclusive=argv[0] == "profile")
        return
    if argv[:1] == ["run"]:  # (one row, under callgrind: setup, then CALLS calls)
        install()
        fn = workloads()[argv[1]]
        for _ in range(20):  # (first calls arm what later calls repeat)
            fn()
        for _ in range(int(argv[2])):
            fn()
        return
    rounds = int(argv[0]) if argv else 7
    calls = int(argv[1]) if len(argv) > 1 else 20000
    install()
    work = workloads()
    work.pop("__keep__")
    for name, fn in work.items():
        n = calls // 100 if name.startswith("capture") else calls
        for _ in range(max(n // 20, 10)):
            fn()
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            times.append((time.perf_counter() - t0) / n * 1e6)
        per = statistics.median(times) / (100 if name.startswith("capture") else 1)
        print(f"{name:26s} {per:8.3f} µs")


if __name__ == "__main__":
    main(sys.argv[1:])
