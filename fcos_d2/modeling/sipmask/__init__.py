"""SipMask (Cao et al., ECCV 2020) on the FCOS core: head, crop-split, mask loss and the
meta-architecture. Importing it registers the meta-architecture "SipMask"."""
from .crop_split import crop_split, crop_to_boxes
from .head import SipMaskHead
from .meta_arch import SipMask

__all__ = ["crop_split", "crop_to_boxes", "SipMaskHead", "SipMask"]
