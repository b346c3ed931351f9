"""Every ``CUDAGRAPHS_*`` setting, read once from the environment.

=====================================  ===========================================
variable                               meaning (default)
=====================================  ===========================================
``CUDAGRAPHS_BACKEND``                 ``cuda`` or ``sim`` (auto: cuda if a GPU answers)
``CUDAGRAPHS_POOL_RELEASE_THRESHOLD_MB`` bytes the driver pool keeps cached (512)
``CUDAGRAPHS_CACHE_DIR``               compiled-kernel cache (``~/.cache/cudagraphs``)
``CUDAGRAPHS_SIM_MEMORY_MB``           memory of each simulated device (16384)
``CUDAGRAPHS_SIM_DEVICES``             number of simulated devices (1)
``CUDAGRAPHS_SIM_SEED``                seed of the simulator's stream interleaving (0)
``CUDAGRAPHS_SIM_PEER``                ``0``: simulated devices have no peer path (1)
``CUDAGRAPHS_FASTCALL``                ``0``: no C path at all (1; see :func:`compiled_part`)
=====================================  ===========================================

Settings can be changed in-process with :func:`configure` or, scoped, with
:func:`override`; code reads them through :func:`settings`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "COMPILED_MODULES",
    "Settings",
    "compiled_part",
    "configure",
    "override",
    "settings",
]

_BACKENDS = ("cuda", "sim")


@dataclasses.dataclass(frozen=True)
class Settings:
    """The library's settings; see the module docstring for the variables.

    Attributes
    ----------
    backend : str or None
        ``"cuda"``, ``"sim"``, or ``None`` for automatic choice.
    pool_release_threshold_mb : int
        Megabytes the device memory pool keeps after a synchronize.
    cache_dir : pathlib.Path
        Where compiled kernels are cached on disk.
    sim_memory_mb : int
        Memory of each simulated device, in megabytes.
    sim_devices : int
        How many simulated devices there are.
    sim_peer : bool
        Whether simulated devices can reach each other's memory
        (``CUDAGRAPHS_SIM_PEER``, default 1): 0 simulates GPUs without a
        peer path, whose copies the driver stages through the host.
    sim_seed : int
        Seed of the order in which the simulator runs the queues of several
        streams (``CUDAGRAPHS_SIM_SEED``): a missing wait between two streams
        shows under some orders; a failing order is replayed with its seed.
    fastcall : bool
        Whether the cuda backend calls the driver through the C part's
        entry points (``CUDAGRAPHS_FASTCALL``, default 1) rather than
        cuda.bindings'; read when a backend starts. Set to 0 in the
        environment before cudagraphs is imported, it also keeps the C part
        from loading at all (:func:`compiled_part`).
    """

    backend: str | None = None
    pool_release_threshold_mb: int = 512
    cache_dir: Path = Path.home() / ".cache" / "cudagraphs"
    sim_memory_mb: int = 16384
    sim_devices: int = 1
    sim_seed: int = 0
    sim_peer: bool = True
    fastcall: bool = True

    def __post_init__(self) -> None:
        if self.backend is not None and self.backend not in _BACKENDS:
            raise ValueError(f"backend must be one of {_BACKENDS} or None, got {self.backend!r}")
        for name in ("pool_release_threshold_mb", "sim_memory_mb", "sim_devices", "sim_seed"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")
        for name in ("fastcall", "sim_peer"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        object.__setattr__(self, "cache_dir", Path(self.cache_dir))


_INTS = {  # integer variables: the setting, what it accepts
    "CUDAGRAPHS_POOL_RELEASE_THRESHOLD_MB": (
        "pool_release_threshold_mb",
        "a non-negative integer (megabytes)",
    ),
    "CUDAGRAPHS_SIM_MEMORY_MB": ("sim_memory_mb", "a non-negative integer (megabytes)"),
    "CUDAGRAPHS_SIM_DEVICES": ("sim_devices", "a non-negative integer"),
    "CUDAGRAPHS_SIM_SEED": ("sim_seed", "a non-negative integer"),
}
_FLAGS = {"CUDAGRAPHS_FASTCALL": "fastcall", "CUDAGRAPHS_SIM_PEER": "sim_peer"}
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _from_environ(env: Mapping[str, str]) -> Settings:
    """Build settings from ``CUDAGRAPHS_*`` variables in ``env``.

    Raises
    ------
    ValueError
        For a variable with a value it does not accept, naming the variable
        and the values it accepts.
    """
    kwargs: dict[str, object] = {}

    def take(var: str, field: str, parse: Callable[[str], object], accepted: str) -> None:
        try:  # (each value checked alone by Settings itself: the one set of rules)
            value = parse(env[var])
            Settings(**{field: value})  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise ValueError(f"{var}={env[var]!r} is not accepted: it must be {accepted}") from None
        kwargs[field] = value

    if env.get("CUDAGRAPHS_BACKEND"):
        backends = f"{' or '.join(_BACKENDS)} (unset: cuda if a GPU answers, else sim)"
        take("CUDAGRAPHS_BACKEND", "backend", lambda s: s.strip().lower(), backends)
    for var, (field, accepted) in _INTS.items():
        if env.get(var):
            take(var, field, int, accepted)
    for var, field in _FLAGS.items():
        flag = env.get(var, "").strip().lower()
        if flag:
            if flag not in _TRUE + _FALSE:
                raise ValueError(
                    f"{var} must be 0 or 1 (or {'/'.join(_TRUE[1:] + _FALSE[1:])}), got {env[var]!r}"
                )
            kwargs[field] = flag in _TRUE
    if env.get("CUDAGRAPHS_CACHE_DIR"):
        kwargs["cache_dir"] = Path(env["CUDAGRAPHS_CACHE_DIR"]).expanduser()
    return Settings(**kwargs)  # type: ignore[arg-type]


_lock = threading.Lock()
_current = _from_environ(os.environ)


# the modules Cython compiles from their Python source where the package is built (setup.py reads
# this list; each has a .pxd beside it; a slash: a subpackage's), in the order of the layers
COMPILED_MODULES = (
    "_config",
    "_dtypes",
    "_fields",
    "_recording",
    "_device",
    "_allocator",
    "_kernel",
    "_builtin_kernels",
    "_array",
    "ops/_elementwise",
    "_node_changes",
    "_update",
    "_graph",
    "_argtree",
    "_staging",
    "_graphed_callable",
    "interop/torch",
    "interop/_keep",
)


def _load_compiled_part() -> Any:
    if not _current.fastcall:  # (CUDAGRAPHS_FASTCALL=0 at import)
        return None
    try:  # (the submodule by its full name: the package itself is not imported from here)
        import cudagraphs._fastcall as fastcall
    except ImportError:  # not built
        return None
    return fastcall


_COMPILED = _load_compiled_part()


def compiled_part() -> Any:
    """The optional C part (``cudagraphs._fastcall``), or None where no C path runs.

    None where it is not built, or when ``CUDAGRAPHS_FASTCALL=0`` was in the
    environment as cudagraphs was imported: then every path is the Python
    one (the allocator's block release and ``cudagraphs.empty`` included),
    which is how CI runs the suite a second time. Decided once, at import:
    the classes built on it cannot change afterwards.
    """
    return _COMPILED


def settings() -> Settings:
    """Return the settings in force now."""
    return _current


def configure(**changes: object) -> Settings:
    """Change settings for the rest of the process and return the new ones.

    Raises
    ------
    TypeError
        If a name is not a setting.
    ValueError
        If a value is not accepted.
    """
    global _current
    with _lock:
        _current = _replace(_current, changes)
        return _current


@contextlib.contextmanager
def override(**changes: object) -> Iterator[Settings]:
    """Change settings inside a ``with`` block, then restore them."""
    global _current
    with _lock:
        before = _current
        _current = _replace(before, changes)
    try:
        yield _current
    finally:
        with _lock:
            _current = before


def _replace(base: Settings, changes: Mapping[str, object]) -> Settings:
    names = {f.name for f in dataclasses.fields(Settings)}
    unknown = sorted(set(changes) - names)
    if unknown:
        raise TypeError(f"unknown setting(s) {unknown}; settings are {sorted(names)}")
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]
