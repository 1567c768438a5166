"""SipMask (Cao et al., ECCV 2020) on the FCOS core: head, crop-split, mask loss and the
meta-architecture. Importing it registers the meta-architecture "SipMask", the
``MODEL.SIPMASK`` node and the SipMask-benchmark checkpoint layout."""
from . import config  # noqa: F401  (side effect: registers MODEL.SIPMASK)
from .checkpoint import convert_sipmask_key, convert_sipmask_state_dict  # registers the layout
from .crop_split import crop_split, crop_to_boxes
from .head import SipMaskHead
from .meta_arch import SipMask

__all__ = ["convert_sipmask_key", "convert_sipmask_state_dict", "crop_split", "crop_to_boxes",
           "SipMaskHead", "SipMask"]
