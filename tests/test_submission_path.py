"""Work reaches a stream through ``_recording.submit``, except where this file says why.

docs/architecture.md ("One path for all queued work"): every piece of work
that queues on a stream is a ``Work`` handed to ``submit``, which records it
in a capture or issues it. This test reads the package's source and lists
every place that reaches a backend primitive that queues work (a launch, a
copy, a memset, an event record or wait, a graph launch, a stream-ordered
allocation or free, a node added to a capture) outside a ``Work`` and
outside the ``issue`` function a ``Work`` carries. Each such place must be
in ``BYPASSES`` with its reason, and each entry of ``BYPASSES`` must still
exist: a new way around ``submit`` fails here, and so does a bypass removed
without taking it off the list (the list only shrinks).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "cudagraphs"

# the backend methods that queue work on a stream or add a node to a capture
QUEUEING = frozenset(
    {
        "launch",
        "launch_host",
        "memcpy",
        "memset",
        "event_record",
        "stream_wait_event",
        "graph_launch",
        "mem_alloc",
        "mem_free",
        "capture_node",
    }
)

_MEMORY = "the allocator's own memory management: never captured work (the capture mode is relaxed around it)"
_REPLAY = (
    "a replay's launch: Graph.replay submits a child-graph Work where its stream is captured, and "
    "otherwise launches; submit would only issue it (a replay names no array whose rules it applies), "
    "at a cost on the replay path"
)

# (module, function, primitive): why it does not go through submit
BYPASSES: dict[tuple[str, str, str], str] = {
    ("_allocator.py", "CachingAllocator._driver_alloc", "mem_alloc"): _MEMORY,
    ("_allocator.py", "CachingAllocator._empty_cache_locked", "mem_free"): _MEMORY,
    ("_allocator.py", "CachingAllocator._follow", "stream_wait_event"): _MEMORY,
    ("_allocator.py", "CachingAllocator._record", "event_record"): _MEMORY,
    ("_allocator.py", "CachingAllocator._wait_for", "stream_wait_event"): _MEMORY,
    ("_allocator.py", "CachingAllocator.free_segment", "mem_free"): _MEMORY,
    ("_allocator.py", "CachingAllocator.segment", "mem_alloc"): _MEMORY,
    ("_pool.py", "GraphMemory.allocate", "mem_alloc"): (
        "a graph-owned allocation during a capture: the driver records the allocation node as it "
        "returns the address (a Work's issue returns a node), in memory the capture itself owns"
    ),
    ("_recording.py", "Recording.flush_frees", "mem_free"): (
        "the free nodes of graph-owned memory, which Recording.record records before the work it "
        "records: submit's own step (a Work here would recurse into it)"
    ),
    ("_recording.py", "begin", "event_record"): "the event that marks a capture's start: submit's own module",
    ("_builder.py", "GraphBuilder._node", "capture_node"): (
        "sets the dependencies of the builder's next node, no work of its own"
    ),
    ("_executable.py", "ordered_launch.launch", "event_record"): _REPLAY + " (across devices)",
    ("_executable.py", "ordered_launch.launch", "graph_launch"): _REPLAY + " (across devices)",
    ("_executable.py", "ordered_launch.launch", "stream_wait_event"): _REPLAY + " (across devices)",
    ("_graph.py", "Graph._capturing", "graph_launch"): _REPLAY + " (binds the backend's launch)",
    ("_graph.py", "Graph.upload", "graph_launch"): "uploads the executable, no work on the stream's data",
    ("_kernel.py", "Kernel._arm", "launch"): (
        "names the backend's launch as the Packer's fallback (what issues a kernel's Work where the "
        "Packer cannot): queues nothing"
    ),
    ("_kernel.py", "Kernel.function", "launch"): (
        "binds the backend's launch as the issue of the kernel's Works (Kernel._enqueue submits them): "
        "queues nothing"
    ),
    ("_graph.py", "Graph._set_exec", "graph_launch"): (
        "compares the graph's launch with the backend's, to know whether the C part's cuGraphLaunch "
        "may stand in for it: queues nothing"
    ),
}


def _is_backend(node: ast.expr) -> bool:
    """Whether ``node`` names a backend: ``backend``, ``x.backend``, ``self._backend``."""
    if isinstance(node, ast.Name):
        return node.id in ("backend", "_backend")
    return isinstance(node, ast.Attribute) and node.attr in ("backend", "_backend")


_MAKERS = ("Work", "submit_parts")  # (submit_parts: a work given by its parts, as the hot paths give it)


def _is_work(node: ast.AST) -> bool:
    """``Work(...)``, ``submit_parts(...)``, or ``tuple.__new__(Work, ...)``."""
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    if (isinstance(f, ast.Name) and f.id in _MAKERS) or (isinstance(f, ast.Attribute) and f.attr in _MAKERS):
        return True
    return bool(node.args) and isinstance(node.args[0], ast.Name) and node.args[0].id == "Work"


def bypasses(root: Path = SRC) -> set[tuple[str, str, str]]:
    """Every (module, function, primitive) that reaches a queueing primitive outside a Work.

    A call of a primitive counts unless it is inside a ``Work(...)`` or the
    ``issue`` function a Work carries; naming a primitive without calling it
    (binding it for later) counts unless the function it is in builds a Work.
    """
    found: set[tuple[str, str, str]] = set()
    for path in sorted(root.rglob("*.py")):
        module = path.relative_to(root).as_posix()
        if module.startswith(("backends/", "bench/")) or module == "demo.py":
            continue  # (the backends are the primitives; the benchmarks and the demo measure them)
        tree = ast.parse(path.read_text())
        called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}

        def visit(
            node: ast.AST,
            scope: list[str],
            inside_work: bool,
            builds: bool,
            module: str = module,
            called: set[int] = called,
        ) -> None:
            for child in ast.iter_child_nodes(node):
                names, ok, b = scope, inside_work or _is_work(child), builds
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names = [*scope, child.name]
                    ok = ok or child.name == "issue"  # (the function a Work carries)
                    b = any(_is_work(n) for n in ast.walk(child))
                if (
                    isinstance(child, ast.Attribute)
                    and child.attr in QUEUEING
                    and _is_backend(child.value)
                    and not inside_work
                    and (id(child) in called or not builds)
                ):
                    found.add((module, ".".join(scope) or "<module>", child.attr))
                visit(child, names, ok, b)

        visit(tree, [], False, False)
    return found


def test_work_reaches_streams_through_submit_except_the_listed_bypasses() -> None:
    found = bypasses()
    new = sorted(found - set(BYPASSES))
    assert not new, (
        f"work queued around _recording.submit at {new}: describe it as a Work and submit it "
        "(or, for a reason, add it to BYPASSES in this file)"
    )
    gone = sorted(set(BYPASSES) - found)
    assert not gone, f"these bypasses no longer exist: take them off BYPASSES: {gone}"


def test_the_scan_sees_a_bypass_and_what_a_work_carries(tmp_path: Path) -> None:
    """The scanner itself: a direct call is found; calls inside a Work or its issue function are not."""
    (tmp_path / "mod.py").write_text(
        "def eager(backend, stream, launch):\n"
        "    backend.launch(stream, launch)\n"
        "def described(device, stream, copy):\n"
        "    submit(stream, Work('memcpy', device.backend.memcpy, copy))\n"
        "    def issue(raw, arg):\n"
        "        return device.backend.memset(arg, 0, 4, raw)\n"
        "    submit(stream, Work('memset', issue, 0))\n"
        "class Bound:\n"
        "    def bind(self):\n"
        "        self.go = self._backend.graph_launch\n"
        "def described_later(backend, stream, launch):\n"
        "    issue = backend.launch\n"
        "    submit(stream, tuple.__new__(Work, ('kernel', issue, launch)))\n"
        "def made(backend, stream, copy):\n"
        "    submit_parts(stream, 'memcpy', backend.memcpy, copy, (), (), (), '', None, None)\n"
    )
    assert bypasses(tmp_path) == {("mod.py", "eager", "launch"), ("mod.py", "Bound.bind", "graph_launch")}
