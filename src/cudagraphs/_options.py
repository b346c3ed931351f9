"""The options of graphed callables, checked once: :class:`GraphedOptions`.

:func:`cudagraphs.graphed` and :class:`~cudagraphs.GraphModule` take them as
keywords and check them here (:meth:`GraphedOptions.checked`);
:class:`~cudagraphs.GraphedCallable` is made from the checked, frozen result.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from ._capture import capture_options
from ._device import Device, Stream, StreamLike
from ._pool import GraphPool
from .interop import _torch_rng

__all__ = ["FALLBACKS", "MAX_WARMUP", "GraphedOptions", "checked_params"]

MAX_WARMUP = 1000  # eager runs before a capture: more is a mistake (2**70 would never end)
FALLBACKS = ("raise", "eager")  # what a key whose capture is refused does


@dataclasses.dataclass(frozen=True, slots=True)
class GraphedOptions:
    """What a graphed callable is made with (see :func:`cudagraphs.graphed`), checked.

    Attributes
    ----------
    buckets : tuple of int or None
        The sizes along ``dim``, sorted, each once; None: graphs keyed by exact shape.
    dim : int
        The padded dimension.
    warmup : int
        Eager runs of the function before a key's capture (0 to :data:`MAX_WARMUP`).
    pool : GraphPool or None
        The pool the graphs share; None: the callable makes its own.
    stream : Stream or None
        Where calls replay; None: the caller's current stream.
    mode : str
        The capture mode.
    copy_outputs : bool
        Whether calls return copies of the static outputs.
    pad_value : object
        What padding rows are filled with (None: left as they are).
    device : Device
        The device: given, or the stream's, the pool's or the current one.
    fallback : str
        What a key whose capture is refused does: ``"raise"`` the
        CaptureError, or run the function ``"eager"``-ly from then on.
    grad : bool
        Whether calls in PyTorch's grad mode are differentiable (a forward
        and a backward graph per key: :mod:`cudagraphs._training`).
    params : tuple or None
        The tensors, besides the inputs, a plain function's gradients are
        taken for (``grad=True`` only; a module's are its parameters).
    generators : tuple of torch.Generator or None
        None: PyTorch's generators left alone; else the generators put in
        capture mode with every capture, besides the device's default one
        (see :func:`cudagraphs.capture`).
    """

    buckets: tuple[int, ...] | None
    dim: int
    warmup: int
    pool: GraphPool | None
    stream: Stream | None
    mode: str
    copy_outputs: bool
    pad_value: Any
    device: Device
    fallback: str = "raise"
    grad: bool = False
    params: tuple[Any, ...] | None = None
    generators: tuple[Any, ...] | None = None

    @classmethod
    def checked(
        cls,
        *,
        buckets: Sequence[int] | None,
        dim: int,
        warmup: int,
        pool: GraphPool | None,
        stream: Stream | StreamLike | None,
        mode: str,
        copy_outputs: bool,
        pad_value: Any,
        device: Device | int | None,
        fallback: str = "raise",
        grad: bool = False,
        params: Any = None,
        generators: bool | Sequence[Any] | None = None,
    ) -> GraphedOptions:
        """The options, checked (the keywords of :func:`cudagraphs.graphed`).

        Raises
        ------
        TypeError
            For buckets that are not a non-empty sequence, a warmup that is
            not an int, a stream, pool or device that is not cudagraphs', a
            ``grad`` that is not a bool, ``params`` that are not a sequence
            of tensors, generators that are not True or a list or tuple of
            CUDA ``torch.Generator`` objects.
        ValueError
            For buckets that are not positive integers, a negative ``dim``, a
            warmup out of range, an unknown mode or fallback, a pool or stream
            on another device, ``params`` without ``grad=True``, ``stream``
            with it.
        """
        sizes = None
        if buckets is not None:
            if isinstance(buckets, (str, bytes)) or not isinstance(buckets, Sequence) or not buckets:
                raise TypeError(f"buckets must be a non-empty sequence of sizes, got {buckets!r}")
            if any(isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1 for b in buckets):
                raise ValueError(f"buckets must be positive integers, got {list(buckets)}")
            sizes = tuple(sorted({int(b) for b in buckets}))
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 0:
            raise ValueError(f"dim must be a non-negative int, got {dim!r}")
        if isinstance(warmup, bool) or not isinstance(warmup, int):
            raise TypeError(f"warmup must be an int (eager runs before capturing), got {warmup!r}")
        if not 0 <= warmup <= MAX_WARMUP:
            raise ValueError(f"warmup must be in 0..{MAX_WARMUP} (eager runs before a capture), got {warmup}")
        if not isinstance(fallback, str) or fallback not in FALLBACKS:
            raise ValueError(f"fallback must be one of {FALLBACKS}, got {fallback!r}")
        if not isinstance(grad, bool):
            raise TypeError(
                f"grad must be a bool (True: calls in PyTorch's grad mode get a backward graph), got {grad!r}"
            )
        held = checked_params(params)
        if held is not None and not grad:
            raise ValueError(
                "params= names the tensors a graphed callable takes gradients for: it needs grad=True"
            )
        if grad and stream is not None:
            raise ValueError(
                "grad=True calls replay on PyTorch's current stream, where autograd orders the "
                "backward and the outputs' uses: stream= is not accepted with it"
            )
        gens = _torch_rng.check_generators(generators)
        resolved, stream = capture_options(device, stream, mode, pool)
        if stream is not None and stream.device is not resolved:
            raise ValueError(f"stream {stream} is on {stream.device}, the callable on {resolved}")
        return cls(
            buckets=sizes,
            dim=dim,
            warmup=warmup,
            pool=pool,
            stream=stream,
            mode=mode,
            copy_outputs=bool(copy_outputs),
            pad_value=pad_value,
            device=resolved,
            fallback=fallback,
            grad=grad,
            params=held,
            generators=gens,
        )


def checked_params(params: Any) -> tuple[Any, ...] | None:
    """``params`` as a tuple of tensors (None stays None), checked.

    Accepted: None, or a sequence or other iterable (``model.parameters()``)
    of tensors, each an object with ``requires_grad`` and ``data_ptr`` (a
    ``torch.Tensor``; a torch.nn.Module is refused: pass the module itself as
    the function, or its ``.parameters()``).

    Raises
    ------
    TypeError
        For anything else, naming what is accepted.
    """
    if params is None:
        return None
    accepted = "None or an iterable of torch tensors (e.g. model.parameters())"
    if isinstance(params, (str, bytes, dict)) or not hasattr(params, "__iter__"):
        raise TypeError(f"params must be {accepted}, got {type(params).__name__}")
    if hasattr(params, "parameters") and hasattr(params, "forward"):  # a module
        raise TypeError(f"params must be {accepted}, got a module: pass module.parameters()")
    held = tuple(params)
    for p in held:
        if not (hasattr(p, "requires_grad") and hasattr(p, "data_ptr")):
            raise TypeError(f"params must be {accepted}; an element is a {type(p).__name__}")
    return held
