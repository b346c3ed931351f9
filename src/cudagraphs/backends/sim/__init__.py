"""The ``sim`` backend: a CPU simulation of a CUDA device, in numpy.

It is the living spec of the library's behaviour on machines without a GPU:

* device memory is a set of numpy byte buffers at fake aligned addresses; a
  freed address goes to the next allocation that fits, lowest first, as the
  driver's (:attr:`SimBackend.reuse_addresses` turns that off, so a stale
  pointer always fails loudly with ``CUDA_ERROR_ILLEGAL_ADDRESS``);
* fresh allocations are filled with a poison byte, as real device memory
  holds whatever was there before;
* streams are queues: queued work runs only when something forces it (a
  synchronize or query of the stream, device or event, a download into
  pageable memory, a wait on an event of another stream, which first runs
  that stream up to the event, destroying the stream, or more than
  ``MAX_PENDING`` items pending); a device synchronize runs the streams in
  an interleaving drawn from ``CUDAGRAPHS_SIM_SEED``, so a missing wait
  between two streams gives wrong results instead of passing by luck;
* device addresses are resolved when work runs: touching freed memory (that
  no allocation took again) then raises CUDA_ERROR_ILLEGAL_ADDRESS and, as on
  a GPU, leaves the context unusable until :meth:`SimBackend.reset` (tests
  reset it); a free (``cuMemFreeAsync``) runs in its stream's order, as the
  driver's (at once on an idle stream), and a graph's memory keeps its
  address while the graph lives;
* pageable host memory is staged when an upload is queued, and a download
  into it completes before the call returns (the driver's rules); pinned
  memory is read and written when the copy runs;
* a graph launch runs the executable as it was at launch time (node and
  whole-graph updates apply to later launches);
* kernels run their host implementation on numpy views of device memory
  (one that sets a conditional handle gets the device's host context);
* while a stream is captured, work is recorded as graph nodes instead of run,
  and the calls the driver refuses during a capture (the table ``RULES``)
  fail with the driver's code and invalidate the captures the driver would;
* what the driver holds by pointer (host callbacks, the events of graph
  nodes, pinned host memory of copy nodes) must still live when it is used;
* an H100's launch limits, and graph memory that outlives a launch, are
  refused as the driver refuses them;
* :meth:`SimBackend.inject` makes the N-th call of a kind (``FAULTS``) fail
  with the driver's code, and :meth:`SimBackend.live_handles` counts driver
  objects made and not destroyed, for fault sweeps;
* errors carry CUDA's result codes (invalid value, out of memory, ...);
* threads may use it at once, as they use the driver: every primitive runs
  holding one re-entrant lock (so work it runs, a host function or a
  kernel's host code, may call the backend again), let go only while the
  host waits for another process.

Its modules, from the bottom up: :mod:`.rules` (what the driver refuses
during a capture, and its errors), :mod:`.faults` (fault injection),
:mod:`.memory` (device memory), :mod:`.conditions` (conditional handles),
:mod:`.graph` (the graph DAG), :mod:`.executor` (running a graph),
:mod:`.streams` (streams, events and the scheduler that runs them),
:mod:`.kernels` (kernels and host functions), and :mod:`.backend`
(:class:`SimBackend`, the primitives). Each simulator has state of its own:
two never share a stream, an allocation or a conditional handle's value.
"""

from __future__ import annotations

from ..base import Rendezvous
from .backend import SimBackend
from .faults import FAULTS
from .rules import RULES, Rule

__all__ = ["FAULTS", "RULES", "Rendezvous", "Rule", "SimBackend"]
