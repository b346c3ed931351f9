"""PyTorch's random numbers inside cudagraphs' captures: the generators' bookkeeping.

PyTorch's CUDA generators (Philox) are graph-safe only in *capture mode*: a
random op on a capturing stream takes its seed and offset from two device
tensors of the generator's state, plus an offset counted during the capture
(``offset_intragraph``), and each replay must first copy the host seed and
offset into those tensors and advance the host offset by what the capture
drew. PyTorch (2.4 to 2.11) does that only through a ``torch.cuda.CUDAGraph``
object: its ``capture_begin`` puts the registered generators in capture mode,
``capture_end`` takes them out and keeps the increment, ``replay`` does the
copy and the advance, then launches its own executable.

So each cudagraphs graph whose capture drew PyTorch random numbers keeps a
*shadow*: a ``torch.cuda.CUDAGraph`` that captures nothing, on a private side
stream (:class:`Shadow`). Its ``capture_begin`` runs before cudagraphs'
``cuStreamBeginCapture`` (and before the capture's ``torch.cuda.MemPool``
is entered: registering a generator allocates its two tensors), its
``capture_end`` after cudagraphs' capture ended, whatever ended it (else
every later eager random op of PyTorch fails), and its ``replay`` on the
replay stream before each launch of the graph (:meth:`Shadow.__call__`, the
graph's ``_rng`` hook). While a shadow is open, PyTorch's allocator counts
a capture underway, and a ``torch.cuda.MemPool`` that dies then aborts the
process: cudagraphs' releases, on every thread, wait until it ends
(:func:`cudagraphs._recording.hold`). A capture that drew nothing keeps no
shadow: its replays pay nothing. The default generator of the capture's
device is always registered; a ``torch.Generator(device="cuda")`` of the
user's is registered when named by ``generators=``.

Which torch works this way is decided once by a self-test (:func:`works`):
after 2.11 PyTorch tracks RNG per capture, and the shadow would not be
seen; then random ops inside captures are refused by name
(:func:`refusal`), never replayed with wrong numbers.

Threads: PyTorch 2.11's generator state has one capture-mode flag and one
intragraph counter, so captures that use a generator are serialized (a lock
per generator, held from the shadow's begin to its end), and so are shadow
replays against them. Eager random ops on the same generator from another
thread while a capture is in progress fail in PyTorch itself ("Offset
increment outside graph capture").
"""

from __future__ import annotations

import sys
import threading
import warnings
from collections.abc import Sequence
from typing import Any

from .. import _recording
from .._errors import CaptureError
from .._where import raised_at, refused

__all__ = ["Shadow", "begin", "check_generators", "refusal", "works"]

# PyTorch's error for a random op on a capturing stream whose generator is not in capture mode
# (2.11: CUDAGeneratorImpl.cpp, "Attempt to increase offset for a CUDA generator not in
# capture mode.")
_NOT_IN_CAPTURE = "generator not in capture mode"
# cuRAND's host API inside a capture, refused by CuPy (curand.setStream: NotImplementedError
# "calling cuRAND API during stream capture is currently unsupported")
_CURAND = "curand api during stream capture"
_EMPTY = "The CUDA Graph is empty"  # (TORCH_WARN of a shadow's capture_end: expected)

_locks: dict[int, threading.RLock] = {}  # by id() of a generator: serializes its captures
_locks_lock = threading.Lock()
_sides: dict[int, Any] = {}  # a side stream per device index, where shadows capture nothing
_verdict: list[Any] = [None, ""]  # self-test: None untested, True works, False not; why not
_test_lock = threading.Lock()
_here = threading.local()  # .open: the shadows this thread has begun and not ended


