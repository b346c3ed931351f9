"""Random numbers that stay random across graph replays: Philox4x32-10 with its state on the device.

A :class:`Generator` keeps its seed and its offset (the first unused Philox
counter) in a two-word device array allocated when it is made. Each draw is
two kernels queued through the one submission path: the draw, which reads
the seed and offset *when it runs*, and a one-thread kernel that advances the
offset on the device by the counters the draw used (see ``random.cu`` for why
two). A graph that captured a draw therefore draws new numbers on every
replay, and a sequence of draws replayed gives exactly what the same
sequence gives eagerly. cuRAND's host-side generators cannot do this (CuPy
refuses them inside a capture); PyTorch's graph-safe generator does it the
same way.

Element ``i`` of a draw (in C order of the output's shape) uses the Philox
block of counter ``offset + i // K`` (``K`` values per block of four 32-bit
words), whatever the grid, so the numpy reference below, which the ``sim``
backend runs, is the specification of the stream, bit for bit for
``uniform`` and ``randint``.

This module sits with the arrays and the built-in ops: it imports only
layers below it.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ._array import DeviceArray, empty
from ._builtin_kernels import _LAYOUT, MAX_NDIM, _make, layout
from ._device import Device, Stream, StreamLike, as_device, as_stream, resolve_stream
from ._dtypes import SUPPORTED, normalize_dtype
from ._kernel import Kernel

__all__ = [
    "FLOAT_DTYPES",
    "INT_DTYPES",
    "Generator",
    "default_generator",
    "normal",
    "philox4x32_10",
    "randint",
    "seed",
    "uniform",
]

SOURCE = (Path(__file__).parent / "ops" / "kernels" / "random.cu").read_text()
_MASK = np.uint64(0xFFFFFFFF)
_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85)
_TWO64 = 1 << 64

# output dtype -> (C storage type, arithmetic type, CG_STORE)
_FLOAT_TYPES = {
    "float16": ("unsigned short", "float", "1"),
    "bfloat16": ("unsigned short", "float", "2"),
    "float32": ("float", "float", "0"),
    "float64": ("double", "double", "0"),
}
FLOAT_DTYPES = tuple(n for n in _FLOAT_TYPES if n in SUPPORTED)
"""The output dtypes of :meth:`Generator.uniform` and :meth:`Generator.normal`."""
INT_DTYPES = ("int32", "int64")
"""The output dtypes of :meth:`Generator.randint`."""
_INT_TYPES = {"int32": "int", "int64": "long long"}
_BLOCK = (256, 1, 1)
_STATE = np.dtype(np.uint64)


# the numpy reference, run by the sim backend ------------------------------------------
def philox4x32_10(counter: Any, key: Any) -> np.ndarray:
    """Philox4x32-10 on the host: the blocks of ``counter`` under ``key``.

    Parameters
    ----------
    counter : array_like of uint32, shape (..., 4)
    key : array_like of uint32, shape (2,)

    Returns
    -------
    numpy.ndarray of uint32, shape (..., 4)
        Random123's ``philox4x32_R(10, counter, key)``, word for word.

    Raises
    ------
    TypeError
        For words that are not integers.
    ValueError
        For words out of 0..2**32-1, or shapes other than these.
    """
    c = _words("counter", counter)
    k = _words("key", key)
    if c.shape[-1:] != (4,) or k.shape != (2,):
        raise ValueError(
            f"philox4x32_10 takes counters of shape (..., 4) and a key of shape (2,); "
            f"got {c.shape} and {k.shape}"
        )
    words = _philox(c[..., 0], c[..., 1], c[..., 2], c[..., 3], k[0], k[1])
    return np.stack(words, axis=-1).astype(np.uint32)


def _words(what: str, value: Any) -> np.ndarray:
    """``value`` checked to hold 32-bit words, as uint64 (what :func:`_philox` computes in)."""
    a = np.asarray(value)
    if a.dtype.kind not in "iuO" or (a.dtype.kind == "O" and not all(_is_int(w) for w in a.flat)):
        raise TypeError(f"philox4x32_10: {what} must hold integers (uint32 words), got {a.dtype} values")
    if a.size and not (int(a.min()) >= 0 and int(a.max()) <= 0xFFFFFFFF):
        raise ValueError(f"philox4x32_10: {what} holds values out of 0..2**32-1")
    return a.astype(np.uint64)


def _philox(c0: Any, c1: Any, c2: Any, c3: Any, k0: Any, k1: Any) -> tuple[np.ndarray, ...]:
    # uint64 arithmetic on 32-bit values: a product of two fits, its halves are mulhi/mullo
    for r in range(10):
        if r:
            k0, k1 = (k0 + _W0) & _MASK, (k1 + _W1) & _MASK
        p0, p1 = _M0 * c0, _M1 * c2
        c0, c1, c2, c3 = (
            (p1 >> np.uint64(32)) ^ c1 ^ k0,
            p1 & _MASK,
            (p0 >> np.uint64(32)) ^ c3 ^ k1,
            p0 & _MASK,
        )
    return c0, c1, c2, c3


def _blocks(state: np.ndarray, nc: int) -> np.ndarray:
    """The words of counters ``offset .. offset + nc - 1`` under ``seed``: uint64, shape (nc, 4)."""
    seed, offset = state.reshape(-1)[:2]
    counters = np.arange(nc, dtype=np.uint64) + offset  # wraps modulo 2^64, as on the device
    zero = np.zeros(nc, np.uint64)
    k0, k1 = seed & _MASK, seed >> np.uint64(32)
    return np.stack(_philox(counters & _MASK, counters >> np.uint64(32), zero, zero, k0, k1), axis=-1)


def _u64(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    out: np.ndarray = (hi << np.uint64(32)) | lo
    return out


def _mulhi64(a: np.ndarray, b: int) -> np.ndarray:
    """The upper 64 bits of ``a * b`` (uint64), from 32-bit halves (Hacker's Delight's mulhu)."""
    a0, a1 = a & _MASK, a >> np.uint64(32)
    b0, b1 = np.uint64(b & 0xFFFFFFFF), np.uint64(b >> 32)
    t = a1 * b0 + ((a0 * b0) >> np.uint64(32))
    w1 = (t & _MASK) + a0 * b1
    hi: np.ndarray = a1 * b1 + (t >> np.uint64(32)) + (w1 >> np.uint64(32))
    return hi


def _store(out: np.ndarray, values: np.ndarray) -> None:
    out[...] = values[: out.size].reshape(out.shape)


def _host_uniform(
    out: np.ndarray, state: np.ndarray, n: Any, low: Any, scale: Any, top: Any, *rest: Any
) -> None:
    acc = np.dtype(type(low))
    n = int(n)
    if acc == np.float64:
        w = _blocks(state, -(-n // 2))
        u = (_u64(w[:, 0::2], w[:, 1::2]).reshape(-1) >> np.uint64(11)).astype(np.float64) * 2.0**-53
    else:
        w = _blocks(state, -(-n // 4))
        u = (w.reshape(-1) >> np.uint64(8)).astype(np.float32) * np.float32(2.0**-24)
    v = (u * scale + low).astype(out.dtype)  # rounded as the kernel's __fmul_rn, __fadd_rn and store
    v[v.astype(acc) > top] = top
    _store(out, v)


def _host_normal(out: np.ndarray, state: np.ndarray, n: Any, mean: Any, std: Any, *rest: Any) -> None:
    acc = np.dtype(type(mean))
    n = int(n)
    if acc == np.float64:
        w = _blocks(state, -(-n // 2))
        u1 = ((_u64(w[:, 0], w[:, 1]) >> np.uint64(11)) + np.uint64(1)).astype(np.float64) * 2.0**-53
        u2 = (_u64(w[:, 2], w[:, 3]) >> np.uint64(11)).astype(np.float64) * 2.0**-53
    else:
        w = _blocks(state, -(-n // 4))
        u1 = (w[:, 0::2].astype(np.float64) + 1.0) * 2.0**-32
        u2 = w[:, 1::2].astype(np.float64) * 2.0**-32
    r = np.sqrt(-2.0 * np.log(u1))
    theta = 6.283185307179586 * u2
    z = np.stack([r * np.cos(theta), r * np.sin(theta)], axis=-1).reshape(-1)
    with np.errstate(over="ignore"):  # float16 overflows to inf, as on the device
        _store(out, (z.astype(acc) * std + mean).astype(out.dtype))


def _host_randint(out: np.ndarray, state: np.ndarray, n: Any, low: Any, span: Any, *rest: Any) -> None:
    n = int(n)
    w = _blocks(state, -(-n // 2))
    r = _u64(w[:, 0::2], w[:, 1::2]).reshape(-1)
    span = int(span)
    off = _mulhi64(r, span) if span else r
    v = (np.uint64(int(low) % _TWO64) + off).view(np.int64)
    _store(out, v.astype(out.dtype))


def _host_advance(state: np.ndarray, counters: Any) -> None:
    np.add(state[1:2], np.uint64(counters), out=state[1:2])  # wraps modulo 2**64, as on the device


def _host_set(state: np.ndarray, seed: Any, offset: Any) -> None:
    state[0], state[1] = np.uint64(seed), np.uint64(offset)


# kernels ----------------------------------------------------------------------------
_HOSTS: dict[str, Callable[..., None]] = {
    "uniform": _host_uniform,
    "normal": _host_normal,
    "randint": _host_randint,
}


@functools.cache
def _kernel(kind: str, dtype: np.dtype, strided: bool) -> Kernel:
    """The draw kernel of ``kind`` writing ``dtype`` elements (contiguous or any layout)."""
    name = f"cg_rand_{kind}" + ("_strided" if strided else "")
    out = ("out", "void*")
    head = [out, ("state", "uint64*"), ("n", "int64")]
    if kind == "randint":
        defines = {"CG_T": _INT_TYPES[dtype.name], "CG_RANDINT": "1"}
        tail = [("low", "int64"), ("range", "uint64")]
    else:
        ctype, acc, store = _FLOAT_TYPES[dtype.name]
        defines = {"CG_T": ctype, "CG_ACC": acc, "CG_STORE": store}
        a = "float64" if acc == "double" else "float32"
        tail = [("low", a), ("scale", a), ("top", a)] if kind == "uniform" else [("mean", a), ("std", a)]
    params: list[tuple[str, Any]] = [*head, *tail]
    if strided:
        params.append(("layout", _LAYOUT))
    return _make(SOURCE, name, _HOSTS[kind], params, defines)


@functools.cache
def _state_kernel(name: str) -> Kernel:
    """``cg_philox_advance`` or ``cg_philox_set`` (compiled with the float32 draws)."""
    defines = {"CG_T": "float", "CG_ACC": "float", "CG_STORE": "0"}
    if name == "cg_philox_advance":
        return _make(SOURCE, name, _host_advance, [("state", "uint64*"), ("counters", "uint64")], defines)
    return _make(
        SOURCE, name, _host_set, [("state", "uint64*"), ("seed", "uint64"), ("offset", "uint64")], defines
    )


# arguments ----------------------------------------------------------------------------
class _Draw(NamedTuple):
    """What a draw launches: its kernel kind, values per counter, and by-value arguments."""

    kind: str
    per_counter: int
    args: tuple[Any, ...]


def _is_real(x: Any) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _float_dtype(op: str, dtype: np.dtype) -> np.dtype:
    if dtype.name not in FLOAT_DTYPES:
        raise TypeError(f"{op} writes {', '.join(FLOAT_DTYPES)} arrays; got a {dtype} array")
    return np.dtype(np.float64 if dtype.name == "float64" else np.float32)


def _reals(op: str, **named: Any) -> None:
    for name, x in named.items():
        if not _is_real(x):
            raise TypeError(f"{op}: {name} must be a real number, got {x!r}")
        try:
            finite = bool(np.isfinite(float(x)))
        except OverflowError:  # an int beyond any float
            finite = False
        if not finite:
            raise ValueError(f"{op}: {name} must be finite, got {x!r}")


def _uniform_draw(dtype: np.dtype, low: Any, high: Any) -> _Draw:
    op = "uniform"
    acc = _float_dtype(op, dtype)
    _reals(op, low=low, high=high)
    if not float(low) < float(high):
        raise ValueError(f"{op}: low must be less than high, got low={low!r}, high={high!r}")
    with np.errstate(over="ignore"):
        lo_t, hi_t = np.asarray(low, dtype), np.asarray(high, dtype)
        lo, hi, top = lo_t.astype(acc)[()], hi_t.astype(acc)[()], _below(hi_t).astype(acc)[()]
        scale = hi - lo
    if not (np.isfinite(lo) and np.isfinite(hi)):
        raise ValueError(f"{op}: low={low!r} and high={high!r} do not both fit in {dtype}")
    if not lo < hi:
        raise ValueError(
            f"{op}: low={low!r} and high={high!r} round to the same {dtype} value; "
            "widen the interval or use a wider dtype"
        )
    if not np.isfinite(scale):
        raise ValueError(
            f"{op}: high - low = {float(high) - float(low)!r} overflows {acc}; narrow the interval"
        )
    return _Draw(op, 2 if acc == np.float64 else 4, (lo.item(), scale.item(), top.item()))


def _below(x: np.ndarray) -> np.ndarray:
    """The largest value of ``x``'s (float) dtype below the finite value ``x``, from its bits."""
    bits = x.view(f"u{x.itemsize}")
    sign = bits.dtype.type(1 << (8 * x.itemsize - 1))
    if x > 0:
        step = bits - bits.dtype.type(1)
    elif x < 0:
        step = bits + bits.dtype.type(1)
    else:  # +0 or -0: the negative value of least magnitude
        step = sign | bits.dtype.type(1)
    return np.asarray(step).view(x.dtype)


