"""User kernels: CUDA C++ source plus an optional numpy host implementation.

A :class:`Kernel` is compiled through NVRTC (cuda.core's ``Program``) for the
device's architecture the first time it runs on a device, or ahead of time by
:func:`preload`. Compiled code is cached in memory per device and on disk in
``CUDAGRAPHS_CACHE_DIR``.

The parameter list is read from the ``extern "C" __global__`` declaration, or
given explicitly with ``signature=``; it decides how each argument is passed
(device arrays as pointers to their first element, numbers converted to the
declared C type) and is checked on every launch. A pointer parameter takes a
C-contiguous array only: the kernel gets a bare address and indexes it as
dense memory, so a strided or reversed view is refused (copy it first, or
pass ``x.ptr`` with the strides as arguments of your own).

Compiling is legal inside a capture (measured on an H200: NVRTC, module
loading and a launch inside a capture, in all three modes, replay fine), so a
kernel compiles on first use wherever that is; :func:`preload` pays the cost
early. A launch is one :class:`~cudagraphs._recording.Work` handed to
:func:`~cudagraphs._recording.submit`, which applies the capture rules.

This module is compiled by Cython from this source where the package is
built (``_kernel.pxd`` declares :class:`Kernel` and the argument checks,
:class:`_Arg`, extension types: docs/architecture.md, "The compiled part"),
and runs as plain Python where not. Where the C part is built, a kernel's
recorded launches are issued by its ``Packer`` (its arguments' byte layout:
packing, and the driver's ``cuLaunchKernel``; nothing decided there).
"""

from __future__ import annotations

import re
import struct
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np

try:
    import cython
except ImportError:  # (run as Python where Cython is not installed: nothing is compiled)
    cython = SimpleNamespace(compiled=False, cast=lambda _type, value: value)

from . import _nvrtc
from ._config import compiled_part
from ._device import Device, Stream, StreamLike, _current_stream_of, as_device, current_device, resolve_stream
from ._dtypes import SUPPORTED
from ._errors import BackendUnavailableError, CudaError
from ._fields import ArrayFields, DeviceFields
from ._recording import array_address, issue_launch, submit_parts, view_of
from .backends.base import CUDA_ERROR_NOT_FOUND, ERROR_NAMES, KernelLaunch, Param, param_offsets

if not cython.compiled:  # (compiled, _capi.pxd's C functions)
    from ._capi import cg_put, cg_tuple6, cg_values

# (the same, for the hot paths: compiled, C globals, no name lookup)
_DEVICE, _STREAM, _KERNEL_LAUNCH = Device, Stream, KernelLaunch

# the optional C part: packs and issues a kernel's launches (see Kernel._arm), node updates
# (None: the backend's launch packs them)
fastcall = compiled_part()

__all__ = ["Kernel", "fastcall", "normalize_dims", "preload"]

_C_TYPES: dict[str, str] = {
    "float": "float32",
    "double": "float64",
    "int": "int32",
    "signed": "int32",
    "signed int": "int32",
    "unsigned": "uint32",
    "unsigned int": "uint32",
    "short": "int16",
    "short int": "int16",
    "unsigned short": "uint16",
    "long": "int64",
    "long int": "int64",
    "long long": "int64",
    "long long int": "int64",
    "unsigned long": "uint64",
    "unsigned long long": "uint64",
    "size_t": "uint64",
    "ptrdiff_t": "int64",
    "char": "int8",
    "signed char": "int8",
    "unsigned char": "uint8",
    "bool": "bool",
    "int8_t": "int8",
    "int16_t": "int16",
    "int32_t": "int32",
    "int64_t": "int64",
    "uint8_t": "uint8",
    "uint16_t": "uint16",
    "uint32_t": "uint32",
    "uint64_t": "uint64",
    "__half": "float16",
    "half": "float16",
    "__nv_bfloat16": "bfloat16",
    "void": "void",
}
_QUALIFIERS = {"const", "volatile", "__restrict__", "__restrict", "restrict", "struct"}
_POINTER = np.dtype(np.uint64)
_IMAGES: dict[tuple[str, tuple[str, ...], str], bytes | None] = {}
_BYTE_POINTEES = {"int8", "uint8", "void"}


