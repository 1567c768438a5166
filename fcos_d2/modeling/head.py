"""FCOSHead: shared towers over the FPN levels, then class logits, box distances and
centerness per location.

Symbols: N images, L levels, Hi x Wi the size of level i, K foreground classes, C channels.
The head computes the same thing in training and inference; converting the regression to
pixels and selecting detections is the caller's business.
"""
import math
from typing import List, Tuple

import torch
from detectron2.config import configurable
from detectron2.layers import ShapeSpec, get_norm
from torch import Tensor, nn
from torch.nn import functional as F

from .layers import DeformConv2d, Scale

NORMS = ("", "GN", "BN", "SyncBN")
REG_ACTIVATIONS = ("relu", "exp", "softplus")


def conv_tower(channels: int, num_convs: int, norm: str, deform_last: bool) -> nn.Sequential:
    """[conv3x3 -> norm -> ReLU] * num_convs, laid out as in the official FCOS head so that
    its checkpoints map index by index (conv at 3i, norm at 3i + 1 with a norm)."""
    layers: List[nn.Module] = []
    for i in range(num_convs):
        if deform_last and i == num_convs - 1:
            layers.append(DeformConv2d(channels, channels, 3, padding=1, bias=True))
        else:
            layers.append(nn.Conv2d(channels, channels, 3, padding=1, bias=True))
        if norm:
            layers.append(get_norm(norm, channels))
        layers.append(nn.ReLU())
    return nn.Sequential(*layers)


# relu: the improved official FCOS; exp: the original; softplus: relu-like but its gradient
# never vanishes, so a regression pushed below zero recovers instead of dying.
REG_ACTIVATION_FUNCTIONS = {"relu": F.relu, "exp": torch.exp, "softplus": F.softplus}


class FCOSHead(nn.Module):
    """Towers and predictors shared by all levels, with a learnable scale per level.

    Output contract, per level i: class logits (N, K, Hi, Wi); box regression (N, 4, Hi, Wi)
    as (l, t, r, b), ``act(scale_i * x)`` in units of the level's stride when
    ``norm_reg_targets`` else in pixels, where ``act`` is ``reg_activation`` (official:
    relu in strides, exp in pixels) and ``scale_i`` is 1 without ``use_scale``; centerness
    logits (N, 1, Hi, Wi).
    """

    @configurable
    def __init__(
        self,
        *,
        input_shape: List[ShapeSpec],
        num_classes: int,
        num_convs: int = 4,
        num_share_convs: int = 0,
        norm: str = "GN",
        use_deformable: bool = False,
        prior_prob: float = 0.01,
        norm_reg_targets: bool = True,
        centerness_on_reg: bool = True,
        reg_activation: str = "",
        use_scale: bool = True,
    ):
        super().__init__()
        if norm not in NORMS:
            raise ValueError(f"MODEL.FCOS.NORM: unknown '{norm}', expected one of {NORMS}")
        reg_activation = reg_activation or ("relu" if norm_reg_targets else "exp")
        if reg_activation not in REG_ACTIVATIONS:
            raise ValueError(f"MODEL.FCOS.REG_ACTIVATION: unknown '{reg_activation}', expected "
                             f"one of {REG_ACTIVATIONS} (or '' for the official choice)")
        channels = {s.channels for s in input_shape}
        if len(channels) != 1:
            raise ValueError(f"FCOS head needs the same channels on every level, got {channels}")
        channels = channels.pop()
        self.norm_reg_targets = norm_reg_targets
        self.centerness_on_reg = centerness_on_reg
        self.reg_activation = reg_activation
        self.share_tower = conv_tower(channels, num_share_convs, norm, False)
        self.cls_tower = conv_tower(channels, num_convs, norm, use_deformable)
        self.bbox_tower = conv_tower(channels, num_convs, norm, use_deformable)
        self.cls_logits = nn.Conv2d(channels, num_classes, 3, padding=1)
        self.bbox_pred = nn.Conv2d(channels, 4, 3, padding=1)
        self.centerness = nn.Conv2d(channels, 1, 3, padding=1)
        self.scales = nn.ModuleList([Scale(1.0) if use_scale else nn.Identity()
                                     for _ in input_shape])
        self._init_weights(prior_prob)

    def _init_weights(self, prior_prob: float) -> None:
        # Offset predictors of deformable convs keep their zero init.
        offsets = {m.offset for m in self.modules() if isinstance(m, DeformConv2d)}
        for module in self.modules():
            if isinstance(module, (nn.Conv2d, DeformConv2d)) and module not in offsets:
                nn.init.normal_(module.weight, std=0.01)
                nn.init.zeros_(module.bias)
        nn.init.constant_(self.cls_logits.bias, -math.log((1 - prior_prob) / prior_prob))

    @classmethod
    def from_config(cls, cfg, input_shape: List[ShapeSpec]):
        fcos = cfg.MODEL.FCOS
        return {
            "input_shape": input_shape,
            "num_classes": fcos.NUM_CLASSES,
            "num_convs": fcos.NUM_CONVS,
            "num_share_convs": fcos.NUM_SHARE_CONVS,
            "norm": fcos.NORM,
            "use_deformable": fcos.USE_DEFORMABLE,
            "prior_prob": fcos.PRIOR_PROB,
            "norm_reg_targets": fcos.NORM_REG_TARGETS,
            "centerness_on_reg": fcos.CENTERNESS_ON_REG,
            "reg_activation": fcos.REG_ACTIVATION,
            "use_scale": fcos.USE_SCALE,
        }

    def forward(self, features: List[Tensor]) -> Tuple[List[Tensor], List[Tensor], List[Tensor]]:
        """features: per level (N, C, Hi, Wi) -> (logits, box regression, centerness)."""
        logits, regression, centerness = [], [], []
        for feature, scale in zip(features, self.scales):
            feature = self.share_tower(feature)
            cls_feature = self.cls_tower(feature)
            box_feature = self.bbox_tower(feature)
            logits.append(self.cls_logits(cls_feature))
            box = scale(self.bbox_pred(box_feature))
            regression.append(REG_ACTIVATION_FUNCTIONS[self.reg_activation](box))
            ctr_feature = box_feature if self.centerness_on_reg else cls_feature
            centerness.append(self.centerness(ctr_feature))
        return logits, regression, centerness
