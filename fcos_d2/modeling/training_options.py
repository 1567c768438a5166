"""``MODEL.FCOS`` keys of FCOS-family training improvements, off by default (the official
FCOS): ATSS-style positives (``atss.py``) and GFL's quality focal loss (``losses.py``).
Added by ``add_fcos_config``; validated by name in ``FCOSBase``.
"""
from detectron2.config import CfgNode as CN

ASSIGNERS = ("fcos", "atss")


def add_training_options_config(fcos: CN) -> None:
    """Adds ASSIGNER, ATSS_TOPK, ATSS_ANCHOR_SCALE and CLS_LOSS to the ``MODEL.FCOS`` node `fcos` in place."""
    # Which locations are an object's positives: "fcos" (official: inside the box, or its
    # center region with CENTER_SAMPLING_RADIUS, and within the level's SIZES_OF_INTEREST
    # range) or "atss" (ATSS, Zhang et al. 2020: per level the ATSS_TOPK locations nearest
    # the box centre are candidates; positive where the IoU of the location's 8-stride
    # square anchor with the box reaches the mean + std of the candidates' IoUs and the
    # location lies inside the box; SIZES_OF_INTEREST and CENTER_SAMPLING_RADIUS unused).
    fcos.ASSIGNER = "fcos"
    # "atss" only: candidates per level and object (ATSS: 9).
    fcos.ATSS_TOPK = 9
    # "atss" only: the side of a location's square anchor, in strides (ATSS: 8). Like
    # SIZES_OF_INTEREST it decides which level an object lands on: with 8, objects of
    # 10-100 px put nearly all their positives on P3; 4 spreads them as the halved ranges do.
    fcos.ATSS_ANCHOR_SCALE = 8.0
    # Classification loss: "focal" (official sigmoid focal loss, FOCAL_LOSS_ALPHA/GAMMA) or
    # "quality_focal" (GFL's quality focal loss, beta 2: a positive's target is the IoU of
    # its predicted box with its box, detached, instead of 1).
    fcos.CLS_LOSS = "focal"
