"""Delete each safety mechanism of the core, one at a time, and run the suite on sim.

A mechanism (a wait, a keep-alive, a refusal, a deferred release) whose
deletion leaves every test green has no test protecting it. Each mutation is
applied to a scratch copy of the tree, never to the checkout.

Usage: python scripts/mutation_check.py [-k NAME]   (prints one line per mutation)
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (name, file, code to delete or replace, replacement)
MUTATIONS = [
    (
        "a release skips a closed stream whose work nothing waited for",
        "src/cudagraphs/_recording.py",
        "        live = [s for s in streams if not s.closed or id(s._raw) in UNFINISHED]\n",
        "        live = [s for s in streams if not s.closed]\n",
    ),
    (
        "a miss takes another stream's block while a capture is active",
        "src/cudagraphs/_recording.py",
        "    if _ACTIVE or not _act():\n        yield False\n        return",
        "    if not _act():\n        yield True\n        return",
    ),
    (
        "deferred release runs at once",
        "src/cudagraphs/_recording.py",
        "    if _ACTIVE or not _act():\n        _QUEUE.append((device, fn, args))\n        return\n    try:",
        "    _acting[0] += 1\n    try:",
    ),
    (
        "a capture begins while a release runs",
        "src/cudagraphs/_recording.py",
        "        while _acting[0]:  # and from here on none begins\n            _settled.wait()\n",
        "",
    ),
    (
        "finalizers release inline",
        "src/cudagraphs/_recording.py",
        '    """Queue ``fn(*args)`` for the next safe point (from finalizers: never blocks)."""\n    _QUEUE.append((device, fn, args))',
        '    """Queue ``fn(*args)`` for the next safe point (from finalizers: never blocks)."""\n    fn(*args)',
    ),
    (
        "dead blocks released under any lock",
        "src/cudagraphs/_allocator.py",
        "        if not cg_lock_take(lock, False):  # (never waits: the lock may be this thread's own)",
        "        if not cg_lock_take(lock, True):",
    ),
    (
        "capture keeps nothing alive",
        "src/cudagraphs/_recording.py",
        "                if block.owner not in owners:\n                    keep.append(o)",
        "                pass",
    ),
    (
        "other threads' work recorded",
        "src/cudagraphs/_recording.py",
        '        if self.thread != cg_thread_ident():\n            raise CaptureError(\n                f"{kind',
        '        if False:\n            raise CaptureError(\n                f"{kind',
    ),
    (
        "refused work recorded",
        "src/cudagraphs/_recording.py",
        "        if refuse is not None:\n            self.fail(refuse)",
        "",
    ),
    (
        "device sync allowed during captures",
        "src/cudagraphs/_device.py",
        '        _recording.forbid(self, None, "Device.synchronize()", device_wide=True)\n',
        "",
    ),
    (
        "stream closed while captured",
        "src/cudagraphs/_device.py",
        '        if self._recording is not None:\n            raise CaptureError(\n                f"Stream.close()',
        '        if False:\n            raise CaptureError(\n                f"Stream.close()',
    ),
    (
        "body after the end accepted",
        "src/cudagraphs/_recording.py",
        "        if not self.active:\n            raise RuntimeError(",
        "        if False:\n            raise RuntimeError(",
    ),
    (
        "embedded graph not kept",
        "src/cudagraphs/_graph.py",
        'backend.capture_node(raw, "child", child), keep=(self,)))',
        'backend.capture_node(raw, "child", child)))',
    ),
    (
        "strided views passed as pointers",
        "src/cudagraphs/_kernel.py",
        "                if not arr.is_contiguous:\n",
        "                if False:\n",
    ),
    (
        "misaligned views accepted",
        "src/cudagraphs/_array.py",
        "    if offset % itemsize or any(s % itemsize for s in st):",
        "    if False:",
    ),
    (
        "integers wrap",
        "src/cudagraphs/_transfer.py",
        "        if lo < info.min or hi > info.max:",
        "        if False:",
    ),
    (
        "update keeps old parameters",
        "src/cudagraphs/_update.py",
        "    _recording.later(graph.device, release_resources, old)\n",
        "",
    ),
    (
        "pools never return memory",
        "src/cudagraphs/_pool.py",
        "        _recording.release(self.device, _give_back, self.device.allocator, segments, streams)",
        "        pass",
    ),
    (
        "sim keeps condition handles",
        "src/cudagraphs/backends/sim/conditions.py",
        "                self._refs.pop(handle, None)\n                self.values.pop(handle, None)",
        "                self._refs.pop(handle, None)",
    ),
    (
        "set_arg skips the shape check",
        "src/cudagraphs/_node_changes.py",
        "        if (view.shape, view.strides, view.dtype) != (recorded.shape, recorded.strides, recorded.dtype):",
        "        if False:",
    ),
    (
        "host slot frees with the slot",
        "src/cudagraphs/_scalar.py",
        "        self._bytes: np.ndarray | None = pinned_array(dev, nbytes)",
        "        self._bytes: np.ndarray | None = pinned_array(dev, nbytes).copy()",
    ),
    (
        "unused conditions reach the driver",
        "src/cudagraphs/_capture.py",
        "            if rec.conditions:\n",
        "            if False:\n",
    ),
    (
        "loop guard omitted",
        "src/cudagraphs/_control.py",
        "            if exc_type is None and self._guard is not None and not empty:",
        "            if False:",
    ),
    # stream ordering (issue 9: each must be caught by sim's stream queues)
    (
        "Stream.wait waits for nothing",
        "src/cudagraphs/_device.py",
        '"", lambda raw, _: backend.stream_wait_event(raw, event), keep=(other,)),',
        '"", lambda raw, _: None, keep=(other,)),',
    ),
    # (not listed: get()'s synchronize after its download into a new numpy array, which
    # the driver already completes before returning for pageable memory, so deleting it
    # changes nothing on either backend)
    (
        "get_async's copy does not wait for the array's stream",
        "src/cudagraphs/_transfer.py",
        "        copy_stream.wait(stream)\n",
        "",
    ),
    (
        "get_async's result does not wait for the copy",
        "src/cudagraphs/_transfer.py",
        "            self._done.synchronize()\n",
        "",
    ),
    # (not listed: get_async's record_stream of its source; the handle holds the
    # source until its result is read, so the memory cannot be reused under the copy)
    (
        "cache reuse does not wait for other streams",
        "src/cudagraphs/_allocator.py",
        "                if self._waits:  # (a failed wait leaves the block where it was)\n"
        "                    self._wait_for(cached[-1], stream)",
        "                pass",
    ),
    (
        "stolen block does not wait for its owner",
        "src/cudagraphs/_allocator.py",
        "                            self._follow(stream, other)\n",
        "                            pass\n",
    ),
    (
        "pool release does not wait for its other streams",
        "src/cudagraphs/_allocator.py",
        "                    self._follow(first, other)  # the free is queued on first: after them all\n",
        "                    pass\n",
    ),
    (
        "a stream closed while a release uses it is destroyed under it",
        "src/cudagraphs/_recording.py",
        "        if id(raw) in _held:\n",
        "        if False:\n",
    ),
    (
        "sim: a free does not wait for its stream's work",
        "src/cudagraphs/backends/sim/backend.py",
        "        self._scheduler.queue(stream, lambda: self._memory.free(ptr))",
        "        self._memory.free(ptr)",
    ),
    (
        "generator state reused under a draw on another stream",
        "src/cudagraphs/_random.py",
        "            self._state.record_stream(s)  # its memory is not reused before that stream is done\n",
        "            pass\n",
    ),
    # (not listed: the graphed callable's side stream waiting for the call's stream before
    # a capture. The side stream only ever captures: a capture starts with no dependency on
    # the stream's earlier work, warmups run on the call's stream, and replays run there;
    # the one eager use of the side stream, the free of the pool's segments (the pool's
    # first stream), waits for every stream its graphs replayed on ("pool release does not
    # wait for its other streams", above). Deleting the wait changes nothing on either
    # backend, so no test can fail without it)
    (
        "DLPack consumer does not wait",
        "src/cudagraphs/_dlpack.py",
        "    device.external_stream(stream).wait(device.current_stream())\n",
        "    device.external_stream(stream)\n",
    ),
    # keep-alives of the nodes a capture records
    (
        "builder event-record node keeps no event",
        "src/cudagraphs/_builder.py",
        "backend.event_record(event._raw, raw, external=True),\n                    keep=(event,),",
        "backend.event_record(event._raw, raw, external=True),",
    ),
    (
        "builder host node keeps nothing",
        "src/cudagraphs/_builder.py",
        'Work("host", issue, keep=(callbacks, fn, *args))',
        'Work("host", issue)',
    ),
    (
        "builder child keeps nothing",
        "src/cudagraphs/_builder.py",
        "child), keep=(graph, *used)),",
        "child), keep=()),",
    ),
    # (not listed: the conditional node's keep of its Condition, a plain record of a
    # handle the graph owns on both backends; keeping it is free and changes nothing)
    (
        "rebind keeps no new array",
        "src/cudagraphs/_node_changes.py",
        "    _move(graph.device.backend, exec_, records, hits, key, spec, new.ptr)\n    graph._res.keep.append(new)\n",
        "    _move(graph.device.backend, exec_, records, hits, key, spec, new.ptr)\n",
    ),
    (
        "a graphed call repeated on another stream",
        "src/cudagraphs/_graphed_callable.py",
        "        if (source is not armed.source and source != armed.source) or stream._recording is not None:",
        "        if stream._recording is not None:",
    ),
    (
        "a graphed call repeated on a captured stream",
        "src/cudagraphs/_graphed_callable.py",
        "        if (source is not armed.source and source != armed.source) or stream._recording is not None:",
        "        if source is not armed.source and source != armed.source:",
    ),
    (
        "a graphed call repeated for another shape or dtype",
        "src/cudagraphs/_graphed_callable.py",
        "            if (shape is not i.shape and shape != i.shape) or (dtype is not i.dtype and dtype != i.dtype):",
        "            if False:",
    ),
    (
        "a graphed call repeated with the last call's inputs",
        "src/cudagraphs/_graphed_callable.py",
        "            if x is not i.obj or (ptr is not i.ptr and ptr != i.ptr) or contiguous != i.contiguous:",
        "            if contiguous != i.contiguous:",
    ),
    (
        "a graphed call repeated for another type of input",
        "src/cudagraphs/_graphed_callable.py",
        "            if type(x) is not type(i.obj):\n                return _MISSED\n",
        "",
    ),
    (
        "a graphed call that raised stays armed",
        "src/cudagraphs/_graphed_callable.py",
        "                self._armed = None  # (until this call is made: a call that raises leaves it so)\n",
        "",
    ),
    (
        "graph outputs never expire",
        "src/cudagraphs/_graphed_callable.py",
        "        if lease.calls != self._call:",
        "        if False:",
    ),
    (
        "GraphModule replays with replaced parameters",
        "src/cudagraphs/_graph_module.py",
        "            if stale:",
        "            if False:",
    ),
    (
        "GraphModule replays without the parameters added",
        "src/cudagraphs/_graph_module.py",
        "            if self._added:",
        "            if False:",
    ),
    (
        "repoint moves memory two arrays share and move differently",
        "src/cudagraphs/_node_changes.py",
        "    if any(d != delta for d, _ in inside):",
        "    if False:",
    ),
    (
        "repoint moves a part of what a node reads",
        "src/cudagraphs/_node_changes.py",
        "        if any(d and a < hi and lo < b for a, b, d, _ in ranges):",
        "        if False:",
    ),
    (
        "repoint moves another library's node in memory two arrays share",
        "src/cudagraphs/_node_changes.py",
        "    if others:\n        _refuse_shared(graph, exec_, records, ranges)",
        "    if others:\n        pass",
    ),
    (
        "graph pools reuse no freed range",
        "src/cudagraphs/_pool.py",
        "            fits = [(n, start) for start, (n, _) in self._free.items() if n >= size]",
        "            fits = [(n, start) for start, (n, _) in self._free.items() if n == -1]",
    ),
    (
        "other libraries' pools die with their GraphPool, mid-capture",
        "src/cudagraphs/_pool.py",
        "        weakref.finalize(self, _recording.release, self.device, dict.clear, self.foreign).atexit = False",
        "        pass",
    ),
    (
        "repoint leaves other libraries' nodes alone",
        "src/cudagraphs/_node_changes.py",
        "    if others and moves != graph._moves:\n        _unrecorded_users(graph, exec_, records, moves, patch=True)",
        "    if others and moves != graph._moves:\n        pass",
    ),
    (
        "a foreign array is let go during a capture",
        "src/cudagraphs/_array.py",
        "        release(self.device, _drop, obj)",
        "        _drop(obj)",
    ),
    (
        "repoint keeps no new array",
        "src/cudagraphs/_node_changes.py",
        "    graph._res.keep.extend(new for _, new in pairs)\n",
        "",
    ),
    (
        "builder memset keeps no array",
        "src/cudagraphs/_builder.py",
        "backend.memset(ptr, value, nbytes, raw), None, (), (dst,)),",
        "backend.memset(ptr, value, nbytes, raw), None, (), ()),",
    ),
    (
        "HostSlot download keeps no buffer",
        "src/cudagraphs/_scalar.py",
        'submit(stream, Work("memcpy", backend.memcpy, copy, (x,), (), (buf,)))',
        'submit(stream, Work("memcpy", backend.memcpy, copy, (x,), (), ()))',
    ),
    (
        "HostSlot upload keeps no buffer",
        "src/cudagraphs/_scalar.py",
        'submit(stream, Work("memcpy", backend.memcpy, copy, (), (x,), (buf,)))',
        'submit(stream, Work("memcpy", backend.memcpy, copy, (), (x,), ()))',
    ),
    # several devices and the communicators (issue 13)
    (
        "graphs of an aborted communicator still replay",
        "src/cudagraphs/distributed/_comm.py",
        "                graph._unusable(error)",
        "                pass",
    ),
    (
        "a collective's output in a capture is planned before the fork",
        "src/cudagraphs/distributed/_comm.py",
        "            st = self._fork(st)\n            plans = [plan(c, x, o, s) for c, x, o, s in zip(self.comms, xs, outs, st)]",
        "            plans = [plan(c, x, o, s) for c, x, o, s in zip(self.comms, xs, outs, st)]\n"
        "            st = self._fork(st)",
    ),
    (
        "sim: a stream behind one that waits for another process runs on",
        "src/cudagraphs/backends/sim/backend.py",
        "            while not run(other, seq, wait=False):",
        "            while not run(other, seq):",
    ),
    (
        "sim: a remote abort ends the other operations without an error",
        "src/cudagraphs/distributed/_simulated.py",
        "            meeting.done, meeting.error = True, error  # (the stopped streams go on)",
        "            meeting.done = True",
    ),
    (
        "sim: mailbox files stay after they are read",
        "src/cudagraphs/distributed/_mailbox.py",
        "        path.unlink()  # (read once: only this rank reads it)",
        "        pass",
    ),
    (
        "a graph keeps nothing of the memory other libraries' kernels in it use",
        "src/cudagraphs/_graph.py",
        "        res.keep.extend(interop.keep_foreign(self.device, raw_graph, self._records, res.keep, res.pools))\n",
        "",
    ),
    (
        "the census of live arrays finds no library's arrays",
        "src/cudagraphs/interop/_keep.py",
        "            lib = kinds[t] = _library_for(t, wanted)",
        "            lib = kinds[t] = None",
    ),
    (
        "a census is forgotten: every capture with other libraries' nodes makes a new one",
        "src/cudagraphs/interop/_keep.py",
        "        _remember(device.index, spans)\n",
        "",
    ),
    (
        "an expiring array's cached view read without its check",
        "src/cudagraphs/_recording.py",
        "        if spec is None or cg_type_in(a, _EXPIRING):",
        "        if spec is None:",
    ),
    (
        "the allocator's free list at hand kept after empty_cache emptied the cache",
        "src/cudagraphs/_allocator.py",
        "        self._last_free = None  # (a list no longer in _free)\n",
        "",
    ),
    (
        "a capture's signature left out of its records' kinds and names (update reads no record)",
        "src/cudagraphs/_recording.py",
        "            self.signature = cg_mix(self.signature, kind, name)\n",
        "",
    ),
    (
        "an expiring array's address read from its field, not through its checking property",
        "src/cudagraphs/_recording.py",
        "    if cg_type_in(arr, _EXPIRING):\n        return arr.ptr  # type: ignore[attr-defined]  # (DeviceArray's property: it checks)\n",
        "",
    ),
    (
        "a kernel's spare list of launch values lent without being marked lent",
        "src/cudagraphs/_kernel.py",
        "        self._spare = None  # (lent)",
        "        pass",
    ),
    (
        "the memory a graph holds is read at every capture's end (PyTorch's pool snapshots)",
        "src/cudagraphs/interop/__init__.py",
        "    return foreign_memory(device, graph, records, libs, owned)",
        "    held = owned()\n    return foreign_memory(device, graph, records, libs, lambda: held)",
    ),
    (
        "the graph's own pools are looked for in a census",
        "src/cudagraphs/interop/_keep.py",
        "    addresses = _outside(owned(), sorted(",
        "    addresses = _outside([], sorted(",
    ),
]


def _suite(tree: Path) -> bool:
    """Whether the suite passes on sim in ``tree`` (a hang counts as a failure)."""
    try:
        r = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "--timeout=120", "tests"],
            cwd=tree,
            capture_output=True,
            text=True,
            env={"CUDAGRAPHS_BACKEND": "sim", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(tree / "src")},
            timeout=900,
        )
    except subprocess.TimeoutExpired:
        return False
    return r.returncode == 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-k", action="append", help="only mutations whose name contains this (repeatable)")
    args = parser.parse_args()
    survived = 0
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        # (without the compiled modules: a mutation of a .py must be what runs, so the suite runs
        # the package as plain Python, the mode that ships where no compiler is)
        shutil.copytree(
            ROOT, tree, ignore=shutil.ignore_patterns(".venv", ".git", ".baseline", "out", "*.so", "build")
        )
        if not _suite(tree):
            print("the suite fails without any mutation: fix that first")
            return 2
        for name, rel, old, new in MUTATIONS:
            if args.k and not any(k in name for k in args.k):
                continue
            path = tree / rel
            original = path.read_text()
            if original.count(old) != 1:
                print(f"STALE  {name}: the code to mutate is not in {rel} exactly once")
                survived += 1
                continue
            path.write_text(original.replace(old, new))
            try:
                killed = not _suite(tree)  # a hang (a deadlock) is a detection too
            finally:
                path.write_text(original)
            survived += not killed
            print(f"{'killed' if killed else 'SURVIVED'}  {name}", flush=True)
    print(f"{survived} mutation(s) survived")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
