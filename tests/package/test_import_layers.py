"""The imports of fcos_d2 run one way (issue 49, item 3), checked by reading the source.

Every module of the package is parsed with ``ast``; every ``import``/``from ... import``
node counts, those inside functions included (a lazy import is still a dependency), with
relative imports resolved against the importing module. From that graph the tests ask:

* no circle between modules, nor between the package's top-level parts (``fcos_d2.X``);
* modeling, data and checkpoint import nothing from engine, tools or benchmarks;
* the core (config, modeling's own modules, checkpoint, engine, train_net) imports no
  member (a subpackage of ``fcos_d2/modeling``); only ``fcos_d2/__init__.py`` may;
* no private name (``_x``) is imported from, or read through, another module.

The walker is tested first on a fake package written to ``tmp_path``, so that each check is
shown able to fail.
"""
import ast
import dataclasses
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Set, Tuple

import pytest

REPO = Path(__file__).resolve().parents[2]
LOWER_LAYERS = ("modeling", "data", "checkpoint")
UPPER_LAYERS = ("engine",)
OUTSIDE_UPPER = ("tools", "benchmarks")
CORE = ("config", "modeling", "checkpoint", "engine", "train_net")


@dataclasses.dataclass(frozen=True)
class Import:
    """One imported module (and the names taken from it) as written in ``importer``."""
    importer: str
    module: str  # the full dotted module the statement reaches
    names: Tuple[str, ...]  # names taken by ``from module import names``; () for ``import``
    line: int


def module_names(root: Path) -> Dict[str, Path]:
    """Maps every dotted module name of the package at ``root`` to its file."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _resolve(importer: str, is_package: bool, level: int, module: str) -> str:
    """The absolute module named by ``from <level dots><module> import ...``."""
    if level == 0:
        return module
    base = importer.split(".")
    if not is_package:
        base = base[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def imports_of(name: str, path: Path, modules: Dict[str, Path]) -> Iterator[Import]:
    """Every import in the module ``name``; ``from p import m`` reaches module p.m if any."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(name, alias.name, (), node.lineno)
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(name, is_package, node.level, node.module or "")
            plain = []
            for alias in node.names:
                if f"{source}.{alias.name}" in modules:
                    yield Import(name, f"{source}.{alias.name}", (), node.lineno)
                else:
                    plain.append(alias.name)
            if plain:
                yield Import(name, source, tuple(plain), node.lineno)


def private_attribute_reads(name: str, path: Path,
                            modules: Dict[str, Path]) -> Iterator[Tuple[str, int]]:
    """``alias._x`` where ``alias`` is a package module bound by ``import``/``from``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name in modules:
                    aliases[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(name, is_package, node.level, node.module or "")
            for alias in node.names:
                if f"{source}.{alias.name}" in modules:
                    aliases[alias.asname or alias.name] = f"{source}.{alias.name}"
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and _is_private(node.attr)):
            yield f"{aliases[node.value.id]}.{node.attr}", node.lineno


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def collect(root: Path) -> Tuple[Dict[str, Path], List[Import]]:
    """The package's modules and all their imports."""
    modules = module_names(root)
    found = [imp for name, path in modules.items() for imp in imports_of(name, path, modules)]
    return modules, found


def module_graph(modules: Dict[str, Path], found: List[Import]) -> Dict[str, Set[str]]:
    """importer -> imported modules, both inside the package."""
    graph = {name: set() for name in modules}
    for imp in found:
        if imp.module in modules and imp.module != imp.importer:
            graph[imp.importer].add(imp.module)
    return graph


def part_graph(graph: Dict[str, Set[str]]) -> Dict[str, Set[str]]:
    """The module graph collapsed onto the package's top-level parts ``package.X``."""
    parts: Dict[str, Set[str]] = {}
    for importer, targets in graph.items():
        node = parts.setdefault(top_part(importer), set())
        node.update(top_part(t) for t in targets if top_part(t) != top_part(importer))
    return parts


def circles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def top_part(module: str) -> str:
    """``fcos_d2.checkpoint.download`` -> ``fcos_d2.checkpoint``."""
    return ".".join(module.split(".")[:2])


