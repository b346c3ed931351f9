"""What keeping other libraries' memory costs a capture: the bench decoder's 8 buckets, with and without.

At the end of a capture that holds nodes cudagraphs did not record, the
graph's arguments are read and the live arrays of every library are counted
(``cudagraphs.interop._keep``). This times ``capture_all`` of the bench's
PyTorch decoder over 8 batch buckets (one graph each), interleaved with the
same capture where ``interop.keep_foreign`` keeps nothing, and reports the
number of objects the collector tracks and what one census takes.

Usage (GPU, PyTorch installed): PYTHONPATH=src python benchmarks/keepalive_cost.py [ROUNDS]
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from typing import Any

import cudagraphs as cg
from cudagraphs import interop
from cudagraphs.bench.decoder import make_decoder
from cudagraphs.interop import _keep


def main(rounds: int) -> None:
    import torch

    model = make_decoder(torch)
    tokens = torch.zeros(8, dtype=torch.long, device="cuda")
    pos = torch.zeros(8, dtype=torch.long, device="cuda")
    real = interop.keep_foreign

    def nothing(*args: Any) -> Any:
        return []

    def capture_all() -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        f = cg.graphed(lambda t, p: model(t, p), buckets=list(range(1, 9)), warmup=1).capture_all(tokens, pos)
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        f.close()
        return ms

    capture_all()  # (warm)
    on, off = [], []
    for _ in range(rounds):
        interop.keep_foreign = nothing  # type: ignore[assignment]
        off.append(capture_all())
        interop.keep_foreign = real  # type: ignore[assignment]
        on.append(capture_all())
    t0 = time.perf_counter()
    _keep._spans(_keep.registered(list(interop.libraries())), 0)
    census = (time.perf_counter() - t0) * 1e3
    print(f"objects the collector tracks: {len(gc.get_objects())}; one census: {census:.1f} ms")
    print(
        f"capture_all of 8 buckets (ms, median of {rounds}): keeping {statistics.median(on):.1f}, "
        f"not keeping {statistics.median(off):.1f}"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
