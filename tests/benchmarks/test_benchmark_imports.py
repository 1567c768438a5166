"""benchmarks/ imports one way: read with ``ast`` (every import statement, also those inside
functions), its modules form no circle, and none imports train_net.py or tools/ (the
library trainer is fcos_d2.engine.trainer)."""
import ast
from pathlib import Path
from typing import Dict, List, Set

PACKAGE = Path(__file__).resolve().parents[2] / "benchmarks"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(tree: ast.AST, modules: Set[str]) -> Set[str]:
    """The names `tree` imports: modules, and for ``from M import x`` M.x where that is a
    module of `modules`, else M."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                names.add(full if full in modules else node.module)
    return names


def import_graph(package: Path = PACKAGE) -> Dict[str, Set[str]]:
    """module -> the names it imports, for every module of `package`."""
    paths = {_module_name(p): p for p in package.rglob("*.py")}
    return {name: _imported(ast.parse(path.read_text()), set(paths))
            for name, path in paths.items()}


def circles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The import circles among the modules of `graph` (each found once per start)."""
    found = []

    def visit(module: str, path: List[str]) -> None:
        for target in sorted(graph[module] & set(graph)):
            if target in path:
                found.append(path[path.index(target):] + [target])
            elif target not in done:
                visit(target, path + [target])
        done.add(module)

    done: Set[str] = set()
    for module in sorted(graph):
        if module not in done:
            visit(module, [module])
    return found


def test_circles_are_found_in_a_hand_made_graph():
    graph = {"a": {"b"}, "b": {"c", "os"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c", "a"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_benchmarks_have_no_import_circle():
    graph = import_graph()
    assert {"benchmarks.train_quality.protocol", "benchmarks.train_quality.labelenc",
            "benchmarks.runner", "benchmarks.records", "benchmarks.tables"} <= set(graph)
    assert circles(graph) == []


def test_the_protocol_and_the_contenders_do_not_know_the_command_or_the_catalog():
    graph = import_graph()
    command = {"benchmarks.train_quality.cli", "benchmarks.train_quality.catalog"}
    for module in ("protocol", "contenders", "labelenc", "results"):
        assert not graph[f"benchmarks.train_quality.{module}"] & command, module
    assert "benchmarks.train_quality.labelenc" not in \
        graph["benchmarks.train_quality.contenders"]


def test_no_benchmark_imports_train_net_or_tools():
    for module, names in import_graph().items():
        assert not {n for n in names if n.split(".")[0] in ("train_net", "tools")}, module
