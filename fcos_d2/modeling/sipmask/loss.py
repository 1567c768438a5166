"""SipMask's mask loss with its sampling and mask-alignment weighting, as in
SipMask-benchmark's ``SipMaskLossComputation`` (written anew here).

Symbols: N images, R locations of all levels, K classes, B basis masks of Hm x Wm pixels
(stride 2), P positives of one image, M its ground-truth boxes.

Per image, over its positive locations (FCOS assignment):
1. the predicted boxes (detached), in basis-mask pixels (input / 2); positives whose box
   area there is not above 1 are dropped;
2. weight w = sigmoid(logit of the assigned class) * IoU(predicted box, assigned
   ground-truth box), both detached, IoU with the +1 pixel convention of maskrcnn-benchmark;
   the weights are scaled to mean 1 over these positives;
3. sampling: NMS at IoU 0.9 over the predicted boxes (scores: the class probabilities,
   +1 convention), so that near-duplicate positives count once;
4. for each kept positive, its mask logits (crop-split, ``masks.instance_mask_logits``)
   against its ground-truth mask cropped to the predicted box: binary cross-entropy summed
   over the box, divided by the box's width and height (basis pixels) and by the number
   kept, times w.
The image terms are summed, divided by N; a total above 1 is halved (SipMask-benchmark
does so). Cross-entropy is computed from logits (SipMask-benchmark: on probabilities,
whose log it clamps at -100): the same value wherever float32 sigmoids do not saturate.
"""
from typing import List, Sequence

import torch
from detectron2.structures import Instances
from torch import Tensor
from torch.nn import functional as F
from torchvision.ops import nms

from .crop_split import box_inside_masks
from .masks import MASK_STRIDE, gt_masks_at_basis_size, instance_mask_logits


def aligned_iou_plus_one(a: Tensor, b: Tensor) -> Tensor:
    """IoU of (P, 4) box pairs with the +1 convention (a box [0, 0] is one pixel wide)."""
    lt = torch.maximum(a[:, :2], b[:, :2])
    rb = torch.minimum(a[:, 2:], b[:, 2:])
    overlap = (rb - lt + 1).clamp(min=0).prod(dim=1)
    area_a = (a[:, 2:] - a[:, :2] + 1).prod(dim=1)
    area_b = (b[:, 2:] - b[:, :2] + 1).prod(dim=1)
    return overlap / (area_a + area_b - overlap)


def nms_plus_one(boxes: Tensor, scores: Tensor, threshold: float) -> Tensor:
    """NMS with the +1 convention (maskrcnn-benchmark's): x2, y2 moved by one pixel."""
    return nms(boxes + boxes.new_tensor([0, 0, 1, 1]), scores, threshold)


def mask_loss_image(basis: Tensor, coefficients: Tensor, pred_boxes: Tensor,
                    class_scores: Tensor, gt_boxes: Tensor, gt_masks: Tensor, matched: Tensor,
                    *, sample_nms_thresh: float) -> Tensor:
    """The summed, weighted mask loss of one image (steps 1-4 of the module docstring).

    Args:
        basis: (B, Hm, Wm) basis masks.
        coefficients: (P, 4 * B) coefficients of the positives.
        pred_boxes: (P, 4) predicted boxes of the positives, XYXY in input pixels.
        class_scores: (P,) probability of each positive's assigned class.
        gt_boxes: (M, 4) XYXY input pixels; gt_masks: (M, Hm, Wm) 0/1 float
            (``gt_masks_at_basis_size``); matched: (P,) index into them.
        sample_nms_thresh: IoU of the sampling NMS (0.9).

    Returns:
        a scalar; exactly zero (connected to the graph) without a usable positive.
    """
    boxes = pred_boxes.detach() / MASK_STRIDE
    usable = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]) > 1.0
    boxes, scores, matched = boxes[usable], class_scores.detach()[usable], matched[usable]
    coefficients = coefficients[usable]
    if len(boxes) == 0:
        return coefficients.sum() * 0 + basis.sum() * 0
    weights = scores * aligned_iou_plus_one(gt_boxes[matched] / MASK_STRIDE, boxes)
    weights = weights / weights.sum() * len(weights)
    keep = nms_plus_one(boxes, scores, sample_nms_thresh)
    boxes, weights, matched, coefficients = (x[keep] for x in
                                             (boxes, weights, matched, coefficients))
    logits = instance_mask_logits(basis, coefficients, boxes)  # (P', Hm, Wm)
    inside = box_inside_masks(boxes, *basis.shape[1:]).to(logits.dtype)
    targets = gt_masks[matched] * inside  # ground truth cropped to the predicted boxes
    bce = F.binary_cross_entropy_with_logits(logits, targets, reduction="none") * inside
    widths, heights = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    per_instance = bce.sum(dim=(1, 2)) / widths / heights / len(boxes)
    return (per_instance * weights).sum()


def sipmask_mask_loss(*, basis: Tensor, coefficients: Tensor, pred_boxes: Tensor,
                      logits: Tensor, labels: Tensor, matched: Tensor,
                      instances: Sequence[Instances], num_classes: int,
                      sample_nms_thresh: float = 0.9) -> Tensor:
    """SipMask's mask loss of a batch (see the module docstring), in float32.

    Args:
        basis: (N, B, Hm, Wm) basis masks.
        coefficients: (N, R, 4 * B).
        pred_boxes: (N, R, 4) decoded boxes, XYXY input pixels.
        logits: (N, R, K) class logits.
        labels: (N, R) in [0, K], K background; matched: (N, R) the assigned box index.
        instances: per image, ``gt_boxes`` and ``gt_masks`` (BitMasks or PolygonMasks at
            the input size, ``image_size`` the unpadded input).
        num_classes: K.
        sample_nms_thresh: IoU of the sampling NMS.
    """
    with torch.autocast(basis.device.type, enabled=False):
        basis, coefficients, logits = basis.float(), coefficients.float(), logits.float()
        total: List[Tensor] = []
        for i, image in enumerate(instances):
            positive = labels[i] < num_classes
            if not image.has("gt_masks"):
                raise ValueError("SipMask training needs instances.gt_masks: set MODEL.MASK_ON "
                                 "True so that the data mapper loads the masks")
            gt_masks = gt_masks_at_basis_size(image.gt_masks, image.image_size,
                                              basis.shape[-2:]).to(basis.device)
            rows = positive.nonzero(as_tuple=True)[0]
            scores = logits[i, rows, labels[i, rows]].sigmoid()
            total.append(mask_loss_image(
                basis[i], coefficients[i, rows], pred_boxes[i, rows].float(), scores,
                image.gt_boxes.tensor.float(), gt_masks, matched[i, rows],
                sample_nms_thresh=sample_nms_thresh))
        loss = torch.stack(total).sum() / len(instances)
        return torch.where(loss > 1.0, loss * 0.5, loss)
