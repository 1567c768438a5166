"""The NAS-FCOS meta-architecture: FCOS with the searched FPN (the backbone builder
``build_nas_fcos_backbone``) and, when ``MODEL.NAS_FCOS.HEAD_GENOTYPE`` is given, the
searched head; assignment, losses and detections are ``FCOSBase``'s."""
from typing import Dict, List, Optional

from detectron2.layers import ShapeSpec
from detectron2.modeling import META_ARCH_REGISTRY
from torch import nn

from ..head import FCOSHead
from ..meta_arch import FCOS
from .head import NASFCOSHead


@META_ARCH_REGISTRY.register()
class NASFCOS(FCOS):
    """NAS-FCOS (Wang et al., CVPR 2020). Input and output as ``FCOS``."""

    @classmethod
    def build_head(cls, cfg, input_shape: List[ShapeSpec],
                   features: Optional[Dict[str, ShapeSpec]] = None) -> nn.Module:
        """The searched head, or FCOS's head when ``MODEL.NAS_FCOS.HEAD_GENOTYPE`` is []."""
        if not cfg.MODEL.NAS_FCOS.HEAD_GENOTYPE:
            return FCOSHead(cfg, input_shape)
        return NASFCOSHead(cfg, input_shape)
