"""Per captured launch: the backend primitive alone vs Kernel.launch, both trees, one process.

Splits the capture path's cost into the driver's share and the library's.
Usage: PYTHONPATH=src python scripts/capture_launch_split.py [OLD_SRC]
"""

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from ab_inprocess import TINY, load_old

import cudagraphs as new

old = load_old(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(".baseline/src"))


def setup(cg):
    dev = cg.Device(0)
    k = cg.Kernel(TINY, "inc", host=lambda p: p.__iadd__(1))
    x = cg.zeros(1, "float32")
    k.launch(1, 1, x)
    dev.synchronize()
    return dev, k, x


def primitive(cg, dev, k, x):
    if cg is new:
        from cudagraphs.backends.base import KernelLaunch

        fn = dev.kernels[k]
        launch = KernelLaunch(fn, (1, 1, 1), (1, 1, 1), 0, (x.ptr,), ())
        call = dev.backend.launch
        return lambda raw: call(raw, launch)
    launcher = dev.kernels[k]
    raw_args = [x.ptr]
    return lambda raw: launcher(raw, (1, 1, 1), (1, 1, 1), 0, raw_args, ())


def timed(cg, dev, k, x, how, n=1000):
    prim = primitive(cg, dev, k, x)
    with cg.capture() as g:
        raw = dev.stream._raw
        if how == "primitive":
            k.launch(1, 1, x)  # the capture must record one node of ours
            t0 = time.perf_counter()
            for _ in range(n):
                prim(raw)
        else:
            t0 = time.perf_counter()
            for _ in range(n):
                k.launch(1, 1, x)
        t = time.perf_counter() - t0
    g.close()
    return t / n * 1e6


trees = {"old": (old, *setup(old)), "new": (new, *setup(new))}


def main() -> None:
    res = {(t, h): [] for t in trees for h in ("primitive", "Kernel.launch")}
    for r in range(25):
        for t in ("old", "new") if r % 2 else ("new", "old"):
            for h in ("primitive", "Kernel.launch"):
                res[(t, h)].append(timed(*trees[t], h))
    print("| per captured launch (µs) | old | new |")
    print("|---|---|---|")
    for h in ("primitive", "Kernel.launch"):
        print(
            f"| {h} | {statistics.median(res[('old', h)]):.3f} | {statistics.median(res[('new', h)]):.3f} |"
        )


if __name__ == "__main__":
    main()
