"""Stores: where the ranks of a communicator find its unique id.

Rank 0 makes the id (:meth:`Engine.unique_id`) and puts it in a store; the
other ranks wait for it there. A store is any object with ``set(key, value)``
and ``get(key)`` (bytes values): :class:`FileStore` (a file on a path every
rank sees), :class:`TCPStore` (PyTorch's, where PyTorch is installed), or
PyTorch's own stores as they are.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from .._errors import CollectiveTimeoutError

__all__ = ["FileStore", "Store", "TCPStore", "exchange"]


@runtime_checkable
class Store(Protocol):
    """What :func:`cudagraphs.distributed.init` needs of a store."""

    def set(self, key: str, value: bytes) -> Any:
        """Publish ``value`` under ``key``."""

    def get(self, key: str) -> Any:
        """The value under ``key``, waiting (up to the store's timeout) until it is set."""


class FileStore:
    """A store in a directory every rank can read (a shared file system, or /tmp on one host).

    Parameters
    ----------
    path : str or Path
        The directory (made if missing). Use a fresh one per job: a value
        left by an earlier job would be read as this job's.
    timeout : float
        Seconds :meth:`get` waits for a key before raising
        :class:`~cudagraphs.CollectiveTimeoutError`.
    """

    def __init__(self, path: str | os.PathLike[str], timeout: float = 60.0) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or a path, got {type(path).__name__}")
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self.path = Path(path)
        self.timeout = float(timeout)
        self.path.mkdir(parents=True, exist_ok=True)

    def _file(self, key: str) -> Path:
        if not isinstance(key, str) or not key:
            raise ValueError(f"a store key is a non-empty str, got {key!r}")
        return self.path / key.replace("/", "__")

    def set(self, key: str, value: bytes) -> None:
        """Write ``value`` under ``key`` (atomically: readers never see half of it)."""
        target = self._file(key)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        tmp.write_bytes(bytes(value))
        os.replace(tmp, target)

    def get(self, key: str) -> bytes:
        """The value under ``key``, polling until it appears or the timeout passes."""
        target = self._file(key)
        deadline = time.monotonic() + self.timeout
        delay = 0.001
        while True:
            try:
                return target.read_bytes()
            except FileNotFoundError:
                if time.monotonic() > deadline:
                    raise CollectiveTimeoutError(
                        f"no value for {key!r} appeared in {self.path} within {self.timeout:g} s: "
                        "start the rank that publishes it (rank 0), and give every rank the "
                        "same directory, on a file system they all see"
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.05)

    def __repr__(self) -> str:
        return f"<cudagraphs.distributed.FileStore {str(self.path)!r}>"


def TCPStore(host: str, port: int, *, world_size: int, is_master: bool, timeout: float = 60.0) -> Any:
    """PyTorch's ``torch.distributed.TCPStore``: a store served by one rank over TCP.

    The rank with ``is_master=True`` serves it on ``host:port``; the others
    connect. Needs PyTorch (``pip install torch``); on several machines, the
    one store is enough: NCCL then connects the ranks over the network.
    """
    try:
        from datetime import timedelta

        from torch.distributed import TCPStore as _TCPStore
    except ImportError as exc:
        raise ImportError(
            "TCPStore needs PyTorch (pip install torch); without it use "
            "cudagraphs.distributed.FileStore on a path every rank sees"
        ) from exc
    return _TCPStore(host, port, world_size, is_master, timedelta(seconds=timeout))


def check_store(store: Any) -> None:
    """TypeError unless ``store`` has the ``set(key, value)`` and ``get(key)`` a rank exchange needs."""
    if not (callable(getattr(store, "set", None)) and callable(getattr(store, "get", None))):
        raise TypeError(
            f"store must have set(key, value) and get(key) methods (a cudagraphs.distributed."
            f"FileStore or TCPStore, or a PyTorch store), got {type(store).__name__}"
        )


def exchange(store: Any, key: str, value: bytes | None, what: str) -> bytes:
    """Publish ``value`` under ``key`` (one rank), or wait for it (the others)."""
    check_store(store)
    if value is not None:
        store.set(key, value)
        return value
    try:
        got = store.get(key)
    except CollectiveTimeoutError:
        raise
    except Exception as exc:  # PyTorch's stores raise their own errors on a timeout
        if "timeout" in str(exc).lower() or "timed out" in str(exc).lower():
            raise CollectiveTimeoutError(f"{what}: {exc}") from exc
        raise
    return bytes(got)