def describe_circle(component: List[str], found: List[Import],
                    node: Callable[[str], str] = str) -> str:
    """'circle a <-> b: a -> b (line 3); b -> a (line 9)': the imports that make it.

    Args:
        component: the modules (or parts, see ``node``) in the circle.
        found: every import of the package.
        node: maps a module to its node in the graph (the module itself, or its part).
    """
    inside = set(component)
    edges = sorted({f"{imp.importer} -> {imp.module} (line {imp.line})" for imp in found
                    if node(imp.importer) in inside and node(imp.module) in inside
                    and node(imp.importer) != node(imp.module)})
    return "circle " + " <-> ".join(component) + ": " + "; ".join(edges)


def in_part(module: str, package: str, parts: Tuple[str, ...]) -> bool:
    """True when ``module`` is ``package.P`` or below it, for one of ``parts``."""
    return any(module == f"{package}.{p}" or module.startswith(f"{package}.{p}.")
               for p in parts)


def members(root: Path) -> List[str]:
    """Member folders: the subpackages of ``<package>/modeling``."""
    return sorted(f"{root.name}.modeling.{d.name}" for d in (root / "modeling").iterdir()
                  if (d / "__init__.py").is_file())


def layer_violations(found: List[Import], package: str) -> List[str]:
    """Imports from engine, tools or benchmarks into modeling, data or checkpoint."""
    bad = []
    for imp in found:
        upward = (in_part(imp.module, package, UPPER_LAYERS)
                  or imp.module.split(".")[0] in OUTSIDE_UPPER)
        if in_part(imp.importer, package, LOWER_LAYERS) and upward:
            bad.append(f"{imp.importer} imports {imp.module} (line {imp.line})")
    return sorted(set(bad))


def member_violations(found: List[Import], package: str, member_names: List[str]) -> List[str]:
    """Core modules (config, modeling's own, checkpoint, engine, train_net) naming a member."""
    def member_of(module: str) -> str:
        return next((m for m in member_names if module == m or module.startswith(m + ".")), "")
    bad = []
    for imp in found:
        core = in_part(imp.importer, package, CORE) and not member_of(imp.importer)
        if core and member_of(imp.module):
            bad.append(f"{imp.importer} imports member {imp.module} (line {imp.line})")
    return sorted(set(bad))


def private_violations(root: Path, modules: Dict[str, Path], found: List[Import]) -> List[str]:
    """Private names taken from another module by ``from m import _x`` or ``m._x``."""
    bad = [f"{imp.importer} imports {imp.module}.{n} (line {imp.line})"
           for imp in found for n in imp.names if _is_private(n)]
    for name, path in modules.items():
        bad += [f"{name} reads {attribute} (line {line})"
                for attribute, line in private_attribute_reads(name, path, modules)]
    return sorted(set(bad))


# ---------------------------------------------------------------------------------------
# The walker, on a fake package whose faults are known.

def write_package(root: Path, files: Dict[str, str]) -> Path:
    """Writes ``{relative path: source}`` under ``root``; returns the package folder."""
    for relative, source in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source, encoding="utf-8")
    return root / "pkg"


FAKE = {
    "pkg/__init__.py": "from .modeling import member  # allowed: the root registers members\n",
    "pkg/config.py": "X = 1\n",
    "pkg/modeling/__init__.py": "from .head import Head\n",
    "pkg/modeling/head.py": ("from ..config import X\n"
                             "def _tower():\n    pass\n"
                             "def build():\n    from .meta import Meta  # lazy, still counted\n"),
    "pkg/modeling/meta.py": "from .head import _tower\nfrom . import head\nhead._tower()\n",
    "pkg/modeling/member/__init__.py": "from ..head import Head\n",
    "pkg/engine/__init__.py": "",
    "pkg/engine/amp.py": "from ..modeling.member import something\n",
    "pkg/checkpoint/__init__.py": "from ..engine import amp\nimport pkg.export.files\n",
    "pkg/export/__init__.py": "",
    "pkg/export/files.py": "from ..checkpoint import load\n",
}


