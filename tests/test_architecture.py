"""The shape the design asks for: files that do one job, no import circle, passes that import
neither onnx nor torch, the CLI with no file-suffix checks."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"graphamp": ROOT / "graphamp", "graphamp.passes": ROOT / "passes"}


def modules() -> dict[str, Path]:
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    # graphamp.passes lives in passes/, not in graphamp/passes
    return {name: path for name, path in found.items() if "graphamp.graphamp" not in name}


def imports(path: Path, known: dict[str, Path] | None = None) -> set[str]:
    """Every module ``path`` imports at run time, at any depth (function-level imports count
    too; ``if TYPE_CHECKING:`` blocks do not). ``from package import module`` counts as an
    import of that module, not of the package."""
    known = known or {}
    names: set[str] = set()
    pending: list[ast.AST] = [ast.parse(path.read_text())]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            pending.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                names.add(full if full in known else node.module)
        pending.extend(ast.iter_child_nodes(node))
    return names


def test_no_module_over_400_lines():
    long = {
        name: n
        for name, path in modules().items()
        if (n := len(path.read_text().splitlines())) > 400
    }
    assert not long, long


def test_no_import_circle():
    known = modules()
    graph = nx.DiGraph()
    for name, path in known.items():
        graph.add_node(name)
        for target in imports(path, known):
            if target in known and target != name:
                graph.add_edge(name, target)
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, cycles


def test_passes_import_neither_onnx_nor_torch():
    for name, path in modules().items():
        if name.startswith("graphamp.passes"):
            top = {target.partition(".")[0] for target in imports(path)}
            assert not top & {"onnx", "onnx_ir", "onnxruntime", "torch"}, name


def test_the_cli_checks_no_file_suffix():
    for path in (ROOT / "graphamp" / "cli").glob("*.py"):
        text = path.read_text()
        assert ".suffix" not in text and '".pt2"' not in text and '".onnx"' not in text, path
