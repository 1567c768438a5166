"""The mask AP cap of SipMask's mask pipeline: what a perfect predictor gets through
fcos-d2's own target making, crop and paste (``tools/mask_resolution_bound.py`` prints it).

Symbols: M objects of one image, H x W the input image (the original size here), Hm x Wm
the basis-mask map (the padded input at stride 2).

The perfect predictor has each object's ground-truth box and, as its mask, the best map
the pipeline can express: the training target itself (``masks.mask_targets``). Inside the
box (the loss's crop) the cross-entropy's optimum is exactly the target; outside, the loss
sets nothing and the map is free, so the target there too (what the paste's crop keeps
of it depends on the paste stride). It is made as the model makes masks: one basis mask
per object holding the target's logits, coefficients that pick it in all four quadrants,
then the real ``paste_mask_probabilities`` and ``resize_and_threshold``. With
``basis_stride`` 4 or 8 the map must be a bilinear upsampling of a map at that stride (the
basis masks' source: P2 or SipMask's P3), fitted to the target by Adam (an upper bound for
a combination of shared basis masks).

The cap is the oracle mask AP: the mean over COCO's IoU thresholds 0.50:0.95 of the
fraction of objects whose mask reaches it (COCO's AP when each object has one detection
and the scores rank the masks by IoU, up to COCO's 101-point recall sampling).
"""
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import torch
from detectron2.structures import BitMasks
from torch import Tensor
from torch.nn import functional as F

from .crop_split import CROP_RULES
from .masks import (EMPTY_TARGET_RULES, MASK_STRIDE, MASK_TARGETS, PASTE_STRIDES, mask_targets,
                    paste_mask_probabilities, resize_and_threshold)

SIZE_BINS = ((0, 16), (16, 32), (32, 64), (64, float("inf")), (0, float("inf")))
SIZE_LABELS = ("< 16 px", "16-32 px", "32-64 px", "> 64 px", "all")
IOU_THRESHOLDS = torch.arange(0.5, 0.951, 0.05)  # COCO's ten
PROBABILITY_CLAMP = 1e-6  # targets 0 and 1 become finite logits


@dataclass(frozen=True)
class PipelineSettings:
    """The ``MODEL.SIPMASK`` options that decide the cap, SipMask's by default, and how far
    the perfect boxes are shifted (``box_shift`` pixels added to every edge)."""
    mask_target: str = "threshold"
    empty_targets: str = "official"
    crop_rule: str = "official"
    paste_stride: int = MASK_STRIDE
    mask_threshold: float = 0.4
    basis_stride: int = MASK_STRIDE
    box_shift: float = 0.0

    def __post_init__(self):
        for key, value, allowed in (("MASK_TARGET", self.mask_target, MASK_TARGETS),
                                    ("EMPTY_TARGETS", self.empty_targets,
                                     tuple(r for r in EMPTY_TARGET_RULES if r != "drop")),
                                    ("CROP_RULE", self.crop_rule, CROP_RULES),
                                    ("PASTE_STRIDE", self.paste_stride, PASTE_STRIDES),
                                    ("basis stride", self.basis_stride, (2, 4, 8))):
            if value not in allowed:  # "drop": a dropped object's mask is not trained at all
                raise ValueError(f"mask cap: {key} {value!r} is not one of {allowed}")


def image_targets(masks: Tensor, basis_size: Tuple[int, int],
                  settings: PipelineSettings) -> Tensor:
    """(M, H, W) bool masks -> (M, Hm, Wm) their training targets."""
    targets, _ = mask_targets(BitMasks(masks), tuple(masks.shape[1:]), basis_size,
                              target=settings.mask_target, empty_rule=settings.empty_targets)
    return targets