def test_walker_resolves_relative_and_lazy_imports(tmp_path):
    modules, found = collect(write_package(tmp_path, FAKE))
    graph = module_graph(modules, found)
    assert graph["pkg.modeling.head"] == {"pkg.config", "pkg.modeling.meta"}
    assert graph["pkg.modeling.meta"] == {"pkg.modeling.head"}
    assert graph["pkg"] == {"pkg.modeling.member"}
    assert graph["pkg.checkpoint"] == {"pkg.engine.amp", "pkg.export.files"}


def test_walker_finds_module_and_part_circles(tmp_path):
    modules, found = collect(write_package(tmp_path, FAKE))
    graph = module_graph(modules, found)
    assert circles(graph) == [["pkg.checkpoint", "pkg.export.files"],
                              ["pkg.modeling.head", "pkg.modeling.meta"]]
    assert circles(part_graph(graph)) == [["pkg.checkpoint", "pkg.export"]]
    assert describe_circle(["pkg.modeling.head", "pkg.modeling.meta"], found) == (
        "circle pkg.modeling.head <-> pkg.modeling.meta: "
        "pkg.modeling.head -> pkg.modeling.meta (line 5); "
        "pkg.modeling.meta -> pkg.modeling.head (line 1); "
        "pkg.modeling.meta -> pkg.modeling.head (line 2)")


def test_walker_finds_upward_member_and_private_imports(tmp_path):
    root = write_package(tmp_path, FAKE)
    modules, found = collect(root)
    assert members(root) == ["pkg.modeling.member"]
    assert layer_violations(found, "pkg") == ["pkg.checkpoint imports pkg.engine.amp (line 1)"]
    assert member_violations(found, "pkg", members(root)) == [
        "pkg.engine.amp imports member pkg.modeling.member (line 1)"]
    assert private_violations(root, modules, found) == [
        "pkg.modeling.meta imports pkg.modeling.head._tower (line 1)",
        "pkg.modeling.meta reads pkg.modeling.head._tower (line 3)"]


def test_walker_passes_a_package_without_faults(tmp_path):
    root = write_package(tmp_path, {
        "pkg/__init__.py": "from . import config\n", "pkg/config.py": "import os\n",
        "pkg/modeling/__init__.py": "from ..config import *\nfrom .head import Head\n",
        "pkg/modeling/head.py": "from ..config import os as _os\nHead = 1\n"})
    modules, found = collect(root)
    assert circles(module_graph(modules, found)) == []
    assert circles(part_graph(module_graph(modules, found))) == []
    assert layer_violations(found, "pkg") == []
    assert member_violations(found, "pkg", members(root)) == []
    assert private_violations(root, modules, found) == []


# ---------------------------------------------------------------------------------------
# fcos_d2 itself.

@pytest.fixture(scope="module")
def package():
    root = REPO / "fcos_d2"
    modules, found = collect(root)
    return root, modules, found


def _fail_if(problems: List[str], what: str) -> None:
    if problems:
        pytest.fail(f"{len(problems)} {what}:\n" + "\n".join(problems), pytrace=False)


def test_no_circle_between_modules(package):
    _, modules, found = package
    graph = module_graph(modules, found)
    _fail_if([describe_circle(c, found) for c in circles(graph)], "import circles between modules")


def test_no_circle_between_parts_of_the_package(package):
    _, modules, found = package
    graph = part_graph(module_graph(modules, found))
    internal = [imp for imp in found if imp.module in modules]
    _fail_if([describe_circle(c, internal, top_part) for c in circles(graph)],
             "import circles between parts of fcos_d2 (fcos_d2.X)")


def test_modeling_data_and_checkpoint_import_nothing_from_above(package):
    _, _, found = package
    _fail_if(layer_violations(found, "fcos_d2"), "imports from engine/tools/benchmarks below")


def test_the_core_imports_no_member(package):
    root, _, found = package
    assert members(root), "no member folders found under fcos_d2/modeling"
    _fail_if(member_violations(found, "fcos_d2", members(root)), "core imports of members")


def test_no_private_name_crosses_modules(package):
    root, modules, found = package
    _fail_if(private_violations(root, modules, found), "private names used outside their module")
