"""The public surface, backend selection and settings."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

import cudagraphs as cg
from cudagraphs import _config

PUBLIC = {
    "AllocatorStats",
    "BackendUnavailableError",
    "BlasError",
    "Block",
    "CachingAllocator",
    "CaptureError",
    "CaptureInvalidatedError",
    "CollectiveTimeoutError",
    "CudaError",
    "CudaGraphsError",
    "CudaGraphsWarning",
    "Device",
    "DeviceArray",
    "Event",
    "FallbackWarning",
    "Kernel",
    "KernelCompileError",
    "OutOfMemoryError",
    "PendingCopy",
    "SUPPORTED_DTYPES",
    "Settings",
    "Stream",
    "StreamLike",
    "UpdateError",
    "__version__",
    "as_strided",
    "asarray",
    "backend",
    "configure",
    "current_device",
    "device_count",
    "distributed",
    "empty",
    "empty_like",
    "enable_peer_access",
    "full",
    "full_like",
    "is_cuda_available",
    "ones",
    "ops",
    "override",
    "preload",
    "settings",
    "zeros",
    "zeros_like",
    "DeviceScalar",
    "DistributedError",
    "Graph",
    "GraphPool",
    "HostSlot",
    "Node",
    "capture",
    "Body",
    "Condition",
    "BuilderNode",
    "GraphBuilder",
    "capture_status",
    "is_capturing",
    "GraphState",
    "GraphStateError",
    "GraphModule",
    "GraphOutput",
    "GraphedCallable",
    "StaleOutputError",
    "StaleParameterError",
    "graphed",
    "interop",
    "random",
    "current_stream",
}


def test_all_is_exactly_the_public_api() -> None:
    assert set(cg.__all__) == PUBLIC
    for name in cg.__all__:
        assert hasattr(cg, name), name


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **env}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=120,
    )


def test_fastcall_0_at_import_keeps_every_c_path_off() -> None:
    """CUDAGRAPHS_FASTCALL=0 at import: no C path at all, the allocator's lock included.

    (The modules Cython compiles from their Python source stay compiled: they
    are the one implementation, and CI runs the same source as plain Python.)
    """
    code = """
        import importlib.util
        import cudagraphs as cg
        from cudagraphs import _allocator, _config, _kernel
        built = importlib.util.find_spec("cudagraphs._fastcall") is not None
        parts = (_config.compiled_part(), _allocator._fastcall, _kernel.fastcall)
        lock = type(cg.current_device().allocator._lock)
        print(built, *(p is not None for p in parts), f"{lock.__module__}.{lock.__name__}")
        x = cg.empty(8, "float32")
        x.set(list(range(8)))
        print(x.get().tolist())
        """
    off = _run(code, CUDAGRAPHS_FASTCALL="0", CUDAGRAPHS_BACKEND="sim")
    assert off.returncode == 0, off.stderr
    built, *loaded, base = off.stdout.split("\n")[0].split()
    assert loaded == ["False", "False", "False"]
    assert base == "_thread.lock"  # (threading.Lock: not the C part's)
    assert off.stdout.split("\n")[1] == str([float(i) for i in range(8)])
    on = _run(code, CUDAGRAPHS_FASTCALL="1", CUDAGRAPHS_BACKEND="sim")
    assert on.returncode == 0, on.stderr
    built, *loaded, base = on.stdout.split("\n")[0].split()
    assert loaded == [built] * 3  # (loaded wherever it is built)
    assert base == ("cudagraphs._fastcall.Lock" if built == "True" else "_thread.lock")


def test_import_needs_no_gpu_and_loads_no_cuda_module() -> None:
    r = _run(
        """
        import sys, cudagraphs
        loaded = [m for m in sys.modules if m.startswith(("cuda.core", "cuda.bindings"))]
        print("LOADED", loaded)
        """
    )
    assert r.returncode == 0, r.stderr
    assert "LOADED []" in r.stdout


def test_env_var_selects_backend() -> None:
    r = _run("import cudagraphs as cg; print(cg.backend())", CUDAGRAPHS_BACKEND="sim")
    assert r.stdout.strip() == "sim", r.stderr


def test_bad_env_var_is_a_clear_error() -> None:
    r = _run("import cudagraphs", CUDAGRAPHS_BACKEND="tpu")
    assert r.returncode != 0
    assert "CUDAGRAPHS_BACKEND='tpu' is not accepted: it must be cuda or sim" in r.stderr


@pytest.mark.parametrize(
    ("var", "value", "accepted"),
    [
        ("CUDAGRAPHS_BACKEND", "gpu", "cuda or sim"),
        ("CUDAGRAPHS_SIM_DEVICES", "-1", "a non-negative integer"),
        ("CUDAGRAPHS_SIM_DEVICES", "two", "a non-negative integer"),
        ("CUDAGRAPHS_SIM_SEED", "-3", "a non-negative integer"),
        ("CUDAGRAPHS_SIM_MEMORY_MB", "1.5", "a non-negative integer (megabytes)"),
        ("CUDAGRAPHS_POOL_RELEASE_THRESHOLD_MB", "-1", "a non-negative integer (megabytes)"),
        ("CUDAGRAPHS_SIM_PEER", "2", "0 or 1"),
        ("CUDAGRAPHS_FASTCALL", "maybe", "0 or 1"),
    ],
)
def test_every_bad_env_var_names_itself_and_what_it_accepts(var: str, value: str, accepted: str) -> None:
    """Issue 26 item 16: a bad value names the variable (not the setting) and the values it takes."""
    with pytest.raises(ValueError, match=re.escape(var)) as err:
        _config._from_environ({var: value})
    assert accepted in str(err.value)
    assert repr(value) in str(err.value)


def test_auto_picks_cuda_only_when_a_gpu_answers() -> None:
    with cg.override(backend=None):
        assert cg.backend() == ("cuda" if cg.is_cuda_available() else "sim")


def test_is_cuda_available_never_raises() -> None:
    assert cg.is_cuda_available() in (True, False)


def test_override_restores_and_validates(backend: str) -> None:
    before = cg.settings()
    with cg.override(sim_memory_mb=64):
        assert cg.settings().sim_memory_mb == 64
    assert cg.settings() == before
    with pytest.raises(TypeError, match="unknown setting"):
        cg.configure(bogus=1)
    with pytest.raises(ValueError, match="non-negative int"):
        cg.configure(pool_release_threshold_mb=-1)
    assert cg.settings() == before


def test_unavailable_backend_is_a_clear_error() -> None:
    if cg.is_cuda_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(cg.BackendUnavailableError):
        cg.Device(0, backend="cuda")


def test_error_hierarchy() -> None:
    assert issubclass(cg.CaptureInvalidatedError, cg.CaptureError)
    assert issubclass(cg.OutOfMemoryError, MemoryError)
    for e in (
        cg.BackendUnavailableError,
        cg.CudaError,
        cg.CaptureError,
        cg.UpdateError,
        cg.KernelCompileError,
        cg.OutOfMemoryError,
    ):
        assert issubclass(e, cg.CudaGraphsError)
    err = cg.CudaError(1, "CUDA_ERROR_INVALID_VALUE", "cuX", "because")
    assert (err.code, err.name) == (1, "CUDA_ERROR_INVALID_VALUE")
    assert str(err) == "cuX failed with CUDA_ERROR_INVALID_VALUE (1): because"
    assert issubclass(cg.FallbackWarning, cg.CudaGraphsWarning)
    assert issubclass(cg.CudaGraphsWarning, UserWarning)


def test_cli_doctor_runs(backend: str) -> None:
    r = _run(
        "from cudagraphs.cli import main; raise SystemExit(main(['doctor']))", CUDAGRAPHS_BACKEND=backend
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"backend in use: {backend}" in r.stdout
    assert "self-check (scale on the device): ok" in r.stdout
    # which modules run compiled: every one of the list, or none (the plain tree)
    from cudagraphs._config import COMPILED_MODULES
    from cudagraphs.cli import compiled_modules

    n = len(compiled_modules())
    assert n in (0, len(COMPILED_MODULES)), compiled_modules()
    assert f"modules compiled from their Python source: {n} of {len(COMPILED_MODULES)}" in r.stdout
