"""PNG plots of a benchmark run (needs matplotlib: ``pip install cudagraphs[report]``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .graphs import IN_PROCESS

__all__ = ["plot_all"]

# graph benchmark contender -> the same framework's eager-launch contender
EAGER_NAME = {
    "cudagraphs": "cudagraphs Kernel.launch",
    "cuda.core GraphBuilder": "cuda.core launch",
    "CuPy Graph": "CuPy RawKernel",
    "PyTorch CUDAGraph": "PyTorch add_",
    "raw CUDA C": "raw CUDA C",
}
SIZES = (10, 100, 1000)


def _frameworks(benches: dict[str, dict[str, float]], key: str) -> list[str]:
    names: list[str] = []
    for n in SIZES:
        for name in benches.get(key.format(n=n), {}):
            if name not in names:
                names.append(name)
    return names


def _grouped_bars(
    plt: Any, groups: list[str], series: dict[str, list[float]], ylabel: str, title: str, path: Path
) -> Path:
    """One bar per series in each group; saved to ``path``."""
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / max(len(series), 1)
    for i, (name, values) in enumerate(series.items()):
        ax.bar([x + i * width for x in range(len(groups))], values, width, label=name)
    ax.set_xticks([x + width * (len(series) - 1) / 2 for x in range(len(groups))], groups)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_all(results: dict[str, Any], out: Path) -> list[Path]:
    """Write the plots for ``results`` into ``out``; return their paths.

    Returns an empty list (and writes nothing) when matplotlib is missing.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    benches = results["benchmarks"]
    title = f"{results['gpu']} ({results['backend']}), {results['date']}"
    written = []

    # 1. µs per kernel: eager launches against graph replay, per framework
    node_key = "replay per node, {n}-node graph (µs GPU)"
    eager = benches.get("eager launch", {})
    series = {
        name: [eager.get(EAGER_NAME.get(name, ""), float("nan"))]
        + [benches.get(node_key.format(n=n), {}).get(name, float("nan")) for n in SIZES]
        for name in _frameworks(benches, node_key)
    }
    written.append(
        _grouped_bars(
            plt,
            ["eager"] + [f"graph, {n} nodes" for n in SIZES],
            series,
            "µs per kernel",
            f"Eager launch vs graph replay — {title}",
            out / "eager_vs_graph.png",
        )
    )

    # 2. CPU cost of one replay call, per framework and graph size
    call_key = "replay call, {n}-node graph (µs CPU)"
    series = {
        name: [benches.get(call_key.format(n=n), {}).get(name, float("nan")) for n in SIZES]
        for name in _frameworks(benches, call_key)
    }
    written.append(
        _grouped_bars(
            plt,
            [f"{n} nodes" for n in SIZES],
            series,
            "µs of CPU per replay call",
            f"Replay call — {title}",
            out / "replay_call.png",
        )
    )

    # 3. updating a graph against capturing and instantiating it again
    rows = [
        (k, v)
        for k, v in benches.items()
        if k.startswith(
            ("whole-graph update", "capture (no instantiate) + update", "re-capture + instantiate")
        )
        and IN_PROCESS not in k  # (the rows measured in a fresh process are drawn)
    ]
    if rows:
        fig, ax = plt.subplots(figsize=(9, 4.5))
        bars = [(f"{k.split(',')[0]}\n{name}", v) for k, contenders in rows for name, v in contenders.items()]
        ax.barh([b[0] for b in bars], [b[1] for b in bars], color="#4c72b0")
        ax.set_xlabel("ms (1000-node graph)")
        ax.set_title(f"Update vs re-capture — {title}")
        fig.tight_layout()
        written.append(out / "update.png")
        fig.savefig(written[-1], dpi=120)
        plt.close(fig)
    return written
