"""The C part's Lock: threading.Lock's subset (and RLock's) that compiled code takes directly.

The caching allocator's and the graphed callable's lock where the C part is
built (``_fastcall.Lock``; compiled modules take and give it through the
capsule ``_fastcall.lock_api``, without a method call).
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import pytest
from conftest import compiled_part_or_skip

fast = compiled_part_or_skip()


def test_the_lock() -> None:
    lock = fast.Lock()
    assert not lock.locked()
    assert lock.acquire(False) is True
    assert lock.locked()
    assert lock.acquire(blocking=False) is False
    lock.release()
    with pytest.raises(RuntimeError, match="release unlocked lock"):
        lock.release()
    with lock:
        assert lock.locked()
    assert not lock.locked()
    with pytest.raises(TypeError):
        fast.Lock(1)
    with pytest.raises(ValueError, match="non-blocking"):
        lock.acquire(False, timeout=1)
    with pytest.raises(ValueError, match="non-negative"):
        lock.acquire(timeout=-2)
    lock.acquire()
    start = time.perf_counter()
    assert lock.acquire(timeout=0.1) is False  # (held: the timeout ends the wait)
    assert time.perf_counter() - start >= 0.09
    assert lock.acquire(timeout=0) is False
    done: list[float] = []
    t = threading.Thread(target=lambda: (lock.acquire(), done.append(time.perf_counter()), lock.release()))
    t.start()
    time.sleep(0.1)
    assert not done  # a blocking acquire waits (the GIL released) for the holder
    lock.release()
    t.join(10)
    assert done
    assert lock.acquire(timeout=1) is True
    lock.release()


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs signal.setitimer (POSIX)")
@pytest.mark.parametrize("how", ["acquire", "with"])
def test_a_signal_ends_a_blocking_wait_for_the_lock(how: str) -> None:
    """Ctrl-C reaches a thread waiting for the allocator's lock, as with threading.Lock."""

    class Interrupted(Exception):
        pass

    def interrupt(signum: int, frame: Any) -> None:
        raise Interrupted

    lock = fast.Lock()
    holder_done = threading.Event()

    def hold() -> None:  # (let go after 5 s: a wait the signal cannot end fails, not hangs)
        holder_done.wait(5)
        lock.release()

    lock.acquire()
    holder = threading.Thread(target=hold)
    holder.start()
    old = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.2)
    start = time.perf_counter()
    try:
        with pytest.raises(Interrupted):
            if how == "acquire":
                lock.acquire()
            else:
                with lock:
                    pass
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        holder_done.set()
        holder.join(10)
    assert time.perf_counter() - start < 4  # ended by the signal, not by the holder
    assert not lock.locked()  # (the interrupted wait did not take it)


def test_the_lock_excludes_under_contention() -> None:
    """Four threads, each taking the lock 200 times around a read, a switch and a write."""
    lock = fast.Lock()
    box = [0]

    def work() -> None:
        for _ in range(200):
            with lock:
                seen = box[0]
                time.sleep(0)  # (another thread runs here: without the lock, an update is lost)
                box[0] = seen + 1
            if lock.acquire(timeout=1):
                box[0] += 1
                lock.release()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert box[0] == 4 * 200 * 2
    assert not lock.locked()


def test_the_reentrant_lock() -> None:
    """Lock(reentrant=True) is threading.RLock's subset: its owner takes it again, only it gives it back."""
    lock = fast.Lock(reentrant=True)
    with pytest.raises(RuntimeError, match="un-acquired"):
        lock.release()
    assert lock.acquire() is True
    assert lock.acquire(False) is True  # (the owner, again)
    with lock:
        assert lock.locked()
    got: list[Any] = []

    def other() -> None:
        got.append(lock.acquire(False))
        try:
            lock.release()
        except RuntimeError as e:
            got.append(str(e))
        got.append(lock.acquire(timeout=5))  # (waits for the owner's last release)
        got.append(time.perf_counter())
        lock.release()

    t = threading.Thread(target=other)
    t.start()
    time.sleep(0.1)
    lock.release()
    time.sleep(0.1)
    assert got[:2] == [False, "cannot release un-acquired lock"]
    assert len(got) == 2  # held once more: the other thread still waits
    released = time.perf_counter()
    lock.release()
    t.join(10)
    assert got[2] is True
    assert got[3] >= released
    assert not lock.locked()
    with pytest.raises(TypeError):
        fast.Lock(True)  # (keyword only)
