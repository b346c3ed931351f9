"""Make a copy of the package without its compiled files, to run it as plain Python.

The modules Cython compiles (_config.COMPILED_MODULES) and the C part are built
in place beside their sources; Python imports a built module before its
``.py``. The same source as plain Python is what ships where no compiler is,
and CI runs the suite on it too: ``PYTHONPATH=$(python scripts/plain_tree.py
DIR)`` puts this copy first.

Usage: python scripts/plain_tree.py DIR   (prints the directory to put on PYTHONPATH)
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
BUILT = ("*.so", "*.pyd", "__pycache__")  # (sources stay: the layer test reads _fastcall.c)


def plain_tree(dest: Path) -> Path:
    """Copy ``src/cudagraphs`` into ``dest`` without compiled files; return ``dest``."""
    shutil.rmtree(dest / "cudagraphs", ignore_errors=True)
    shutil.copytree(SRC / "cudagraphs", dest / "cudagraphs", ignore=shutil.ignore_patterns(*BUILT))
    return dest


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(plain_tree(Path(sys.argv[1]).resolve()))
