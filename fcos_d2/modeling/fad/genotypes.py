"""FAD's genotypes: which operation each edge of a cell applies to which earlier state.

A cell has two inputs (states 0 and 1) and ``n`` intermediate nodes (states 2 .. n+1);
node i sums two edges, each an operation of :data:`PRIMITIVES` on one of the i + 2 states
before it; the cell's output concatenates the nodes (``concat``).

Three forms, all read and written here, none ``eval``'d:

* :class:`Genotype`, the typed value;
* the config value of ``MODEL.FAD.GENO_BOX`` / ``GENO_CLS``: a list per node of
  ``[operation, source]`` pairs, also the YAML form (``box:`` and ``cls:`` keys);
* FAD's release's text, one line per tower (box first, classification second) in a
  ``genotype.log``: ``Genotype(normal=[[('op', 0), ('op', 1)], ...], normal_concat=range(2, 5))``.
"""
import ast
import random
import re
from pathlib import Path
from typing import List, NamedTuple, Sequence, Tuple, Union

import yaml

# The candidate operations, in the order of the architecture weights' last axis (FAD's
# PRIMSTACK): two families of five stacks, then "none" (always last).
PRIMITIVES = (
    "std_conv_3x3",
    "std_conv_3x3+dil_conv_3x3",
    "std_conv_3x3_x2",
    "std_conv_3x3_x2+dil_conv_3x3",
    "std_conv_3x3_x3",
    "sinSep_conv_3x3",
    "sinSep_conv_3x3+dil_conv_3x3",
    "sinSep_conv_3x3_x2",
    "sinSep_conv_3x3_x2+dil_conv_3x3",
    "sinSep_conv_3x3_x3",
    "none",
)
NONE = "none"


class Edge(NamedTuple):
    """One input of a node: ``op`` applied to state ``source``."""
    op: str
    source: int


class Genotype(NamedTuple):
    """A derived cell: ``nodes[i]`` lists the edges summed by node i; the output is the
    concatenation of the states ``concat``."""
    nodes: Tuple[Tuple[Edge, ...], ...]
    concat: Tuple[int, ...]

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)


ConfigValue = List[List[List[Union[str, int]]]]


def make_genotype(nodes: Sequence[Sequence[Sequence]], *, what: str = "genotype") -> Genotype:
    """A checked :class:`Genotype` from per-node ``(op, source)`` pairs; the output is the
    concatenation of all nodes.

    Raises:
        ValueError: naming ``what`` and the node at fault (unknown op, a source that is not
            an earlier state, a node without edges).
    """
    checked = []
    for i, edges in enumerate(nodes):
        if not edges:
            raise ValueError(f"{what}: node {i} has no edges")
        node = []
        for edge in edges:
            if len(edge) != 2:
                raise ValueError(f"{what}: node {i}: an edge is [operation, source], got {edge!r}")
            op, source = edge
            if op not in PRIMITIVES or op == NONE:
                raise ValueError(f"{what}: node {i}: unknown operation '{op}', expected one of "
                                 f"{PRIMITIVES[:-1]}")
            if not isinstance(source, int) or not 0 <= source < i + 2:
                raise ValueError(f"{what}: node {i}: source {source!r} is not one of the "
                                 f"{i + 2} states before it (0 .. {i + 1})")
            node.append(Edge(op, source))
        checked.append(tuple(node))
    if not checked:
        raise ValueError(f"{what}: no nodes")
    return Genotype(tuple(checked), tuple(range(2, 2 + len(checked))))


def to_config_value(genotype: Genotype) -> ConfigValue:
    """The config/YAML form: ``[[[op, source], ...], ...]``, a list per node."""
    return [[[edge.op, edge.source] for edge in node] for node in genotype.nodes]


def from_config_value(value: Sequence, *, what: str = "genotype") -> Genotype:
    """The inverse of :func:`to_config_value` (checked by :func:`make_genotype`)."""
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{what}: expected a list per node of [operation, source] pairs, "
                         f"got {value!r}")
    return make_genotype(value, what=what)


_LINE = re.compile(r"Genotype\(normal=(?P<nodes>\[.*\]),\s*normal_concat="
                   r"(?:range\((?P<start>\d+),\s*(?P<stop>\d+)\)|(?P<list>\[[\d,\s]*\]))\)")


def format_line(genotype: Genotype) -> str:
    """FAD's one-line text of a genotype."""
    nodes = ", ".join("[" + ", ".join(f"('{e.op}', {e.source})" for e in node) + "]"
                      for node in genotype.nodes)
    return (f"Genotype(normal=[{nodes}], normal_concat=range({genotype.concat[0]}, "
            f"{genotype.concat[-1] + 1}))")


