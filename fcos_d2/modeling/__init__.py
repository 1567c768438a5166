"""The FCOS model: backbone builder, head, target assignment, losses, post-processing, the
meta-architecture, the proposal generator and test-time augmentation. Importing it
registers the backbone, the meta-architectures "FCOS" and "SipMask" (``sipmask/``) and the
proposal generator "FCOS"."""
from .backbone import build_fcos_resnet_fpn_backbone
from .fold import fold_frozen_batchnorm
from .head import FCOSHead
from .meta_arch import FCOS
from .proposal_generator import FCOSProposalGenerator
from .sipmask import SipMask, SipMaskHead
from .test_time_augmentation import FCOSWithTTA

__all__ = ["build_fcos_resnet_fpn_backbone", "fold_frozen_batchnorm", "FCOSHead", "FCOS",
           "FCOSProposalGenerator", "FCOSWithTTA", "SipMask", "SipMaskHead"]
