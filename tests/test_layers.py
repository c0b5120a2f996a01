"""specviz's packages import one way, in floors (docs/layout.md):

    data (trace, records, metrics, limits, assets) <- theory <- engine <- drafters <- pair
        <- serving, measure, training, lab, recording <- ui, visitors, cli

and the views sit beside the engine, reading only data and theory (pure functions of traces).

A package here is a folder under specviz/ (trace, engine, drafters, views, ...) or a module on the top floor
(metrics, limits, recording, cli, ...); the top-level ``specviz/__init__`` is the package "specviz". Every import
counts, read from the source with ``ast`` (nothing is imported): at the top of a module, inside a
function (a lazy import is still a dependency) and under ``if TYPE_CHECKING:`` (so is an annotation).
``from specviz.x import name`` is an import of ``specviz.x.name`` when that is a module, else of ``specviz.x``.

Checked: no cycle between packages; the data layer imports only data; the engine and the views import
only data and theory; measuring imports no UI. The checker runs once more on a small package tree
written by the test with one violation of each kind planted in it, and must report every one, and on the
real graph with one edge planted.
"""

from __future__ import annotations

import ast
from pathlib import Path

SPECVIZ = Path(__file__).resolve().parent.parent / "specviz"

DATA = frozenset({"trace", "records", "metrics", "limits", "assets"})
THEORY = frozenset({"theory"})
# What each of these packages may import besides itself; anything else is a violation.
ALLOWED = {
    **{name: DATA for name in DATA},
    "theory": DATA,
    "engine": DATA | THEORY,
    "views": DATA | THEORY,
}
FORBIDDEN = {"measure": frozenset({"ui"})}  # what these packages must not import