def fit_coarse_logits(targets: Tensor, factor: int, *, steps: int = 100,
                      lr: float = 0.5) -> Tensor:
    """(M, Hm, Wm) targets -> (M, Hm, Wm) logits: the bilinear x``factor`` upsampling of a
    free map at 1 / ``factor`` of the size, fitted by Adam to the targets (cross-entropy
    over the whole map)."""
    num, height, width = targets.shape
    if height % factor or width % factor:
        raise ValueError(f"mask cap: basis map {height} x {width} is not a multiple of {factor}")
    grid = torch.zeros(num, 1, height // factor, width // factor, requires_grad=True)
    optimizer = torch.optim.Adam([grid], lr=lr)
    for _ in range(steps):
        up = F.interpolate(grid, scale_factor=factor, mode="bilinear", align_corners=False)
        loss = F.binary_cross_entropy_with_logits(up[:, 0], targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        return F.interpolate(grid, scale_factor=factor, mode="bilinear",
                             align_corners=False)[:, 0]


def perfect_predictor(targets: Tensor) -> Tuple[Tensor, Tensor]:
    """(M, Hm, Wm) targets (probabilities) -> ((M, Hm, Wm) basis logits, (M, 4 * M)
    coefficients): basis mask m is object m's logit map; object m's coefficients pick it
    in each quadrant."""
    clamped = targets.clamp(PROBABILITY_CLAMP, 1 - PROBABILITY_CLAMP)
    basis = torch.log(clamped) - torch.log1p(-clamped)
    return basis, torch.eye(len(targets)).repeat(1, 4)


def perfect_masks(basis: Tensor, coefficients: Tensor, boxes: Tensor,
                  image_size: Tuple[int, int], settings: PipelineSettings) -> Tensor:
    """The real paste and threshold of the perfect predictor -> (M, H, W) bool."""
    probs = paste_mask_probabilities(basis, coefficients, boxes, image_size,
                                     cell_centre=settings.crop_rule == "cell_centre",
                                     paste_stride=settings.paste_stride)
    return resize_and_threshold(probs, image_size, settings.mask_threshold)


def mask_iou(pred: Tensor, truth: Tensor) -> Tensor:
    """(M, H, W) bool pairs -> (M,) IoU (0 where both are empty)."""
    inter = (pred & truth).flatten(1).sum(1).float()
    union = (pred | truth).flatten(1).sum(1).float()
    return inter / union.clamp(min=1)


def oracle_ap(ious: Tensor) -> float:
    """Mean over the COCO IoU thresholds of the fraction of (M,) IoUs reaching each, x100."""
    if not len(ious):
        return float("nan")
    return (ious[:, None] >= IOU_THRESHOLDS[None]).float().mean().item() * 100


def caps_by_size(ious: Tensor, sides: Tensor) -> Dict[str, Tuple[int, float]]:
    """{size label: (objects, oracle AP)} over ``SIZE_BINS`` of the boxes' longer sides."""
    caps = {}
    for label, (low, high) in zip(SIZE_LABELS, SIZE_BINS):
        keep = (sides >= low) & (sides < high)
        caps[label] = (int(keep.sum()), oracle_ap(ious[keep]))
    return caps


def pipeline_masks(images: Sequence[Tuple[Tensor, Tensor]], settings: PipelineSettings, *,
                   size_divisibility: int = 32, fit_steps: int = 100) -> List[Tensor]:
    """Per image of ``images`` ((M, H, W) bool masks and (M, 4) XYXY boxes in input pixels,
    the input at its original size), the perfect predictor's (M, H, W) bool masks, its
    boxes shifted by ``settings.box_shift``."""
    factor = settings.basis_stride // MASK_STRIDE
    pasted = []
    for masks, boxes in images:
        height, width = masks.shape[1:]
        basis_size = tuple(-(-s // size_divisibility) * size_divisibility // MASK_STRIDE
                           for s in (height, width))
        targets = image_targets(masks, basis_size, settings)
        basis, coefficients = perfect_predictor(targets)
        if factor > 1 and len(targets):
            basis = fit_coarse_logits(targets, factor, steps=fit_steps)
        pasted.append(perfect_masks(basis, coefficients, boxes + settings.box_shift,
                                    (height, width), settings))
    return pasted


def empty_target_flags(images: Sequence[Tuple[Tensor, Tensor]], *,
                       size_divisibility: int = 32) -> Tensor:
    """Per object of ``images``, whether SipMask's "threshold" target is all zero though its
    mask is not (``masks.mask_targets``) -> (sum M,) bool."""
    flags = []
    for masks, _ in images:
        basis_size = tuple(-(-s // size_divisibility) * size_divisibility // MASK_STRIDE
                           for s in masks.shape[1:])
        flags.append(mask_targets(BitMasks(masks), tuple(masks.shape[1:]), basis_size)[1])
    return torch.cat(flags) if flags else torch.zeros(0, dtype=torch.bool)


def pipeline_ious(images: Sequence[Tuple[Tensor, Tensor]], settings: PipelineSettings,
                  **kwargs) -> Tensor:
    """Per object of ``images``, the IoU of the perfect predictor's mask with the truth ->
    (sum M,); ``kwargs``: those of ``pipeline_masks``."""
    ious = [mask_iou(pasted, masks.bool()) for pasted, (masks, _) in
            zip(pipeline_masks(images, settings, **kwargs), images)]
    return torch.cat(ious) if ious else torch.zeros(0)
