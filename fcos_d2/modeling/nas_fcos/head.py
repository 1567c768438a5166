"""The searched NAS-FCOS head, built from any head genotype.

Symbols: N images, L levels, Hi x Wi level sizes, C channels, K foreground classes,
S the share index.

The classification and regression towers apply the genotype's operations in turn, each
tower with its own weights. Layers below S have separate weights per level
(``cls_split[level][j]``); layers from S on are shared by all levels (``cls_shared[j - S]``).
3x3 predictors follow; centerness is predicted from the classification tower, as the
authors' head does, or from the regression tower with ``centerness_on_reg`` (FCOS-imprv's
placement, so that a comparison with FCOS's head can change one thing at a time). Outputs
follow ``FCOSHead``'s contract, so ``FCOSBase`` decodes and trains them unchanged.
"""
import math
from typing import List, Tuple

import torch
from detectron2.config import configurable
from detectron2.layers import ShapeSpec
from torch import Tensor, nn
from torch.nn import functional as F

from ..head import REG_ACTIVATIONS
from ..layers import Scale
from .genotypes import HeadGenotype, parse_head_genotype
from .ops import build_head_op

_ACTIVATION_FUNCTIONS = {"relu": F.relu, "exp": torch.exp, "softplus": F.softplus}


def _tower(ops: Tuple[str, ...], channels: int) -> nn.ModuleList:
    return nn.ModuleList([build_head_op(op, channels) for op in ops])


class NASFCOSHead(nn.Module):
    """Per level i: class logits (N, K, Hi, Wi), box regression (N, 4, Hi, Wi) as
    ``act(scale_i * x)`` (``act`` per ``reg_activation``; exp in pixels for the published
    models), centerness logits (N, 1, Hi, Wi)."""

    @configurable
    def __init__(self, *, input_shape: List[ShapeSpec], num_classes: int,
                 genotype: HeadGenotype, prior_prob: float = 0.01,
                 reg_activation: str = "exp", centerness_on_reg: bool = False):
        super().__init__()
        if reg_activation not in REG_ACTIVATIONS:
            raise ValueError(f"MODEL.FCOS.REG_ACTIVATION: unknown '{reg_activation}', expected "
                             f"one of {REG_ACTIVATIONS}")
        channels = {s.channels for s in input_shape}
        if len(channels) != 1:
            raise ValueError(f"NAS-FCOS head needs the same channels on every level, got "
                             f"{channels}")
        channels = channels.pop()
        self.genotype = genotype
        self.reg_activation = reg_activation
        self.centerness_on_reg = centerness_on_reg
        split, shared = genotype.ops[:genotype.share_index], genotype.ops[genotype.share_index:]
        self.cls_split = nn.ModuleList([_tower(split, channels) for _ in input_shape])
        self.reg_split = nn.ModuleList([_tower(split, channels) for _ in input_shape])
        self.cls_shared = _tower(shared, channels)
        self.reg_shared = _tower(shared, channels)
        self.cls_logits = nn.Conv2d(channels, num_classes, 3, padding=1)
        self.bbox_pred = nn.Conv2d(channels, 4, 3, padding=1)
        self.centerness = nn.Conv2d(channels, 1, 3, padding=1)
        self.scales = nn.ModuleList([Scale(1.0) for _ in input_shape])
        for predictor in (self.cls_logits, self.bbox_pred, self.centerness):
            nn.init.normal_(predictor.weight, std=0.01)
            nn.init.zeros_(predictor.bias)
        nn.init.constant_(self.cls_logits.bias, -math.log((1 - prior_prob) / prior_prob))

    @classmethod
    def from_config(cls, cfg, input_shape: List[ShapeSpec]):
        node, fcos = cfg.MODEL.NAS_FCOS, cfg.MODEL.FCOS
        reg_activation = fcos.REG_ACTIVATION or ("relu" if fcos.NORM_REG_TARGETS else "exp")
        return {
            "input_shape": input_shape,
            "num_classes": fcos.NUM_CLASSES,
            "genotype": parse_head_genotype(node.HEAD_GENOTYPE, node.HEAD_SHARE_INDEX),
            "prior_prob": fcos.PRIOR_PROB,
            "reg_activation": reg_activation,
            "centerness_on_reg": node.CENTERNESS_ON_REG,
        }

    @staticmethod
    def _run(layers: nn.ModuleList, x: Tensor) -> Tensor:
        for layer in layers:
            x = layer(x)
        return x

    def forward(self, features: List[Tensor]) -> Tuple[List[Tensor], List[Tensor], List[Tensor]]:
        """features: per level (N, C, Hi, Wi) -> (logits, box regression, centerness)."""
        if len(features) != len(self.scales):
            raise ValueError(f"NAS-FCOS head built for {len(self.scales)} levels got "
                             f"{len(features)} (MODEL.FCOS.IN_FEATURES)")
        logits, regression, centerness = [], [], []
        for level, feature in enumerate(features):
            cls_out = self._run(self.cls_shared, self._run(self.cls_split[level], feature))
            reg_out = self._run(self.reg_shared, self._run(self.reg_split[level], feature))
            logits.append(self.cls_logits(cls_out))
            centerness.append(self.centerness(reg_out if self.centerness_on_reg else cls_out))
            box = self.scales[level](self.bbox_pred(reg_out))
            regression.append(_ACTIVATION_FUNCTIONS[self.reg_activation](box))
        return logits, regression, centerness
