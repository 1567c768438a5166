"""Layers FCOS and its family need beyond detectron2's: a per-level scale, a deformable
conv and a depthwise-separable conv.

The deformable conv runs without detectron2's C++ extension: on a GPU on
``torchvision.ops.deform_conv2d``, on the CPU on ``deform_sampling`` (the same function by
bilinear sampling and a matrix product, several times faster there than torchvision's CPU
kernel).
"""
import math
from typing import List, Optional, Tuple

import torch
from torch import Tensor, nn
from torchvision.ops import deform_conv2d

from .deform_sampling import sampled_deform_conv2d


class Scale(nn.Module):
    """Multiplies its input by one learnable scalar (one per FPN level in the head)."""

    def __init__(self, init_value: float = 1.0):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor([init_value]))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.scale


def _deform_conv2d_any_device(x: Tensor, offset: Tensor, weight: Tensor,
                              bias: Optional[Tensor], *, stride: int, padding: int,
                              dilation: int, mask: Optional[Tensor]) -> Tensor:
    """``deform_conv2d``: on the CPU by sampling and one matrix product
    (``deform_sampling``; the same function, ~6x faster forward + backward there, any
    dtype, the product in the autocast dtype under autocast), elsewhere torchvision's."""
    if x.device.type == "cpu":
        return sampled_deform_conv2d(x, offset, weight, bias, stride=stride, padding=padding,
                                     dilation=dilation, mask=mask)
    return deform_conv2d(x, offset, weight, bias, stride=stride, padding=padding,
                         dilation=dilation, mask=mask)


class DeformConv2d(nn.Module):
    """A deformable 3x3-style conv whose offsets (and, if modulated, masks) are predicted
    from its input by ``self.offset``, a plain conv initialised to zero, so that training
    starts from a regular convolution (DCNv1; DCNv2 when ``modulated``).

    Parameters: ``weight``, ``bias`` (optional), ``offset.weight``, ``offset.bias``, and
    ``norm.*`` when a norm is given; ``forward`` applies conv -> norm -> activation, like
    ``detectron2.layers.Conv2d``.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int = 3,
        *,
        stride: int = 1,
        padding: int = 1,
        dilation: int = 1,
        groups: int = 1,
        deform_groups: int = 1,
        modulated: bool = True,
        bias: bool = True,
        norm: Optional[nn.Module] = None,
        activation: Optional[nn.Module] = None,
    ):
        super().__init__()
        self.stride, self.padding, self.dilation = stride, padding, dilation
        self.modulated = modulated
        self.weight = nn.Parameter(
            torch.empty(out_channels, in_channels // groups, kernel_size, kernel_size))
        self.bias = nn.Parameter(torch.zeros(out_channels)) if bias else None
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        # (dy, dx) per kernel tap and deform group, then one mask value per tap if modulated.
        per_tap = 3 if modulated else 2
        self.offset = nn.Conv2d(in_channels, per_tap * deform_groups * kernel_size ** 2,
                                kernel_size, stride=stride, padding=padding, dilation=dilation)
        nn.init.zeros_(self.offset.weight)
        nn.init.zeros_(self.offset.bias)
        self.norm = norm
        self.activation = activation

    def predict_offsets(self, x: Tensor) -> Tuple[Tensor, Optional[Tensor]]:
        """The offsets (N, 2 * G * k * k, Ho, Wo) and, if modulated, the masks
        (N, G * k * k, Ho, Wo, in (0, 1)) this conv predicts for ``x``."""
        offset = self.offset(x)  # (N, per_tap * G * k * k, Ho, Wo)
        if not self.modulated:
            return offset, None
        num_mask = offset.shape[1] // 3
        return offset[:, :2 * num_mask], offset[:, 2 * num_mask:].sigmoid()

    def forward(self, x: Tensor) -> Tensor:
        offset, mask = self.predict_offsets(x)
        x = _deform_conv2d_any_device(x, offset, self.weight, self.bias, stride=self.stride,
                                     padding=self.padding, dilation=self.dilation, mask=mask)
        if self.norm is not None:
            x = self.norm(x)
        if self.activation is not None:
            x = self.activation(x)
        return x


def scale_offset_lr(groups: List[dict], model: nn.Module, factor: float) -> List[dict]:
    """``groups`` with the parameters of every ``DeformConv2d``'s offset predictor moved to
    groups of their own at ``factor`` x their lr (the rest unchanged; none moved at 1.0).

    Zero-initialised offset convs under AdamW move by about the lr per step whatever their
    gradient's size; at lr 1e-3 the NAS-FCOS offsets ended 3-7.5 feature pixels long on
    average on 4x4 and 8x8 maps (issue 62), sampling mostly outside them.

    Raises:
        ValueError: naming ``SOLVER.DEFORM_OFFSET_LR_FACTOR`` (the key that sets it) when it
            is negative.
    """
    if factor < 0:
        raise ValueError(f"SOLVER.DEFORM_OFFSET_LR_FACTOR: at least 0 expected, got {factor}")
    if factor == 1.0:
        return groups
    offsets = {id(p) for m in model.modules() if isinstance(m, DeformConv2d)
               for p in m.offset.parameters()}
    scaled = []
    for group in groups:
        moved = [p for p in group["params"] if id(p) in offsets]
        kept = [p for p in group["params"] if id(p) not in offsets]
        if kept:
            scaled.append({**group, "params": kept})
        if moved:
            scaled.append({**group, "params": moved, "lr": group["lr"] * factor})
    return scaled


class SeparableConv2d(nn.Module):
    """A depthwise-separable conv: a depthwise ``kernel_size`` conv (dilated by
    ``dilation``, padded to keep the size at stride 1), then a pointwise 1x1 conv to
    ``out_channels``, then ``norm`` and ``activation`` when given. Shared by the searched
    heads and FPNs of the family (NAS-FCOS, FAD).

    Parameters: ``depthwise.weight``, ``pointwise.weight`` (and ``pointwise.bias`` when
    ``bias``), ``norm.*`` when a norm is given.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int = 3,
        *,
        stride: int = 1,
        dilation: int = 1,
        bias: bool = False,
        norm: Optional[nn.Module] = None,
        activation: Optional[nn.Module] = None,
    ):
        super().__init__()
        padding = dilation * (kernel_size - 1) // 2
        self.depthwise = nn.Conv2d(in_channels, in_channels, kernel_size, stride=stride,
                                   padding=padding, dilation=dilation, groups=in_channels,
                                   bias=False)
        self.pointwise = nn.Conv2d(in_channels, out_channels, 1, bias=bias)
        self.norm = norm
        self.activation = activation

    def forward(self, x: Tensor) -> Tensor:
        x = self.pointwise(self.depthwise(x))  # (N, C_in, H, W) -> (N, C_out, H', W')
        if self.norm is not None:
            x = self.norm(x)
        if self.activation is not None:
            x = self.activation(x)
        return x
