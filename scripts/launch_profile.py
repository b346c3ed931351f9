"""cProfile of N eager Kernel.launch calls on the current backend (any tree on PYTHONPATH)."""
import cProfile
import pstats
import sys

import cudagraphs as cg

N = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
dev = cg.Device(0)
k = cg.Kernel('extern "C" __global__ void inc(float* p) { p[0] += 1.0f; }', "inc",
              host=lambda p: p.__iadd__(1))
cg.preload([k], dev)
x = cg.zeros(1, "float32")
k.launch(1, 1, x)
dev.synchronize()
prof = cProfile.Profile()
prof.enable()
for _ in range(N):
    k.launch(1, 1, x)
dev.synchronize()
prof.disable()
pstats.Stats(prof).sort_stats("tottime").print_stats(14)
