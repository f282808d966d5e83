"""The package's layers, read from the import statements of every module (function-level ones included):
the library (``hf_hetspec/*.py``) imports neither ``hf_hetspec.testing`` nor ``hf_hetspec.tools``; the testing
layer does not import the tools; and no two modules import each other, directly or through others."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import hf_hetspec

PACKAGE = Path(hf_hetspec.__file__).parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_package(name: str) -> bool:
    return (PACKAGE.parent / Path(*name.split(".")) / "__init__.py").exists()


def _exists(name: str) -> bool:
    return _is_package(name) or (PACKAGE.parent / Path(*name.split("."))).with_suffix(".py").exists()


def import_graph() -> dict[str, set[str]]:
    """``{module: {hf_hetspec modules it imports}}`` for every module of the package."""
    graph = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = _module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                edges |= {alias.name for alias in node.names if alias.name.startswith("hf_hetspec")}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - node.level + 1]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                if not module.startswith("hf_hetspec"):
                    continue
                # `from pkg import sub` imports the submodule pkg.sub; `from pkg import name` imports pkg
                subs = {f"{module}.{alias.name}" for alias in node.names if _exists(f"{module}.{alias.name}")}
                edges |= subs or {module}
                if len(subs) < len(node.names):
                    edges.add(module)
        graph[name] = {edge for edge in edges if edge != name}
    return graph


def layer(name: str) -> int:
    if name.startswith("hf_hetspec.tools"):
        return 2
    if name.startswith("hf_hetspec.testing"):
        return 1
    return 0


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


GRAPH = import_graph()


def test_the_graph_sees_the_layers():
    assert "hf_hetspec.tools.cli" in GRAPH and "hf_hetspec.testing" in GRAPH and "hf_hetspec.verify" in GRAPH
    assert "hf_hetspec.tools.common" in GRAPH["hf_hetspec.tools.cli"]
    assert "hf_hetspec.integration" in GRAPH["hf_hetspec.testing.lossless"]


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_no_module_imports_a_higher_layer(module):
    upward = sorted(dep for dep in GRAPH[module] if layer(dep) > layer(module))
    assert not upward, f"{module} imports {upward} from a layer above its own"


def test_no_import_cycle():
    assert find_cycle(GRAPH) is None, " -> ".join(find_cycle(GRAPH))


def test_the_checks_catch_a_cycle_and_an_upward_import():
    graph = {**GRAPH, "hf_hetspec.verify": GRAPH["hf_hetspec.verify"] | {"hf_hetspec.tools.cli"}}
    assert find_cycle(graph) is not None
    assert layer("hf_hetspec.tools.cli") > layer("hf_hetspec.verify")
