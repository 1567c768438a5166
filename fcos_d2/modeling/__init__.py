"""The FCOS model: backbone builder, head, target assignment, losses, post-processing, the
meta-architecture and the proposal generator. Importing it
registers the backbone, the meta-architecture "FCOS" and the proposal generator "FCOS"."""
from .backbone import build_fcos_resnet_fpn_backbone
from .head import FCOSHead
from .meta_arch import FCOS
from .proposal_generator import FCOSProposalGenerator

__all__ = ["build_fcos_resnet_fpn_backbone", "FCOSHead", "FCOS", "FCOSProposalGenerator"]
