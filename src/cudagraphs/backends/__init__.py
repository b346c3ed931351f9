"""Backend selection: explicit name, then ``CUDAGRAPHS_BACKEND``, then auto.

Auto picks ``cuda`` when a GPU answers and ``sim`` otherwise. Each backend is
created once per process and shared.
"""

from __future__ import annotations

import threading

from .._config import settings
from .._errors import BackendUnavailableError
from .base import Backend

__all__ = ["Backend", "get_backend", "is_cuda_available", "resolve_name"]

_lock = threading.RLock()
_instances: dict[str, Backend] = {}
# why a backend could not be created; a fresh exception is raised each time,
# since re-raising one stored exception would pin every caller's frames
# (and the arrays in them) through its growing traceback
_failures: dict[str, str] = {}
_auto: list[str] = []


def _create(name: str) -> Backend:
    if name == "sim":
        from .sim import SimBackend

        return SimBackend()
    if name == "cuda":
        from .cuda import CudaBackend

        return CudaBackend()
    raise ValueError(f"unknown backend {name!r}; choose 'cuda' or 'sim'")


def get_backend(name: str | None = None) -> Backend:
    """Return the backend called ``name`` (default: the configured or auto one).

    Raises
    ------
    BackendUnavailableError
        If the named backend cannot run on this machine.
    ValueError
        If ``name`` is not a backend.
    """
    name = resolve_name(name)
    backend = _instances.get(name)
    if backend is not None:
        return backend
    with _lock:
        if name in _failures:
            raise BackendUnavailableError(_failures[name])
        if name not in _instances:
            try:
                _instances[name] = _create(name)
            except BackendUnavailableError as exc:
                _failures[name] = str(exc)
                raise
        return _instances[name]


def resolve_name(name: str | None = None) -> str:
    """The backend name that ``get_backend(name)`` would use."""
    if name is None:
        name = settings().backend
    if name is None:
        if not _auto:
            _auto.append("cuda" if is_cuda_available() else "sim")
        return _auto[0]
    if name not in ("cuda", "sim"):
        raise ValueError(f"unknown backend {name!r}; choose 'cuda' or 'sim'")
    return name


def is_cuda_available() -> bool:
    """Whether a CUDA GPU answers on this machine. Never raises."""
    try:
        get_backend("cuda")
        return True
    except Exception:
        return False
