"""The element types device arrays accept, and their DLPack codes."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["SUPPORTED", "dlpack_code", "from_dlpack_code", "normalize_dtype"]

_NAMES = (
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
)
SUPPORTED: dict[str, np.dtype] = {n: np.dtype(n) for n in _NAMES}
try:  # bfloat16 exists in numpy only through ml_dtypes (optional)
    import ml_dtypes

    SUPPORTED["bfloat16"] = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - depends on the environment
    pass
_BY_DTYPE = {dt: name for name, dt in SUPPORTED.items()}
_SUPPORTED = SUPPORTED  # (the same dict, for normalize_dtype: compiled, a C global, no name lookup)
_LAST: tuple[Any, np.dtype] = ("float64", SUPPORTED["float64"])  # the last name normalize_dtype looked up


def normalize_dtype(dtype: Any) -> np.dtype:
    """Return the numpy dtype for ``dtype`` if device arrays support it.

    Raises
    ------
    TypeError
        If ``dtype`` is not a dtype, or not one of :data:`SUPPORTED`.
    """
    global _LAST
    last = _LAST  # (read once: another thread may set it)
    if dtype is last[0]:  # (the dtype named by the last call, the same object: no lookup)
        return last[1]
    if isinstance(dtype, str):
        known = _SUPPORTED.get(dtype)
        if known is not None:
            _LAST = (dtype, known)
            return known
    if isinstance(dtype, np.dtype) and dtype in _BY_DTYPE:
        return dtype
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if not isinstance(dt, np.dtype) or dt not in _BY_DTYPE:
        extra = "" if "bfloat16" in SUPPORTED else " (bfloat16 needs `pip install ml_dtypes`)"
        raise TypeError(f"unsupported dtype {dtype!r}; device arrays accept {', '.join(SUPPORTED)}{extra}")
    return dt


def dlpack_code(dtype: np.dtype) -> tuple[int, int]:
    """Return DLPack's (type code, bits) for ``dtype``."""
    name = _BY_DTYPE[dtype]
    if name == "bool":
        return 6, 8
    if name == "bfloat16":
        return 4, 16
    code = {"i": 0, "u": 1, "f": 2, "c": 5}[dtype.kind]
    return code, dtype.itemsize * 8


def from_dlpack_code(code: int, bits: int) -> np.dtype:
    """The dtype of DLPack's (type code, bits); TypeError for one arrays do not support."""
    for dt in SUPPORTED.values():
        if dlpack_code(dt) == (code, bits):
            return dt
    raise TypeError(
        f"unsupported DLPack dtype (code {code}, {bits} bits); device arrays accept {', '.join(SUPPORTED)}"
    )
