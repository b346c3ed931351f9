"""Build and run the raw CUDA C baselines in ``benchmarks/raw/`` with nvcc."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import cudagraphs as cg

RAW = Path(__file__).resolve().parent / "raw"


def run(source: str, args: tuple[str, ...] = (), repeats: int = 1) -> list[str]:
    """Stdout of ``repeats`` runs of ``raw/<source>`` built for this GPU.

    Empty when not on the cuda backend or nvcc is missing.
    """
    nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    if cg.backend() != "cuda" or not Path(nvcc).exists():
        return []
    cc = "".join(map(str, cg.Device(0).compute_capability))
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / Path(source).stem
        subprocess.run(
            [nvcc, "-O2", f"-arch=sm_{cc}", str(RAW / source), "-o", str(exe)],
            check=True,
            capture_output=True,
            text=True,
        )
        return [
            subprocess.run([str(exe), *args], check=True, capture_output=True, text=True).stdout
            for _ in range(repeats)
        ]
