"""Every Python block of the README and the docs is a complete program that runs (on sim).

A block fenced as ```python runs in a fresh interpreter with
``CUDAGRAPHS_BACKEND=sim``; a block right after a ``<!-- gpu -->`` line uses
PyTorch or CuPy and runs on the cuda backend, where the test backends include
it (skipped elsewhere); a block that is not meant to run is fenced as
something else (``bash``, ``text``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^(<!-- gpu -->\n)?```python\n(.*?)^```", re.S | re.M)
GPU = "cuda" in os.environ.get("CUDAGRAPHS_TEST_BACKENDS", "sim").split(",")


def _blocks() -> list[tuple[str, str]]:
    out = []
    for page in PAGES:
        for i, (gpu, code) in enumerate(BLOCK.findall(page.read_text())):
            out.append((f"{page.relative_to(ROOT)}#{i + 1}{'-gpu' if gpu else ''}", code))
    return out


BLOCKS = _blocks()


def test_the_docs_have_examples() -> None:
    assert len(BLOCKS) >= 8, [name for name, _ in BLOCKS]


@pytest.mark.parametrize(("name", "code"), BLOCKS, ids=[name for name, _ in BLOCKS])
def test_each_python_block_runs(name: str, code: str, tmp_path: Path) -> None:
    gpu = name.endswith("-gpu")
    if gpu and not GPU:
        pytest.skip("a GPU example (PyTorch/CuPy): runs with CUDAGRAPHS_TEST_BACKENDS=cuda,sim on a GPU")
    script = tmp_path / "block.py"
    script.write_text(code)
    backend = "cuda" if gpu else "sim"
    env = {**os.environ, "CUDAGRAPHS_BACKEND": backend, "PYTHONPATH": str(ROOT / "src")}
    run = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}"
