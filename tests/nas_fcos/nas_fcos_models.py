"""Small NAS-FCOS models for the tests of tests/nas_fcos/ (imported by name)."""
from detectron2.config import get_cfg
from detectron2.modeling import build_model

import fcos_d2


def small_nas_fcos_cfg(**nas_fcos):
    """A ResNet-18 NAS-FCOS at 32 channels on P3-P7; ``nas_fcos``: MODEL.NAS_FCOS keys."""
    cfg = get_cfg()
    fcos_d2.add_fcos_config(cfg)
    cfg.merge_from_file(fcos_d2.get_config_file("NAS-FCOS/Base-NAS-FCOS.yaml"))
    cfg.MODEL.RESNETS.DEPTH = 18
    cfg.MODEL.RESNETS.RES2_OUT_CHANNELS = 64
    cfg.MODEL.NAS_FCOS.CHANNELS = 32
    cfg.MODEL.FCOS.NUM_CLASSES = 3
    cfg.MODEL.DEVICE = "cpu"
    for key, value in nas_fcos.items():
        setattr(cfg.MODEL.NAS_FCOS, key, value)
    return cfg


def small_nas_fcos(**nas_fcos):
    return build_model(small_nas_fcos_cfg(**nas_fcos)).eval()
