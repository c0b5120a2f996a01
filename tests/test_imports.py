"""The import graph of the package has no cycle: data flows one way (UI -> engine -> trace -> views).

Every ``import`` and ``from ... import`` in every module counts, those inside functions too (a lazy import is still a
dependency), and so do imports under ``if TYPE_CHECKING:`` (an annotation that needs the other module is a dependency
too). ``from specviz.x import name`` is an edge to ``specviz.x.name`` when that is a module, else to ``specviz.x``. A
package's ``__init__`` running before its submodules is not an edge of its own (every package would otherwise import
itself).
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _modules() -> dict[str, Path]:
    found = {}
    for path in (ROOT / "specviz").rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


class _Imports(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool, known: dict[str, Path]):
        self.module, self.package = module, module if is_package else module.rpartition(".")[0]
        self.known, self.edges = known, set()

    def visit_Import(self, node: ast.Import) -> None:
        self.edges |= {a.name for a in node.names if a.name in self.known}

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:
            package = self.package
            for _ in range(node.level - 1):
                package = package.rpartition(".")[0]
            base = f"{package}.{base}" if base else package
        if base.split(".")[0] != "specviz":
            return
        for a in node.names:
            self.edges.add(f"{base}.{a.name}" if f"{base}.{a.name}" in self.known else base)


def import_graph() -> dict[str, set[str]]:
    """{module: the specviz modules it imports}."""
    known = _modules()
    graph = {}
    for module, path in known.items():
        visitor = _Imports(module, path.name == "__init__.py", known)
        visitor.visit(ast.parse(path.read_text(encoding="utf-8")))
        graph[module] = visitor.edges - {module}
    return graph


def test_the_import_graph_has_no_cycle():
    graph = import_graph()
    try:
        order = list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as err:
        raise AssertionError(f"import cycle: {' -> '.join(err.args[1])}") from None
    assert set(order) >= set(graph)


def test_the_graph_sees_lazy_and_type_checking_imports(tmp_path):
    known = {"specviz.a": tmp_path, "specviz.b": tmp_path, "specviz.c": tmp_path}
    visitor = _Imports("specviz.a", False, known)
    visitor.visit(ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from specviz.c import C\n"
                            "def f():\n    from specviz import b\n"))
    assert visitor.edges == {"specviz.b", "specviz.c"}


def test_the_validation_does_not_import_the_trace_it_validates():
    graph = import_graph()
    assert (
        "specviz.trace.validation" in graph["specviz.trace"]
        and "specviz.trace" not in graph["specviz.trace.validation"]
    )


def test_the_trace_and_the_recording_import_no_views():
    graph = import_graph()
    for module in (
        "specviz.trace",
        "specviz.recording",
        "specviz.trace.validation",
        "specviz.engine.chain",
        "specviz.engine.batch",
    ):
        assert not any(m.startswith("specviz.views") for m in graph[module]), (module, graph[module])
    assert not any(m.startswith("specviz.measure.bench") for m in graph["specviz.views.batch"])
