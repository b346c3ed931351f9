"""Where a call came from: the user's line, told apart from library code.

One rule (:func:`library_of_frame`) says which Python frames are not the
user's: those of cudagraphs, of the libraries in :data:`LIBRARIES` (array
libraries, kernel compilers, the CUDA bindings, and ``importlib`` and
``contextlib``), of the standard library, and of any module that declares
itself a library with a global ``__cudagraphs_library__ = "its name"`` (a
wrapper library of a user's own can do so, and the tests' stand-in
library does). Every refusal that names "the user's line" uses it: the
stack of a call refused now (:func:`user_line`), the traceback of an
error another library raised (:func:`raised_at`); warnings are given at
that line too (:func:`warn`).
"""

from __future__ import annotations

import linecache
import os
import sys
import sysconfig
import warnings
from types import FrameType, TracebackType
from typing import NamedTuple

__all__ = [
    "LIBRARIES",
    "Site",
    "library_of_frame",
    "library_of_module",
    "raised_at",
    "refused",
    "user_line",
    "warn",
]

LIBRARIES = {
    "cudagraphs": "cudagraphs",
    "torch": "PyTorch",
    "cupy": "CuPy",
    "cupyx": "CuPy",
    "cupy_backends": "CuPy",
    "triton": "Triton",
    "numba": "Numba",
    "cuda": "cuda-python",
    "numpy": "NumPy",
    "importlib": "importlib",
    "contextlib": "contextlib",
}
"""Top-level module -> the library's name in messages: code that is never the user's."""

_STDLIB = tuple(
    {os.path.join(os.path.realpath(sysconfig.get_paths()[k]), "") for k in ("stdlib", "platstdlib")}
)
_THIRD_PARTY = ("site-packages", "dist-packages")


def library_of_module(name: str) -> str | None:
    """The library a module (by its ``__name__``) belongs to, or None for the user's."""
    known = LIBRARIES.get(name.partition(".")[0])
    if known is not None:
        return known
    module = sys.modules.get(name)
    declared = getattr(module, "__cudagraphs_library__", None) if module is not None else None
    return declared if isinstance(declared, str) else None


def library_of_frame(frame: FrameType) -> str | None:
    """The library whose code ``frame`` runs (``"the standard library"`` too), or None: the user's."""
    g = frame.f_globals
    declared = g.get("__cudagraphs_library__")
    if isinstance(declared, str):
        return declared
    known = LIBRARIES.get(str(g.get("__name__", "")).partition(".")[0])
    if known is not None:
        return known
    path = frame.f_code.co_filename
    if path.startswith("<frozen"):
        return "the standard library"
    path = os.path.realpath(path)
    if path.startswith(_STDLIB) and not any(part in path for part in _THIRD_PARTY):
        return "the standard library"
    return None


def _at(frame: FrameType, line: int) -> str:
    return f"{frame.f_code.co_filename}:{line}"


def _caller() -> FrameType | None:
    """The innermost calling frame of user code; else the innermost outside cudagraphs; else None."""
    # (from this frame: compiled, the functions of compiled modules have none, and the innermost
    # Python frame may already be the caller's)
    frame: FrameType | None = sys._getframe(0)
    fallback = None
    while frame is not None:
        library = library_of_frame(frame)
        if library is None:
            return frame
        if fallback is None and library != "cudagraphs":
            fallback = frame
        frame = frame.f_back
    return fallback


def user_line() -> str:
    """``file:line`` of the innermost caller that is user code (see :func:`library_of_frame`).

    Where every caller is library code, the innermost one outside cudagraphs.
    """
    frame = _caller()
    return "<unknown>" if frame is None else _at(frame, frame.f_lineno)


def warn(message: str, category: type[Warning]) -> None:
    """``warnings.warn(message, category)`` at the user's line (as :func:`user_line` finds it)."""
    frame = _caller()
    if frame is None:
        warnings.warn(message, category, stacklevel=2)
        return
    g = frame.f_globals
    warnings.warn_explicit(
        message,
        category,
        frame.f_code.co_filename,
        frame.f_lineno,
        module=g.get("__name__"),
        registry=g.setdefault("__warningregistry__", {}),
    )


class Site(NamedTuple):
    """Where an error came from in the user's code (see :func:`raised_at`)."""

    line: str  # ``file:line`` of the innermost user frame of the traceback
    source: str  # the text of that line ("" where it cannot be read)
    operation: str  # the library function that frame called (``torch.cuda.synchronize``), or ""
    library: str  # the library that raised it (by the error's type, else that function's), or ""


def raised_at(exc: BaseException) -> Site:
    """Where ``exc`` came from: the innermost user frame of its traceback and what it called there.

    A library written in C (``torch.Tensor.item``) leaves no frame of its
    own: the operation is then "", and the source line shows the call. With
    no user frame in the traceback, the line is :func:`user_line`'s.
    """
    frames: list[tuple[FrameType, int, str | None]] = []
    tb: TracebackType | None = exc.__traceback__
    while tb is not None:
        frames.append((tb.tb_frame, tb.tb_lineno, library_of_frame(tb.tb_frame)))
        tb = tb.tb_next
    library = library_of_module(type(exc).__module__) or ""
    mine = [j for j, (_, _, lib) in enumerate(frames) if lib is None]
    if not mine:
        return Site(user_line(), "", "", library)
    j = mine[-1]
    frame, line, _ = frames[j]
    source = linecache.getline(frame.f_code.co_filename, line).strip()
    operation = ""
    for called, _, lib in frames[j + 1 :]:
        if lib is not None and lib != "the standard library":
            code = called.f_code
            qualname = getattr(code, "co_qualname", code.co_name)
            operation = f"{called.f_globals.get('__name__', '?')}.{qualname}"
            library = library or lib
            break
    return Site(_at(frame, line), source, operation, library)


def refused(exc: BaseException, site: Site, who: str, what: str, stream_handle: int) -> str:
    """How a refusal's message begins: who refused what, at the user's line, during which capture.

    ``site`` is :func:`raised_at` of ``exc``; the first line of ``exc``'s
    message closes it.
    """
    source = f" (`{site.source}`)" if site.source else ""
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    return (
        f"{who} refused {what} at {site.line}{source} while stream 0x{stream_handle:x} was being "
        f"captured ({type(exc).__name__}: {first})"
    )
