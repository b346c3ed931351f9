"""Build the optional C part (``cudagraphs._fastcall``); everything else is in pyproject.toml.

The extension calls the hot paths' driver functions at C's cost. It needs
only a C compiler and Python's headers (no CUDA toolkit); where it cannot be
built, the install goes on without it and cudagraphs calls the driver
through cuda.bindings instead.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("cudagraphs._fastcall", ["src/cudagraphs/_fastcall.c"], optional=True),
    ]
)
