"""fcos-d2: FCOS as a detectron2 extension. Importing this package registers FCOS."""
# compat first: it makes detectron2 v0.6 importable without its C++ extension.
from . import compat  # noqa: F401  (side effect: detectron2 compatibility)
from .config import add_fcos_config, get_config_file

# Side effects: register the backbone builder, the FCOS meta-architecture and the FCOS
# proposal generator.
from .modeling import (FCOS, FCOSHead, FCOSProposalGenerator, FCOSWithTTA,  # noqa: E402
                       build_fcos_resnet_fpn_backbone, fold_frozen_batchnorm)

# Side effects: the members of the family register their META_ARCHs, config nodes
# (add_fcos_config adds them) and checkpoint layouts. The core imports none of them.
from .modeling import fad, labelenc, nas_fcos, sipmask  # noqa: E402,F401

from .export import Predictor  # noqa: E402
from . import model_zoo  # noqa: E402,F401  (fcos_d2.model_zoo.get(name), fcos-d2://NAME)

# Side effect: registers the built-in datasets synthetic_shapes_{train,val} (generated on
# first use, not at import).
from . import data  # noqa: E402,F401

__version__ = "0.1.0"
__all__ = ["add_fcos_config", "get_config_file", "build_fcos_resnet_fpn_backbone", "FCOS",
           "FCOSHead", "FCOSProposalGenerator", "FCOSWithTTA", "Predictor",
           "fold_frozen_batchnorm", "model_zoo"]
