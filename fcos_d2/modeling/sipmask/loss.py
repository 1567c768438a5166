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
does so). The targets, the crop rule and an object with an empty target follow
``MODEL.SIPMASK`` (``masks.mask_targets``, ``crop_split``); SipMask's are the defaults
here. With re-scoring (SipMask++), ``scoring.py`` adds its loss on the kept positives. Cross-entropy is computed from logits (SipMask-benchmark: on probabilities,
whose log it clamps at -100): the same value wherever float32 sigmoids do not saturate.
"""
from typing import List, NamedTuple, Optional, Sequence

import torch
from detectron2.structures import Instances
from torch import Tensor
from torch.nn import functional as F
from torchvision.ops import nms

from .crop_split import box_inside_masks
from .masks import MASK_STRIDE, instance_mask_logits, mask_targets
from .scoring import MaskScoring, RescoringSums


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


class ImageMaskTerms(NamedTuple):
    """One image's mask loss and what re-scoring needs: the kept positives' rows (P',) into
    the positives given, their cropped mask probabilities (P', Hm, Wm), detached."""
    loss: Tensor
    rows: Tensor
    probabilities: Tensor


def mask_terms_image(basis: Tensor, coefficients: Tensor, pred_boxes: Tensor,
                     class_scores: Tensor, gt_boxes: Tensor, gt_masks: Tensor, matched: Tensor,
                     *, sample_nms_thresh: float, cell_centre: bool = False) -> ImageMaskTerms:
    """``mask_loss_image`` with the kept positives and their probabilities."""
    boxes = pred_boxes.detach() / MASK_STRIDE
    usable = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]) > 1.0
    rows = usable.nonzero(as_tuple=True)[0]
    boxes, scores, matched = boxes[rows], class_scores.detach()[rows], matched[rows]
    coefficients = coefficients[rows]
    if len(boxes) == 0:
        return ImageMaskTerms(coefficients.sum() * 0 + basis.sum() * 0, rows,
                              basis.new_zeros((0, *basis.shape[1:])))
    weights = scores * aligned_iou_plus_one(gt_boxes[matched] / MASK_STRIDE, boxes)
    weights = weights / weights.sum() * len(weights)
    keep = nms_plus_one(boxes, scores, sample_nms_thresh)
    boxes, weights, matched, coefficients, rows = (x[keep] for x in
                                                   (boxes, weights, matched, coefficients, rows))
    logits = instance_mask_logits(basis, coefficients, boxes,
                                  cell_centre=cell_centre)  # (P', Hm, Wm)
    inside = box_inside_masks(boxes, *basis.shape[1:], cell_centre=cell_centre).to(logits.dtype)
    targets = gt_masks[matched] * inside  # ground truth cropped to the predicted boxes
    bce = F.binary_cross_entropy_with_logits(logits, targets, reduction="none") * inside
    widths, heights = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    per_instance = bce.sum(dim=(1, 2)) / widths / heights / len(boxes)
    return ImageMaskTerms((per_instance * weights).sum(), rows,
                          logits.detach().sigmoid() * inside)


def mask_loss_image(basis: Tensor, coefficients: Tensor, pred_boxes: Tensor,
                    class_scores: Tensor, gt_boxes: Tensor, gt_masks: Tensor, matched: Tensor,
                    *, sample_nms_thresh: float, cell_centre: bool = False) -> Tensor:
    """The summed, weighted mask loss of one image (steps 1-4 of the module docstring).

    Args:
        basis: (B, Hm, Wm) basis masks.
        coefficients: (P, 4 * B) coefficients of the positives.
        pred_boxes: (P, 4) predicted boxes of the positives, XYXY in input pixels.
        class_scores: (P,) probability of each positive's assigned class.
        gt_boxes: (M, 4) XYXY input pixels; gt_masks: (M, Hm, Wm) targets in [0, 1]
            (``masks.mask_targets``); matched: (P,) index into them.
        sample_nms_thresh: IoU of the sampling NMS (0.9).
        cell_centre: the crop rule (``crop_split``).

    Returns:
        a scalar; exactly zero (connected to the graph) without a usable positive.
    """
    return mask_terms_image(basis, coefficients, pred_boxes, class_scores, gt_boxes, gt_masks,
                            matched, sample_nms_thresh=sample_nms_thresh,
                            cell_centre=cell_centre).loss


class MaskLosses(NamedTuple):
    """A batch's mask loss, its re-scoring loss (None without a scoring branch) and the
    number of objects whose target was all zero though their mask was not."""
    mask: Tensor
    rescoring: Optional[Tensor]
    empty_targets: int


def sipmask_mask_loss(**kwargs) -> Tensor:
    """The mask loss alone of ``sipmask_mask_losses`` (same arguments)."""
    return sipmask_mask_losses(**kwargs).mask


def sipmask_mask_losses(*, basis: Tensor, coefficients: Tensor, pred_boxes: Tensor,
                        logits: Tensor, labels: Tensor, matched: Tensor,
                        instances: Sequence[Instances], num_classes: int,
                        sample_nms_thresh: float = 0.9, target: str = "threshold",
                        empty_rule: str = "official", cell_centre: bool = False,
                        scoring: Optional[MaskScoring] = None) -> MaskLosses:
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
        target, empty_rule: how targets are made (``masks.mask_targets``); with
            ``empty_rule`` "drop" the positives of an object with an empty target are left
            out of the mask loss.
        cell_centre: the crop rule (``crop_split``).
        scoring: the re-scoring branch (``scoring.MaskScoring``), trained on the kept
            positives' detached masks; None: no re-scoring loss.
    """
    with torch.autocast(basis.device.type, enabled=False):
        basis, coefficients, logits = basis.float(), coefficients.float(), logits.float()
        total: List[Tensor] = []
        rescoring = RescoringSums()
        num_empty = 0
        for i, image in enumerate(instances):
            positive = labels[i] < num_classes
            if not image.has("gt_masks"):
                raise ValueError("SipMask training needs instances.gt_masks: set MODEL.MASK_ON "
                                 "True so that the data mapper loads the masks")
            gt_masks, empty = mask_targets(image.gt_masks, image.image_size, basis.shape[-2:],
                                           target=target, empty_rule=empty_rule)
            gt_masks, empty = gt_masks.to(basis.device), empty.to(basis.device)
            num_empty += int(empty.sum())
            if empty_rule == "drop" and empty.any():
                positive = positive & ~empty[matched[i].clamp(0, len(empty) - 1)]
            rows = positive.nonzero(as_tuple=True)[0]
            scores = logits[i, rows, labels[i, rows]].sigmoid()
            terms = mask_terms_image(
                basis[i], coefficients[i, rows], pred_boxes[i, rows].float(), scores,
                image.gt_boxes.tensor.float(), gt_masks, matched[i, rows],
                sample_nms_thresh=sample_nms_thresh, cell_centre=cell_centre)
            total.append(terms.loss)
            if scoring is not None:
                kept = rows[terms.rows]
                rescoring.add(scoring, terms.probabilities, gt_masks[matched[i, kept]],
                              labels[i, kept])
        loss = torch.stack(total).sum() / len(instances)
        loss = torch.where(loss > 1.0, loss * 0.5, loss)
        return MaskLosses(loss, rescoring.loss(scoring) if scoring is not None else None,
                          num_empty)
