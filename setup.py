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

import ast
import os
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# CUDAGRAPHS_WERROR=1 (CI): every warning is an error in the hand-written C, so that a warning
# cannot pass unseen (the C API's unused `self` parameters excepted); CUDAGRAPHS_REQUIRE_C=1 (CI):
# a failed build (or Cython missing) fails the install instead of leaving plain Python
WARNINGS = ["-Wall", "-Wextra", "-Wno-unused-parameter", "-Werror"]
STRICT = WARNINGS if os.environ.get("CUDAGRAPHS_WERROR") == "1" else []
REQUIRED = os.environ.get("CUDAGRAPHS_REQUIRE_C") == "1"


def _compiled_list() -> list[str]:
    """The modules compiled from their Python source: _config.COMPILED_MODULES, read without an import."""
    tree = ast.parse(Path("src/cudagraphs/_config.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            getattr(t, "id", "") == "COMPILED_MODULES" for t in node.targets
        ):
            return list(ast.literal_eval(node.value))
    raise RuntimeError("src/cudagraphs/_config.py names no COMPILED_MODULES")


# the modules compiled from their Python source (each has a .pxd beside it)
COMPILED = _compiled_list()


def compiled_modules() -> list[Extension]:
    """The Cython extensions, or none where Cython is not installed (unless required)."""
    try:
        from Cython.Build import cythonize
    except ImportError:
        if REQUIRED:
            raise
        return []
    extensions = [
        # (include_dirs: _fastcall_api.h, the C part's functions that _capi.pxd declares)
        Extension(
            "cudagraphs." + name.replace("/", "."),
            [f"src/cudagraphs/{name}.py"],
            include_dirs=["src/cudagraphs"],
            optional=not REQUIRED,
            # (Cython's C has warnings of its own; a call of an undeclared function is an error)
            extra_compile_args=["-Werror=implicit-function-declaration"] if STRICT else [],
        )
        for name in COMPILED
    ]
    # (annotations are for the type checker: only the .pxd types what compiled code takes)
    directives = {"language_level": 3, "binding": False, "embedsignature": True, "annotation_typing": False}
    try:
        # (every CPU: seventeen modules, each translated, then compiled, in a minute or two on two)
        built: list[Extension] = cythonize(
            extensions, compiler_directives=directives, quiet=True, nthreads=os.cpu_count() or 1
        )
    except Exception as exc:  # (Cython's own errors: the package still installs, as plain Python)
        if REQUIRED:
            raise
        print(f"cudagraphs: the modules were not compiled ({exc}); they run as plain Python")
        return []
    for ext in built:  # (cythonize's extensions do not keep it)
        ext.optional = not REQUIRED
    return built


class BuildAllOrNone(build_ext):
    """Build the compiled modules all, or none of them.

    Each was compiled against the others' declarations: one left out (its C
    failed to build) would make the others fail to import its plain form,
    and with them the package. Where one fails, the others' built files are
    removed, and the package runs as plain Python.
    """

    def finalize_options(self) -> None:
        """Compile the extensions in parallel, one per CPU, unless ``-j`` says otherwise."""
        super().finalize_options()
        if self.parallel is None:
            self.parallel = os.cpu_count() or 1

    def run(self) -> None:
        """Build every extension; then, if a compiled module failed, remove the others'."""
        self.failed: list[str] = []
        super().run()
        names = {"cudagraphs." + name.replace("/", ".") for name in COMPILED}
        if any(name in names for name in self.failed):
            print(f"cudagraphs: {', '.join(self.failed)} failed to build; the modules run as plain Python")
            for ext in self.extensions:
                if ext.name in names:
                    for path in (Path(self.get_ext_fullpath(ext.name)), Path("src", *ext.name.split("."))):
                        for built in path.parent.glob(path.name.split(".")[0] + ".*.so"):
                            built.unlink()

    def build_extension(self, ext: Extension) -> None:
        """Build ``ext``, noting a failure (setuptools then goes on: every extension is optional)."""
        try:
            super().build_extension(ext)
        except Exception:
            self.failed.append(ext.name)
            raise


setup(
    cmdclass={"build_ext": BuildAllOrNone},
    ext_modules=[
        Extension(
            "cudagraphs._fastcall",
            ["src/cudagraphs/_fastcall.c"],
            optional=not REQUIRED,
            extra_compile_args=STRICT,
        ),
        *compiled_modules(),
    ],
)
