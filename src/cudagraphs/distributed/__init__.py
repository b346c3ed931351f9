"""Collectives between devices and processes: NCCL, as graph nodes like any other work.

Two ways to make a communicator:

- :func:`local_group`: every device of this process (one rank per device);
  its operations take one array per rank and issue them together;
- :func:`init`: one rank per process (one process per GPU, on one machine or
  several), the ranks meeting through a store (:class:`FileStore`,
  :func:`TCPStore`).

Operations: ``all_reduce``, ``all_gather``, ``reduce_scatter``,
``broadcast``, ``send``/``recv`` (:func:`group_calls` issues several
together), eagerly or inside ``cg.capture()``. On GPUs they run through NCCL
(``pip install 'cudagraphs[nccl]'``: nccl4py); on ``sim``, through a
simulated communicator that runs them in stream order across the simulated
devices (``CUDAGRAPHS_SIM_DEVICES``) and raises where a GPU would hang.
"""

from __future__ import annotations

from .._errors import CollectiveTimeoutError, DistributedError
from ._comm import Communicator, LocalGroup, group_calls, init, local_group
from ._engine import REDUCTIONS
from ._store import FileStore, Store, TCPStore

__all__ = [
    "REDUCTIONS",
    "CollectiveTimeoutError",
    "Communicator",
    "DistributedError",
    "FileStore",
    "LocalGroup",
    "Store",
    "TCPStore",
    "group_calls",
    "init",
    "local_group",
]
