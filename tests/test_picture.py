"""Graph pictures: DOT text, files, and the error when Graphviz is missing."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import cudagraphs as cg


@pytest.fixture
def graph(dev: cg.Device) -> cg.Graph:
    x, y = cg.ones(8, "float32"), cg.zeros(8, "float32")

    def step() -> None:
        cg.ops.axpy(2.0, x, y)
        y[::2] = np.arange(4, dtype=np.float32)  # a memcpy into a temporary, then a strided copy
        cg.ops.fill(x, 3.0)

    return cg.capture(step)


def test_edges_and_dot(graph: cg.Graph) -> None:
    types = [n.type for n in graph.nodes]
    assert types == ["kernel", "memcpy", "kernel", "kernel"]
    assert graph.edges == [(0, 1), (1, 2), (2, 3)]
    dot = graph.to_dot()
    assert dot.startswith("digraph cudagraphs {")
    assert dot.rstrip().endswith("}")
    assert 'n0 [label="0: kernel\\ncg_axpy"' in dot
    assert 'n1 [label="1: memcpy"' in dot
    assert "n2 -> n3;" in dot
    assert "4 nodes (kernel 3, memcpy 1)" in dot


def test_save(graph: cg.Graph, tmp_path: Path) -> None:
    assert graph.save(tmp_path / "g.dot").read_text() == graph.to_dot()
    with pytest.raises(ValueError, match=re.escape("got 'g.txt'")):
        graph.save(tmp_path / "g.txt")
    if shutil.which("dot"):
        assert "<svg" in graph.save(tmp_path / "g.svg").read_text()
    else:
        with pytest.raises(RuntimeError, match="needs Graphviz's `dot` program"):
            graph.save(tmp_path / "g.svg")


def test_closed_graph_has_no_picture(graph: cg.Graph) -> None:
    graph.close()
    assert graph.nodes == ()
    assert graph.edges == []
    assert "0 nodes" in graph.to_dot()
