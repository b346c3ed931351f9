"""Delete each safety mechanism of the core, one at a time, and run the suite on sim.

A mechanism (a wait, a keep-alive, a refusal, a deferred release) whose
deletion leaves every test green has no test protecting it. Each mutation is
applied to a scratch copy of the tree, never to the checkout.

Usage: python scripts/mutation_check.py [-k NAME]   (prints one line per mutation)
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (name, file, code to delete or replace, replacement)
MUTATIONS = [
    ("deferred release runs at once", "src/cudagraphs/_recording.py",
     "    if device in _ACTIVE:\n        _QUEUE.append((device, fn, args))\n    else:\n        fn(*args)",
     "    fn(*args)"),
    ("finalizers release inline", "src/cudagraphs/_recording.py",
     '    """Queue ``fn(*args)`` for the next safe point (from finalizers: never blocks)."""\n    _QUEUE.append((device, fn, args))',
     '    """Queue ``fn(*args)`` for the next safe point (from finalizers: never blocks)."""\n    fn(*args)'),
    ("dead blocks released under any lock", "src/cudagraphs/_allocator.py",
     "owner._lock.acquire(False):", "owner._lock.acquire():"),
    ("capture keeps nothing alive", "src/cudagraphs/_recording.py",
     "                if block is None or block._ref.owner not in owners:\n                    keep.append(o)",
     "                pass"),
    ("other threads' work recorded", "src/cudagraphs/_recording.py",
     "        if self.thread != threading.get_ident():\n            raise CaptureError(\n                f\"{work.kind",
     "        if False:\n            raise CaptureError(\n                f\"{work.kind"),
    ("refused work recorded", "src/cudagraphs/_recording.py",
     "        if work.refuse is not None:\n            self.fail(work.refuse)", ""),
    ("device sync allowed during captures", "src/cudagraphs/_device.py",
     '        _recording.forbid(self, None, "Device.synchronize()", device_wide=True)\n', ""),
    ("stream closed while captured", "src/cudagraphs/_device.py",
     "        if self._recording is not None:\n            raise CaptureError(\n                f\"Stream.close()",
     "        if False:\n            raise CaptureError(\n                f\"Stream.close()"),
    ("body after the end accepted", "src/cudagraphs/_recording.py",
     "        if not self.active:\n            raise RuntimeError(", "        if False:\n            raise RuntimeError("),
    ("embedded graph not kept", "src/cudagraphs/_graph.py",
     '        submit(stream, Work("child", lambda raw, _: backend.capture_node(raw, "child", child),\n                            keep=(self,)))',
     '        submit(stream, Work("child", lambda raw, _: backend.capture_node(raw, "child", child)))'),
    ("strided views passed as pointers", "src/cudagraphs/_kernel.py",
     "                if not a.is_contiguous:\n                    raise ValueError(",
     "                if False:\n                    raise ValueError("),
    ("misaligned views accepted", "src/cudagraphs/_array.py",
     "    if offset % itemsize or any(s % itemsize for s in st):", "    if False:"),
    ("integers wrap", "src/cudagraphs/_transfer.py",
     "        if lo < info.min or hi > info.max:", "        if False:"),
    ("update keeps old parameters", "src/cudagraphs/_graph.py",
     "        _recording.later(self.device, release_resources, old)\n", ""),
    ("pools never return memory", "src/cudagraphs/_pool.py",
     "        _recording.release(self.device, _give_back, self.device.allocator, segments, streams)",
     "        pass"),
    ("sim keeps condition handles", "src/cudagraphs/backends/sim.py",
     "                _COND_REFS.pop(handle, None)\n                CONDITIONS.pop(handle, None)",
     "                _COND_REFS.pop(handle, None)"),
    ("set_arg skips the shape check", "src/cudagraphs/_patch.py",
     "        if (view.shape, view.strides, view.dtype) != (recorded.shape, recorded.strides, recorded.dtype):",
     "        if False:"),
    ("host slot frees with the slot", "src/cudagraphs/_scalar.py",
     "        self._bytes: np.ndarray | None = pinned_array(dev, nbytes)",
     "        self._bytes: np.ndarray | None = pinned_array(dev, nbytes).copy()"),
    ("unused conditions reach the driver", "src/cudagraphs/_capture.py",
     "            if rec.conditions:\n", "            if False:\n"),
    ("loop guard omitted", "src/cudagraphs/_control.py",
     "            if exc_type is None and self._guard is not None:", "            if False:"),
]


def _suite(tree: Path) -> bool:
    """Whether the suite passes on sim in ``tree`` (a hang counts as a failure)."""
    try:
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                            "--timeout=120", "tests"], cwd=tree, capture_output=True, text=True,
                           env={"CUDAGRAPHS_BACKEND": "sim", "PATH": "/usr/bin:/bin",
                                "PYTHONPATH": str(tree / "src")}, timeout=900)
    except subprocess.TimeoutExpired:
        return False
    return r.returncode == 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-k", help="only mutations whose name contains this")
    args = parser.parse_args()
    survived = 0
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns(".venv", ".git", ".baseline", "out"))
        if not _suite(tree):
            print("the suite fails without any mutation: fix that first")
            return 2
        for name, rel, old, new in MUTATIONS:
            if args.k and args.k not in name:
                continue
            path = tree / rel
            original = path.read_text()
            if original.count(old) != 1:
                print(f"STALE  {name}: the code to mutate is not in {rel} exactly once")
                survived += 1
                continue
            path.write_text(original.replace(old, new))
            try:
                killed = not _suite(tree)  # a hang (a deadlock) is a detection too
            finally:
                path.write_text(original)
            survived += not killed
            print(f"{'killed' if killed else 'SURVIVED'}  {name}", flush=True)
    print(f"{survived} mutation(s) survived")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