def _normal_draw(dtype: np.dtype, mean: Any, std: Any) -> _Draw:
    op = "normal"
    acc = _float_dtype(op, dtype)
    _reals(op, mean=mean, std=std)
    if float(std) < 0:
        raise ValueError(f"{op}: std must be >= 0, got {std!r}")
    with np.errstate(over="ignore"):
        m, s = acc.type(mean), acc.type(std)
    if not (np.isfinite(m) and np.isfinite(s)):
        raise ValueError(f"{op}: mean={mean!r} and std={std!r} do not both fit in {acc}")
    return _Draw(op, 2 if acc == np.float64 else 4, (m.item(), s.item()))


def _randint_draw(dtype: np.dtype, low: Any, high: Any) -> _Draw:
    op = "randint"
    if dtype.name not in INT_DTYPES:
        raise TypeError(f"{op} writes {', '.join(INT_DTYPES)} arrays; got a {dtype} array")
    for name, x in (("low", low), ("high", high)):
        if not _is_int(x):
            raise TypeError(f"{op}: {name} must be an integer, got {x!r}")
    low, high = int(low), int(high)
    if low >= high:
        raise ValueError(f"{op}: low must be less than high (high is exclusive), got low={low}, high={high}")
    info = np.iinfo(dtype)
    if low < info.min or high > info.max + 1:
        raise ValueError(
            f"{op}: [{low}, {high}) is out of the range of {dtype}, "
            f"[{info.min}, {info.max + 1}); use a wider dtype or a narrower interval"
        )
    return _Draw(op, 2, (low, (high - low) % _TWO64))


