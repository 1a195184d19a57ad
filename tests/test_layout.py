"""The package layout the architecture map promises: no import cycles between packages, dependencies in
one direction (techniques -> stores <- backends), and no SQL outside the store backends."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

PACKAGE = Path(__file__).resolve().parents[1] / "iris_rag"


def _node(path: Path) -> str:
    """A module's node in the graph: its package, or the module itself at the top level of iris_rag."""
    relative = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = relative.parts
    if len(parts) == 2:  # iris_rag/service.py: a node of its own (the root package is not one unit)
        return ".".join(parts)
    return ".".join(parts[:-1])


def _known(name: str, nodes: set[str]) -> str | None:
    """The node an imported dotted name belongs to (the longest node that prefixes it)."""
    candidates = [n for n in nodes if name == n or name.startswith(n + ".")]
    return max(candidates, key=len) if candidates else None


def import_graph() -> nx.DiGraph:
    """Package -> package edges of every import in iris_rag (function-level and TYPE_CHECKING ones too)."""
    modules = sorted(PACKAGE.rglob("*.py"))
    nodes = {_node(m) for m in modules}
    graph: nx.DiGraph = nx.DiGraph()
    graph.add_nodes_from(nodes)
    for module in modules:
        source = _node(module)
        for statement in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(statement, ast.Import):
                names = [alias.name for alias in statement.names]
            elif isinstance(statement, ast.ImportFrom) and statement.module and statement.level == 0:
                names = [f"{statement.module}.{alias.name}" for alias in statement.names]
            for name in names:
                target = _known(name, nodes)
                if target is not None and target != source:
                    graph.add_edge(source, target)
    return graph


def test_no_package_cycles() -> None:
    cycles = list(nx.simple_cycles(import_graph()))
    assert cycles == [], f"package import cycles: {cycles}"


def test_dependencies_point_one_way() -> None:
    graph = import_graph()
    wrong = [
        (a, b)
        for a, b in graph.edges
        if (a.startswith("iris_rag.stores") and b.startswith(("iris_rag.backends", "iris_rag.techniques")))
        or (a.startswith("iris_rag.techniques") and b.startswith("iris_rag.backends"))
        or (a.startswith("iris_rag.retrieval") and b.startswith(("iris_rag.backends", "iris_rag.techniques")))
    ]
    assert wrong == [], "the store contract and the techniques must not depend on a backend"


def test_no_sql_outside_the_backends() -> None:
    """Every statement a database runs is built in iris_rag/backends/: a new backend is one folder."""
    offenders = []
    for module in sorted(PACKAGE.rglob("*.py")):
        if (PACKAGE / "backends") in module.parents:
            continue
        for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in {"execute", "executemany", "executescript"}
                and node.args
                and isinstance(node.args[0], ast.Constant | ast.JoinedStr | ast.Name | ast.BinOp)
                and not (isinstance(node.args[0], ast.Constant) and not isinstance(node.args[0].value, str))
            ):
                offenders.append(f"{module.relative_to(PACKAGE.parent)}:{node.lineno}")
            if isinstance(node, ast.Import | ast.ImportFrom):
                imported = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                if any(
                    name.split(".")[0] in {"sqlite3", "psycopg", "psycopg_pool", "iris"} for name in imported
                ):
                    offenders.append(f"{module.relative_to(PACKAGE.parent)}:{node.lineno} (driver import)")
    assert offenders == [], f"SQL or a database driver outside iris_rag/backends/: {offenders}"


def test_the_graph_sees_real_imports() -> None:
    """The checks above would pass on an empty graph: make sure it holds the edges everyone knows of."""
    graph = import_graph()
    assert graph.has_edge("iris_rag.service", "iris_rag.backends")
    assert graph.has_edge("iris_rag.techniques", "iris_rag.stores")
    assert graph.number_of_edges() > 30
