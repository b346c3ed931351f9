"""cProfile of 5 x 1000 captured launches, earlier tree and this one in one process.

See capture_launch_split.py for the trees.
"""

import cProfile
import io
import pstats
import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))
from capture_launch_split import trees

for name, (cg, _dev, k, x) in trees.items():
    p = cProfile.Profile()
    for _ in range(5):
        with cg.capture() as g:
            p.enable()
            for _ in range(1000):
                k.launch(1, 1, x)
            p.disable()
        g.close()
    s = io.StringIO()
    pstats.Stats(p, stream=s).sort_stats("tottime").print_stats(16)
    print("==", name)
    print(s.getvalue()[-2600:])
