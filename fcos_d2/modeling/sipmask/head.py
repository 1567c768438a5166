"""SipMaskHead: the FCOS head with SipMask's feature alignment, spatial coefficients and
basis masks (Cao et al., ECCV 2020; layout of the public SipMask-benchmark).

Symbols: N images, L levels, Hi x Wi the size of level i, K classes, C channels, B basis
masks (32), Hm x Wm the basis-mask size (the padded input at stride 2 when level 0 has
stride 8).

Per level, as in SipMask-benchmark:
- the box tower has NUM_CONVS convs, the classification tower one fewer;
- ``feat_align``: a 3x3 deformable conv (4 deformable groups) on the classification
  tower's output, whose offsets are a 1x1 conv (no bias, zero init) of the detached box
  regression (l, t, r, b) -> GroupNorm(32) -> ReLU; class logits and coefficients are
  predicted from it;
- ``sip_cof``: 4 x B spatial coefficients per location, one set per 2 x 2 cell of the
  box, in the order of ``crop_split.QUADRANTS``.
Once per image: the box-tower outputs of the BASIS_LEVELS finest levels, upsampled to the
finest level's size and concatenated -> ``sip_mask_lat0`` (1x1, hidden channels) -> ReLU
-> ``sip_mask_lat`` (3x3, B) -> ReLU -> bilinear to stride ``MASK_STRIDE`` (x4 from
stride 8): the B basis masks.

An option of fcos-d2, not SipMask's (``MODEL.SIPMASK.BASIS_IN_FEATURE``): a finer backbone
feature (e.g. FPN's P2 at stride 4) joins the concatenation, the box-tower outputs
upsampled to its size, so that the basis masks come from its stride. At stride 8 a mask's
edge can only bend every 8 pixels, which small objects need far finer.
"""
from typing import List, Optional, Tuple

import torch
from detectron2.config import configurable
from detectron2.layers import ShapeSpec
from torch import Tensor, nn
from torch.nn import functional as F
from torchvision.ops import deform_conv2d

from ..head import REG_ACTIVATION_FUNCTIONS, FCOSHead, conv_tower
from .masks import MASK_STRIDE


