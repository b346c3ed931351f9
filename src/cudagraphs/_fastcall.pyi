"""The optional C part, ``cudagraphs._fastcall`` (``_fastcall.c``): its contract with the Python code.

What the module offers is typed below. What it reads of Python objects is
declared here too, in one place (the C source names each of these where it
reads them; ``tests/test_core.py::test_the_c_part_reads_only_declared_names``
fails when the C source names an attribute this page does not):

===================================  ==============================================
class (given to C by)                attributes, slots and methods C reads
===================================  ==============================================
``DeviceArray`` (``configure``)      fields ``_ptr device dtype is_contiguous shape
                                     size strides _block _arg`` (at the offsets
                                     ``_array`` gives where compiled, else slots);
                                     ``ptr`` and ``_view_spec`` not overridden
``Stream`` (``configure``)           fields ``device handle _recording _finalizer``
                                     (at the offsets ``_fields`` gives where
                                     compiled, else slots)
``KernelLaunch`` (``Packer.issue``)  its six items; its function's ``handle``
``GraphedCallable``                  ``_hot``, ``_moved()``, ``replay()``; ``Lease``
(``graphed_method``)                 slots ``calls made``; ``Entry`` slot ``hits``;
                                     ``GraphOutput`` slots ``_lease _call``
other libraries' tensors             ``data_ptr get_device is_contiguous shape dtype``
keyword arguments                    ``stream``
the standard library                 ``time.monotonic``; ``weakref.finalize``'s
                                     ``_registry`` and ``alive``; a lock's ``acquire
                                     release locked`` (``blocking``, ``timeout``,
                                     ``reentrant``)
compiled modules (``api``)           nothing: _fastcall_api.h declares what they call
===================================  ==============================================

Every decision the C paths take is also taken by the Python code they stand
in front of (docs/architecture.md, "The compiled part"): issue 27 replaces
them with one implementation.
"""

from collections.abc import Callable, Sequence
from typing import Any

class Packer:
    """A kernel's argument layout: ``issue`` packs a checked launch's values and queues it."""

    def __init__(self, layout: Sequence[tuple[str, int, int]], fallback: Callable[[Any, Any], Any]) -> None: ...
    def issue(self, stream: Any, launch: Any) -> None: ...

class Lock:
    """A lock as ``threading.Lock`` (``threading.RLock`` if reentrant) that C takes without a call."""

    def __init__(self, *, reentrant: bool = False) -> None: ...
    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool: ...
    def release(self) -> None: ...
    def locked(self) -> bool: ...
    def __enter__(self) -> bool: ...
    def __exit__(self, *exc: object) -> None: ...

def bind(name: str, address: int) -> None: ...
def bound(name: str) -> int: ...
def names() -> list[str]: ...

api: Any  # a capsule: what compiled modules call (_fastcall_api.h: the Lock's take and give, trampolines)

def configure(
    array_type: type,
    stream_type: type,
    current_streams: Any,
    array_offsets: dict[str, int] | None,
    stream_offsets: dict[str, int] | None,
) -> None: ...
def graphed_method(
    callable_type: type,
    python_call: Callable[..., Any],
    lease_type: type,
    entry_type: type,
    output_type: type,
    active: dict[Any, Any],
) -> Callable[..., Any]: ...
def graphed_calls() -> int: ...
def cuLaunchKernel(*args: Any) -> Any: ...
def cuGraphLaunch(*args: Any) -> Any: ...
def cuEventRecord(*args: Any) -> Any: ...
def cuStreamWaitEvent(*args: Any) -> Any: ...
def cuMemAllocFromPoolAsync(*args: Any) -> Any: ...
def cuMemFreeAsync(*args: Any) -> Any: ...
def cuMemcpyDtoDAsync(*args: Any) -> Any: ...
def cuMemcpyDtoHAsync(*args: Any) -> Any: ...
def cuMemcpyHtoDAsync(*args: Any) -> Any: ...
def cuMemsetD8Async(*args: Any) -> Any: ...
def cuGraphExecKernelNodeSetParams(*args: Any) -> Any: ...
def cuGraphExecMemcpyNodeSetParams(exec_: Any, node: Any, dst: int, src: int, nbytes: int) -> Any: ...
