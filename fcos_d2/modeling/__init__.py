"""The FCOS model: backbone builder, head, target assignment, losses, post-processing, the
meta-architecture, the proposal generator and test-time augmentation. Importing it
registers the backbone, the meta-architecture "FCOS" and the proposal generator "FCOS".

The members of the family are subpackages (``fcos_d2.modeling.<member>``) that the core
never imports: ``fcos_d2/__init__.py`` imports them, and they register themselves."""
from .backbone import build_fcos_resnet_fpn_backbone
from .fast_inference import inference_model
from .fold import fold_batchnorm, fold_frozen_batchnorm
from .head import FCOSHead
from .meta_arch import FCOS
from .proposal_generator import FCOSProposalGenerator
from .test_time_augmentation import FCOSWithTTA

__all__ = ["build_fcos_resnet_fpn_backbone", "fold_batchnorm", "fold_frozen_batchnorm",
           "inference_model", "FCOSHead", "FCOS", "FCOSProposalGenerator", "FCOSWithTTA"]
