"""``add_sipmask_config``: the ``MODEL.SIPMASK`` node (called by ``add_fcos_config``).

SipMask also reads ``MODEL.FCOS`` (head, assignment, box losses, detections) and needs
``MODEL.MASK_ON True`` (the data mapper then loads ``gt_masks``; the evaluator scores
``segm``). Defaults are SipMask-benchmark's except the four mask options marked
"beyond SipMask" (configs/SipMask/README.md says what each is worth); the official
behaviour is one value away.
"""
from detectron2.config import CfgNode as CN

from ...config import register_config_node


@register_config_node  # add_fcos_config adds it
def add_sipmask_config(cfg: CN) -> None:
    """Adds the ``MODEL.SIPMASK`` node to ``cfg`` in place. Safe to call twice."""
    if "SIPMASK" in cfg.MODEL:
        return
    cfg.MODEL.SIPMASK = _C = CN()
    # Basis masks B; each location predicts 4 x B spatial coefficients, one set per 2 x 2
    # cell of its box.
    _C.NUM_BASIS = 32
    # The basis masks are built from the box-tower outputs of this many finest head levels
    # (SipMask: P3-P5), upsampled to the finest and concatenated.
    _C.BASIS_LEVELS = 3
    # Channels of the 1x1 conv that fuses them (SipMask: 512 for a 256-channel head).
    _C.BASIS_HIDDEN_CHANNELS = 512
    # fcos-d2's option, not SipMask's: a backbone feature finer than the head's first level
    # (e.g. "p2", FPN's stride-4 output when MODEL.FPN.IN_FEATURES has res2) that joins the
    # basis masks' input, the box-tower outputs upsampled to its size; the basis masks then
    # come from its stride instead of stride 8. "": the box towers alone (SipMask).
    _C.BASIS_IN_FEATURE = ""
    # Deformable groups of the feature-alignment conv (offsets from the box distances).
    _C.FEATURE_ALIGN_GROUPS = 4
    # Sampling of the mask loss: NMS at this IoU over the positives' predicted boxes, so
    # that near-duplicate positives of one object count once.
    _C.MASK_SAMPLE_NMS_TH = 0.9
    # Multiplies the mask loss (SipMask: 1).
    _C.MASK_LOSS_WEIGHT = 1.0
    # A pixel belongs to a predicted mask when its probability, resized to the original
    # image, exceeds this (SipMask-benchmark's and SipMask-mmdetection's 0.4).
    _C.MASK_THRESHOLD = 0.4
    # Beyond SipMask: "area" trains each stride-2 cell toward the fraction of it the object
    # covers; "threshold" (SipMask) toward fraction > 0.5, which erases thin strokes.
    _C.MASK_TARGET = "area"
    # Beyond SipMask: an object whose target is all zero though its mask is not: "keep_peak"
    # trains its most-covered cells to 1; "drop" leaves it out of the mask loss; "official"
    # trains it toward an empty mask (SipMask). The count is logged either way.
    _C.EMPTY_TARGETS = "keep_peak"
    # Beyond SipMask: "cell_centre" places a pixel by its centre when cropping to a box;
    # "official" by its left/top edge, which shifts the crop by half a pixel.
    _C.CROP_RULE = "cell_centre"
    # Beyond SipMask: 1 crops the upsampled mask to the box at input pixels; 2 (SipMask)
    # crops at stride 2 before upsampling, which moves box edges by up to a pixel.
    _C.PASTE_STRIDE = 1
    # SipMask++'s re-scoring: a small branch predicts each mask's IoU from the mask and
    # multiplies the detection's score by it. Off: SipMask (SipMask-benchmark) has none.
    _C.MASK_RESCORING = False
    # Multiplies the re-scoring loss (itself 10 x the squared error, as SipMask++).
    _C.MASK_RESCORING_LOSS_WEIGHT = 1.0
    # Beyond SipMask++: "trained" re-scores only detections whose box covers the 100 cells
    # (at stride 2) the branch trains on, leaving smaller ones as scored; "all": SipMask++.
    _C.MASK_RESCORING_SCOPE = "trained"