def check_generators(generators: Any) -> tuple[Any, ...] | None:
    """The ``generators=`` option, checked: None, or a tuple of CUDA ``torch.Generator`` objects.

    None (the default) leaves PyTorch's generators alone (a random-number
    call in the capture is refused, naming this option); True puts the
    device's default generator in capture mode (an empty tuple here); a list
    or tuple of generators puts those in capture mode too.

    Raises
    ------
    TypeError
        For anything but None, True, or a list or tuple of ``torch.Generator``
        objects of a CUDA device.
    """
    if generators is None or generators is False:
        return None
    if generators is True:
        return ()
    if not isinstance(generators, (list, tuple)):
        raise TypeError(
            "generators must be True or a list or tuple of torch.Generator(device='cuda') objects, "
            f"got {type(generators).__name__}"
        )
    torch = sys.modules.get("torch")
    out: list[Any] = []
    for g in generators:
        if torch is None or not isinstance(g, torch.Generator) or g.device.type != "cuda":
            raise TypeError(
                "generators must be True or a list or tuple of torch.Generator(device='cuda') "
                f"objects, got an element {g!r}"
            )
        if not any(g is o for o in out):
            out.append(g)
    return tuple(out)


def _lock_of(gen: Any) -> threading.RLock:
    with _locks_lock:
        lock = _locks.get(id(gen))
        if lock is None:
            lock = _locks[id(gen)] = threading.RLock()
        return lock


def _side(torch: Any, index: int) -> Any:
    side = _sides.get(index)
    if side is None:
        side = _sides[index] = torch.cuda.Stream(torch.device("cuda", index))
    return side


class Shadow:
    """The generator bookkeeping of one graph: an empty ``torch.cuda.CUDAGraph``.

    Made and begun by :func:`begin`; :meth:`end` ends it and says whether
    the capture drew numbers; a graph whose capture did calls the shadow
    before each launch (:meth:`__call__`) and keeps it as long as its
    executable: the shadow's destruction unregisters the generators and may
    free the device tensors the graph's kernels read.
    """

    __slots__ = ("generators", "graph", "index", "locks", "open", "pool", "streams", "torch")

    def __init__(self, torch: Any, index: int, generators: Sequence[Any]) -> None:
        self.torch = torch
        self.index = index
        default = torch.cuda.default_generators[index]
        self.generators = [default, *(g for g in generators if g is not default)]
        self.locks = [_lock_of(g) for g in sorted(self.generators, key=id)]
        self.graph = torch.cuda.CUDAGraph()
        self.streams: dict[int, Any] = {}  # PyTorch's stream object of each replay stream
        self.open = False
        self.pool: Any = None  # the id of the allocator's pool of its capture (see _abandon)

    def _begin(self, synchronize: bool) -> None:
        torch = self.torch
        # (from capture_begin to capture_end PyTorch's allocator counts a capture underway, and a
        # MemPool that dies meanwhile aborts the process: cudagraphs' releases wait, see hold)
        _recording.hold()
        for lock in self.locks:
            lock.acquire()
        try:
            if synchronize:  # (capture_begin rewrites the tensors replays in flight read)
                torch.cuda.synchronize(self.index)
            for g in self.generators[1:]:  # (the default one: capture_begin registers it)
                self.graph.register_generator_state(g)
            self.pool = torch.cuda.graph_pool_handle()
            with torch.cuda.stream(_side(torch, self.index)):
                self.graph.capture_begin(pool=self.pool, capture_error_mode="relaxed")
            self.open = True
            _open_here().append(self)
        except BaseException:
            self._release()
            raise

    def _release(self) -> None:
        for lock in reversed(self.locks):
            lock.release()
        _recording.unhold()

    def end(self) -> bool:
        """End the shadow's capture (idempotent); whether the capture drew random numbers.

        Called after cudagraphs' capture ended, whatever ended it. The
        increment PyTorch recorded is not readable from Python: one replay of
        the shadow shows it (the host offsets move by it), and the offsets
        are set back.
        """
        if not self.open:
            return False
        self.open = False
        torch = self.torch
        try:
            opened = _open_here()
            if self in opened:
                opened.remove(self)
            side = _side(torch, self.index)
            try:
                with torch.cuda.stream(side), warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message=_EMPTY)
                    self.graph.capture_end()
            except BaseException:
                self._abandon(side)
                raise
            before = [g.get_offset() for g in self.generators]
            with torch.cuda.stream(side):
                self.graph.replay()
            drew = False
            for g, offset in zip(self.generators, before):
                if g.get_offset() != offset:
                    g.set_offset(offset)
                    drew = True
            return drew
        finally:
            self._release()

    def _abandon(self, side: Any) -> None:
        """Undo what a failed ``capture_end`` left: the allocator's capture, the generators' capture mode.

        PyTorch (2.11) ends the allocator's routing to the graph's pool and
        takes the generators out of capture mode only after
        ``cudaStreamEndCapture`` succeeded. It fails when the shadow's capture
        was invalidated: a device-wide synchronize in the captured code
        invalidates every capture on the device. Left so, the allocator would
        count a capture underway for good (every MemPool that dies later
        aborts the process) and every eager random op would fail. The routing
        is ended here (and the pool released, which the graph's ``reset`` does
        only after a capture that ended), and a fresh graph's empty capture
        takes the generators out of capture mode; the failed graph holds no
        graph of the driver's.
        """
        torch = self.torch
        try:
            torch._C._cuda_endAllocateToPool(self.index, self.pool)
        except RuntimeError:
            pass  # (ended already: what failed came after, and the graph's reset releases the pool)
        else:  # (its reset would not: capture_end failed before the capture counted as ended)
            torch._C._cuda_releasePool(self.index, self.pool)
        # (the failed graph dies once the fresh one registered the generators: the last graph
        # unregistered frees a generator's device tensors, which other graphs' kernels may read)
        failed, self.graph = self.graph, torch.cuda.CUDAGraph()
        for g in self.generators[1:]:
            self.graph.register_generator_state(g)
        with torch.cuda.stream(side), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_EMPTY)
            self.graph.capture_begin(capture_error_mode="relaxed")
            self.graph.capture_end()
        del failed

    def __call__(self, handle: int) -> None:
        """Before a launch of the graph on stream ``handle``: the generators advance.

        PyTorch's ``replay`` copies each generator's seed and offset to its
        device tensors on that stream, advances the host offset by what the
        capture drew, and launches the shadow's empty graph there.
        """
        torch = self.torch
        for lock in self.locks:
            lock.acquire()
        try:
            if torch._C._cuda_getCurrentRawStream(self.index) == handle:
                self.graph.replay()
                return
            stream = self.streams.get(handle)
            if stream is None:
                stream = self.streams[handle] = _torch_stream(torch, handle, self.index)
            with torch.cuda.stream(stream):
                self.graph.replay()
        finally:
            for lock in reversed(self.locks):
                lock.release()