_EXTERN_C = re.compile(r'extern\s*"C"')


def _strip_comments(source: str) -> str:
    source = re.sub(r"/\*.*?\*/", " ", source, flags=re.S)
    return re.sub(r"//[^\n]*", " ", source)


def parse_params(source: str, name: str) -> list[Param]:
    """Read the parameters of ``__global__ void name(...)`` from ``source``.

    Raises
    ------
    ValueError
        If the declaration is missing or uses a type that needs ``signature=``.
    """
    pattern = (
        r"__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?" + re.escape(name) + r"\s*\(([^)]*)\)"
    )
    match = re.search(pattern, _strip_comments(source))
    if match is None:
        raise ValueError(
            f"no `__global__ void {name}(...)` in the kernel source; check the name, "
            'declare the kernel extern "C", or pass signature=[...]'
        )
    params: list[Param] = []
    text = match.group(1).strip()
    if not text or text == "void":
        return params
    for i, decl in enumerate(text.split(",")):
        pointer = decl.count("*")
        words = [w for w in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", decl) if w not in _QUALIFIERS]
        pname = words[-1] if len(words) > 1 else f"arg{i}"
        ctype = " ".join(words[:-1] if len(words) > 1 else words)
        if pointer > 1 or ctype not in _C_TYPES:
            raise ValueError(
                f"kernel {name!r}: cannot infer how to pass parameter {i} "
                f"({decl.strip()!r}); pass signature=[...] to cg.Kernel"
            )
        params.append(_make_param(pname, _C_TYPES[ctype], bool(pointer), name))
    return params


def _make_param(pname: str, type_name: str, pointer: bool, kernel: str) -> Param:
    if pointer:
        pointee = None if type_name in ("void",) else SUPPORTED.get(type_name)
        if type_name not in ("void",) and pointee is None:
            raise ValueError(f"kernel {kernel!r}: unsupported pointee type {type_name!r}")
        return Param(pname, _POINTER, True, pointee)
    if type_name not in SUPPORTED:
        raise ValueError(f"kernel {kernel!r}: parameter {pname!r} has unsupported type {type_name!r}")
    return Param(pname, SUPPORTED[type_name], False, None)


def _param_from_spec(i: int, spec: Any, kernel: str) -> Param:
    """One entry of an explicit signature: ``"float32*"``, ``"int64"``, a dtype."""
    if isinstance(spec, Param):
        return spec
    if isinstance(spec, str):
        text = spec.replace(" ", "")
        pointer = text.endswith("*")
        return _make_param(f"arg{i}", text.rstrip("*"), pointer, kernel)
    try:
        dt = np.dtype(spec)
    except TypeError:
        raise TypeError(
            f"kernel {kernel!r}: signature entry {i} must be a type name like "
            f"'float32*' or 'int64', or a numpy dtype; got {spec!r}"
        ) from None
    return Param(f"arg{i}", dt, False, None)


_DIMS: dict[tuple[Any, str], tuple[int, int, int]] = {}
_LIMITS = {"grid": ((1 << 31) - 1, 65535, 65535), "block": (1024, 1024, 64)}


def normalize_dims(dims: Any, what: str) -> tuple[int, int, int]:
    """Turn a grid or block given as an int or 1-3 ints into a 3-tuple.

    Raises
    ------
    TypeError
        If ``dims`` is not an int or a tuple/list of 1-3 ints (floats,
        strings and bools are refused, not truncated).
    ValueError
        If a dimension is not positive or exceeds CUDA's limits.
    """
    # only exact ints are cached: 1.0 == 1 and (1.0,) == (1,) as dict keys
    if type(dims) is int or (type(dims) is tuple and all(type(d) is int for d in dims)):
        key = (dims, what)
        t = _DIMS.get(key)
        if t is None:
            t = _check_dims(dims, what)
            if len(_DIMS) < 4096:
                _DIMS[key] = t
        return t
    return _check_dims(dims, what)


def _is_int(d: Any) -> bool:
    return isinstance(d, (int, np.integer)) and not isinstance(d, (bool, np.bool_))


def _check_dims(dims: Any, what: str) -> tuple[int, int, int]:
    if _is_int(dims):
        t = (int(dims), 1, 1)
    elif isinstance(dims, (tuple, list)) and all(_is_int(d) for d in dims):
        if not 1 <= len(dims) <= 3:
            raise ValueError(f"{what} must have 1 to 3 dimensions, got {dims!r}")
        t = tuple(int(d) for d in dims) + (1,) * (3 - len(dims))  # type: ignore[assignment]
    else:
        raise TypeError(f"{what} must be an int or a tuple of 1-3 ints, got {dims!r}")
    for d, lim in zip(t, _LIMITS[what]):
        if not 1 <= d <= lim:
            raise ValueError(f"{what} {dims!r}: each dimension must be in 1..{lim} (got {d})")
    if what == "block" and t[0] * t[1] * t[2] > 1024:
        raise ValueError(f"block {dims!r} has {t[0] * t[1] * t[2]} threads; CUDA allows 1024")
    return t


def _define_options(defines: Any) -> tuple[str, ...]:
    """NVRTC's ``-DNAME=VALUE`` options for a kernel's ``defines`` mapping."""
    if defines is None:
        return ()
    if not isinstance(defines, Mapping):
        raise TypeError(f"defines must be a mapping of macro names to values, got {type(defines).__name__}")
    for k, v in defines.items():
        if not isinstance(k, str) or not k.isidentifier():
            raise ValueError(f"defines: a macro name must be a C identifier, got {k!r}")
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise TypeError(f"defines: the value of {k} must be a str or a number, got {type(v).__name__}")
    return tuple(f"-D{k}={v}" for k, v in defines.items())


class Kernel:
    """A CUDA C++ kernel that runs on both backends.

    Parameters
    ----------
    source : str
        CUDA C++ source holding ``extern "C" __global__ void <name>(...)``.
    name : str
        The kernel's name.
    host : callable, optional
        The numpy reference, run on the ``sim`` backend. It is called with the
        launch's arguments: device arrays as writable numpy views of their
        memory, numbers as numpy scalars of the declared C type, raw pointers
        as uint8 views from that address.
    signature : sequence, optional
        The parameter types, e.g. ``["float32*", "const float32*", "int64"]``
        or numpy dtypes (structs by value); default: parsed from the source.
    defines : mapping, optional
        Preprocessor macros (``{"T": "float"}``): C identifiers to strings or numbers.

    Notes
    -----
    The kernel compiles on its first launch on a device, also inside a
    capture; :func:`preload` compiles ahead of time.
    """

    def __init__(
        self,
        source: str,
        name: str,
        host: Callable[..., object] | None = None,
        *,
        signature: Sequence[Any] | None = None,
        defines: dict[str, str] | None = None,
    ) -> None:
        if not isinstance(source, str) or not source.strip():
            raise TypeError("source must be a non-empty string of CUDA C++")
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"name must be a C identifier, got {name!r}")
        if host is not None and not callable(host):
            raise TypeError(f"host must be callable or None, got {type(host).__name__}")
        self.source = source
        self.name = name
        self.host = host
        self.options = _define_options(defines)
        if signature is None:
            self.params = parse_params(source, name)
        else:
            self.params = [_param_from_spec(i, s, name) for i, s in enumerate(signature)]
        self._convert = [_Arg(p, name) for p in self.params]
        # a list for one launch's converted values, lent to one launch at a time (compiled, taken
        # and given back without a switch of threads between; a launch that finds it lent, on
        # another thread or started by a conversion, makes its own): no allocation per launch
        self._spare: list[Any] | None = [None] * len(self.params)
        self._lock = threading.Lock()
        self.fixed: frozenset[str] = frozenset()  # parameters set_arg may not change
        self.fast: Any = None  # the C part's Packer of the arguments, once armed (see _arm)
        # per device it was loaded on: how its launches there are issued (see _Plan)
        self._plans: dict[Device, _Plan] = {}
        # the last launch's plan: one object naming its device, replaced whole (so a thread reads
        # a device with its plan), matched by identity where a dictionary would hash the device
        self._last: _Plan = _NO_PLAN
        # the last (grid, block) objects given and their normalized form: a hot
        # loop passes the same objects, recognised by identity (1.0 is not 1)
        self._dims: tuple[Any, Any, tuple[int, int, int], tuple[int, int, int]] = (
            None,
            None,
            (1, 1, 1),
            (1, 1, 1),
        )

    def __repr__(self) -> str:
        args = ", ".join(p.name for p in self.params)
        return f"<cudagraphs.Kernel {self.name}({args})>"

    # compilation ----------------------------------------------------------
    def function(self, device: Device | int) -> Any:
        """The loaded kernel for ``device``, compiling it first if needed.

        Legal inside a capture (compiling and loading a module are).

        Raises
        ------
        KernelCompileError
            If NVRTC rejects the source.
        BackendUnavailableError
            If the backend needs compiled code and NVRTC is missing.
        """
        if type(device) is not Device:
            device = as_device(device)
        fn = device.kernels.get(self)
        if fn is not None:
            return fn
        with self._lock:
            fn = device.kernels.get(self)
            if fn is None:
                backend = device.backend
                arch = device.properties.arch
                key = (self.source, self.options, arch)  # one image per source
                if key in _IMAGES:
                    image = _IMAGES[key]
                else:
                    try:
                        image = _nvrtc.compile_cubin(self.source, self.name, arch, self.options)
                    except _nvrtc.NvrtcUnavailable as exc:
                        if backend.capabilities.needs_compiled_code:
                            raise BackendUnavailableError(
                                f"cannot compile kernel {self.name!r}: {exc}. Install NVRTC "
                                "(`pip install nvidia-cuda-nvrtc`) or the CUDA toolkit"
                            ) from exc
                        image = None  # the simulator runs the host implementation
                    _IMAGES[key] = image
                if image is None and not _EXTERN_C.search(
                    " ".join((_strip_comments(self.source), *self.options))
                ):
                    # (no NVRTC, on sim): what the GPU's loader would answer
                    raise self._not_exported(CudaError(CUDA_ERROR_NOT_FOUND, "", "cuModuleGetFunction"))
                try:
                    fn = backend.load_kernel(device.index, image, self.name, self.params, self.host)
                except CudaError as exc:
                    if exc.code != CUDA_ERROR_NOT_FOUND:
                        raise
                    raise self._not_exported(exc) from exc
                issue: Callable[[Any, KernelLaunch], Any] = backend.launch
                packer = None
                if backend.fastcall:  # (its launches are packed and issued by the C part: see _arm)
                    issue = self._arm(device, param_offsets(self.params))
                    packer = self.fast
                address = int(fn) if packer is not None else 0
                describe = bool(backend.capabilities.runs_host_code)
                self._plans[device] = _Plan(device, fn, issue, describe, packer, address)
                device.kernels[self] = fn
        return fn

    def _not_exported(self, exc: CudaError) -> CudaError:
        """The loader's error for a kernel name the compiled module does not export."""
        return CudaError(
            exc.code,
            ERROR_NAMES[CUDA_ERROR_NOT_FOUND],
            exc.call,
            f"the compiled module has no kernel named {self.name!r}: a kernel not declared "
            'extern "C" gets a mangled C++ name; declare it '
            f'`extern "C" __global__ void {self.name}(...)`',
        )

    def _arm(self, device: Device, offsets: tuple[int, ...]) -> Callable[[Any, KernelLaunch], Any]:
        """What issues this kernel's launches on ``device``: the C part's ``Packer``, where it can.

        The kernel's ``Packer`` (made once: the byte layout of its
        parameters) queues a launch :meth:`launch` checked and converted, as
        the backend's ``launch`` does, and falls back on that ``launch`` for
        anything it cannot pack or the driver refuses (which raises).
        Kernels with a parameter it does not pack (float16, structs by value)
        are issued by the backend.
        """
        if self.fast is None:
            layout = _fast_layout(self.params, offsets)
            if layout is None:
                return device.backend.launch
            self.fast = fastcall.Packer(layout, device.backend.launch)
        return self.fast.issue  # type: ignore[no-any-return]

    # launching ------------------------------------------------------------
    def launch(
        self,
        grid: int | tuple[int, ...],
        block: int | tuple[int, ...],
        *args: Any,
        stream: Stream | StreamLike | None = None,
        shared_mem: int = 0,
        device: Device | int | None = None,
    ) -> None:
        """Launch the kernel on ``grid`` blocks of ``block`` threads.

        Work is queued on ``stream`` (default: this thread's current stream
        of the arrays' device) and the call returns without waiting.

        Raises
        ------
        TypeError, ValueError
            If an argument does not fit its parameter (count, type, range,
            array dtype, layout or device), or ``stream`` is not a Stream.
        """
        self._launch(grid, block, args, stream, shared_mem, device)

    def _launch(
        self, grid: Any, block: Any, args: tuple[Any, ...], stream: Any, shared_mem: Any, device: Any
    ) -> None:
        """:meth:`launch`, its arguments as a tuple (compiled: a C method, called without a lookup)."""
        convert = self._convert
        n = len(convert)
        if len(args) != n:
            names = ", ".join([p.name for p in self.params])  # (compiled: no closure in a cpdef)
            raise TypeError(f"kernel {self.name!r} takes {n} arguments ({names}), got {len(args)}")
        if device is not None and type(device) is not _DEVICE:
            device = as_device(device)
        if stream is None:
            if device is None:
                # (the common case first: an array of this library, on a Device, comes first)
                first = args[0] if n else None
                if isinstance(first, ArrayFields):
                    device = cython.cast(ArrayFields, first).device
                if type(device) is not _DEVICE:
                    device = _device_of(args)
            stream = _current_stream_of(cython.cast(DeviceFields, device))  # (a Device: no check)
        else:
            if device is None:
                device = stream.device if type(stream) is _STREAM else _device_of(args)
            stream = resolve_stream(stream, device)
        values = self._lend_values(n)
        for i in range(n):
            arg = convert[i]  # (compiled: typed, its check a C call)
            values[i] = arg.convert(args[i], device)
        last_grid, last_block, g3, b3 = self._dims
        if grid is not last_grid or block is not last_block:
            g3, b3 = normalize_dims(grid, "grid"), normalize_dims(block, "block")
            self._dims = (grid, block, g3, b3)
        if type(shared_mem) is not int or not 0 <= shared_mem <= 0xFFFFFFFF:  # (the driver's unsigned)
            raise ValueError(f"shared_mem must be an int in 0..2**32-1 (bytes), got {shared_mem!r}")
        self._enqueue(device, stream, g3, b3, shared_mem, values, args, None)
        self._spare = values  # (given back: a launch keeps a copy of its values, never the list)

    def _lend_values(self, n: int) -> list[Any]:
        """A list for one launch's ``n`` converted values, given back to ``_spare`` after it.

        The kernel's spare list where it is not lent (compiled: taken with no
        switch of threads between the read and the write; as Python, threads
        switch anywhere, so never), else a new one: no allocation per launch.
        """
        values = self._spare if cython.compiled else None
        if values is None or len(values) != n:
            return [None] * n
        self._spare = None  # (lent)
        return values

    def enqueue(
        self,
        device: Device,
        stream: Stream,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_mem: int,
        values: tuple[Any, ...],
        args: Sequence[Any],
        writes: int | None = None,
    ) -> None:
        """Queue a launch whose arguments are already checked and converted.

        ``args`` are the arguments as given (arrays among them are described
        to the simulator and kept alive by a capture, as is any other object
        passed as a pointer); the first ``writes`` arguments are written and
        the rest read (None: all of them may be written).
        """
        self._enqueue(device, stream, grid, block, shared_mem, values, args, writes)

    def _enqueue(
        self,
        device: Device,
        stream: Stream,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_mem: int,
        values: Sequence[Any],
        args: Sequence[Any],
        writes: int | None,
    ) -> None:
        """:meth:`enqueue` (compiled: a C method, called without a lookup); ``values`` a list or tuple."""
        plan = self._last
        if plan.device is not device:
            found = self._plans.get(device)
            if found is None:
                self.function(device)
                found = self._plans[device]
            plan = self._last = found
        on = stream  # (compiled: typed, its fields read as C fields)
        if on._finalizer is not None:
            stream._live()
        packer = plan.packer
        if packer is not None and issue_launch(
            stream, packer, plan.function, grid, block, shared_mem, values, args
        ):
            return  # (queued as submit would queue it: uncaptured, through the C part's Packer)
        n = len(args)
        views: Any = ()
        if on._recording is not None or plan.describe:
            # each argument's view, for arrays: what the simulator runs on, what a capture
            # records (an uncaptured launch on a GPU reads only the packed values)
            views = cg_values(n)  # (compiled: a tuple filled in place, one allocation)
            for i in range(n):
                cg_put(views, i, view_of(args[i]))
        # what is written comes first (submit skips the values passed by value)
        if writes is None:
            written, reads = tuple(args), ()
        else:
            written, reads = tuple(args[:writes]), tuple(args[writes:])
        # (made without the NamedTuple's __new__, a Python call; the work passed by its parts, none made)
        fn, issue = plan.fn, plan.issue
        launch = cg_tuple6(_KERNEL_LAUNCH, fn, grid, block, shared_mem, tuple(values), tuple(views))
        submit_parts(stream, "kernel", issue, launch, reads, written, (), self.name, (self, launch), None)


