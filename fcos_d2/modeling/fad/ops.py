"""FAD's candidate operations and their representation-sharing ("RepShare") modules.

Symbols: N images, C channels, H x W the feature size (kept by every operation).

Every candidate but "none" stacks layers of one family, each followed by GN and ReLU:
``std`` a 3x3 conv, ``sinSep`` a single depthwise-separable 3x3 conv (depthwise, then
pointwise); ``_xN`` stacks N of them; ``+dil_conv_3x3`` adds a dilation-2 separable 3x3
conv on top. In the search, :class:`RepShare` computes one family's three stacked layers
and two dilated branches once and returns all five candidates of the family from them.
"""
from typing import List, NamedTuple, Optional

import torch
from detectron2.layers import get_norm
from torch import Tensor, nn

from ..layers import SeparableConv2d
from .genotypes import NONE, PRIMITIVES

FAMILIES = ("std", "sinSep")


class OpSpec(NamedTuple):
    """What a candidate is: ``depth`` layers of ``family``, then a dilated conv or not."""
    family: str
    depth: int
    dilated: bool


def op_spec(name: str) -> OpSpec:
    """The :class:`OpSpec` of a candidate name of :data:`PRIMITIVES` but "none"."""
    if name not in PRIMITIVES or name == NONE:
        raise ValueError(f"unknown FAD operation '{name}', expected one of {PRIMITIVES[:-1]}")
    family = name.split("_conv_3x3")[0]
    stack = name.split("+")[0]
    depth = int(stack[-1]) if stack[-3:-1] == "_x" else 1
    return OpSpec(family, depth, name.endswith("+dil_conv_3x3"))


def family_layer(family: str, channels: int) -> nn.Module:
    """One layer of a family at ``channels``: conv -> GN -> ReLU, (N, C, H, W) -> same."""
    if family == "std":
        return nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1),
                             get_norm("GN", channels), nn.ReLU())
    if family == "sinSep":
        return SeparableConv2d(channels, channels, 3, bias=True, norm=get_norm("GN", channels),
                               activation=nn.ReLU())
    raise ValueError(f"unknown FAD operation family '{family}', expected one of {FAMILIES}")


def dilated_layer(channels: int) -> nn.Module:
    """The dilation-2 separable 3x3 conv -> GN -> ReLU (a 5x5 receptive field)."""
    return SeparableConv2d(channels, channels, 3, dilation=2, bias=True,
                           norm=get_norm("GN", channels), activation=nn.ReLU())


class StackedOp(nn.Module):
    """A derived candidate: ``layers`` (``depth`` family layers), then ``dilated`` if any."""

    def __init__(self, spec: OpSpec, channels: int):
        super().__init__()
        self.layers = nn.Sequential(*[family_layer(spec.family, channels)
                                      for _ in range(spec.depth)])
        self.dilated = dilated_layer(channels) if spec.dilated else None

    def forward(self, x: Tensor) -> Tensor:
        x = self.layers(x)
        return x if self.dilated is None else self.dilated(x)


class Zero(nn.Module):
    """The "none" candidate: zeros of the input's shape."""

    def forward(self, x: Tensor) -> Tensor:
        return torch.zeros_like(x)


def build_op(name: str, channels: int) -> nn.Module:
    """The candidate ``name`` of :data:`PRIMITIVES` at ``channels`` (a multiple of 32: GN)."""
    return Zero() if name == NONE else StackedOp(op_spec(name), channels)


class RepShare(nn.Module):
    """The five candidates of one family from shared intermediates: layers
    ``stack[0..2]`` applied in turn give x1, x2, x3; ``dilated[k]`` reads x(k+1). Outputs,
    in :data:`PRIMITIVES` order: x1, dil(x1), x2, dil(x2), x3, where with ``decouple`` the
    shared x1 and x2 pass a 1x1 conv (``decouple[k]``, search-only: the derived op has
    none) before they are returned, so that the candidates' outputs are not tied to the
    input of the next layer. Without ``decouple`` the outputs equal the five
    :class:`StackedOp` of the family holding the same layers.
    """

    def __init__(self, family: str, channels: int, decouple: bool = True):
        super().__init__()
        self.family = family
        self.stack = nn.ModuleList([family_layer(family, channels) for _ in range(3)])
        self.dilated = nn.ModuleList([dilated_layer(channels) for _ in range(2)])
        self.decouple = (nn.ModuleList([nn.Conv2d(channels, channels, 1, bias=False)
                                        for _ in range(2)]) if decouple else None)

    def forward(self, x: Tensor) -> List[Tensor]:
        outputs = []
        for k, layer in enumerate(self.stack):
            x = layer(x)  # x(k+1): (N, C, H, W)
            if k == 2:
                outputs.append(x)
                break
            outputs.append(x if self.decouple is None else self.decouple[k](x))
            outputs.append(self.dilated[k](x))
        return outputs


class MixedOp(nn.Module):
    """A search edge's operation: the sum of every candidate weighted by ``weights`` (the
    softmax of its architecture weights, in :data:`PRIMITIVES` order). With ``repshare``
    one :class:`RepShare` per family computes the ten convolutional candidates; without,
    ten separate :class:`StackedOp` (five times the memory and compute of a family)."""

    def __init__(self, channels: int, repshare: bool = True, decouple: bool = True):
        super().__init__()
        self.repshare = repshare
        if repshare:
            self.families = nn.ModuleList([RepShare(f, channels, decouple) for f in FAMILIES])
        else:
            self.candidates = nn.ModuleList([build_op(name, channels)
                                             for name in PRIMITIVES if name != NONE])

    def candidate_outputs(self, x: Tensor) -> List[Tensor]:
        """The ten convolutional candidates' outputs ("none" is zero), each (N, C, H, W)."""
        if self.repshare:
            return [y for family in self.families for y in family(x)]
        return [op(x) for op in self.candidates]

    def forward(self, x: Tensor, weights: Tensor) -> Tensor:
        """x (N, C, H, W), weights (len(PRIMITIVES),) -> (N, C, H, W)."""
        outputs = self.candidate_outputs(x)
        return sum(w * y for w, y in zip(weights[:len(outputs)], outputs))


class Bottleneck(nn.Module):
    """A cell edge: 1x1 conv ``in_channels`` -> ``channels``, ``op``, 1x1 conv back."""

    def __init__(self, op: nn.Module, in_channels: int, channels: int, bias: bool = True):
        super().__init__()
        self.reduce = nn.Conv2d(in_channels, channels, 1, bias=bias)
        self.op = op
        self.expand = nn.Conv2d(channels, in_channels, 1, bias=bias)

    def forward(self, x: Tensor, weights: Optional[Tensor] = None) -> Tensor:
        x = self.reduce(x)  # (N, channels, H, W)
        x = self.op(x) if weights is None else self.op(x, weights)
        return self.expand(x)  # (N, in_channels, H, W)