def _torch_stream(torch: Any, handle: int, index: int) -> Any:
    if handle == 0:
        return torch.cuda.default_stream(index)
    return torch.cuda.ExternalStream(handle, device=torch.device("cuda", index))


def _open_here() -> list[Shadow]:
    opened = getattr(_here, "open", None)
    if opened is None:
        opened = _here.open = []
    return opened


def begin(device: Any, generators: Sequence[Any] | None) -> Shadow | None:
    """Put PyTorch's generators in capture mode for a capture on ``device``; its shadow, or None.

    None where the capture did not ask for it (``generators`` None), where
    nothing of PyTorch's can draw numbers in the capture (PyTorch not
    imported, no CUDA, a backend whose memory PyTorch cannot see), where
    this torch fails the self-test (:func:`works`: its random ops are then
    refused by :func:`refusal`), and inside another capture of this thread
    (see the Notes). Call before the capture begins, and :meth:`Shadow.end`
    after it ended.

    Raises
    ------
    ValueError
        For a generator of another device than the capture's.

    Notes
    -----
    A capture that this thread begins inside another capture it makes gets
    no shadow: PyTorch 2.11 counts one capture per generator, and its
    bookkeeping calls (a synchronize, an instantiation) are unsafe inside a
    capture; random numbers drawn there are not supported.
    """
    torch = sys.modules.get("torch")
    if generators is None or torch is None or not device.backend.capabilities.shares_memory:
        return None
    if not torch.cuda.is_available():
        return None
    for g in generators:
        if g.device.index is not None and g.device.index != device.index:
            raise ValueError(
                f"generator {g!r} is on cuda:{g.device.index}, the capture on device {device.index}: "
                "pass the generators of the capture's device"
            )
    if _open_here() or _recording.captures_here() or _recording.unsafe_blocker() is not None:
        return None
    if not works(device):
        return None
    shadow = Shadow(torch, device.index, generators)
    shadow._begin(synchronize=not _recording.active(device))
    return shadow


