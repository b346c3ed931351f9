"""Build the optional compiled part; everything else is in pyproject.toml.

Two kinds of extension, both optional (where they cannot be built, the
install goes on and the same package runs as plain Python):

* ``cudagraphs._fastcall`` (C): the driver calls of the hot paths at C's
  cost; it needs only a C compiler and Python's headers (no CUDA toolkit);
* the hot modules compiled by Cython from their one Python source
  (pure-Python mode: each ``.py`` beside a ``.pxd`` that declares its
  extension types), listed in ``COMPILED``.

See docs/architecture.md, "The compiled part".
"""

import os

from setuptools import Extension, setup

# CUDAGRAPHS_WERROR=1 (CI): every warning is an error in the hand-written C, so that a warning
# cannot pass unseen (the C API's unused `self` parameters excepted); CUDAGRAPHS_REQUIRE_C=1 (CI):
# a failed build (or Cython missing) fails the install instead of leaving plain Python
WARNINGS = ["-Wall", "-Wextra", "-Wno-unused-parameter", "-Werror"]
STRICT = WARNINGS if os.environ.get("CUDAGRAPHS_WERROR") == "1" else []
REQUIRED = os.environ.get("CUDAGRAPHS_REQUIRE_C") == "1"

# the modules compiled from their Python source (each has a .pxd beside it)
COMPILED = ["_config", "_dtypes", "_fields", "_device", "_allocator", "_array"]


def compiled_modules() -> list[Extension]:
    """The Cython extensions, or none where Cython is not installed (unless required)."""
    try:
        from Cython.Build import cythonize
    except ImportError:
        if REQUIRED:
            raise
        return []
    extensions = [
        Extension(f"cudagraphs.{name}", [f"src/cudagraphs/{name}.py"], optional=not REQUIRED)
        for name in COMPILED
    ]
    # (annotations are for the type checker: only the .pxd types what compiled code takes)
    directives = {"language_level": 3, "binding": False, "embedsignature": True, "annotation_typing": False}
    try:
        return cythonize(extensions, compiler_directives=directives, quiet=True)  # type: ignore[no-any-return]
    except Exception as exc:  # (Cython's own errors: the package still installs, as plain Python)
        if REQUIRED:
            raise
        print(f"cudagraphs: the modules were not compiled ({exc}); they run as plain Python")
        return []


setup(
    ext_modules=[
        Extension(
            "cudagraphs._fastcall",
            ["src/cudagraphs/_fastcall.c"],
            optional=not REQUIRED,
            extra_compile_args=STRICT,
        ),
        *compiled_modules(),
    ]
)
