"""fcos-d2: FCOS as a detectron2 extension. Importing this package registers FCOS."""
# compat first: it makes detectron2 v0.6 importable without its C++ extension.
from . import compat  # noqa: F401  (side effect: detectron2 compatibility)
from .config import add_fcos_config

# Side effects: register the backbone builder and the FCOS meta-architecture.
from .modeling import (FCOS, FCOSHead, build_fcos_resnet_fpn_backbone,  # noqa: E402
                       fold_frozen_batchnorm)

# Side effect: registers the built-in datasets synthetic_shapes_{train,val} (generated on
# first use, not at import).
from . import data  # noqa: E402,F401

__version__ = "0.1.0"
__all__ = ["add_fcos_config", "build_fcos_resnet_fpn_backbone", "FCOS", "FCOSHead",
           "fold_frozen_batchnorm"]
