"""Random numbers for arrays, eager or captured: ``cg.random``.

A :class:`Generator` is Philox4x32-10 with its seed and offset in device
memory: each draw reads them when it runs and advances the offset on the
device, so a captured draw gives new numbers on every replay, and the same
seed gives the same numbers eagerly and replayed, on every backend.

    g = cg.random.Generator(42)
    g.normal(x)
    g.uniform(y, -1.0, 1.0)
    g.randint(k, 0, 10)

The functions :func:`uniform`, :func:`normal` and :func:`randint` draw from
the default generator of the output's device (:func:`default_generator`),
which :func:`seed` seeds.
"""

from __future__ import annotations

from ._random import (
    FLOAT_DTYPES,
    INT_DTYPES,
    Generator,
    default_generator,
    normal,
    philox4x32_10,
    randint,
    seed,
    uniform,
)

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
