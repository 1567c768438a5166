"""FAD's meta-architectures: FCOS (backbone, FCOS-imprv assignment and losses, detections,
all ``FCOS``'s) with FAD's heads, chosen through ``FCOSBase.build_head``.

* "FAD": the searched head of a genotype pair (``head.FADHead``), trained and evaluated
  by train_net.py like any FCOS;
* "FADSearch": the supernet (``supernet.FADSearchHead``), trained by
  ``python -m fcos_d2.modeling.fad.search``.
"""
from typing import Dict, List, Optional, Tuple

from detectron2.layers import ShapeSpec
from detectron2.modeling import META_ARCH_REGISTRY
from torch import nn

from ..meta_arch import FCOS
from .genotypes import Genotype
from .head import FADHead
from .supernet import FADSearchHead


@META_ARCH_REGISTRY.register()
class FAD(FCOS):
    """FCOS with FAD's searched head (MODEL.FAD: genotypes, cells, channels)."""

    @classmethod
    def build_head(cls, cfg, input_shape: List[ShapeSpec],
                   features: Optional[Dict[str, ShapeSpec]] = None) -> nn.Module:
        return FADHead(cfg, input_shape)


@META_ARCH_REGISTRY.register()
class FADSearch(FCOS):
    """FCOS with FAD's supernet head; its architecture weights are ``head.alphas_*``."""

    @classmethod
    def build_head(cls, cfg, input_shape: List[ShapeSpec],
                   features: Optional[Dict[str, ShapeSpec]] = None) -> nn.Module:
        return FADSearchHead(cfg, input_shape)

    def genotypes(self) -> Tuple[Genotype, Genotype]:
        """The (box, classification) genotypes the architecture weights derive now."""
        return self.head.genotypes()
