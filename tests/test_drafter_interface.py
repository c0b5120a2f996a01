"""The engine never asks which kind of drafter it holds: every kind's way of drafting a chain, a
batch row or a token tree lives behind the Drafter interface (``specviz.engine.drafter``).

Read from the source (the AST), so a new ``isinstance`` on a drafter kind, or an import of one,
anywhere under specviz/engine fails here before it ships.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import specviz.drafters as drafters
from specviz.engine.drafter import Drafter

ENGINE = Path(__file__).resolve().parent.parent / "specviz" / "engine"


def _drafter_kinds() -> set[str]:
    """Names of every Drafter subclass the drafters package exports (the interface itself excluded)."""
    return {name for name, obj in vars(drafters).items()
            if inspect.isclass(obj) and issubclass(obj, Drafter) and obj is not Drafter}


def _names(node: ast.AST) -> set[str]:
    """Every bare or dotted name in an isinstance/issubclass second argument (tuples included)."""
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
    }


def _offences(source: str, kinds: set[str]) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("isinstance", "issubclass")
            and len(node.args) == 2
            and _names(node.args[1]) & kinds
        ):
            found.append(f"line {node.lineno}: {node.func.id} on {sorted(_names(node.args[1]) & kinds)}")
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("specviz.drafters"):
            named = {a.name for a in node.names} & kinds
            if named:
                found.append(f"line {node.lineno}: imports {sorted(named)}")
    return found


def test_the_drafter_kinds_are_found():
    kinds = _drafter_kinds()
    assert {
        "ModelDrafter",
        "PromptLookupDrafter",
        "EagleDrafter",
        "EarlyExitDrafter",
        "QuantizedDrafter",
        "CrossTokenizerDrafter",
    } <= kinds


def test_no_engine_module_tests_or_imports_a_drafter_kind():
    kinds = _drafter_kinds()
    offences = {
        str(path.relative_to(ENGINE)): found
        for path in sorted(ENGINE.rglob("*.py"))
        if (found := _offences(path.read_text(encoding="utf-8"), kinds))
    }
    assert not offences, offences


@pytest.mark.parametrize(
    "planted",
    [
        "from specviz.drafters import EagleDrafter\n",
        "def f(d):\n    return isinstance(d, ModelDrafter)\n",
        "def f(d):\n    return isinstance(d, (int, drafters.PromptLookupDrafter))\n",
    ],
)
def test_the_check_catches_a_planted_kind_test(planted):
    assert _offences(planted, _drafter_kinds())


def test_a_drafter_without_trees_says_so():
    class Chain(Drafter):
        def start(self, seq, n, vocab, cached):
            pass

        def propose(self, request):
            return None

    with pytest.raises(TypeError, match="token trees need"):
        Chain().propose_tree(None, None, 1)
