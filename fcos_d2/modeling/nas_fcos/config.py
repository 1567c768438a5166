"""``add_nas_fcos_config``: the ``MODEL.NAS_FCOS`` node (called by ``add_fcos_config``).

NAS-FCOS also reads ``MODEL.FCOS`` (assignment, losses, detections; the published models
use the original FCOS formulation there) and ``MODEL.RESNETS`` for a ResNet bottom-up.
Defaults are the published genotype (``genotypes.PUBLISHED_FPN`` / ``PUBLISHED_HEAD``).
"""
from detectron2.config import CfgNode as CN

from ...config import register_config_node
from .genotypes import PUBLISHED_FPN, PUBLISHED_HEAD


@register_config_node  # add_fcos_config adds it
def add_nas_fcos_config(cfg: CN) -> None:
    """Adds the ``MODEL.NAS_FCOS`` node to ``cfg`` in place. Safe to call twice."""
    if "NAS_FCOS" in cfg.MODEL:
        return
    cfg.MODEL.NAS_FCOS = _C = CN()
    # The bottom-up network: "resnet" (detectron2's ResNet/ResNeXt, MODEL.RESNETS) or
    # "mobilenet_v2" (torchvision's, blocks 3/6/13/17, trainable BN, weights from
    # MODEL.WEIGHTS only).
    _C.BOTTOM_UP = "resnet"
    # Its four features, fine to coarse, that the FPN adapts (C2-C5: pool indices 0-3).
    _C.IN_FEATURES = ["res2", "res3", "res4", "res5"]
    # Width of the FPN (the adapters, every cell and P3-P7) and so of the head.
    _C.CHANNELS = 256
    # The FPN's cells, each [input index, input index, operation, operation, aggregation]:
    # indices into the pool (0-3: C2-C5, 4 + i: cell i's output); operations of
    # genotypes.FPN_OPS; aggregation "psum" or "cat". At least 3 cell outputs must be read
    # by no later cell (they make P5, P4, P3). Default: the published genotype.
    _C.FPN_GENOTYPE = PUBLISHED_FPN.to_config()
    # The head's layers, operations of genotypes.HEAD_OPS, applied in both towers; [] for
    # FCOS's own head (MODEL.FCOS.NUM_CONVS, NORM: the published "FPN only" models).
    _C.HEAD_GENOTYPE = list(PUBLISHED_HEAD.ops)
    # Layers of HEAD_GENOTYPE below this index have separate weights per level; the rest
    # are shared by all levels (published: 0, all shared).
    _C.HEAD_SHARE_INDEX = PUBLISHED_HEAD.share_index
    # Predict centerness from the searched head's regression tower (FCOS-imprv's place)
    # instead of its classification tower (the authors'); lets a row change one thing.
    _C.CENTERNESS_ON_REG = False
