"""The cudagraphs command on each backend: bench, show, demo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import cudagraphs as cg


def cli(backend: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    # the package as this test found it, whatever the working directory
    here = str(Path(cg.__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "CUDAGRAPHS_BACKEND": backend, "PYTHONPATH": path}
    return subprocess.run(
        [sys.executable, "-m", "cudagraphs", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=cwd,
    )


def test_bench_quick_writes_json_markdown_and_plots(backend: str, tmp_path: Path) -> None:
    r = cli(backend, "bench", "--quick", "--out", str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "| eager launch | cudagraphs Kernel.launch |" in r.stdout
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["backend"] == backend
    assert "cudagraphs" in data["benchmarks"]["replay per node, 10-node graph (µs GPU)"]
    assert "whole-graph update" in (tmp_path / "bench.md").read_text()
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    pytest.importorskip("matplotlib")
    assert pngs == ["eager_vs_graph.png", "replay_call.png", "update.png"]
    assert (tmp_path / "update.png").read_bytes()[:4] == b"\x89PNG"


def test_capture_and_per_node_are_measured_in_a_fresh_process(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each framework's capture time and GPU time per node, alone in a child process (as raw C's)."""
    from cudagraphs.bench import graphs

    monkeypatch.setenv("CUDAGRAPHS_BACKEND", backend)
    got = graphs.clean("cudagraphs", (10, 20), 1)
    assert got is not None
    assert sorted(got) == ["capture", "node"]
    for metric in ("capture", "node"):
        assert sorted(got[metric]) == [10, 20]
        assert all(v > 0 for v in got[metric].values())
    assert graphs.clean("no such framework", (10,), 1) is None  # reported, not fatal
    updates = graphs._child(["--clean-update", "20", "1"], "the update benchmarks")
    assert updates["whole-graph update, 20 nodes (ms)"]["cudagraphs"] > 0
    assert updates["rebind, 20-node graph (µs per node)"]["cudagraphs"] > 0


def test_raw_c_figures_are_medians_over_fresh_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Raw C runs several times; each figure is its own median (one run's host timings swing)."""
    from cudagraphs.bench import graphs, rawc

    def run(source: str, args: tuple[str, ...] = (), repeats: int = 1) -> list[str]:
        assert source == "graph.cu"
        outs = []
        for i, call in enumerate([3.0, 1.0, 2.0, 9.0, 5.0][:repeats]):
            outs.append(
                f'{{"nodes": 10, "capture_ms": {i}, "per_node_us": 1.0, "call_us": {call}}}\n'
                f'{{"nodes": 1000, "capture_ms": 1.0, "per_node_us": 0.9, "call_us": {call * 2}}}\n'
                f'{{"update_nodes": 1000, "update_ms": {0.1 * (i + 1)}, "set_params_us": 0.5}}\n'
            )
        return outs

    monkeypatch.setattr(rawc, "run", run)
    got = graphs.raw_c(repeats=3)
    assert got[10]["call_us"] == 2.0
    assert got[10]["capture_ms"] == 1.0
    assert got[10]["update_ms"] is None  # (only the updated size has update figures)
    assert got[1000]["call_us"] == 4.0
    assert got[1000]["update_ms"] == pytest.approx(0.2)
    assert got[1000]["set_params_us"] == 0.5
    assert graphs.raw_c(repeats=1)[10]["call_us"] == 3.0


def test_show_example_and_function(backend: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    r = cli(backend, "show", "--example", "jacobi", "--out", str(tmp_path / "j.dot"))
    assert r.returncode == 0, r.stdout + r.stderr
    dot = (tmp_path / "j.dot").read_text()
    assert "conditional" in dot
    assert "jacobi_step" in dot
    assert "cluster_" in dot
    script = tmp_path / "work.py"
    script.write_text(
        textwrap.dedent("""
        import cudagraphs as cg
        cg.ops.preload_dtypes(["float32"])
        x = cg.ones(16, "float32")

        def step():
            cg.ops.scale(2.0, x, out=x)
            cg.ops.fill(x[::2], 0.0)
    """)
    )
    r = cli(backend, "show", f"{script}:step", "--out", str(tmp_path / "s.dot"), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 nodes (kernel 2)" in r.stdout
    assert "cg_fill_strided" in (tmp_path / "s.dot").read_text()
    fresh = tmp_path / "fresh.py"  # no preload: kernels compile inside the capture
    fresh.write_text(
        textwrap.dedent("""
        import cudagraphs as cg
        k = cg.Kernel('extern "C" __global__ void neg(float* p) { p[threadIdx.x] = -p[threadIdx.x]; }',
                      "neg", host=lambda p: p.__imul__(-1))
        x = cg.ones(16, "float32")

        def step():
            k.launch(1, 16, x)
            cg.ops.axpy(2.0, x, x)
    """)
    )
    r = cli(backend, "show", f"{fresh}:step", "--out", str(tmp_path / "f.dot"), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 nodes (kernel 2)" in r.stdout
    assert "neg" in (tmp_path / "f.dot").read_text()
    r = cli(backend, "show", "--example", "nope")  # (the command's status, as a shell sees it)
    assert r.returncode == 2
    assert "unknown example" in r.stderr
    from cudagraphs import cli as cli_module

    for bad, message in (  # (the same main(), in this process)
        (["show", "missing.py:f"], "no such Python file"),
        (["show", f"{script}:nothing"], "has no function 'nothing'"),
        (["show"], "needs FILE.py:function"),
    ):
        assert cli_module.main(bad) == 2, bad
        assert message in capsys.readouterr().err, bad


def test_demo_prints_the_table(backend: str) -> None:
    r = cli(backend, "demo")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"backend: {backend}" in r.stdout
    assert "Jacobi solve" in r.stdout
    assert "MLP decode" in r.stdout
    assert r.stdout.count(" ok") >= 2
    assert "WRONG" not in r.stdout


def test_a_bad_out_is_refused_before_any_work(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 26 item 15: ``--out`` naming something unwritable fails at once, not after the work."""
    from cudagraphs import cli as cli_module
    from cudagraphs.bench import multigpu, runner

    def never(argv: list[str]) -> int:
        raise AssertionError(f"the benchmark ran with {argv}")

    monkeypatch.setattr(runner, "main", never)
    monkeypatch.setattr(multigpu, "main", never)
    existing = tmp_path / "results.txt"
    existing.write_text("keep me")
    ran = tmp_path / "ran"
    script = tmp_path / "work.py"
    script.write_text(
        textwrap.dedent(f"""
        import pathlib
        import cudagraphs as cg
        pathlib.Path({str(ran)!r}).write_text("imported")  # (the work: never reached)
        x = cg.ones(4, "float32")

        def step():
            cg.ops.scale(2.0, x, out=x)
    """)
    )
    cases = [
        (["bench", "--out", str(existing)], "exists and is not a directory"),
        (["bench", "--devices", "--out", str(existing)], "exists and is not a directory"),
        (["bench", "--out", str(existing / "sub")], "cannot make the directory"),
        (["show", f"{script}:step", "--out", str(existing)], "save writes .dot, .svg, .png or .pdf files"),
        (["show", f"{script}:step", "--out", str(tmp_path)], "is a directory"),
        (["show", f"{script}:step", "--out", str(tmp_path / "no" / "g.dot")], "does not exist"),
        (["show", "--example", "jacobi", "--out", str(existing)], "save writes"),
    ]
    for argv, message in cases:
        assert cli_module.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err, (argv, err)
    assert not ran.exists()
    assert existing.read_text() == "keep me"