_DRAWS: dict[str, Callable[[np.dtype, Any, Any], _Draw]] = {
    "uniform": _uniform_draw,
    "normal": _normal_draw,
    "randint": _randint_draw,
}


def _check_u64(what: str, value: Any) -> int:
    if not _is_int(value):
        raise TypeError(f"{what} must be an integer, got {value!r}")
    if not 0 <= int(value) < _TWO64:
        raise ValueError(f"{what} must be in [0, 2**64), got {value}")
    return int(value)


def reference(kind: str, shape: Any, dtype: Any, seed: int, offset: int, a: Any, b: Any) -> np.ndarray:
    """What a draw gives, computed on the host (the specification of the stream).

    ``reference("uniform", (3, 4), "float32", seed, offset, low, high)`` is
    what ``Generator(seed).uniform(out, low, high)`` writes into a ``(3, 4)``
    float32 ``out`` when the generator's offset is ``offset`` (``kind`` may be
    ``"uniform"``, ``"normal"`` with ``a, b = mean, std``, or ``"randint"``).
    The draw advances the offset by ``counters(kind, size, dtype)``.
    """
    dt = normalize_dtype(dtype)
    draw = _DRAWS[kind](dt, a, b)
    out = np.empty(shape, dt)
    state = np.array([_check_u64("seed", seed), _check_u64("offset", offset)], np.uint64)
    if out.size:
        acc = np.dtype(np.float64 if dt.name == "float64" else np.float32)
        args = [acc.type(x) for x in draw.args] if kind != "randint" else list(draw.args)
        _HOSTS[kind](out, state, np.int64(out.size), *args)
    return out


