"""The FAD head: FCOS's predictors on searched towers.

Symbols: N images, L levels, Hi x Wi the size of level i, F the feature channels, K
classes, n nodes a cell. Per level: the box tower (two cells of the box genotype on
(feature, feature)) gives (N, n * F, Hi, Wi), reduced to F by a 1x1 conv: the box feature,
read by ``bbox_pred`` and ``centerness``; the classification tower (cells of the
classification genotype on (box feature, feature)) gives (N, n * F, Hi, Wi), reduced to
F: the classification feature, read by ``cls_logits``. Either tower can be FCOS's plain
one instead (MODEL.FAD.BOX_TOWER / CLS_TOWER False). The output contract is FCOSHead's.
"""
import math
from typing import List, Optional, Tuple

import torch
from detectron2.config import configurable
from detectron2.layers import ShapeSpec, get_norm
from torch import Tensor, nn
from torch.nn import functional as F

from ..layers import Scale
from .cells import DerivedTower
from .config import fad_head_options
from .genotypes import Genotype

_ACTIVATIONS = {"relu": F.relu, "exp": torch.exp, "softplus": F.softplus}


def plain_tower(channels: int, num_convs: int) -> nn.Sequential:
    """FCOS's tower: [3x3 conv -> GN -> ReLU] * num_convs."""
    layers: List[nn.Module] = []
    for _ in range(num_convs):
        layers += [nn.Conv2d(channels, channels, 3, padding=1), get_norm("GN", channels),
                   nn.ReLU()]
    return nn.Sequential(*layers)


def feature_channels(input_shape: List[ShapeSpec]) -> int:
    channels = {s.channels for s in input_shape}
    if len(channels) != 1:
        raise ValueError(f"FAD head needs the same channels on every level, got {channels}")
    return channels.pop()


class FADHeadBase(nn.Module):
    """Predictors, per-level scales and the forward of the FAD heads; subclasses set
    ``box_tower``/``cls_tower`` and implement :meth:`towers`."""

    def __init__(self, *, channels: int, num_levels: int, num_classes: int,
                 box_out_channels: int, cls_out_channels: int, prior_prob: float,
                 reg_activation: str):
        super().__init__()
        if reg_activation not in _ACTIVATIONS:
            raise ValueError(f"MODEL.FCOS.REG_ACTIVATION: unknown '{reg_activation}', "
                             f"expected one of {tuple(_ACTIVATIONS)}")
        self.reg_activation = reg_activation
        # 1x1 reductions of a searched tower's concatenation (identity for a plain tower)
        self.box_reduce = (nn.Conv2d(box_out_channels, channels, 1)
                           if box_out_channels != channels else nn.Identity())
        self.cls_reduce = (nn.Conv2d(cls_out_channels, channels, 1)
                           if cls_out_channels != channels else nn.Identity())
        self.cls_logits = nn.Conv2d(channels, num_classes, 3, padding=1)
        self.bbox_pred = nn.Conv2d(channels, 4, 3, padding=1)
        self.centerness = nn.Conv2d(channels, 1, 3, padding=1)
        self.scales = nn.ModuleList([Scale(1.0) for _ in range(num_levels)])
        for module in (self.cls_reduce, self.cls_logits, self.bbox_pred, self.centerness):
            if isinstance(module, nn.Conv2d):  # as FAD's: normal(0.01) and zero biases
                nn.init.normal_(module.weight, std=0.01)
                nn.init.zeros_(module.bias)
        nn.init.constant_(self.cls_logits.bias, -math.log((1 - prior_prob) / prior_prob))

    def towers(self, feature: Tensor) -> Tuple[Tensor, Tensor]:
        """(box tower output, classification tower output) of one level, before the
        reductions; the classification tower reads the reduced box feature."""
        raise NotImplementedError

    def forward(self, features: List[Tensor]) -> Tuple[List[Tensor], List[Tensor], List[Tensor]]:
        """features: per level (N, F, Hi, Wi) -> (logits, box regression, centerness)."""
        logits, regression, centerness = [], [], []
        activation = _ACTIVATIONS[self.reg_activation]
        for feature, scale in zip(features, self.scales):
            box_feature, cls_feature = self.towers(feature)  # (N, F, Hi, Wi) each
            logits.append(self.cls_logits(cls_feature))
            regression.append(activation(scale(self.bbox_pred(box_feature))))
            centerness.append(self.centerness(box_feature))
        return logits, regression, centerness


class FADHead(FADHeadBase):
    """The searched head of a genotype pair (MODEL.FAD; defaults: the paper's)."""

    @configurable
    def __init__(self, *, input_shape: List[ShapeSpec], num_classes: int, box_genotype:
                 Optional[Genotype], cls_genotype: Optional[Genotype], box_channels: int = 96,
                 cls_channels: int = 96, num_cells_box: int = 2, num_cells_cls: int = 2,
                 num_convs: int = 4, prior_prob: float = 0.01, reg_activation: str = "relu"):
        """A genotype None: FCOS's plain tower of ``num_convs`` convs for that branch."""
        channels = feature_channels(input_shape)
        box = (DerivedTower(box_genotype, channels, box_channels, num_cells_box)
               if box_genotype else plain_tower(channels, num_convs))
        cls = (DerivedTower(cls_genotype, channels, cls_channels, num_cells_cls)
               if cls_genotype else plain_tower(channels, num_convs))
        super().__init__(channels=channels, num_levels=len(input_shape), num_classes=num_classes,
                         box_out_channels=getattr(box, "out_channels", channels),
                         cls_out_channels=getattr(cls, "out_channels", channels),
                         prior_prob=prior_prob, reg_activation=reg_activation)
        self.box_tower, self.cls_tower = box, cls

    @classmethod
    def from_config(cls, cfg, input_shape: List[ShapeSpec]):
        return {"input_shape": input_shape, **fad_head_options(cfg)}

    def towers(self, feature: Tensor) -> Tuple[Tensor, Tensor]:
        if isinstance(self.box_tower, DerivedTower):
            box = self.box_reduce(self.box_tower(feature, feature))
        else:
            box = self.box_tower(feature)
        if isinstance(self.cls_tower, DerivedTower):
            cls = self.cls_reduce(self.cls_tower(box, feature))
        else:
            cls = self.cls_tower(feature)
        return box, cls
