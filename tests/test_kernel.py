"""User kernels: signature parsing, argument checks, compile errors, preload."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from conftest import nvrtc_available, random_array

import cudagraphs as cg
from cudagraphs._kernel import parse_params
from cudagraphs._nvrtc import NvrtcUnavailable

SAXPY = r"""
extern "C" __global__ void saxpy(float* __restrict__ y, const float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""


def saxpy_host(y: np.ndarray, x: np.ndarray, a: np.float32, n: np.int32) -> None:
    y[:n] = a * x[:n] + y[:n]


def test_user_kernel_matches_numpy(backend: str, rng: np.random.Generator) -> None:
    k = cg.Kernel(SAXPY, "saxpy", host=saxpy_host)
    x_h, y_h = random_array(rng, 1000, "float32"), random_array(rng, 1000, "float32")
    x, y = cg.asarray(x_h), cg.asarray(y_h)
    k.launch(-(-1000 // 128), 128, y, x, 0.5, 1000)
    np.testing.assert_allclose(y.get(), np.float32(0.5) * x_h + y_h, rtol=1e-6)
    assert [p.name for p in k.params] == ["y", "x", "a", "n"]
    assert "saxpy(y, x, a, n)" in repr(k)


@pytest.mark.parametrize("nvrtc", [True, False], ids=["compiled", "no-nvrtc"])
def test_kernel_without_extern_c_fails_to_load(
    device: cg.Device, rng: np.random.Generator, nvrtc: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A C++ kernel's name is mangled: the GPU cannot find it, and neither does sim."""
    from cudagraphs import _kernel

    if not nvrtc:  # sim where NVRTC is missing: it reads the source instead
        if device.backend.name != "sim":
            pytest.skip("a GPU always compiles")
        monkeypatch.setattr(_kernel, "_IMAGES", {})
        monkeypatch.setattr(_kernel._nvrtc, "compile_cubin", _no_nvrtc)
    elif not nvrtc_available(device):
        pytest.skip("NVRTC is not installed")
    source = SAXPY.replace('extern "C" ', "") + "// no C linkage: the name is mangled\n"
    mangled = cg.Kernel(source, "saxpy", host=saxpy_host)
    x_h, y_h = random_array(rng, 100, "float32"), random_array(rng, 100, "float32")
    x, y = cg.asarray(x_h), cg.asarray(y_h)
    with pytest.raises(
        cg.CudaError, match=r'declare it `extern "C" __global__ void saxpy\(\.\.\.\)`'
    ) as info:
        mangled.launch(1, 128, y, x, 0.5, 100)
    assert info.value.name == "CUDA_ERROR_NOT_FOUND"
    assert info.value.call == "cuModuleGetFunction"
    with pytest.raises(cg.CudaError, match="mangled"):  # every launch (nothing half-loaded)
        mangled.launch(1, 128, y, x, 0.5, 100)
    k = cg.Kernel(SAXPY + "// the same kernel, extern C\n", "saxpy", host=saxpy_host)
    k.launch(1, 128, y, x, 0.5, 100)
    np.testing.assert_allclose(y.get(), np.float32(0.5) * x_h + y_h, rtol=1e-6)


def _no_nvrtc(*args: object) -> bytes:
    raise NvrtcUnavailable("NVRTC is missing (test)")


def test_signature_parsing() -> None:
    src = """
    // a comment with __global__ void fake(int)
    extern "C" __global__ void __launch_bounds__(256) k(
        const double* __restrict__ a, unsigned long long n, size_t m, __half h,
        unsigned char* bytes, void* raw, bool flag, long long q, short s) {}
    """
    ps = parse_params(src, "k")
    assert [(p.name, p.pointer) for p in ps][:2] == [("a", True), ("n", False)]
    assert ps[0].pointee == np.float64
    assert [str(p.dtype) for p in ps[1:4]] == ["uint64", "uint64", "float16"]
    assert ps[5].pointer
    assert ps[5].pointee is None
    assert [str(p.dtype) for p in ps[6:]] == ["bool", "int64", "int16"]
    assert parse_params('extern "C" __global__ void e() {}', "e") == []
    with pytest.raises(ValueError, match="no `__global__ void missing"):
        parse_params(src, "missing")
    with pytest.raises(ValueError, match="pass signature="):
        parse_params('extern "C" __global__ void s(struct Foo f) {}', "s")
    with pytest.raises(ValueError, match="pass signature="):
        parse_params('extern "C" __global__ void s(float** p) {}', "s")


def test_explicit_signature(backend: str, rng: np.random.Generator) -> None:
    src = 'extern "C" __global__ void inc(int* p, int by) { p[threadIdx.x] += by; }'

    def host(p: np.ndarray, by: np.int32) -> None:
        p[:32] += by

    k = cg.Kernel(src, "inc", host, signature=["int32*", "int32"])
    data = random_array(rng, 32, "int32")
    x = cg.asarray(data)
    k.launch(1, 32, x, 7)
    np.testing.assert_array_equal(x.get(), data + 7)
    with pytest.raises(TypeError, match="signature entry 0"):
        cg.Kernel(src, "inc", host, signature=[object()])


def test_argument_errors(backend: str) -> None:
    k = cg.Kernel(SAXPY, "saxpy", host=saxpy_host)
    y, x = cg.zeros(8, "float32"), cg.zeros(8, "float32")
    with pytest.raises(TypeError, match=r"takes 4 arguments \(y, x, a, n\), got 3"):
        k.launch(1, 8, y, x, 1.0)
    with pytest.raises(TypeError, match="parameter 'y' expects float32 data, got a float64 array"):
        k.launch(1, 8, cg.zeros(8), x, 1.0, 8)
    with pytest.raises(TypeError, match=re.escape("'n' is int32: expected an integer, got 8.5")):
        k.launch(1, 8, y, x, 1.0, 8.5)
    with pytest.raises(ValueError, match="'n': 4294967296 does not fit in int32"):
        k.launch(1, 8, y, x, 1.0, 1 << 32)
    with pytest.raises(TypeError, match="'a' is float32: expected a real number"):
        k.launch(1, 8, y, x, "1", 8)
    with pytest.raises(ValueError, match=re.escape("'a': 1e+39 does not fit in float32")):
        k.launch(1, 8, y, x, 1e39, 8)  # (C's packing refuses it; sim refuses it alike)
    y2 = cg.zeros(8, "float32")
    k.launch(1, 8, y2, cg.ones(8, "float32"), float("inf"), 8)  # infinity itself fits
    assert np.isinf(y2.get()).all()
    with pytest.raises(TypeError, match="'y' is a pointer"):
        k.launch(1, 8, np.zeros(8, np.float32), x, 1.0, 8)
    with pytest.raises(ValueError, match=re.escape("each dimension must be in 1..1024")):
        k.launch(1, 2048, y, x, 1.0, 8)
    with pytest.raises(ValueError, match="has 2048 threads; CUDA allows 1024"):
        k.launch(1, (64, 32), y, x, 1.0, 8)
    with pytest.raises(ValueError, match="grid 0"):
        k.launch(0, 8, y, x, 1.0, 8)
    with pytest.raises(ValueError, match="1 to 3 dimensions"):
        k.launch((1, 1, 1, 1), 8, y, x, 1.0, 8)
    with pytest.raises(ValueError, match="shared_mem must be"):
        k.launch(1, 8, y, x, 1.0, 8, shared_mem=-1)
    with pytest.raises(ValueError, match="name must be a C identifier"):
        cg.Kernel(SAXPY, "sa xpy")
    with pytest.raises(TypeError, match="non-empty string"):
        cg.Kernel("", "k")
    # nothing was launched and the stream is fine
    k.launch(1, 8, y, x, 1.0, 8)
    assert np.all(y.get() == 0)


def test_syntax_error_raises_compile_error_with_log(device: cg.Device) -> None:
    if not nvrtc_available(device):
        pytest.skip("NVRTC is not installed (pip install nvidia-cuda-nvrtc)")
    bad = cg.Kernel(
        'extern "C" __global__ void broken(float* x { x[0] = 1; }',
        "broken",
        host=lambda x: None,
        signature=["float32*"],
    )
    with pytest.raises(cg.KernelCompileError) as info:
        cg.preload([bad], device)
    assert info.value.kernel == "broken"
    assert "error" in info.value.log
    assert "broken.cu" in info.value.log
    assert "failed to compile; NVRTC log:" in str(info.value)
    # the device, the allocator and the stream still work
    x = cg.asarray(np.arange(5.0))
    np.testing.assert_array_equal(cg.ops.scale(2.0, x).get(), np.arange(5.0) * 2)


def test_kernel_without_host_fails_clearly_on_sim(device: cg.Device) -> None:
    k = cg.Kernel(SAXPY, "saxpy")
    y = cg.zeros(8, "float32")
    if device.backend.name == "sim":
        with pytest.raises(cg.BackendUnavailableError, match="no host implementation"):
            k.launch(1, 8, y, y, 1.0, 8)
    else:
        k.launch(1, 8, y, y, 1.0, 8)
        assert np.all(y.get() == 0)


def test_preload_compiles_once(device: cg.Device) -> None:
    k = cg.Kernel(SAXPY, "saxpy", host=saxpy_host)
    assert k not in device.kernels
    cg.preload([k], device)
    launcher = device.kernels[k]
    cg.preload([k], device)
    assert device.kernels[k] is launcher
    with pytest.raises(TypeError, match=re.escape("cudagraphs.Kernel objects")):
        cg.preload(["saxpy"], device)  # type: ignore[list-item]


def test_a_compiled_kernel_is_kept_in_the_disk_cache(device: cg.Device, tmp_path: Path) -> None:
    """The first compile of a source fills ``cache_dir/kernels``: another process reuses it.

    (An empty cache is false, as it has a length: it was once taken for no cache, never filled.)
    """
    from cudagraphs import _nvrtc

    if not nvrtc_available(device):
        pytest.skip("NVRTC is not installed (pip install nvidia-cuda-nvrtc)")
    with cg.override(cache_dir=tmp_path):
        first = _nvrtc.compile_cubin(SAXPY, "saxpy", "sm_80", ())
        entries = [p for p in (tmp_path / "kernels").rglob("*") if p.is_file()]
        assert len(entries) == 1, entries
        assert _nvrtc.compile_cubin(SAXPY, "saxpy", "sm_80", ()) == first  # (read back)
        assert [p for p in (tmp_path / "kernels").rglob("*") if p.is_file()] == entries


def test_raw_pointer_and_none_arguments(backend: str) -> None:
    src = 'extern "C" __global__ void put(float* p, float* unused) { if (!unused) p[0] = 42.0f; }'

    def host(p: np.ndarray, unused: object) -> None:
        if unused is None:
            p.view(np.float32)[0] = 42.0

    k = cg.Kernel(src, "put", host)
    x = cg.zeros(4, "float32")
    k.launch(1, 1, x.ptr, None)
    assert x.get().tolist() == [42.0, 0.0, 0.0, 0.0]
