"""A pytest plugin: after each test, the frames of finished calls still alive, and who holds them.

Usage (the test tree's conftest must be importable, as it is from the
repository root): ``PYTHONPATH=src:scripts:tests python -m pytest -p frame_leaks ...``.
A frame of a call that has returned stays alive only while something holds it
(a traceback, a list, C code); the arrays in its variables stay alive with it.
Each test reports the frames that appeared during it (so the test that leaks is
named, not a later one whose memory check fails), with the innermost one's
tracked holders and the count of references no tracked object holds.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import _holders  # type: ignore[import-not-found]

_known: set[int] = set()
_OURS = ("/cudagraphs/", "/tests/")  # frames of the library and of the tests (not pytest's own)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield
    _report(item.nodeid)


def _report(nodeid: str) -> None:
    gc.collect()
    gc.collect()
    frames = [o for o in gc.get_objects() if type(o).__name__ == "frame" and id(o) not in _known]
    new = [f for f in frames if any(p in f.f_code.co_filename for p in _OURS)]
    del frames
    _known.update(id(f) for f in new)
    backs = {id(f.f_back) for f in new if f.f_back is not None}
    innermost = [f for f in new if id(f) not in backs]  # (no new frame's f_back)
    del new
    while innermost:  # (each passed on alone: _holders counts the references made here)
        _one(nodeid, innermost.pop())


def _one(nodeid: str, frame: Any) -> None:
    chain: list[str] = []
    g = frame
    while g is not None and len(chain) < 8:
        chain.append(f"{g.f_code.co_name} ({g.f_code.co_filename.rsplit('/', 1)[-1]}:{g.f_lineno})")
        g = g.f_back
    held, unseen = _holders(frame)
    sys.stderr.write(
        f"\nFRAME LEAK after {nodeid}: {' <- '.join(chain)}; the innermost held by {held[:4]} "
        f"and by {unseen} untracked reference(s)\n"
    )
