"""Pictures of graphs: Graphviz DOT text, and files rendered by Graphviz.

Nodes are drawn by type and kernel name with their dependency edges; the
bodies of conditional nodes are clusters (``body 0`` of a while/if, one per
branch of a switch) linked to their node by dashed edges.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

__all__ = ["check_destination", "save", "to_dot"]

_COLORS = {
    "kernel": "#cfe2ff",
    "memcpy": "#d1e7dd",
    "memset": "#fff3cd",
    "mem_alloc": "#f8d7da",
    "mem_free": "#f8d7da",
    "host": "#e2d9f3",
    "child": "#dee2e6",
    "conditional": "#ffe5d0",
}


def to_dot(backend: Any, graph: Any, label: str) -> str:
    """The DOT text of driver graph ``graph`` (None: an empty picture) titled ``label``."""
    lines = [
        "digraph cudagraphs {",
        '  rankdir=TB; compound=true; node [shape=box, style="rounded,filled", fontname="Helvetica"];',
        f'  label="{label}"; labelloc=t; fontname="Helvetica";',
    ]
    if graph is not None:
        _add(backend, graph, "n", lines, "  ")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _add(backend: Any, graph: Any, prefix: str, lines: list[str], indent: str) -> str:
    """Append one driver graph's nodes and edges; return its first node's name."""
    nodes, edges = backend.graph_topology(graph)
    for i, n in enumerate(nodes):
        text = f"{i}: {n.type}" + (f"\\n{n.name}" if n.name else "")
        lines.append(f'{indent}{prefix}{i} [label="{text}", fillcolor="{_COLORS.get(n.type, "#eeeeee")}"];')
    lines.extend(f"{indent}{prefix}{a} -> {prefix}{b};" for a, b in edges)
    for i, n in enumerate(nodes):
        for k, body in enumerate(n.bodies):
            sub = f"{prefix}{i}_{k}_"
            lines.append(f"{indent}subgraph cluster_{sub} {{")
            lines.append(f'{indent}  label="body {k} of node {i}"; style=dashed;')
            first = _add(backend, body, sub, lines, indent + "  ")
            lines.append(f"{indent}}}")
            if first:
                lines.append(f"{indent}{prefix}{i} -> {first} [style=dashed, lhead=cluster_{sub}];")
    return f"{prefix}0" if nodes else ""


def check_destination(path: str | os.PathLike[str]) -> Path:
    """``path`` checked to be a picture :func:`save` can write, before any work is done.

    Raises
    ------
    RuntimeError
        If Graphviz's ``dot`` program is needed but not installed.
    ValueError
        For another file suffix, a directory, or a folder that does not exist.
    """
    out = Path(path)
    fmt = out.suffix.lower().lstrip(".")
    if out.is_dir():
        raise ValueError(f"{str(out)!r} is a directory: give a file name (e.g. graph.svg or graph.dot)")
    if fmt not in ("dot", "svg", "png", "pdf"):
        raise ValueError(f"save writes .dot, .svg, .png or .pdf files, got {out.name!r}")
    if not out.parent.is_dir():
        raise ValueError(f"cannot write {str(out)!r}: the folder {str(out.parent)!r} does not exist")
    if fmt != "dot" and shutil.which("dot") is None:
        raise RuntimeError(
            f"saving {out.name!r} needs Graphviz's `dot` program, which is not installed: "
            "install graphviz (e.g. `apt install graphviz` or `conda install graphviz`), "
            "or save as .dot and render it elsewhere"
        )
    return out


def save(dot: str, path: str | os.PathLike[str]) -> Path:
    """Write ``dot`` to ``path``: ``.dot`` as text, ``.svg``/``.png``/``.pdf`` via Graphviz.

    Raises
    ------
    RuntimeError, ValueError
        For a destination :func:`check_destination` refuses.
    """
    out = check_destination(path)
    fmt = out.suffix.lower().lstrip(".")
    if fmt == "dot":
        out.write_text(dot)
        return out
    program = shutil.which("dot")
    assert program is not None  # (checked above)
    subprocess.run(
        [program, f"-T{fmt}", "-o", str(out)], input=dot, text=True, check=True, capture_output=True
    )
    return out
