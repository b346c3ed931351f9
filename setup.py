"""Build the optional C part (``cudagraphs._fastcall``); everything else is in pyproject.toml.

The extension calls the hot paths' driver functions at C's cost. It needs
only a C compiler and Python's headers (no CUDA toolkit); where it cannot be
built, the install goes on without it and cudagraphs calls the driver
through cuda.bindings instead.
"""

import os

from setuptools import Extension, setup

# CUDAGRAPHS_WERROR=1 (CI): every warning is an error, so that a warning cannot pass unseen
# (the C API's unused `self` parameters excepted); CUDAGRAPHS_REQUIRE_C=1 (CI): a failed build
# fails the install instead of leaving the Python paths alone
WARNINGS = ["-Wall", "-Wextra", "-Wno-unused-parameter", "-Werror"]
STRICT = WARNINGS if os.environ.get("CUDAGRAPHS_WERROR") == "1" else []
REQUIRED = os.environ.get("CUDAGRAPHS_REQUIRE_C") == "1"

setup(
    ext_modules=[
        Extension(
            "cudagraphs._fastcall",
            ["src/cudagraphs/_fastcall.c"],
            optional=not REQUIRED,
            extra_compile_args=STRICT,
        ),
    ]
)
