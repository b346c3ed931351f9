"""Every Python block of the README and the docs is a complete program that runs (on sim).

A block fenced as ```python runs in a fresh interpreter with
``CUDAGRAPHS_BACKEND=sim``; a block right after a ``<!-- gpu -->`` line uses
PyTorch or CuPy and runs on the cuda backend, where the test backends include
it (skipped elsewhere); a block that is not meant to run is fenced as
something else (``bash``, ``text``).
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cudagraphs import _errors

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^(<!-- gpu -->\n)?```python\n(.*?)^```", re.S | re.M)
GPU = "cuda" in os.environ.get("CUDAGRAPHS_TEST_BACKENDS", "sim").split(",")


def _blocks() -> list[tuple[str, str]]:
    out = []
    for page in PAGES:
        for i, (gpu, code) in enumerate(BLOCK.findall(page.read_text())):
            out.append((f"{page.relative_to(ROOT)}#{i + 1}{'-gpu' if gpu else ''}", code))
    return out


BLOCKS = _blocks()


def test_the_docs_have_examples() -> None:
    assert len(BLOCKS) >= 8, [name for name, _ in BLOCKS]


@pytest.mark.parametrize(("name", "code"), BLOCKS, ids=[name for name, _ in BLOCKS])
def test_each_python_block_runs(name: str, code: str, tmp_path: Path) -> None:
    gpu = name.endswith("-gpu")
    if gpu and not GPU:
        pytest.skip("a GPU example (PyTorch/CuPy): runs with CUDAGRAPHS_TEST_BACKENDS=cuda,sim on a GPU")
    script = tmp_path / "block.py"
    script.write_text(code)
    backend = "cuda" if gpu else "sim"
    env = {**os.environ, "CUDAGRAPHS_BACKEND": backend, "PYTHONPATH": str(ROOT / "src")}
    run = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}"


# the reference pages read on the repository page too (where mkdocstrings' ::: shows nothing) --------
def _summary(page: str) -> str:
    """What ``docs/page`` says above its first ``:::`` directive (what a repository page shows)."""
    return (ROOT / "docs" / page).read_text().split("\n::: ", 1)[0]


@pytest.mark.parametrize(
    "module",
    ["cudagraphs", "cudagraphs.ops", "cudagraphs.distributed", "cudagraphs.random", "cudagraphs.interop"],
)
def test_the_api_page_names_every_public_name_above_its_directives(module: str) -> None:
    names = importlib.import_module(module).__all__
    summary = _summary("api.md")
    missing = [n for n in names if not re.search(rf"`{re.escape(n)}(\(\))?`", summary)]
    assert not missing, f"docs/api.md's summary does not name {missing} of {module}"


def test_the_errors_page_shows_the_hierarchy_and_when_each_is_raised() -> None:
    summary = _summary("errors.md")
    tree = summary.split("```text\n", 1)[1].split("```", 1)[0]
    drawn: dict[str, str] = {}  # each class drawn, and the class it is drawn under
    stack: list[tuple[int, str]] = []  # (column, name) of the lines above, outermost first
    for line in tree.splitlines():
        found = re.search(r"\w+", line)
        assert found, line
        while stack and stack[-1][0] >= found.start():
            stack.pop()
        drawn[found.group()] = stack[-1][1] if stack else ""
        stack.append((found.start(), found.group()))
    classes = {n: getattr(_errors, n) for n in _errors.__all__}
    assert set(drawn) == set(classes)
    for name, cls in classes.items():
        parent = next((b.__name__ for b in cls.__bases__ if b.__name__ in classes), "")
        assert drawn[name] == parent, f"{name} is drawn under {drawn[name]!r}, its base is {parent!r}"
        assert f"| `{name}` |" in summary, f"docs/errors.md does not say when {name} is raised"


def test_every_optional_extra_of_a_feature_is_on_a_user_page() -> None:
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pages = " ".join(
        " ".join(p.read_text().split()) for p in PAGES if p.name not in ("api.md", "architecture.md")
    )
    for extra in set(extras) - {"test", "docs", "release"}:  # (the project's own tools)
        assert f"cudagraphs[{extra}]" in pages or f"`{extra}` extra" in pages, f"the {extra!r} extra"


def test_the_demo_table_of_getting_started_is_what_the_demo_prints() -> None:
    text = (ROOT / "docs" / "index.md").read_text()
    block = text.split("cudagraphs demo`):\n\n```text\n", 1)[1].split("```", 1)[0]
    env = {**os.environ, "CUDAGRAPHS_BACKEND": "sim", "PYTHONPATH": str(ROOT / "src")}
    run = subprocess.run(
        [sys.executable, "-m", "cudagraphs", "demo"], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stdout + run.stderr

    def rows(out: str) -> list[str]:  # each row's workload and steps (the timings vary)
        return [line[:51] for line in out.splitlines() if line.endswith(("ok", "WRONG"))]

    assert rows(block) == rows(run.stdout)
    assert block.splitlines()[:2] == [
        line for line in run.stdout.splitlines() if "workload" in line or "---" in line
    ]


def test_every_page_is_in_the_site_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text().split("\nnav:", 1)[1]
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages == set(re.findall(r":\s*([\w-]+\.md)\s*$", nav, re.M))
