"""The operations and aggregations of the NAS-FCOS search spaces.

FPN operations keep the width C and the resolution and end with BatchNorm and ReLU (but
``skip_connect``); head operations end with GroupNorm(32) and ReLU. Aggregations merge two
features (N, C, Hx, Wx) and (N, C, Hy, Wy) at the finer of the two sizes, upsampling the
other bilinearly.

Parameter names (the checkpoint converter maps the NAS-FCOS code's names onto them):
separable convs ``depthwise.weight``, ``pointwise.weight``, ``norm.*``; deformable convs
``weight``, ``bias``, ``offset.*``, ``norm.*``; plain head convs ``0.weight`` (conv),
``1.*`` (GroupNorm); ``psum`` ``a``, ``b``; ``cat`` ``norm.*``, ``conv.weight``.
"""
from typing import Callable, Dict, Tuple

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ..layers import DeformConv2d, SeparableConv2d

DEFORM_GROUPS = 2  # the NAS-FCOS deformable convs: DCNv2 with 2 deformable groups
GN_GROUPS = 32


def _separable(channels: int, kernel_size: int, dilation: int, norm: nn.Module) -> nn.Module:
    return SeparableConv2d(channels, channels, kernel_size, dilation=dilation, norm=norm,
                           activation=nn.ReLU())


def _deformable(channels: int, norm: nn.Module) -> nn.Module:
    return DeformConv2d(channels, channels, 3, padding=1, deform_groups=DEFORM_GROUPS,
                        modulated=True, bias=True, norm=norm, activation=nn.ReLU())


def _plain(channels: int, kernel_size: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(channels, channels, kernel_size, padding=kernel_size // 2,
                                   bias=False),
                         nn.GroupNorm(GN_GROUPS, channels), nn.ReLU())


_BN = nn.BatchNorm2d
_GN = lambda c: nn.GroupNorm(GN_GROUPS, c)  # noqa: E731

FPN_OP_BUILDERS: Dict[str, Callable[[int], nn.Module]] = {
    "sep_conv_3x3": lambda c: _separable(c, 3, 1, _BN(c)),
    "sep_conv_3x3_dil3": lambda c: _separable(c, 3, 3, _BN(c)),
    "sep_conv_5x5_dil6": lambda c: _separable(c, 5, 6, _BN(c)),
    "skip_connect": lambda c: nn.Identity(),
    "def_conv_3x3": lambda c: _deformable(c, _BN(c)),
}

HEAD_OP_BUILDERS: Dict[str, Callable[[int], nn.Module]] = {
    "conv1x1": lambda c: _plain(c, 1),
    "conv3x3": lambda c: _plain(c, 3),
    "sep_conv_3x3": lambda c: _separable(c, 3, 1, _GN(c)),
    "sep_conv_3x3_dil3": lambda c: _separable(c, 3, 3, _GN(c)),
    "skip_connect": lambda c: nn.Identity(),
    "def_conv_3x3": lambda c: _deformable(c, _GN(c)),
}


def build_fpn_op(name: str, channels: int) -> nn.Module:
    """An FPN operation (``genotypes.FPN_OPS``) on ``channels`` channels."""
    if name not in FPN_OP_BUILDERS:
        raise KeyError(f"NAS-FCOS FPN operation '{name}' unknown; known: {list(FPN_OP_BUILDERS)}")
    return FPN_OP_BUILDERS[name](channels)


def build_head_op(name: str, channels: int) -> nn.Module:
    """A head operation (``genotypes.HEAD_OPS``) on ``channels`` channels."""
    if name not in HEAD_OP_BUILDERS:
        raise KeyError(f"NAS-FCOS head operation '{name}' unknown; known: "
                       f"{list(HEAD_OP_BUILDERS)}")
    return HEAD_OP_BUILDERS[name](channels)


def match_sizes(x: Tensor, y: Tensor) -> Tuple[Tensor, Tensor]:
    """``x`` and ``y`` at the larger of their sizes (compared as (H, W) tuples, as the
    NAS-FCOS code does), the smaller upsampled bilinearly (align_corners False)."""
    size_x, size_y = tuple(x.shape[-2:]), tuple(y.shape[-2:])
    if size_x > size_y:
        y = F.interpolate(y, size=size_x, mode="bilinear", align_corners=False)
    elif size_y > size_x:
        x = F.interpolate(x, size=size_y, mode="bilinear", align_corners=False)
    return x, y


class ParamSum(nn.Module):
    """``psum``: a * x + b * y with learned per-channel a and b (both start at 1)."""

    def __init__(self, channels: int):
        super().__init__()
        self.a = nn.Parameter(torch.ones(channels))
        self.b = nn.Parameter(torch.ones(channels))

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        x, y = match_sizes(x, y)
        return self.a[:, None, None] * x + self.b[:, None, None] * y  # (C, 1, 1) broadcast


class ConcatReduce(nn.Module):
    """``cat``: concat (N, 2C, H, W) -> BatchNorm -> ReLU -> 1x1 conv with groups=C (no
    bias). Output channel i mixes concatenated channels 2i and 2i + 1: pairs of x's
    channels for i < C/2, of y's for the rest (the published checkpoints depend on it)."""

    def __init__(self, channels: int):
        super().__init__()
        self.norm = nn.BatchNorm2d(2 * channels)
        self.conv = nn.Conv2d(2 * channels, channels, 1, groups=channels, bias=False)

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        x, y = match_sizes(x, y)
        return self.conv(F.relu(self.norm(torch.cat([x, y], dim=1))))  # (N, 2C, H, W) in


AGGREGATION_BUILDERS: Dict[str, Callable[[int], nn.Module]] = {
    "psum": ParamSum,
    "cat": ConcatReduce,
}


def build_aggregation(name: str, channels: int) -> nn.Module:
    """An aggregation (``genotypes.FPN_AGGREGATIONS``) on ``channels`` channels."""
    if name not in AGGREGATION_BUILDERS:
        raise KeyError(f"NAS-FCOS aggregation '{name}' unknown; known: "
                       f"{list(AGGREGATION_BUILDERS)}")
    return AGGREGATION_BUILDERS[name](channels)
