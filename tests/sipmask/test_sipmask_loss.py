"""SipMask's mask loss on cases computed by hand: the per-quadrant cross-entropy over the
box, the mask-alignment weights, the sampling NMS, and the ground-truth masks at the
basis-mask resolution from bitmasks and polygons."""
import math

import pytest
import torch
from detectron2.structures import BitMasks, Boxes, Instances, PolygonMasks

from fcos_d2.modeling.sipmask.loss import (aligned_iou_plus_one, mask_loss_image,
                                           sipmask_mask_loss)
from fcos_d2.modeling.sipmask.masks import gt_masks_at_basis_size


def softplus(x: float) -> float:
    return math.log1p(math.exp(x))


# One basis mask of ones on a 4 x 4 map: each quadrant's logit is its coefficient.
BASIS = torch.ones(1, 4, 4)
# The box [0, 8) in input pixels is [0, 4) in basis pixels; the 2.05-wide cells put
# columns (rows) 0..2 in the first half and 3 in the second.
BOX = torch.tensor([[0.0, 0.0, 8.0, 8.0]])
GT_MASK = torch.zeros(1, 4, 4)
GT_MASK[0, :3, :3] = 1  # exactly the top-left cell


def one_image_loss(coefficients, boxes=BOX, scores=(1.0,), matched=(0,), gt_box=BOX):
    return mask_loss_image(BASIS, torch.tensor(coefficients), boxes, torch.tensor(scores),
                           gt_box, GT_MASK, torch.tensor(matched), sample_nms_thresh=0.9)


def test_cross_entropy_of_each_quadrant_summed_over_the_box_and_divided_by_its_area():
    # Coefficients 2, -1, 0, 3: the top-left cell (9 pixels, target 1) costs softplus(-2)
    # each; top-right (3, target 0) softplus(-1); bottom-left (3) log 2; bottom-right (1)
    # softplus(3). Weight: score 1 * IoU 1, scaled to mean 1 -> 1. Divided by 4 x 4.
    loss = one_image_loss([[2.0, -1.0, 0.0, 3.0]])
    expected = (9 * softplus(-2) + 3 * softplus(-1) + 3 * math.log(2) + softplus(3)) / 16
    assert loss.item() == pytest.approx(expected, rel=1e-6)


def test_near_duplicate_positives_count_once_after_the_sampling_nms():
    # Two positives with the same box: NMS at 0.9 keeps the first; its weight (mean 1 over
    # both before sampling) stays 1 and the kept count is 1: the single-positive loss.
    single = one_image_loss([[2.0, -1.0, 0.0, 3.0]])
    double = one_image_loss([[2.0, -1.0, 0.0, 3.0], [-5.0, 5.0, 5.0, 5.0]],
                            boxes=BOX.repeat(2, 1), scores=(0.8, 0.8), matched=(0, 0))
    assert double.item() == pytest.approx(single.item(), rel=1e-6)


def test_weights_are_score_times_iou_scaled_to_mean_one():
    # Two positives on disjoint boxes (no sampling), coefficients 0: each costs log 2 per
    # pixel, so each term is log 2 / 2 (divided by the kept count) times its weight.
    # Weights 0.9 * 1 and 0.3 * IoU: the second box [8, 16) against the ground truth
    # [0, 8) in basis pixels [4, 8) vs [0, 4) with +1: overlap (0 + 1) * 5 = 5 over
    # 25 + 25 - 5 -> 1 / 9.
    boxes = torch.tensor([[0.0, 0.0, 8.0, 8.0], [8.0, 0.0, 16.0, 8.0]])
    basis = torch.ones(1, 4, 8)
    iou = aligned_iou_plus_one(torch.tensor([[0.0, 0.0, 4.0, 4.0]]),
                               torch.tensor([[4.0, 0.0, 8.0, 4.0]]))
    assert iou.item() == pytest.approx(1 / 9)
    raw = torch.tensor([0.9, 0.3 / 9])
    weights = raw / raw.sum() * 2
    gt = torch.zeros(1, 4, 8)
    loss = mask_loss_image(basis, torch.zeros(2, 4), boxes, torch.tensor([0.9, 0.3]),
                           torch.tensor([[0.0, 0.0, 8.0, 8.0]]), gt, torch.tensor([0, 0]),
                           sample_nms_thresh=0.9)
    # Per positive: 16 pixels x log 2 / (4 x 4) / 2 kept.
    assert loss.item() == pytest.approx((weights.sum() * math.log(2) / 2).item(), rel=1e-6)


def test_positives_whose_box_has_no_area_give_a_zero_loss_that_keeps_the_graph():
    coefficients = torch.ones(1, 4, requires_grad=True)
    loss = mask_loss_image(BASIS, coefficients, torch.tensor([[0.0, 0.0, 2.0, 2.0]]),
                           torch.tensor([1.0]), BOX, GT_MASK, torch.tensor([0]),
                           sample_nms_thresh=0.9)  # 1 x 1 basis pixels: not above 1
    loss.backward()
    assert loss.item() == 0 and coefficients.grad is not None


def test_batch_loss_is_the_mean_over_images_and_halved_above_one():
    # Coefficients -3, 3, 3, 3 cost softplus(3) at every pixel of the box: softplus(3) =
    # 3.05 per image. Two images, the second without positives: mean 1.52, halved to
    # 0.76; the same image twice: mean 3.05, halved to 1.52.
    instances = Instances((8, 8))
    instances.gt_boxes = Boxes(BOX)
    instances.gt_masks = BitMasks(GT_MASK.repeat_interleave(2, 1).repeat_interleave(2, 2) > 0)
    common = dict(basis=BASIS[None].repeat(2, 1, 1, 1),
                  coefficients=torch.tensor([[[-3.0, 3.0, 3.0, 3.0]]]).repeat(2, 1, 1),
                  pred_boxes=BOX[None].repeat(2, 1, 1), logits=torch.full((2, 1, 1), 10.0),
                  matched=torch.zeros(2, 1, dtype=torch.int64),
                  instances=[instances, instances], num_classes=1)
    one = sipmask_mask_loss(labels=torch.tensor([[0], [1]]), **common)  # label 1: background
    both = sipmask_mask_loss(labels=torch.tensor([[0], [0]]), **common)
    assert one.item() == pytest.approx(softplus(3) / 2 / 2, rel=1e-5)
    assert both.item() == pytest.approx(softplus(3) / 2, rel=1e-5)


def test_ground_truth_at_half_resolution_from_bitmasks_keeps_2x2_blocks_above_half():
    mask = torch.zeros(1, 6, 8, dtype=torch.bool)
    mask[0, 0:2, 0:2] = True  # a full block: kept
    mask[0, 2:4, 2:5] = True  # block (1, 1) full, block (1, 2) half: dropped
    out = gt_masks_at_basis_size(BitMasks(mask), (6, 8), (4, 5))  # padded map: 4 x 5
    expected = torch.zeros(4, 5)
    expected[0, 0] = expected[1, 1] = 1
    assert torch.equal(out[0], expected)


def test_ground_truth_from_polygons_is_rasterised_at_the_input_size_first():
    square = PolygonMasks([[[0.0, 0.0, 8.0, 0.0, 8.0, 8.0, 0.0, 8.0]]])
    out = gt_masks_at_basis_size(square, (16, 16), (8, 8))
    expected = torch.zeros(8, 8)
    expected[:4, :4] = 1
    assert torch.equal(out[0], expected)
    with pytest.raises(TypeError, match="instances.gt_masks: expected detectron2 BitMasks"):
        gt_masks_at_basis_size(torch.zeros(1, 4, 4), (4, 4), (2, 2))
