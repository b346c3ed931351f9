"""Work the simulated device runs: kernels (their host implementations) and host functions.

A kernel runs its numpy host implementation on views of device memory made
when it runs, from the addresses given at launch, as a GPU reads its
parameters; a :class:`~cudagraphs.backends.base.ContextualHost` gets the
device's :class:`~cudagraphs.backends.base.HostContext` first. Launches
beyond an H100's limits are refused as the driver refuses them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..base import CUDA_ERROR_INVALID_VALUE, ContextualHost, HostContext, KernelLaunch, Param
from .rules import error

__all__ = [
    "MAX_BLOCK",
    "MAX_GRID",
    "MAX_SHARED_MEM",
    "MAX_THREADS_PER_BLOCK",
    "HostCallback",
    "SimFunction",
    "check_dims",
    "kernel_work",
]

# an H100's launch limits (the driver answers CUDA_ERROR_INVALID_VALUE beyond them)
MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_BLOCK = (1024, 1024, 64)
MAX_THREADS_PER_BLOCK = 1024
MAX_SHARED_MEM = 48 << 10  # per block, without opting in to more


def check_dims(launch: KernelLaunch) -> None:
    """Refuse ``launch`` where it exceeds the device's limits, as the driver does."""
    grid, block, shared = launch.grid, launch.block, launch.shared_mem
    why = None
    if any(g > m for g, m in zip(grid, MAX_GRID)):
        why = f"grid {grid} exceeds the device's {MAX_GRID}"
    elif any(b > m for b, m in zip(block, MAX_BLOCK)):
        why = f"block {block} exceeds the device's {MAX_BLOCK}"
    elif block[0] * block[1] * block[2] > MAX_THREADS_PER_BLOCK:
        why = f"block {block} has more than {MAX_THREADS_PER_BLOCK} threads"
    elif shared > MAX_SHARED_MEM:
        why = f"{shared} B of shared memory exceeds the {MAX_SHARED_MEM} B a block gets"
    if why is not None:
        raise error(CUDA_ERROR_INVALID_VALUE, "cuLaunchKernel", why)


class HostCallback:
    """What :meth:`SimBackend.launch_host` returns (the driver's C callback)."""

    __slots__ = ("__weakref__", "fn")

    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn = fn


class SimFunction:
    """A loaded kernel: its name, parameters and host implementation."""

    __slots__ = ("host", "name", "params")

    def __init__(self, name: str, params: Sequence[Param], host: Callable[..., object] | None) -> None:
        self.name, self.params, self.host = name, list(params), host


def kernel_work(
    launch: KernelLaunch,
    view: Callable[[int, tuple[int, ...], tuple[int, ...], np.dtype], np.ndarray],
    resolve: Callable[[int, int, str], tuple[np.ndarray, int]],
    context: HostContext,
) -> Callable[[], None]:
    """The work of ``launch``: its function's host implementation, on ``view``s of device memory.

    ``resolve`` finds the memory behind a raw pointer argument; ``context``
    is what a :class:`~cudagraphs.backends.base.ContextualHost` gets first.
    """
    fn: SimFunction = launch.function
    host = fn.host
    assert host is not None
    run: Callable[..., object] = host
    if isinstance(host, ContextualHost):  # (it acts on this device: setting a condition)
        run = functools.partial(host, context)
    args_in = list(zip(launch.views, launch.values, fn.params))

    def work() -> None:
        # views are made when the kernel runs, from the addresses given
        # at launch, as a GPU reads its parameters
        args: list[Any] = []
        for spec, value, p in args_in:
            if not p.pointer:
                if isinstance(value, bytes):
                    args.append(np.frombuffer(value, dtype=p.dtype)[0])
                else:
                    args.append(p.dtype.type(value))
            elif spec is not None:
                args.append(view(*spec))
            elif value:
                buf, off = resolve(int(value), 0, "kernel access")
                args.append(buf[off:])
            else:
                args.append(None)
        run(*args)

    return work
