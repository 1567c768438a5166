"""NAS-FCOS (Wang et al., CVPR 2020) on the FCOS core: genotypes, the searched FPN and
head, the MobileNetV2 bottom-up, the checkpoint layouts and the search
(``python -m fcos_d2.modeling.nas_fcos.search``). Importing it registers the backbone
builder "build_nas_fcos_backbone", the meta-architecture "NASFCOS", the ``MODEL.NAS_FCOS``
node, the NAS-FCOS checkpoint layouts and the model-zoo entries "NAS-FCOS/..."."""
from . import config  # noqa: F401  (side effect: registers MODEL.NAS_FCOS)
from . import checkpoint, checkpoint_mmdet  # noqa: F401  (side effect: their layouts)
from . import model_zoo  # noqa: F401  (side effect: fcos-d2://NAS-FCOS/... entries)
from .fpn import NASFCOSFPN, build_nas_fcos_backbone  # registers the backbone builder
from .genotypes import (PUBLISHED_FPN, PUBLISHED_HEAD, FPNCell, FPNGenotype, GenotypeError,
                        HeadGenotype)
from .head import NASFCOSHead
from .meta_arch import NASFCOS  # registers the META_ARCH

__all__ = ["NASFCOSFPN", "build_nas_fcos_backbone", "PUBLISHED_FPN", "PUBLISHED_HEAD",
           "FPNCell", "FPNGenotype", "GenotypeError", "HeadGenotype", "NASFCOSHead", "NASFCOS"]
