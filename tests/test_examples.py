"""Every example runs and passes its own checks, on each backend."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cudagraphs.distributed import _nccl

EXAMPLES = sorted((Path(__file__).parent.parent / "examples").glob("*.py"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example(backend: str, path: Path) -> None:
    if backend == "cuda" and path.stem == "data_parallel" and not _nccl.available():
        pytest.skip(f"{path.name} on GPUs needs nccl4py: {_nccl.INSTALL_HINT}")  # (an optional extra)
    env = {**os.environ, "CUDAGRAPHS_BACKEND": backend}
    r = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "OK" in r.stdout
