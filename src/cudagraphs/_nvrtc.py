"""Compiling CUDA C++ with NVRTC, shared by every backend.

cuda.core's ``Program`` compiles (with its on-disk program cache, keyed by
source, options, target and NVRTC version); cuda.core is imported only when
a kernel is first compiled, so importing cudagraphs never needs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._config import settings
from ._errors import KernelCompileError

__all__ = ["NvrtcUnavailable", "available", "compile_cubin"]

_caches: dict[str, Any] = {}
_state: list[bool] = []  # whether NVRTC could be loaded, once known


class NvrtcUnavailable(RuntimeError):
    """NVRTC (the runtime compiler library) or cuda.core cannot be loaded here."""


def available() -> bool | None:
    """Whether NVRTC compiled something in this process (None: not tried yet)."""
    return _state[0] if _state else None


def compile_cubin(source: str, name: str, arch: str, options: Sequence[str]) -> bytes:
    """Compile ``source`` to a cubin for ``arch`` (e.g. ``"sm_90"``).

    Raises
    ------
    KernelCompileError
        With NVRTC's log when the source does not compile.
    NvrtcUnavailable
        When NVRTC or cuda.core cannot be loaded.
    """
    if _state and not _state[0]:
        raise NvrtcUnavailable("NVRTC could not be loaded earlier in this process")
    try:
        from cuda.core import Program, ProgramOptions
        from cuda.core._utils.cuda_utils import NVRTCError
    except Exception as exc:
        _state[:] = [False]
        raise NvrtcUnavailable(f"cuda.core is not importable: {exc}") from exc
    macros = [o[2:] for o in options if o.startswith("-D")]
    defines = [tuple(m.split("=", 1)) if "=" in m else m for m in macros]
    opts = ProgramOptions(name=f"{name}.cu", arch=arch, std="c++17", define_macro=defines or None)
    try:
        program = Program(source, "c++", opts)
    except Exception as exc:
        _state[:] = [False]
        raise NvrtcUnavailable(f"NVRTC cannot be loaded: {exc}") from exc
    try:
        cache = _program_cache()
        # (`is not None`: the cache has a length, and an empty one is false; it is filled on a miss)
        code = program.compile("cubin", cache=cache) if cache is not None else program.compile("cubin")
    except NVRTCError as exc:
        log = str(exc).split("compilation log:", 1)[-1]
        raise KernelCompileError(name, log) from None
    except Exception as exc:
        if "nvrtc" in type(exc).__name__.lower() or "DynamicLib" in type(exc).__name__:
            _state[:] = [False]
            raise NvrtcUnavailable(f"NVRTC cannot be loaded: {exc}") from exc
        raise
    finally:
        program.close()
    _state[:] = [True]
    return bytes(code.code)


def _program_cache() -> Any:
    """The on-disk cache of compiled kernels (``cache_dir/kernels``), None where it cannot be made."""
    path = str(settings().cache_dir / "kernels")
    if path not in _caches:
        try:
            from cuda.core.utils import FileStreamProgramCache

            _caches[path] = FileStreamProgramCache(path)
        except OSError:  # read-only home: compile without a disk cache
            _caches[path] = None
    return _caches[path]
