"""The FCOS model: backbone builder, head, target assignment, losses, post-processing and
the meta-architecture. Importing it registers the backbone and the meta-architecture."""
from .backbone import build_fcos_resnet_fpn_backbone
from .fold import fold_frozen_batchnorm
from .head import FCOSHead
from .meta_arch import FCOS

__all__ = ["build_fcos_resnet_fpn_backbone", "fold_frozen_batchnorm", "FCOSHead", "FCOS"]
