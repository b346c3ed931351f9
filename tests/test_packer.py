"""The cuda backend's argument packer, checked on the CPU (no driver needed).

A launch hands the driver ``address``: an array of pointers, one per kernel
parameter, each pointing at that parameter's bytes. A wrong offset or a freed
array is a crash on the GPU, so the layout is read back here.
"""

from __future__ import annotations

import ctypes
import gc

import numpy as np

from cudagraphs.backends.base import Param
from cudagraphs.backends.cuda import _Packer


def test_each_pointer_points_at_its_value() -> None:
    params = [
        Param("p", np.dtype(np.uint64), True, np.dtype(np.float32)),
        Param("c", np.dtype(np.int8)),
        Param("f", np.dtype(np.float32)),
        Param("h", np.dtype(np.float16)),
        Param("q", np.dtype(np.int64)),
        Param("s", np.dtype((np.void, 24))),
        Param("b", np.dtype(np.bool_)),
        Param("d", np.dtype(np.float64)),
    ]
    packer = _Packer(params)
    struct_bytes = bytes(range(24))
    values = [0xDEADBEEF12345678, -7, 1.5, 0.25, -(1 << 40), struct_bytes, True, 3.125]
    packer.fmt.pack_into(packer.buf, 0, *values)
    gc.collect()
    ptrs = (ctypes.c_void_p * len(params)).from_address(packer.address)
    read = [
        ctypes.c_uint64.from_address(ptrs[0]).value,
        ctypes.c_int8.from_address(ptrs[1]).value,
        ctypes.c_float.from_address(ptrs[2]).value,
        np.frombuffer(ctypes.string_at(ptrs[3], 2), np.float16)[0],
        ctypes.c_int64.from_address(ptrs[4]).value,
        ctypes.string_at(ptrs[5], 24),
        ctypes.c_bool.from_address(ptrs[6]).value,
        ctypes.c_double.from_address(ptrs[7]).value,
    ]
    assert read == values
    for p, addr in zip(params, ptrs):
        align = 8 if p.dtype.kind == "V" else p.dtype.alignment
        assert addr % align == 0, p.name


def test_kernel_without_parameters() -> None:
    packer = _Packer([])
    assert packer.address == 0
    packer.fmt.pack_into(packer.buf, 0)