def parse_line(line: str, *, what: str = "genotype") -> Genotype:
    """A genotype from FAD's one-line text (parsed with ``ast.literal_eval``, never eval).

    Raises:
        ValueError: naming ``what`` when the line is not of that form or describes a
            genotype that is not valid, or concatenates other states than all nodes.
    """
    match = _LINE.fullmatch(line.strip())
    if match is None:
        raise ValueError(f"{what}: not a FAD genotype line: {line.strip()[:120]!r} (expected "
                         f"\"Genotype(normal=[[('op', source), ...], ...], normal_concat=range(2, N))\")")
    try:
        nodes = ast.literal_eval(match["nodes"])
    except (ValueError, SyntaxError) as error:
        raise ValueError(f"{what}: the node list is not a literal: {error}") from error
    genotype = make_genotype(nodes, what=what)
    concat = (tuple(range(int(match["start"]), int(match["stop"]))) if match["start"]
              else tuple(ast.literal_eval(match["list"])))
    if concat != genotype.concat:
        raise ValueError(f"{what}: normal_concat {list(concat)} must be all the nodes, "
                         f"{list(genotype.concat)}")
    return genotype


def write_genotype_file(path: Union[str, Path], box: Genotype, cls: Genotype) -> None:
    """Writes the two towers' genotypes: FAD's two-line text when ``path`` ends in .log or
    .txt, the YAML form (``box:``, ``cls:``) when it ends in .yaml or .yml."""
    path = Path(path)
    if path.suffix in (".yaml", ".yml"):
        text = yaml.safe_dump({"box": to_config_value(box), "cls": to_config_value(cls)},
                              default_flow_style=None, sort_keys=False)
    else:
        text = f"{format_line(box)}\n{format_line(cls)}\n"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)  # atomic: a reader never sees half a file


def read_genotype_file(path: Union[str, Path]) -> Tuple[Genotype, Genotype]:
    """The (box, classification) genotypes of a file :func:`write_genotype_file` wrote, or
    of FAD's release's ``genotype.log``.

    Raises:
        FileNotFoundError, ValueError: naming the file and what is wrong.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"MODEL.FAD.GENOTYPE_FILE: no file {path} (write one with "
                                f"python -m fcos_d2.modeling.fad.search)")
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        data = yaml.safe_load(text) or {}
        missing = {"box", "cls"} - set(data)
        if missing:
            raise ValueError(f"{path}: missing keys {sorted(missing)} (needs box: and cls:)")
        return (from_config_value(data["box"], what=f"{path} box"),
                from_config_value(data["cls"], what=f"{path} cls"))
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) != 2:
        raise ValueError(f"{path}: expected 2 genotype lines (box tower, then classification "
                         f"tower), found {len(lines)}")
    return (parse_line(lines[0], what=f"{path} line 1 (box)"),
            parse_line(lines[1], what=f"{path} line 2 (cls)"))


def random_genotype(num_nodes: int, seed: int, edges_per_node: int = 2) -> Genotype:
    """A genotype drawn uniformly from the search space, as the derivation could give:
    per node, ``edges_per_node`` distinct sources and any operation but "none" on each
    (the random baselines a search is compared with)."""
    rng = random.Random(seed)
    ops = [name for name in PRIMITIVES if name != NONE]
    return make_genotype([[(rng.choice(ops), source)
                           for source in rng.sample(range(i + 2), edges_per_node)]
                          for i in range(num_nodes)], what=f"random genotype (seed {seed})")


# The genotypes of the paper (FAD's README, "Architectures reported in the paper").
PAPER_BOX = make_genotype([
    [("sinSep_conv_3x3_x3", 0), ("std_conv_3x3_x3", 1)],
    [("std_conv_3x3", 2), ("sinSep_conv_3x3+dil_conv_3x3", 1)],
    [("sinSep_conv_3x3_x2", 2), ("std_conv_3x3_x2", 3)],
], what="paper box genotype")
PAPER_CLS = make_genotype([
    [("sinSep_conv_3x3_x2+dil_conv_3x3", 1), ("std_conv_3x3_x3", 0)],
    [("sinSep_conv_3x3_x2+dil_conv_3x3", 0), ("sinSep_conv_3x3", 2)],
    [("sinSep_conv_3x3_x2", 2), ("std_conv_3x3", 3)],
], what="paper cls genotype")