def counters(kind: str, size: int, dtype: Any) -> int:
    """How many Philox counters a draw of ``size`` elements of ``dtype`` uses."""
    k = 2 if kind == "randint" or normalize_dtype(dtype) == np.float64 else 4
    return -(-size // k)


# the generator ----------------------------------------------------------------------------
_RESEED = (
    "{what} inside a capture would reset the generator on every replay, so every replay "
    "would draw the same numbers: {fix} before the capture (replays then continue from "
    "the state it has)"
)


def _refuse_captured(stream: Stream, what: str, fix: str) -> None:
    rec = stream._recording
    if rec is not None:
        rec.fail(_RESEED.format(what=what, fix=fix))


class Generator:
    """A Philox4x32-10 generator whose seed and offset live on the device.

    Parameters
    ----------
    seed : int, optional
        The 64-bit key of the stream (default 0), in ``[0, 2**64)``.
    device : Device or int, optional
        Default: ``stream``'s device, else the current device.
    stream : Stream, optional
        Where the state is allocated and seeded (default: the current
        stream); draws on another stream must be ordered after it.

    Notes
    -----
    The state is two 64-bit words of device memory allocated here, so draws
    allocate nothing (they work under ``alloc="forbid"``). Each draw reads
    the state when it runs and a second, one-thread kernel advances it on the
    device: captured draws give new numbers on every replay, and a sequence
    of draws gives the same numbers eagerly as captured once and replayed.

    The state is stream-ordered like any array: draws and :meth:`seed` are
    queued on a stream (default: the current stream) and never wait. Draws
    on several streams need ordering between them (events), or their
    offsets race. Seeding is refused inside a capture (every replay would
    reset the stream); seed before capturing, or between replays.
    """

    def __init__(
        self, seed: int = 0, *, device: Device | int | None = None, stream: Stream | StreamLike | None = None
    ) -> None:
        value = _check_u64("Generator seed", seed)
        if stream is not None and type(stream) is not Stream:  # (another library's: its Stream)
            stream = as_stream(stream, device)
        dev = stream.device if device is None and stream is not None else as_device(device)
        stream = resolve_stream(stream, dev)
        _refuse_captured(stream, "creating a Generator", "create it")
        self._device = dev
        self._state = empty(2, _STATE, device=dev, stream=stream)
        self._home = stream
        self._set(value, 0, stream)

    @property
    def device(self) -> Device:
        """The device whose memory holds the state, where the generator draws."""
        return self._device

    def __repr__(self) -> str:
        return f"<cudagraphs.random.Generator on {self._device.backend.name}:{self._device.index}>"

    # state ----------------------------------------------------------------------------
    def _set(self, seed: int, offset: int, stream: Stream) -> None:
        _state_kernel("cg_philox_set").enqueue(
            self._device,
            stream,
            (1, 1, 1),
            (1, 1, 1),
            0,
            (self._state.ptr, seed, offset),
            (self._state, seed, offset),
            1,
        )

    def _stream(self, stream: Stream | StreamLike | None) -> Stream:
        s = resolve_stream(stream, self._device)
        if s is not self._home:
            self._state.record_stream(s)  # its memory is not reused before that stream is done
        return s

    def seed(self, value: int, *, stream: Stream | StreamLike | None = None) -> Generator:
        """Restart the stream at ``value`` with offset 0, on the device; returns ``self``.

        Stream-ordered: draws queued after it on ``stream`` use the new seed.

        Raises
        ------
        TypeError, ValueError
            For a value that is not an integer in ``[0, 2**64)``.
        CaptureError
            Inside a capture of ``stream`` (every replay would restart the
            stream): seed before capturing, or between replays.
        """
        return self.set_state((value, 0), stream=stream)

    manual_seed = seed

    def get_state(self, *, stream: Stream | StreamLike | None = None) -> tuple[int, int]:
        """``(seed, offset)`` after the work queued on ``stream`` (waits for it).

        Raises
        ------
        CaptureError
            While ``stream`` is captured (a read waits for the GPU).
        """
        seed, offset = self._state.get(stream=self._stream(stream))
        return int(seed), int(offset)

    def set_state(self, state: tuple[int, int], *, stream: Stream | StreamLike | None = None) -> Generator:
        """Set ``(seed, offset)`` on the device (stream-ordered), as :meth:`get_state` gave it.

        Raises
        ------
        TypeError, ValueError
            For anything but two integers in ``[0, 2**64)``.
        CaptureError
            Inside a capture of ``stream``.
        """
        if not isinstance(state, (tuple, list)) or len(state) != 2:
            raise TypeError(f"set_state takes (seed, offset), as get_state() returns it; got {state!r}")
        seed, offset = _check_u64("seed", state[0]), _check_u64("offset", state[1])
        s = self._stream(stream)
        _refuse_captured(s, "seeding a Generator (seed, manual_seed, set_state)", "seed it")
        self._set(seed, offset, s)
        return self

    # draws ----------------------------------------------------------------------------
    def uniform(
        self,
        out: DeviceArray,
        low: float = 0.0,
        high: float = 1.0,
        *,
        stream: Stream | StreamLike | None = None,
    ) -> DeviceArray:
        """Fill ``out`` with numbers uniform on ``[low, high)``; returns ``out``.

        ``out`` is a float16, bfloat16, float32 or float64 array of any
        layout. Values come from 24 random bits (53 for float64); a value that
        rounds up to ``high`` in ``out``'s dtype is replaced by ``low``.

        Raises
        ------
        TypeError
            For ``out`` not a device array of a float dtype, or bounds that
            are not real numbers.
        ValueError
            For ``low >= high`` (also after rounding to ``out``'s dtype),
            bounds that are not finite, or ``out`` on another device.
        """
        return self._draw("uniform", out, low, high, stream)

    def normal(
        self,
        out: DeviceArray,
        mean: float = 0.0,
        std: float = 1.0,
        *,
        stream: Stream | StreamLike | None = None,
    ) -> DeviceArray:
        """Fill ``out`` with normal numbers of ``mean`` and ``std`` (Box-Muller); returns ``out``.

        ``out`` is a float16, bfloat16, float32 or float64 array of any
        layout.

        Raises
        ------
        TypeError
            For ``out`` not a device array of a float dtype, or parameters
            that are not real numbers.
        ValueError
            For ``std < 0``, parameters that are not finite, or ``out`` on
            another device.
        """
        return self._draw("normal", out, mean, std, stream)

    def randint(
        self, out: DeviceArray, low: int, high: int, *, stream: Stream | StreamLike | None = None
    ) -> DeviceArray:
        """Fill ``out`` with integers uniform on ``[low, high)`` (high exclusive); returns ``out``.

        ``out`` is an int32 or int64 array of any layout. Each value is
        ``low + floor(r * (high - low) / 2**64)`` for 64 random bits ``r``
        (multiply-shift, no rejection): the bias is below
        ``(high - low) / 2**64`` per value, under 2.4e-10 for any int32 range.

        Raises
        ------
        TypeError
            For ``out`` not an int32/int64 device array, or bounds that are
            not integers.
        ValueError
            For ``low >= high``, bounds outside ``out``'s dtype, or ``out``
            on another device.
        """
        return self._draw("randint", out, low, high, stream)

    def _draw(
        self, kind: str, out: DeviceArray, a: Any, b: Any, stream: Stream | StreamLike | None
    ) -> DeviceArray:
        if not isinstance(out, DeviceArray):
            raise TypeError(f"{kind}: out must be a cudagraphs DeviceArray, got {type(out).__name__}")
        out._view_spec()  # a subclass's own check (an expired graph output raises here)
        if out.device is not self._device:
            raise ValueError(f"{kind}: out is on {out.device} but the generator on {self._device}")
        draw = _DRAWS[kind](out.dtype, a, b)
        if any(s == 0 and d > 1 for s, d in zip(out.strides, out.shape)):
            raise ValueError(
                f"{kind}: out has overlapping elements (strides {out.strides}, shape {out.shape}); "
                "draw into a contiguous array and broadcast that instead"
            )
        s = self._stream(stream)
        n = out.size
        if n == 0:
            return out
        device, state = self._device, self._state
        args: list[Any] = [out, state, n, *draw.args]
        if not out.is_contiguous:
            if out.ndim > MAX_NDIM:
                raise ValueError(f"{kind}: strided outputs have up to {MAX_NDIM} dimensions, got {out.ndim}")
            args.append(layout(out.shape, out))
        nc = -(-n // draw.per_counter)
        grid = (min(-(-nc // _BLOCK[0]), device.properties.multiprocessors * 32), 1, 1)
        values = tuple([a if isinstance(a, (int, float, bytes)) else a.ptr for a in args])
        _kernel(kind, out.dtype, not out.is_contiguous).enqueue(device, s, grid, _BLOCK, 0, values, args, 1)
        _state_kernel("cg_philox_advance").enqueue(
            device, s, (1, 1, 1), (1, 1, 1), 0, (state.ptr, nc), (state, nc), 1
        )
        return out


# the default generator of each device ---------------------------------------------------------
_lock = threading.Lock()
_DEFAULTS: dict[Device, Generator] = {}
_INITIAL = [0]  # the seed of default generators made from now on


def default_generator(device: Device | int | None = None) -> Generator:
    """The default generator of ``device`` (default: the current device), made on first use.

    Its first seed is the last :func:`seed` given (0 if none).

    Raises
    ------
    CaptureError
        If it does not exist yet and the device's current stream is being
        captured: make it first (call this, or :func:`seed`) before capturing.
    """
    dev = as_device(device)
    return _DEFAULTS.get(dev) or _default(dev, dev.current_stream())


def _default(dev: Device, stream: Stream) -> Generator:
    """The default generator of ``dev``, made on ``stream`` (the first draw's) if it is new."""
    with _lock:
        gen = _DEFAULTS.get(dev)
        if gen is None:
            _refuse_captured(
                stream,
                "creating the default generator (on first use of cg.random on a device)",
                "call cg.random.default_generator() or cg.random.seed()",
            )
            gen = _DEFAULTS[dev] = Generator(_INITIAL[0], device=dev, stream=stream)
    return gen


def seed(value: int) -> None:
    """Seed the default generator of every device, now and of devices used later.

    Stream-ordered on each device's current stream, as :meth:`Generator.seed`.

    Raises
    ------
    TypeError, ValueError
        For a value that is not an integer in ``[0, 2**64)``.
    CaptureError
        Inside a capture of a device's current stream.
    """
    value = _check_u64("seed", value)
    with _lock:
        _INITIAL[0] = value
        gens = list(_DEFAULTS.values())
    for gen in gens:
        gen.seed(value)


def _generator(
    kind: str, out: Any, generator: Generator | None, stream: Stream | StreamLike | None
) -> Generator:
    if generator is not None:
        if not isinstance(generator, Generator):
            raise TypeError(
                f"{kind}: generator must be a cudagraphs.random.Generator, got {type(generator).__name__}"
            )
        return generator
    if not isinstance(out, DeviceArray):
        raise TypeError(f"{kind}: out must be a cudagraphs DeviceArray, got {type(out).__name__}")
    dev = out.device
    # a new default generator is seeded on the draw's stream: the draw is ordered after it
    return _DEFAULTS.get(dev) or _default(dev, resolve_stream(stream, dev))


def uniform(
    out: DeviceArray,
    low: float = 0.0,
    high: float = 1.0,
    *,
    generator: Generator | None = None,
    stream: Stream | StreamLike | None = None,
) -> DeviceArray:
    """:meth:`Generator.uniform` with ``generator`` (default: ``out``'s device's default generator)."""
    return _generator("uniform", out, generator, stream).uniform(out, low, high, stream=stream)


def normal(
    out: DeviceArray,
    mean: float = 0.0,
    std: float = 1.0,
    *,
    generator: Generator | None = None,
    stream: Stream | StreamLike | None = None,
) -> DeviceArray:
    """:meth:`Generator.normal` with ``generator`` (default: ``out``'s device's default generator)."""
    return _generator("normal", out, generator, stream).normal(out, mean, std, stream=stream)


def randint(
    out: DeviceArray,
    low: int,
    high: int,
    *,
    generator: Generator | None = None,
    stream: Stream | StreamLike | None = None,
) -> DeviceArray:
    """:meth:`Generator.randint` with ``generator`` (default: ``out``'s device's default generator)."""
    return _generator("randint", out, generator, stream).randint(out, low, high, stream=stream)
