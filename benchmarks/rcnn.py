"""detectron2's two-stage R-CNN on a benchmark's ResNet trunk, shared by the benchmarks that
compare against it: Faster R-CNN in ``benchmarks.train_quality`` and Mask R-CNN in
``benchmarks.masks``.

``faster_rcnn_overrides`` gives the config keys that turn a base config (an FCOS recipe:
ResNet trunk, FPN from res3) into detectron2's GeneralizedRCNN with an RPN and
StandardROIHeads, as detectron2's Base-RCNN-FPN.yaml configures them, on the same trunk:
FPN P2 up to the trunk's deepest stage, plus a max-pooled level for the RPN.
``build_resnet_trunk_fpn_backbone`` is that FPN for any deepest stage (registered in
detectron2's BACKBONE_REGISTRY by ``register_trunk_fpn_backbone``).
"""
from typing import List

BACKBONE_NAME = "build_resnet_trunk_fpn_backbone"
STAGES = ["res2", "res3", "res4", "res5"]


def faster_rcnn_overrides(trunk_stages: List[str], num_classes: int) -> List:
    """The keys that turn the base config into Faster R-CNN with FPN on the same ResNet trunk.

    Args:
        trunk_stages: the base config's ``MODEL.RESNETS.OUT_FEATURES``; the R-CNN's FPN
            takes res2 up to the deepest of them.
        num_classes: foreground classes (``MODEL.ROI_HEADS.NUM_CLASSES``).
    """
    stages = STAGES[:max(STAGES.index(s) for s in trunk_stages) + 1]
    levels = [f"p{int(s[-1])}" for s in stages]  # p2 ... from res2 ...
    rpn_levels = levels + [f"p{int(levels[-1][1:]) + 1}"]  # + the max-pooled top level
    return [
        "MODEL.META_ARCHITECTURE", "GeneralizedRCNN",
        "MODEL.MASK_ON", False,
        "MODEL.BACKBONE.NAME", BACKBONE_NAME,
        "MODEL.RESNETS.OUT_FEATURES", stages,
        "MODEL.FPN.IN_FEATURES", stages,
        # one size a level, from 16 px on P2 (detectron2's 32-512 suit 800-px images), and
        # detectron2's three aspect ratios
        "MODEL.ANCHOR_GENERATOR.SIZES", [[16 * 2 ** i] for i in range(len(rpn_levels))],
        "MODEL.ANCHOR_GENERATOR.ASPECT_RATIOS", [[0.5, 1.0, 2.0]],
        "MODEL.PROPOSAL_GENERATOR.NAME", "RPN",
        "MODEL.RPN.IN_FEATURES", rpn_levels,
        # detectron2's Base-RCNN-FPN.yaml: per level before NMS, in all after it
        "MODEL.RPN.PRE_NMS_TOPK_TRAIN", 2000, "MODEL.RPN.PRE_NMS_TOPK_TEST", 1000,
        "MODEL.RPN.POST_NMS_TOPK_TRAIN", 1000, "MODEL.RPN.POST_NMS_TOPK_TEST", 1000,
        "MODEL.ROI_HEADS.NAME", "StandardROIHeads",
        "MODEL.ROI_HEADS.IN_FEATURES", levels,
        "MODEL.ROI_HEADS.NUM_CLASSES", num_classes,
        # 128 sampled proposals per image, not 512: at most 6-10 objects per image, and 512
        # made the box head's FC layers most of a training step's time
        "MODEL.ROI_HEADS.BATCH_SIZE_PER_IMAGE", 128,
        "MODEL.ROI_BOX_HEAD.NAME", "FastRCNNConvFCHead",
        "MODEL.ROI_BOX_HEAD.NUM_FC", 2,
        "MODEL.ROI_BOX_HEAD.POOLER_RESOLUTION", 7,
    ]


def build_resnet_trunk_fpn_backbone(cfg, input_shape):
    """detectron2's ``build_resnet_fpn_backbone`` for any last stage: FPN over
    ``MODEL.FPN.IN_FEATURES`` and a max-pooled level above the last (detectron2's builder
    pools P5 only, so it needs res5)."""
    from detectron2.modeling.backbone import FPN, build_resnet_backbone
    from detectron2.modeling.backbone.fpn import LastLevelMaxPool

    top_block = LastLevelMaxPool()
    top_block.in_feature = f"p{cfg.MODEL.FPN.IN_FEATURES[-1][-1]}"  # res4 -> p4
    return FPN(bottom_up=build_resnet_backbone(cfg, input_shape),
               in_features=cfg.MODEL.FPN.IN_FEATURES, out_channels=cfg.MODEL.FPN.OUT_CHANNELS,
               norm=cfg.MODEL.FPN.NORM, top_block=top_block, fuse_type=cfg.MODEL.FPN.FUSE_TYPE)


def register_trunk_fpn_backbone() -> None:
    """Registers ``build_resnet_trunk_fpn_backbone`` in detectron2's BACKBONE_REGISTRY (once)."""
    import fcos_d2  # noqa: F401  (before detectron2)
    from detectron2.modeling import BACKBONE_REGISTRY

    if BACKBONE_NAME not in BACKBONE_REGISTRY:
        BACKBONE_REGISTRY.register(build_resnet_trunk_fpn_backbone)
