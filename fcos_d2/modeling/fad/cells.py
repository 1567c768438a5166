"""FAD's cells: the search cell (every edge a softmax-mixed operation), the derived cell
(one operation per edge, from a genotype), the towers they make, and the derivation rule
(DARTS's, on the mixing weights; FAD's code ranks the raw alphas).

Symbols: N images, F the feature channels (256), C the channels of an edge's operation,
n nodes a cell, H x W the feature size. A cell takes two states (N, F, H, W) and returns
its nodes concatenated, (N, n * F, H, W).
"""
from typing import List, Sequence, Tuple

import torch
from detectron2.layers import get_norm
from torch import Tensor, nn

from .genotypes import NONE, PRIMITIVES, Edge, Genotype, make_genotype
from .ops import Bottleneck, MixedOp, build_op


class SearchCell(nn.Module):
    """Node i sums a mixed edge from each of the i + 2 states before it."""

    def __init__(self, in_channels: int, channels: int, num_nodes: int, repshare: bool = True):
        super().__init__()
        self.dag = nn.ModuleList([
            nn.ModuleList([Bottleneck(MixedOp(channels, repshare), in_channels, channels,
                                      bias=False) for _ in range(i + 2)])
            for i in range(num_nodes)])

    def forward(self, s0: Tensor, s1: Tensor, weights: Sequence[Tensor]) -> Tensor:
        """weights[i]: (i + 2, len(PRIMITIVES)), node i's softmax weights per edge."""
        states = [s0, s1]
        for edges, node_weights in zip(self.dag, weights):
            states.append(sum(edge(s, w) for edge, s, w in zip(edges, states, node_weights)))
        return torch.cat(states[2:], dim=1)  # (N, n * F, H, W)


def _preprocess(in_channels: int, out_channels: int) -> nn.Module:
    """1x1 conv -> GN -> ReLU, bringing a previous cell's concatenation back to F."""
    return nn.Sequential(nn.Conv2d(in_channels, out_channels, 1), get_norm("GN", out_channels),
                         nn.ReLU())


class DerivedCell(nn.Module):
    """The cell of ``genotype``: node i sums its edges' operations on their sources.
    An input with other than ``in_channels`` channels (a previous cell's output) is first
    pre-processed to ``in_channels`` (``preprocess[k]``, k the input)."""

    def __init__(self, genotype: Genotype, in_channels: int, channels: int,
                 input_channels: Tuple[int, int]):
        super().__init__()
        self.sources = [[edge.source for edge in node] for node in genotype.nodes]
        self.dag = nn.ModuleList([
            nn.ModuleList([Bottleneck(build_op(edge.op, channels), in_channels, channels)
                           for edge in node]) for node in genotype.nodes])
        self.preprocess = nn.ModuleList([
            _preprocess(c, in_channels) if c != in_channels else nn.Identity()
            for c in input_channels])

    def forward(self, s0: Tensor, s1: Tensor) -> Tensor:
        states = [self.preprocess[0](s0), self.preprocess[1](s1)]  # (N, F, H, W) each
        for edges, sources in zip(self.dag, self.sources):
            states.append(sum(edge(states[s]) for edge, s in zip(edges, sources)))
        return torch.cat(states[2:], dim=1)  # (N, n * F, H, W)


class DerivedTower(nn.Module):
    """``num_cells`` derived cells in a row: cell k reads (s_{k-1}, s_k) with s_0 and s_1
    the tower's two inputs, as DARTS chains cells; so the second cell pre-processes the
    first cell's n * F output to F."""

    def __init__(self, genotype: Genotype, in_channels: int, channels: int, num_cells: int):
        super().__init__()
        out_channels = genotype.num_nodes * in_channels
        inputs, cells = (in_channels, in_channels), []
        for _ in range(num_cells):
            cells.append(DerivedCell(genotype, in_channels, channels, inputs))
            inputs = (inputs[1], out_channels)
        self.cells = nn.ModuleList(cells)
        self.out_channels = out_channels

    def forward(self, s0: Tensor, s1: Tensor) -> Tensor:
        for cell in self.cells:
            s0, s1 = s1, cell(s0, s1)
        return s1  # (N, n * F, H, W)


class SearchTower(nn.Module):
    """As :class:`DerivedTower`, with search cells sharing one set of weights."""

    def __init__(self, in_channels: int, channels: int, num_nodes: int, num_cells: int,
                 repshare: bool = True):
        super().__init__()
        if num_cells != 1:  # a second cell would need the pre-processing of DerivedTower
            raise ValueError(f"MODEL.FAD.SEARCH.NUM_CELLS: the search runs one cell a tower "
                             f"(as FAD's), got {num_cells}")
        self.cells = nn.ModuleList([SearchCell(in_channels, channels, num_nodes, repshare)])
        self.out_channels = num_nodes * in_channels

    def forward(self, s0: Tensor, s1: Tensor, weights: Sequence[Tensor]) -> Tensor:
        return self.cells[0](s0, s1, weights)


def derive_genotype(weights: Sequence[Tensor], edges_per_node: int = 2) -> Genotype:
    """DARTS's derivation rule on the mixing weights: for each node, the
    ``edges_per_node`` incoming edges whose best operation other than "none" has the
    largest weight, each with that operation, strongest first. FAD's code applies the same
    rule to the raw architecture weights instead; the softmax keeps each edge's order of
    operations but not the order across edges (configs/FAD/README.md lists the
    difference).

    Args:
        weights: per node i, (i + 2, len(PRIMITIVES)) mixing weights (softmax of the
            architecture weights), "none" last.
    """
    if PRIMITIVES[-1] != NONE:
        raise AssertionError("derive_genotype expects 'none' last in PRIMITIVES")
    nodes: List[List[Edge]] = []
    for i, node in enumerate(weights):
        if node.shape != (i + 2, len(PRIMITIVES)):
            raise ValueError(f"derive_genotype: node {i} weights have shape {tuple(node.shape)}, "
                             f"expected {(i + 2, len(PRIMITIVES))}")
        best, op = node[:, :-1].max(dim=1)  # (i + 2,) per edge
        chosen = torch.topk(best, min(edges_per_node, i + 2)).indices
        nodes.append([Edge(PRIMITIVES[int(op[e])], int(e)) for e in chosen])
    return make_genotype(nodes, what="derived genotype")
