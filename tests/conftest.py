"""Shared fixtures: every test that takes ``backend`` runs once per backend.

``CUDAGRAPHS_TEST_BACKENDS`` (default ``sim``) lists the backends, e.g.
``cuda,sim`` on a GPU machine, so one suite proves the two agree. A backend
named there that cannot run fails the tests loudly instead of skipping.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator

import numpy as np
import pytest

import cudagraphs as cg

BACKENDS = [b.strip() for b in os.environ.get("CUDAGRAPHS_TEST_BACKENDS", "sim").split(",") if b.strip()]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Iterator[str]:
    """The backend under test, made the current one for the test's duration."""
    name = request.param
    if name == "cuda" and not cg.is_cuda_available():
        pytest.fail("CUDAGRAPHS_TEST_BACKENDS names cuda but no GPU answers")
    with cg.override(backend=name):
        yield name
        gc.collect()


@pytest.fixture
def device(backend: str) -> cg.Device:
    """Device 0 of the backend under test, idle."""
    dev = cg.Device(0)
    dev.synchronize()
    return dev


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


def random_array(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Random data of any supported dtype (never zeros)."""
    dt = np.dtype(dtype)
    if dt.kind == "f" or dt.name == "bfloat16":
        return rng.standard_normal(shape).astype(dt)
    if dt.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)
    if dt.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    info = np.iinfo(dt)
    return rng.integers(max(info.min, -1000), min(info.max, 1000), shape).astype(dt)


def nvrtc_available(device: cg.Device) -> bool:
    """Whether kernel sources are compiled on this backend (always on cuda)."""
    if device.backend.name == "cuda":
        return True
    cg.preload([cg.ops.elementwise_kernel("cg_add", np.dtype("float32"))], device)
    from cudagraphs import _nvrtc

    return bool(_nvrtc.available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked ``gpu`` unless the cuda backend is under test."""
    if "cuda" in BACKENDS:
        return
    skip = pytest.mark.skip(reason="GPU test: set CUDAGRAPHS_TEST_BACKENDS=cuda,sim on a GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
