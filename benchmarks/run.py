"""Run the benchmarks from a source checkout: ``python benchmarks/run.py [--quick] [--out DIR]``.

The same as ``cudagraphs bench``; the code lives in ``cudagraphs.bench``.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from cudagraphs.bench.runner import main

if __name__ == "__main__":
    sys.exit(main())