class _Plan:
    """How a kernel's launches on one device are issued (made once per device, by Kernel.function).

    ``fn`` is the loaded kernel; ``issue`` what queues its launches (a Work's
    issue); ``describe`` whether a launch describes its arrays' views even
    uncaptured (the simulator runs on them); ``packer`` the C part's Packer of
    its arguments, or None; ``function`` the loaded kernel's CUfunction
    address (0 without a Packer).
    """

    # (compiled, an extension type whose fields _kernel.pxd declares: read as C fields)
    __slots__ = ("describe", "device", "fn", "function", "issue", "packer")

    def __init__(self, device: Any, fn: Any, issue: Any, describe: bool, packer: Any, function: int) -> None:
        self.device, self.fn, self.issue, self.packer = device, fn, issue, packer
        self.describe, self.function = describe, function


_NO_PLAN = _Plan(None, None, None, False, None, 0)  # (a kernel's last plan before its first launch)


def _fast_layout(params: Sequence[Param], offsets: Sequence[int]) -> list[tuple[str, int, int]] | None:
    """Each parameter as the C part's Packer packs it: (kind, bytes, offset).

    None when one of them is packed only by the backend (float16, structs by
    value, bfloat16).
    """
    layout = []
    for p, offset in zip(params, offsets):
        dt = p.dtype
        if p.pointer:
            layout.append(("p", 8, offset))
        elif dt.kind in "iub" or (dt.kind == "f" and dt.itemsize in (4, 8)):
            layout.append((dt.kind, dt.itemsize, offset))
        else:
            return None
    return layout