def _modules(root: Path) -> dict[str, Path]:
    """{dotted module name: its file} for every module under ``root`` (a folder named specviz)."""
    found = {}
    for path in root.rglob("*.py"):
        parts = [root.name, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _package(module: str) -> str:
    """The package a module belongs to: its first name below specviz ("specviz" for the top-level __init__)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _imports(module: str, path: Path, known: dict[str, Path]) -> list[tuple[str, int]]:
    """(imported specviz module, line) for every import in ``path``, wherever it stands in the file."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "specviz"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package
                for _ in range(node.level - 1):
                    up = up.rpartition(".")[0]
                base = f"{up}.{base}" if base else up
            if base.split(".")[0] != "specviz":
                continue
            found += [(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base, node.lineno) for a in node.names]
    return found


def package_graph(root: Path = SPECVIZ) -> dict[str, dict[str, list[str]]]:
    """{package: {package it imports: ["module:line", ...]}} over every module under ``root``."""
    known = _modules(root)
    edges: dict[str, dict[str, set[tuple[str, int]]]] = {_package(m): {} for m in known}
    for module, path in known.items():
        source = _package(module)
        for target, line in _imports(module, path, known):
            if _package(target) != source:
                edges[source].setdefault(_package(target), set()).add((module, line))
    return {p: {d: [f"{m}:{n}" for m, n in sorted(where)] for d, where in deps.items()} for p, deps in edges.items()}


def _reachable(graph: dict[str, dict[str, list[str]]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for dep in graph.get(todo.pop(), {}):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def cycles(graph: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """The packages that import one another in circles, each group sorted (strongly connected components)."""
    reach = {p: _reachable(graph, p) for p in graph}
    groups = {tuple(sorted(q for q in reach[p] if p in reach[q])) for p in graph if p in reach[p]}
    return sorted(list(g) for g in groups)


def violations(graph: dict[str, dict[str, list[str]]]) -> list[str]:
    """Every broken rule of the layering, one sentence each naming the modules and lines; [] when none."""
    found = []
    for group in cycles(graph):
        found.append(f"import cycle between packages {', '.join(group)}: "
                     + "; ".join(f"{a} -> {b} at {', '.join(where)}" for a in group
                                 for b, where in sorted(graph[a].items()) if b in group))
    for package, deps in sorted(graph.items()):
        for dep, where in sorted(deps.items()):
            if package in ALLOWED and dep not in ALLOWED[package]:
                found.append(
                    f"{package} imports {dep} ({', '.join(where)}); it may import only "
                    f"{', '.join(sorted(ALLOWED[package]))}"
                )
            if dep in FORBIDDEN.get(package, ()):
                found.append(f"{package} imports {dep} ({', '.join(where)})")
    return found


def test_the_packages_import_one_way():
    problems = violations(package_graph())
    assert not problems, "\n".join(problems)


def test_the_graph_knows_the_layers_it_checks():
    graph = package_graph()
    checked = set(ALLOWED) | set(FORBIDDEN)
    assert checked <= set(graph), checked - set(graph)  # a renamed package would leave its rule checking nothing
    assert "theory" in graph["engine"] and "trace" in graph["views"]  # edges are found at all


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "specviz" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root / "specviz"


def test_the_checker_reports_planted_violations(tmp_path):
    tree = _write(
        tmp_path,
        {
            "__init__.py": "",
            "trace.py": "",
            "engine/__init__.py": "",
            "engine/loop.py": "def run():\n    from specviz.drafters import kinds\n",  # lazy: still an edge
            "drafters/__init__.py": "",
            "drafters/kinds.py": "from specviz.engine import loop\n",  # closes the cycle engine <-> drafters
            "views/__init__.py": "",
            "views/page.py": (
                "from typing import TYPE_CHECKING\nfrom specviz import trace\n"
                "if TYPE_CHECKING:\n    from specviz.recording import Recording\n"
            ),
            "recording.py": "from .trace import Trace\n",  # relative: an edge to trace, which is allowed above data
            "measure/__init__.py": "",
            "measure/bench.py": "import specviz.ui.guard.limits\n",
            "ui/__init__.py": "",
            "ui/limits.py": "",
        },
    )
    graph = package_graph(tree)
    assert graph["recording"] == {"trace": ["specviz.recording:1"]}
    found = "\n".join(violations(graph))
    assert "import cycle between packages" in found and "engine -> drafters" in found and "drafters -> engine" in found
    assert "engine imports drafters (specviz.engine.loop:2)" in found
    assert "views imports recording (specviz.views.page:4)" in found
    assert "measure imports ui (specviz.measure.bench:1)" in found
    assert "views imports trace" not in found


def test_the_checker_reports_one_edge_planted_in_the_real_graph():
    graph = package_graph()
    graph["trace"] = {**graph["trace"], "engine": ["planted"]}  # the data layer reaching up: a cycle, and not allowed
    found = "\n".join(violations(graph))
    assert "import cycle between packages" in found and "trace imports engine (planted)" in found


def _python(code: str, tmp_path: Path) -> str:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "GRADIO_ANALYTICS_ENABLED")}
    env["GRADIO_TEMP_DIR"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-c", code], cwd=SPECVIZ.parent, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_importing_specviz_and_its_page_changes_nothing_outside_them(tmp_path):
    """No environment variable set and no folder made by an import: the page's cache folder is made when the page
    is built, and the OpenMP setting by the entry points (specviz.openmp)."""
    changed = _python(
        "import json, os; before = dict(os.environ)\n"
        "import specviz, specviz.ui, specviz.ui.page.layout, specviz.ui.guard.server, specviz.cli\n"
        "from specviz import Sampling, speculative_generate\n"
        "print(json.dumps(sorted(k for k in set(os.environ) | set(before) if os.environ.get(k) != before.get(k))))",
        tmp_path,
    )
    assert changed == "[]" and list(tmp_path.iterdir()) == []


def test_the_entry_points_set_openmp_before_torch_loads(tmp_path):
    first = _python("import os; from specviz.openmp import spin_briefly; ok = spin_briefly(); import torch\n"
                    "print(ok, os.environ['GOMP_SPINCOUNT'])", tmp_path)
    late = _python("import os, torch; from specviz.openmp import spin_briefly\n"
                   "print(spin_briefly(), os.environ.get('GOMP_SPINCOUNT'))", tmp_path)
    assert first == "True 3000" and late == "False None"