class FeatureAlign(nn.Module):
    """A deformable 3x3 conv whose offsets come from a 1x1 conv of the (detached) box
    distances, then GroupNorm and ReLU. Parameters named as SipMask's ``FeatureAlign``
    (``conv_offset``, ``conv_adaption``, ``norm``); runs on torchvision's deform_conv2d."""

    def __init__(self, channels: int, *, deform_groups: int = 4, kernel_size: int = 3):
        super().__init__()
        if channels % deform_groups:
            raise ValueError(f"MODEL.SIPMASK.FEATURE_ALIGN_GROUPS: {deform_groups} does not "
                             f"divide the head's {channels} channels")
        self.conv_offset = nn.Conv2d(4, deform_groups * 2 * kernel_size ** 2, 1, bias=False)
        # A plain conv's parameters, applied as a deformable conv in forward.
        self.conv_adaption = nn.Conv2d(channels, channels, kernel_size,
                                       padding=(kernel_size - 1) // 2)
        self.norm = nn.GroupNorm(32, channels)
        nn.init.zeros_(self.conv_offset.weight)  # starts as a regular conv
        nn.init.normal_(self.conv_adaption.weight, std=0.01)
        nn.init.zeros_(self.conv_adaption.bias)

    def forward(self, x: Tensor, ltrb: Tensor) -> Tensor:
        """x: (N, C, Hi, Wi); ltrb: (N, 4, Hi, Wi) box distances -> (N, C, Hi, Wi)."""
        offset = self.conv_offset(ltrb.detach())  # (N, G * 2 * k * k, Hi, Wi), (dy, dx) pairs
        conv = self.conv_adaption
        # float32 whatever the autocast precision: torchvision's CPU kernel has no bf16.
        x = deform_conv2d(x.float(), offset.float(), conv.weight.float(), conv.bias.float(),
                          padding=conv.padding)
        return F.relu(self.norm(x))


class SipMaskHead(FCOSHead):
    """FCOSHead (towers, box regression, centerness, per-level scales) plus feature
    alignment, spatial coefficients and basis masks; see the module docstring.

    Output: the FCOSHead outputs (logits, regression, centerness per level; logits now
    from the aligned features), coefficients per level (N, 4 * B, Hi, Wi), and basis masks
    (N, B, Hm, Wm), logits (before any sigmoid; the ReLU makes them non-negative).
    """

    @configurable
    def __init__(self, *, input_shape: List[ShapeSpec], num_basis: int = 32,
                 basis_levels: int = 3, basis_hidden_channels: int = 512,
                 feature_align_groups: int = 4,
                 basis_feature_shape: Optional[ShapeSpec] = None, **fcos_options):
        """``basis_feature_shape``: the finer feature that joins the basis masks' input
        (``MODEL.SIPMASK.BASIS_IN_FEATURE``), None for SipMask's box towers alone;
        ``fcos_options``: FCOSHead's keyword arguments."""
        super().__init__(input_shape=input_shape, **fcos_options)
        if not 1 <= basis_levels <= len(input_shape):
            raise ValueError(f"MODEL.SIPMASK.BASIS_LEVELS: {basis_levels} must lie in "
                             f"[1, {len(input_shape)}] (the head's levels)")
        self.basis_upsample = _basis_upsample(input_shape[0].stride, basis_feature_shape)
        self.has_basis_feature = basis_feature_shape is not None
        for key, value in (("NUM_BASIS", num_basis),
                           ("BASIS_HIDDEN_CHANNELS", basis_hidden_channels)):
            if value < 1:
                raise ValueError(f"MODEL.SIPMASK.{key}: must be >= 1, got {value}")
        channels = input_shape[0].channels
        # SipMask's classification tower has one conv fewer than the box tower (one ReLU
        # per conv there); FCOSHead built both with NUM_CONVS.
        num_convs = len([m for m in self.bbox_tower if isinstance(m, nn.ReLU)])
        norm = fcos_options.get("norm", "GN")
        self.cls_tower = conv_tower(channels, num_convs - 1, norm, False)
        for module in self.cls_tower.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.normal_(module.weight, std=0.01)
                nn.init.zeros_(module.bias)
        self.num_basis, self.basis_levels = num_basis, basis_levels
        self.feat_align = FeatureAlign(channels, deform_groups=feature_align_groups)
        # PyTorch's default init for these three, as SipMask-benchmark.
        self.sip_cof = nn.Conv2d(channels, 4 * num_basis, 3, padding=1)
        extra = basis_feature_shape.channels if basis_feature_shape is not None else 0
        self.sip_mask_lat0 = nn.Conv2d(channels * basis_levels + extra, basis_hidden_channels, 1)
        self.sip_mask_lat = nn.Conv2d(basis_hidden_channels, num_basis, 3, padding=1)

    @classmethod
    def from_config(cls, cfg, input_shape: List[ShapeSpec],
                    basis_feature_shape: Optional[ShapeSpec] = None):
        sipmask = cfg.MODEL.SIPMASK
        return {
            **super().from_config(cfg, input_shape),
            "basis_feature_shape": basis_feature_shape,
            "num_basis": sipmask.NUM_BASIS,
            "basis_levels": sipmask.BASIS_LEVELS,
            "basis_hidden_channels": sipmask.BASIS_HIDDEN_CHANNELS,
            "feature_align_groups": sipmask.FEATURE_ALIGN_GROUPS,
        }

    def forward(self, features: List[Tensor], basis_feature: Optional[Tensor] = None
                ) -> Tuple[List[Tensor], List[Tensor], List[Tensor], List[Tensor], Tensor]:
        """features: per level (N, C, Hi, Wi); basis_feature: (N, Cf, Hf, Wf), the finer
        feature the head was built for (None without one) -> (logits, regression,
        centerness, coefficients, basis masks)."""
        called_with = basis_feature is not None
        if called_with != self.has_basis_feature:
            built, called = ("with", "without") if self.has_basis_feature else ("without", "with")
            raise ValueError(f"SipMaskHead: built {built} a basis feature "
                             f"(MODEL.SIPMASK.BASIS_IN_FEATURE), called {called}")
        logits, regression, centerness, coefficients, basis_inputs = [], [], [], [], []
        for level, (feature, scale) in enumerate(zip(features, self.scales)):
            feature = self.share_tower(feature)
            cls_feature = self.cls_tower(feature)
            box_feature = self.bbox_tower(feature)
            activation = REG_ACTIVATION_FUNCTIONS[self.reg_activation]
            ltrb = activation(scale(self.bbox_pred(box_feature)))
            regression.append(ltrb)
            ctr_feature = box_feature if self.centerness_on_reg else cls_feature
            centerness.append(self.centerness(ctr_feature))
            aligned = self.feat_align(cls_feature, ltrb)
            logits.append(self.cls_logits(aligned))
            coefficients.append(self.sip_cof(aligned))
            if level < self.basis_levels:
                basis_inputs.append(box_feature)
        return (logits, regression, centerness, coefficients,
                self.basis_masks(basis_inputs, basis_feature))

    def basis_masks(self, box_features: List[Tensor], basis_feature: Optional[Tensor] = None
                    ) -> Tensor:
        """Box-tower outputs of the finest levels (N, C, Hi, Wi), and the finer feature
        (N, Cf, Hf, Wf) or None -> (N, B, Hm, Wm) at stride ``MASK_STRIDE``: from level 0's
        size (H0 x W0) x its stride / 2 without the finer feature, from Hf x Wf x its
        stride / 2 with it."""
        first = [] if basis_feature is None else [basis_feature]
        size = (first or box_features)[0].shape[-2:]
        upsampled = first + [x if x.shape[-2:] == size else
                             F.interpolate(x, size=size, mode="bilinear", align_corners=False)
                             for x in box_features]
        x = torch.cat(upsampled, dim=1)  # (N, Cf + C * BASIS_LEVELS, H, W)
        x = F.relu(self.sip_mask_lat(F.relu(self.sip_mask_lat0(x))))  # (N, B, H, W)
        if self.basis_upsample == 1:
            return x
        return F.interpolate(x, scale_factor=self.basis_upsample, mode="bilinear",
                             align_corners=False)


def _basis_upsample(level0_stride: int, basis_feature_shape: Optional[ShapeSpec]) -> int:
    """The factor from the basis masks' source stride (the finer feature's, else level
    0's) to ``MASK_STRIDE``; refuses strides that do not fit."""
    if basis_feature_shape is None:
        if level0_stride % MASK_STRIDE:
            raise ValueError(f"SipMask: the head's first level has stride {level0_stride}; "
                             f"the basis masks need a multiple of {MASK_STRIDE}")
        return level0_stride // MASK_STRIDE
    stride = basis_feature_shape.stride
    if stride is None or stride % MASK_STRIDE or stride >= level0_stride:
        raise ValueError(f"MODEL.SIPMASK.BASIS_IN_FEATURE: its stride {stride} must be a "
                         f"multiple of {MASK_STRIDE} below the head's first level's "
                         f"({level0_stride})")
    return stride // MASK_STRIDE
