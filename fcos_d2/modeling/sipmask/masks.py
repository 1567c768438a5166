"""SipMask's instance masks from basis masks and spatial coefficients, the ground-truth
masks at the basis-mask resolution, and the pasting of predicted masks into the image.

Symbols: B basis masks of Hm x Wm pixels (the padded input at stride ``MASK_STRIDE``),
P instances, H x W the input image (unpadded), H0 x W0 the original image.
"""
from typing import Tuple, Union

import torch
from detectron2.structures import BitMasks, PolygonMasks
from torch import Tensor
from torch.nn import functional as F

from .crop_split import crop_split

MASK_STRIDE = 2  # the basis masks' stride in input pixels


def quadrant_logits(basis: Tensor, coefficients: Tensor) -> Tensor:
    """(B, Hm, Wm) basis masks and (P, 4 * B) coefficients -> (P, 4, Hm, Wm): per
    instance and quadrant, the coefficients' linear combination of the basis masks."""
    num_basis = basis.shape[0]
    weights = coefficients.reshape(-1, 4, num_basis)  # (P, 4, B)
    return torch.einsum("pqb,bhw->pqhw", weights, basis)


def instance_mask_logits(basis: Tensor, coefficients: Tensor, boxes: Tensor) -> Tensor:
    """Crop-split of the quadrant logits to (P, 4) boxes in basis-mask pixels -> (P, Hm, Wm)
    logits, zero outside the boxes (where only the inside counts)."""
    return crop_split(quadrant_logits(basis, coefficients), boxes)


def gt_masks_at_basis_size(gt_masks: Union[BitMasks, PolygonMasks], image_size: Tuple[int, int],
                           basis_size: Tuple[int, int]) -> Tensor:
    """Ground-truth masks (at the input image size) -> (M, Hm, Wm) float 0/1, as
    SipMask-benchmark makes them: bilinear to half size (2 x 2 means), placed at the top-left
    of a zero map of the basis masks' size, then > 0.5.

    Args:
        gt_masks: detectron2 BitMasks (M, H, W) or PolygonMasks in input pixels.
        image_size: (H, W) of the input image (unpadded).
        basis_size: (Hm, Wm).
    """
    if isinstance(gt_masks, PolygonMasks):
        gt_masks = BitMasks.from_polygon_masks(gt_masks, *image_size)
    if not isinstance(gt_masks, BitMasks):
        raise TypeError(f"instances.gt_masks: expected detectron2 BitMasks or PolygonMasks, got "
                        f"{type(gt_masks).__name__}")
    masks = gt_masks.tensor.float()  # (M, H, W)
    out = masks.new_zeros((len(masks), *basis_size))
    if len(masks) == 0:
        return out
    small = F.interpolate(masks[None], scale_factor=1 / MASK_STRIDE, mode="bilinear",
                          align_corners=False)[0]  # (M, H / 2, W / 2)
    h, w = min(small.shape[1], basis_size[0]), min(small.shape[2], basis_size[1])
    out[:, :h, :w] = small[:, :h, :w]
    return (out > 0.5).float()


def paste_mask_probabilities(basis: Tensor, coefficients: Tensor, boxes: Tensor,
                             image_size: Tuple[int, int]) -> Tensor:
    """Mask probabilities of D detections at the input resolution: the sigmoid of each
    quadrant's logits, crop-split to the (D, 4) boxes (input pixels), upsampled bilinearly
    by ``MASK_STRIDE`` and cut to the unpadded ``image_size`` (H, W) -> (D, H, W)."""
    probs = crop_split(quadrant_logits(basis, coefficients).sigmoid(),
                       boxes / MASK_STRIDE)  # (D, Hm, Wm)
    probs = F.interpolate(probs[:, None], scale_factor=MASK_STRIDE, mode="bilinear",
                          align_corners=False)[:, 0]  # (D, 2 Hm, 2 Wm)
    return probs[:, :image_size[0], :image_size[1]]


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