def _device_of(args: Iterable[Any]) -> Device:
    """The device of the first argument that has one (an array's), else the current device."""
    for a in args:
        # (compiled: an array's device read as a C field, its type known)
        dev = cython.cast(ArrayFields, a).device if isinstance(a, ArrayFields) else getattr(a, "device", None)
        if isinstance(dev, DeviceFields):  # (a Device: compiled, a C type check)
            return dev  # type: ignore[return-value]
    return current_device()


class _Arg:
    """One parameter of a kernel: the check of a launch argument, and what the kernel gets.

    ``convert(a, device)`` returns the value passed: a pointer parameter an
    address (an array's, checked to be on the launch's device, of the
    declared data and dense; an int; None as 0; another library's array
    through ``__cuda_array_interface__``), a number parameter the number
    checked against its C type, a struct parameter its bytes.
    """

    # (compiled, an extension type whose fields _kernel.pxd declares: a check is a C call)
    __slots__ = ("by_bytes", "dtype", "high", "kind", "low", "narrow", "pointee", "pointer", "where")

    def __init__(self, p: Param, kernel: str) -> None:
        self.where = f"kernel {kernel!r} parameter {p.name!r}"
        dt = self.dtype = p.dtype
        self.pointee = None
        self.narrow = None
        self.low = self.high = 0
        self.by_bytes = False
        self.pointer = bool(p.pointer)  # (compiled: a C flag, where a kind's == is a call)
        if p.pointer:
            self.kind = "p"
            if p.pointee is not None and p.pointee.name not in _BYTE_POINTEES:
                self.pointee = p.pointee
            return
        self.kind = dt.kind
        if dt.kind == "V" or dt.name == "bfloat16":
            self.by_bytes = True
        elif dt.kind in "iu":
            info = np.iinfo(dt)
            self.low, self.high = int(info.min), int(info.max)
        elif dt.kind == "f" and dt.itemsize < 8:
            # a float32 or float16 parameter refuses what rounds to infinity (as C's packing does)
            self.narrow = struct.Struct({4: "<f", 2: "<e"}[dt.itemsize])

    def convert(self, a: Any, device: Device) -> Any:
        """The value the kernel gets for argument ``a`` of a launch on ``device``; or raise."""
        if self.pointer:
            if isinstance(a, ArrayFields):  # an array of this library
                arr = cython.cast(ArrayFields, a)  # (compiled: its fields read as C fields)
                where = self.where
                if arr.device is not device:
                    raise ValueError(f"{where}: array is on {arr.device}, the launch on {device}")
                pointee = self.pointee
                # (numpy's dtypes are mostly the same object: identity first, then ==)
                if pointee is not None and arr.dtype is not pointee and arr.dtype != pointee:
                    raise TypeError(f"{where} expects {pointee} data, got a {arr.dtype} array")
                if not arr.is_contiguous:
                    raise ValueError(
                        f"{where} is a pointer, and the kernel indexes it as dense memory, but "
                        f"the array is a strided view (shape {a.shape}, strides {a.strides}): "
                        "pass a contiguous array (.copy() makes one), or pass x.ptr and the "
                        "strides as arguments of your own"
                    )
                return array_address(arr)
            if a is None:
                return 0
            if _is_int(a):
                if not 0 <= int(a) < 1 << 64:
                    raise ValueError(f"{self.where}: address {a} is out of range")
                return int(a)
            cai = (
                getattr(a, "__cuda_array_interface__", None)
                if device.backend.capabilities.shares_memory
                else None
            )
            if cai is not None:
                if cai.get("strides") is not None:
                    raise ValueError(
                        f"{self.where}: a strided {type(a).__name__} cannot be passed as a "
                        "pointer; make it contiguous first"
                    )
                return int(cai["data"][0])
            raise TypeError(
                f"{self.where} is a pointer: pass a cudagraphs array, an object with "
                f"__cuda_array_interface__, an int address or None; got {type(a).__name__}"
            )
        if self.by_bytes:
            return self._bytes(a)
        kind = self.kind
        if kind == "i" or kind == "u":
            if not _is_int(a):
                raise TypeError(f"{self.where} is {self.dtype}: expected an integer, got {a!r}")
            if not self.low <= a <= self.high:
                raise ValueError(f"{self.where}: {a} does not fit in {self.dtype}")
            return int(a)
        if kind == "b":
            return bool(a)
        if not isinstance(a, (int, float, np.integer, np.floating)) or isinstance(a, bool):
            raise TypeError(f"{self.where} is {self.dtype}: expected a real number, got {a!r}")
        v = float(a)
        if self.narrow is not None:
            try:
                self.narrow.pack(v)
            except OverflowError:
                raise ValueError(f"{self.where}: {a!r} does not fit in {self.dtype}") from None
        return v

    def _bytes(self, a: Any) -> bytes:
        """A struct (or bfloat16) parameter's value: its bytes."""
        dt = self.dtype
        if isinstance(a, (bytes, bytearray, memoryview)):
            data = bytes(a)
        else:
            try:
                data = np.asarray(a, dtype=dt).tobytes()
            except (TypeError, ValueError) as exc:
                raise TypeError(f"{self.where} expects {dt}, got {a!r}: {exc}") from None
        if len(data) != dt.itemsize:
            raise ValueError(f"{self.where} expects {dt.itemsize} bytes, got {len(data)}")
        return data


def preload(kernels: Iterable[Kernel], device: Device | int | None = None) -> None:
    """Compile and load ``kernels`` for ``device`` now (a cost paid early).

    Raises
    ------
    TypeError
        If an item is not a :class:`Kernel`.
    KernelCompileError
        If one of them does not compile.
    """
    device = as_device(device)
    for k in kernels:
        if not isinstance(k, Kernel):
            raise TypeError(f"preload takes cudagraphs.Kernel objects, got {type(k).__name__}")
        k.function(device)
