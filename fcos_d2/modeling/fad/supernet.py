"""The FAD supernet's head: search towers whose edges mix every candidate operation with
the softmax of the architecture weights.

Symbols as in ``head.py``; P = len(PRIMITIVES). The architecture weights ``alphas_box[i]``
and ``alphas_cls[i]`` are (i + 2, P) per node i, initialised to 1e-3 * N(0, 1) as in DARTS.
They are parameters of the head, but no weight optimizer may hold them: take the two sets
apart with :func:`architecture_parameters` and :func:`weight_parameters`.
"""
from typing import Dict, List, Tuple

import torch
from detectron2.config import configurable
from detectron2.layers import ShapeSpec
from torch import Tensor, nn
from torch.nn import functional as F

from .cells import SearchTower, derive_genotype
from .config import head_common_options, search_nodes, search_options
from .genotypes import PRIMITIVES, Genotype
from .head import FADHeadBase, feature_channels


def _alphas(num_nodes: int) -> nn.ParameterList:
    return nn.ParameterList([nn.Parameter(1e-3 * torch.randn(i + 2, len(PRIMITIVES)))
                             for i in range(num_nodes)])


class FADSearchHead(FADHeadBase):
    """Box tower first, then the classification tower on (box feature, feature), both
    searched and shared over the levels."""

    @configurable
    def __init__(self, *, input_shape: List[ShapeSpec], num_classes: int, box_channels: int = 96,
                 cls_channels: int = 96, box_nodes: int = 3, cls_nodes: int = 3,
                 num_cells: int = 1, repshare: bool = True, prior_prob: float = 0.01,
                 reg_activation: str = "relu"):
        channels = feature_channels(input_shape)
        box = SearchTower(channels, box_channels, box_nodes, num_cells, repshare)
        cls = SearchTower(channels, cls_channels, cls_nodes, num_cells, repshare)
        super().__init__(channels=channels, num_levels=len(input_shape), num_classes=num_classes,
                         box_out_channels=box.out_channels, cls_out_channels=cls.out_channels,
                         prior_prob=prior_prob, reg_activation=reg_activation)
        self.box_tower, self.cls_tower = box, cls
        self.alphas_box, self.alphas_cls = _alphas(box_nodes), _alphas(cls_nodes)

    @classmethod
    def from_config(cls, cfg, input_shape: List[ShapeSpec]):
        head, search = head_common_options(cfg), search_options(cfg)
        return {"input_shape": input_shape, "num_classes": head["num_classes"],
                "box_channels": head["box_channels"], "cls_channels": head["cls_channels"],
                **search_nodes(cfg), "num_cells": search["num_cells"],
                "repshare": search["repshare"], "prior_prob": head["prior_prob"],
                "reg_activation": head["reg_activation"]}

    def mixing_weights(self) -> Dict[str, List[Tensor]]:
        """The softmax of the architecture weights over the operations, per tower and node."""
        return {"box": [F.softmax(a, dim=-1) for a in self.alphas_box],
                "cls": [F.softmax(a, dim=-1) for a in self.alphas_cls]}

    def genotypes(self) -> Tuple[Genotype, Genotype]:
        """The (box, classification) genotypes derived from the current weights."""
        with torch.no_grad():
            weights = self.mixing_weights()
        return derive_genotype(weights["box"]), derive_genotype(weights["cls"])

    def towers(self, feature: Tensor) -> Tuple[Tensor, Tensor]:
        weights = self.mixing_weights()
        box = self.box_reduce(self.box_tower(feature, feature, weights["box"]))
        cls = self.cls_reduce(self.cls_tower(box, feature, weights["cls"]))
        return box, cls


def architecture_parameters(model: nn.Module) -> List[nn.Parameter]:
    """The architecture weights of every :class:`FADSearchHead` in ``model``."""
    return [p for m in model.modules() if isinstance(m, FADSearchHead)
            for p in (*m.alphas_box, *m.alphas_cls)]


def weight_parameters(model: nn.Module) -> List[nn.Parameter]:
    """Every trainable parameter of ``model`` but the architecture weights."""
    alphas = {id(p) for p in architecture_parameters(model)}
    return [p for p in model.parameters() if p.requires_grad and id(p) not in alphas]