def works(device: Any) -> bool:
    """Whether the shadow keeps PyTorch's random numbers right in cudagraphs' captures (tested once).

    The test: a shadow begun, a capture of cudagraphs' own (the driver's
    stream capture) that draws ``uniform_`` on PyTorch's default generator,
    the shadow ended; it works when PyTorch accepted the draw and the
    shadow's replay advanced the generator. The generator's state is set
    back afterwards. A test that cannot run (an API this torch lacks) says
    it does not work.
    """
    verdict = _verdict[0]
    if verdict is not None:
        return bool(verdict)
    with _test_lock:
        if _verdict[0] is None:
            try:
                _verdict[0], _verdict[1] = _self_test(sys.modules["torch"], device)
            except Exception as exc:  # (an API this torch lacks: its random ops are refused)
                _verdict[0], _verdict[1] = False, f"{type(exc).__name__}: {exc}"
    return bool(_verdict[0])


def _self_test(torch: Any, device: Any) -> tuple[bool, str]:
    index = device.index
    gen = torch.cuda.default_generators[index]
    state = gen.get_state()
    buf = torch.empty(4, device=torch.device("cuda", index))
    stream = torch.cuda.Stream(torch.device("cuda", index))
    ours = device.external_stream(int(stream.cuda_stream))
    backend = device.backend
    shadow = Shadow(torch, index, ())
    why = ""
    try:
        shadow._begin(synchronize=False)
        try:
            backend.capture_begin(ours._raw, "relaxed")
            try:
                with torch.cuda.stream(stream):
                    buf.uniform_()
            except Exception as exc:  # (the torch this test is about refuses)
                why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            finally:
                backend.destroy(backend.capture_end(ours._raw))
        finally:
            drew = shadow.end()
        if not why and not drew:
            why = "the shadow's replay did not advance the default generator"
    finally:
        gen.set_state(state)
    return not why, why


def refusal(exc: BaseException, stream_handle: int) -> CaptureError | None:
    """The CaptureError for a random-number call that ``exc`` says a capture cannot take, or None.

    PyTorch's "generator not in capture mode" (a ``torch.Generator`` not
    named by ``generators=``, or a torch whose generators cudagraphs cannot
    put in capture mode) and CuPy's refusal of cuRAND's host API.
    """
    text = f"{type(exc).__name__}: {exc}"
    low = text.lower()
    if _NOT_IN_CAPTURE in low:
        what = "PyTorch"
        torch = sys.modules.get("torch")
        version = getattr(torch, "__version__", "?")
        if _verdict[0] is False:
            why = (
                f"cudagraphs cannot put PyTorch {version}'s generators in capture mode (its "
                f"self-test: {_verdict[1]}): draw the numbers outside the capture and pass them "
                "in, or use cg.random"
            )
        else:
            why = (
                "its generator is not in capture mode: pass generators=True (the default "
                "generator) or generators=[gen, ...] (your torch.Generator objects too) to "
                "cg.capture, cg.graphed or GraphModule, and every replay draws new numbers; a "
                "capture nested in another capture of this thread cannot draw them "
                f"(PyTorch {version})"
            )
    elif _CURAND in low:
        what = "CuPy"
        why = (
            "cuRAND's host API (cupy.random's legacy functions, RandomState) keeps its state "
            "on the host, so a graph would replay the same numbers: draw them outside the "
            "capture, or use cg.random, whose state lives on the device"
        )
    else:
        return None
    site = raised_at(exc)
    op = f" {site.operation}" if site.operation else ""
    begins = refused(exc, site, what, f"a random-number call{op}", stream_handle)
    return CaptureError(f"{begins}: {why}. The capture was undone; the stream and its memory are usable")
