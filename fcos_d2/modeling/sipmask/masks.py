"""SipMask's instance masks from basis masks and spatial coefficients, the ground-truth
masks at the basis-mask resolution, and the pasting of predicted masks into the image.

Symbols: B basis masks of Hm x Wm pixels (the padded input at stride ``MASK_STRIDE``),
P instances, M ground-truth objects, D detections, H x W the input image (unpadded),
H0 x W0 the original image.

Beyond SipMask (each an option of ``MODEL.SIPMASK``, SipMask's behaviour kept): targets
that keep each cell's covered fraction ("area") instead of the fraction > 0.5; a rule for
objects whose thresholded target is empty; the crop at stride 1 after the upsampling
instead of at stride 2 before it (``paste_stride``); the cell-centre crop rule.
"""
from typing import Tuple, Union

import torch
from detectron2.structures import BitMasks, PolygonMasks
from torch import Tensor
from torch.nn import functional as F

from .crop_split import box_inside_masks, crop_split

MASK_STRIDE = 2  # the basis masks' stride in input pixels
MASK_TARGETS = ("threshold", "area")  # MODEL.SIPMASK.MASK_TARGET's values
EMPTY_TARGET_RULES = ("official", "keep_peak", "drop")  # MODEL.SIPMASK.EMPTY_TARGETS'
PASTE_STRIDES = (2, 1)  # MODEL.SIPMASK.PASTE_STRIDE's values


def quadrant_logits(basis: Tensor, coefficients: Tensor) -> Tensor:
    """(B, Hm, Wm) basis masks and (P, 4 * B) coefficients -> (P, 4, Hm, Wm): per
    instance and quadrant, the coefficients' linear combination of the basis masks."""
    num_basis = basis.shape[0]
    weights = coefficients.reshape(-1, 4, num_basis)  # (P, 4, B)
    return torch.einsum("pqb,bhw->pqhw", weights, basis)


def instance_mask_logits(basis: Tensor, coefficients: Tensor, boxes: Tensor, *,
                         cell_centre: bool = False) -> Tensor:
    """Crop-split of the quadrant logits to (P, 4) boxes in basis-mask pixels -> (P, Hm, Wm)
    logits, zero outside the boxes (where only the inside counts)."""
    return crop_split(quadrant_logits(basis, coefficients), boxes, cell_centre=cell_centre)


def gt_masks_at_basis_size(gt_masks: Union[BitMasks, PolygonMasks], image_size: Tuple[int, int],
                           basis_size: Tuple[int, int], *, target: str = "threshold") -> Tensor:
    """Ground-truth masks (at the input image size) -> (M, Hm, Wm) float in [0, 1]. As
    SipMask-benchmark makes them (``target`` "threshold"): bilinear to half size (2 x 2
    means), placed at the top-left of a zero map of the basis masks' size, then > 0.5 (0/1).
    ``target`` "area": the 2 x 2 means themselves, the fraction of each cell the object
    covers (a thin or small object keeps a non-zero target; the cross-entropy's optimum is
    then the covered fraction).

    Args:
        gt_masks: detectron2 BitMasks (M, H, W) or PolygonMasks in input pixels.
        image_size: (H, W) of the input image (unpadded).
        basis_size: (Hm, Wm).
        target: one of ``MASK_TARGETS``.
    """
    if target not in MASK_TARGETS:
        raise ValueError(f"MODEL.SIPMASK.MASK_TARGET: {target!r} is not one of {MASK_TARGETS}")
    if isinstance(gt_masks, PolygonMasks):
        gt_masks = BitMasks.from_polygon_masks(gt_masks, *image_size)
    if not isinstance(gt_masks, BitMasks):
        raise TypeError(f"instances.gt_masks: expected detectron2 BitMasks or PolygonMasks, got "
                        f"{type(gt_masks).__name__}")
    masks = gt_masks.tensor.float()  # (M, H, W)
    out = masks.new_zeros((len(masks), *basis_size))
    if len(masks) == 0:
        return out
    if target == "area":
        small = F.avg_pool2d(masks[None], MASK_STRIDE)[0]  # (M, H // 2, W // 2)
    else:
        small = F.interpolate(masks[None], scale_factor=1 / MASK_STRIDE, mode="bilinear",
                              align_corners=False)[0]  # (M, H / 2, W / 2)
    h, w = min(small.shape[1], basis_size[0]), min(small.shape[2], basis_size[1])
    out[:, :h, :w] = small[:, :h, :w]
    return out if target == "area" else (out > 0.5).float()


