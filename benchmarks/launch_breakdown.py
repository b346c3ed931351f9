"""Where the eager-launch time goes.

Each layer of cudagraphs' launch path is timed alone on a one-thread kernel
(run on a GPU; prints µs per call).
"""

from __future__ import annotations

import cProfile
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
import cudagraphs as cg
from cudagraphs.backends.cuda import _driver
from cudagraphs.bench.runner import per_call_us

N = 20000


def us(fn, sync) -> float:
    per_call_us(fn, sync, 1000)  # warm up
    return per_call_us(fn, sync, N)


def main() -> None:
    dev = cg.Device(0)
    drv = _driver()
    x, zero = cg.zeros(1, "float32"), cg.zeros(1, "float32")
    k = cg.ops.elementwise_kernel("cg_add", x.dtype)
    from cudagraphs._recording import Work, submit
    from cudagraphs.backends.base import KernelLaunch

    launch_spec = KernelLaunch(
        k.function(dev), (1, 1, 1), (256, 1, 1), 0, (x.ptr, x.ptr, zero.ptr, 1), (None,) * 4
    )
    backend, stream = dev.backend, dev.stream
    raw_stream = stream._raw
    cg.ops.add(x, zero, out=x)
    rows = {
        "pass (loop overhead)": lambda: None,
        "cuStreamQuery (a trivial driver call)": lambda: drv.cuStreamQuery(raw_stream),
        "backend launch (pack + cuLaunchKernel)": lambda: backend.launch(raw_stream, launch_spec),
        "submit (Work + backend launch)": lambda: submit(stream, Work("kernel", backend.launch, launch_spec)),
        "Kernel.launch (checks args)": lambda: k.launch(1, 256, x, x, zero, 1),
        "ops.add": lambda: cg.ops.add(x, zero, out=x),
        "allocator raw_malloc+raw_free": lambda: dev.allocator.raw_free(dev.allocator.raw_malloc(512)),
        "allocator malloc (Block) + drop": lambda: dev.allocator.malloc(512),
        "cg.empty + drop": lambda: cg.empty(128, "float32"),
    }
    try:  # the same kernel through cuda.core's launch (Cython), for comparison
        import numpy as np
        from cuda.core import LaunchConfig, ObjectCode, Stream, launch

        from cudagraphs._kernel import _IMAGES

        image = next(
            v
            for (src, opts, _), v in _IMAGES.items()
            if v is not None and opts == k.options and src == k.source
        )
        ck = ObjectCode.from_cubin(image).get_kernel("cg_add")
        cs = Stream.from_handle(dev.stream.handle)
        cfg = LaunchConfig(grid=1, block=256)
        p, n1 = np.uintp(x.ptr), np.int64(1)
        rows["cuda.core launch, same cubin, cached config"] = lambda: launch(cs, cfg, ck, p, p, p, n1)
        rows["cuda.core launch + LaunchConfig per call"] = lambda: launch(
            cs, LaunchConfig(grid=1, block=256), ck, p, p, p, n1
        )
        rows["cuda.core launch + numpy scalar conversion"] = lambda: launch(
            cs, cfg, ck, np.uintp(x.ptr), np.uintp(x.ptr), np.uintp(zero.ptr), np.int64(1)
        )
    except Exception as exc:  # reported, not fatal
        print(f"# cuda.core rows skipped: {exc}")
    for name, fn in rows.items():
        print(f"{us(fn, dev.synchronize):8.3f} us  {name}")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(N):
        cg.ops.add(x, zero, out=x)
        cg.empty(128, "float32")
    prof.disable()
    dev.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(14)


if __name__ == "__main__":
    main()