def keep_peak_cells(targets: Tensor, gt_masks: Union[BitMasks, PolygonMasks],
                    image_size: Tuple[int, int]) -> Tuple[Tensor, Tensor]:
    """Rescues the objects of (M, Hm, Wm) targets that no cell covers by more than half,
    though their mask is not empty: the "threshold" target of such an object is all zero (a
    one-pixel stroke covers half of each 2 x 2 cell at most), and its "area" target pastes
    below the 0.4 threshold. Their cells of the highest covered fraction (the stroke's
    cells for a one-pixel stroke) become 1, the others stay -> (targets, (M,) bool: the
    objects rescued)."""
    if isinstance(gt_masks, PolygonMasks):
        gt_masks = BitMasks.from_polygon_masks(gt_masks, *image_size)
    fractions = gt_masks_at_basis_size(gt_masks, image_size, targets.shape[-2:],
                                       target="area").to(targets.device)  # (M, Hm, Wm)
    peak = fractions.flatten(1).max(dim=1).values if len(fractions) else fractions.new_zeros(0)
    empty = (peak > 0) & (peak <= 0.5)  # (M,)
    if not empty.any():
        return targets, empty
    at_peak = (fractions == peak[:, None, None]) & empty[:, None, None]
    return torch.where(at_peak, torch.ones_like(targets), targets), empty


def mask_targets(gt_masks: Union[BitMasks, PolygonMasks], image_size: Tuple[int, int],
                 basis_size: Tuple[int, int], *, target: str = "threshold",
                 empty_rule: str = "official") -> Tuple[Tensor, Tensor]:
    """The training targets of one image's M objects -> ((M, Hm, Wm) targets, (M,) bool:
    the objects that no cell covers by more than half, though their mask is not empty: the
    "threshold" target makes them all zero).

    ``empty_rule`` "official" (SipMask) and "drop" leave the targets as made (the caller
    drops the flagged objects' positives with "drop"); "keep_peak" gives them their peak
    cells (``keep_peak_cells``)."""
    if empty_rule not in EMPTY_TARGET_RULES:
        raise ValueError(f"MODEL.SIPMASK.EMPTY_TARGETS: {empty_rule!r} is not one of "
                         f"{EMPTY_TARGET_RULES}")
    targets = gt_masks_at_basis_size(gt_masks, image_size, basis_size, target=target)
    fixed, empty = keep_peak_cells(targets, gt_masks, image_size)
    return (fixed if empty_rule == "keep_peak" else targets), empty


def paste_quadrant_probabilities(quadrant_probs: Tensor, boxes: Tensor,
                                 image_size: Tuple[int, int], *, cell_centre: bool = False,
                                 paste_stride: int = MASK_STRIDE) -> Tensor:
    """(D, 4, Hm, Wm) quadrant probabilities and (D, 4) boxes (input pixels) -> (D, H, W)
    mask probabilities at the input resolution, cut to the unpadded ``image_size``.

    ``paste_stride`` 2 (SipMask): crop-split at stride 2 to the boxes / 2, then bilinear x2,
    so that a box edge falls on a 2-pixel cell and the upsampling blurs it by a pixel.
    ``paste_stride`` 1: crop-split at stride 2 to the boxes / 2 grown by one cell on each
    side, bilinear x2, then the crop to the boxes at stride 1, so that the box cuts the mask
    at its own pixels (the upsampled values near the edge come from the cells around it)."""
    if paste_stride not in PASTE_STRIDES:
        raise ValueError(f"MODEL.SIPMASK.PASTE_STRIDE: {paste_stride} is not one of "
                         f"{PASTE_STRIDES}")
    cells = boxes / MASK_STRIDE
    if paste_stride == 1:
        cells = cells + cells.new_tensor([-1.0, -1.0, 1.0, 1.0])
    probs = crop_split(quadrant_probs, cells, cell_centre=cell_centre)  # (D, Hm, Wm)
    probs = F.interpolate(probs[:, None], scale_factor=MASK_STRIDE, mode="bilinear",
                          align_corners=False)[:, 0]  # (D, 2 Hm, 2 Wm)
    probs = probs[:, :image_size[0], :image_size[1]]
    if paste_stride == 1:
        inside = box_inside_masks(boxes.to(probs.dtype), *probs.shape[-2:],
                                  cell_centre=cell_centre)  # (D, H, W)
        probs = probs * inside.to(probs.dtype)
    return probs


def paste_mask_probabilities(basis: Tensor, coefficients: Tensor, boxes: Tensor,
                             image_size: Tuple[int, int], *, cell_centre: bool = False,
                             paste_stride: int = MASK_STRIDE) -> Tensor:
    """Mask probabilities of D detections at the input resolution: the sigmoid of each
    quadrant's logits, crop-split to the (D, 4) boxes (input pixels) and upsampled
    (``paste_quadrant_probabilities``) -> (D, H, W)."""
    return paste_quadrant_probabilities(quadrant_logits(basis, coefficients).sigmoid(), boxes,
                                        image_size, cell_centre=cell_centre,
                                        paste_stride=paste_stride)


def resize_and_threshold(probs: Tensor, output_size: Tuple[int, int], threshold: float) -> Tensor:
    """(D, H, W) probabilities -> (D, H0, W0) bool: bilinear to ``output_size``, then
    > ``threshold`` (detectron2's ``detector_postprocess`` pastes at the original size the
    same way: probabilities resized, then thresholded)."""
    if probs.shape[-2:] != tuple(output_size) and len(probs):
        probs = F.interpolate(probs[:, None], size=output_size, mode="bilinear",
                              align_corners=False)[:, 0]
    elif not len(probs):
        probs = probs.new_zeros((0, *output_size))
    return probs > threshold
