"""ATSS-style positives for FCOS (``MODEL.FCOS.ASSIGNER "atss"``): a pure function beside
``assignment.assign_targets_with_matches``, returning the same three tensors.

Adaptive Training Sample Selection (Zhang et al., CVPR 2020) chooses each object's
positives from statistics of the object itself instead of fixed size ranges:

1. every location gets an anchor box: a square of side ``anchor_scale * stride`` (8
   strides, as ATSS's one anchor per location) centered on it;
2. per object and per level, the ``topk`` locations whose centers lie nearest (L2) the
   object's box center are its candidates (k * L of them, fewer on small levels);
3. the object's threshold is the mean plus the standard deviation (unbiased, as
   ``Tensor.std``) of the candidates' anchor IoUs with its box; a candidate is positive
   when its IoU is at least the threshold and the location lies strictly inside the box;
4. a location positive for several objects goes to the one its anchor overlaps most.

Regression targets are the location's (l, t, r, b) distances to its object's box sides,
as FCOS's (divided by the stride with ``norm_reg_targets``); no size ranges, no center
sampling. Symbols as in ``assignment``: N images, R locations of all levels, M boxes of
one image, K classes (background is K), C candidates of one object.
"""
from typing import List, Sequence, Tuple

import torch
from torch import Tensor


def anchor_boxes(points: Tensor, strides: Tensor, anchor_scale: float) -> Tensor:
    """(R, 2) (x, y) and (R,) strides -> (R, 4) XYXY squares of side anchor_scale * stride."""
    half = (strides * anchor_scale / 2)[:, None]  # (R, 1)
    return torch.cat([points - half, points + half], dim=1)


def pairwise_iou(a: Tensor, b: Tensor) -> Tensor:
    """IoU of (A, 4) and (B, 4) XYXY boxes -> (A, B); 0 where both areas are 0."""
    top_left = torch.maximum(a[:, None, :2], b[None, :, :2])  # (A, B, 2)
    bottom_right = torch.minimum(a[:, None, 2:], b[None, :, 2:])
    intersection = (bottom_right - top_left).clamp(min=0).prod(dim=2)  # (A, B)
    area_a = (a[:, 2:] - a[:, :2]).prod(dim=1)
    area_b = (b[:, 2:] - b[:, :2]).prod(dim=1)
    union = area_a[:, None] + area_b[None, :] - intersection
    return intersection / union.clamp(min=1e-12)


def atss_candidates(points: Tensor, boxes: Tensor, level_sizes: Sequence[int],
                    topk: int) -> Tensor:
    """Per object, the indices of the ``topk`` locations of each level nearest its box
    center: (R, 2) points, (M, 4) boxes -> (C, M) indices into R, level by level."""
    centers = (boxes[:, :2] + boxes[:, 2:]) / 2  # (M, 2)
    distances = torch.cdist(points, centers)  # (R, M)
    candidates, start = [], 0
    for size in level_sizes:
        k = min(topk, size)
        if k > 0:
            nearest = distances[start:start + size].topk(k, dim=0, largest=False).indices
            candidates.append(nearest + start)  # (k, M)
        start += size
    return torch.cat(candidates)


@torch.no_grad()
def assign_targets_atss(
    locations: List[Tensor],
    gt_boxes: List[Tensor],
    gt_classes: List[Tensor],
    *,
    strides: Sequence[int],
    topk: int,
    num_classes: int,
    norm_reg_targets: bool,
    anchor_scale: float = 8.0,
) -> Tuple[Tensor, Tensor, Tensor]:
    """ATSS positives (module docstring) with FCOS's outputs.

    Args:
        locations: per level (Hi * Wi, 2), from ``compute_locations``.
        gt_boxes: per image (M, 4) XYXY in input pixels; M may be 0.
        gt_classes: per image (M,) in [0, K).
        strides: stride per level.
        topk: candidates per level and object (ATSS: 9).
        num_classes: K; background locations get label K.
        norm_reg_targets: divide the regression targets by the level's stride.
        anchor_scale: the anchor side in strides (ATSS: 8).

    Returns:
        labels (N, R) int64 in [0, K]; reg_targets (N, R, 4) float, (l, t, r, b); matched
        (N, R) int64, the index of the box in its image's ``gt_boxes``, -1 for background.
    """
    if len(strides) != len(locations):
        raise ValueError(f"{len(locations)} levels, but {len(strides)} strides")
    if topk < 1:
        raise ValueError(f"MODEL.FCOS.ATSS_TOPK: must be >= 1, got {topk}")
    points = torch.cat(locations)  # (R, 2)
    level_sizes = [len(loc) for loc in locations]
    point_strides = points.new_tensor(strides).repeat_interleave(
        torch.tensor(level_sizes, device=points.device))  # (R,)
    anchors = anchor_boxes(points, point_strides, anchor_scale)
    labels, targets, matches = [], [], []
    for boxes, classes in zip(gt_boxes, gt_classes):
        matched = _match_image(points, anchors, boxes.to(points), level_sizes, topk)  # (R,)
        box = boxes.to(points)[matched.clamp(min=0)] if len(boxes) else points.new_zeros(
            (len(points), 4))
        image_targets = torch.cat([points - box[:, :2], box[:, 2:] - points], dim=1)  # (R, 4)
        if norm_reg_targets:
            image_targets = image_targets / point_strides[:, None]
        image_labels = torch.full_like(matched, num_classes)
        if len(boxes):
            image_labels = torch.where(matched >= 0, classes.to(matched)[matched.clamp(min=0)],
                                       image_labels)
        labels.append(image_labels)
        targets.append(image_targets)
        matches.append(matched)
    return torch.stack(labels), torch.stack(targets), torch.stack(matches)


def _match_image(points: Tensor, anchors: Tensor, boxes: Tensor, level_sizes: Sequence[int],
                 topk: int) -> Tensor:
    """(R,) the index of each location's box in `boxes` (M, 4), -1 for background."""
    num_points = len(points)
    if len(boxes) == 0:
        return torch.full((num_points,), -1, dtype=torch.int64, device=points.device)
    ious = pairwise_iou(anchors, boxes)  # (R, M)
    candidates = atss_candidates(points, boxes, level_sizes, topk)  # (C, M)
    candidate_ious = ious.gather(0, candidates)  # (C, M)
    spread = candidate_ious.std(dim=0) if len(candidates) > 1 else torch.zeros_like(
        candidate_ious[0])
    threshold = candidate_ious.mean(dim=0) + spread  # (M,)
    x, y = points[candidates, 0], points[candidates, 1]  # (C, M) each
    inside = ((x > boxes[:, 0]) & (y > boxes[:, 1]) & (x < boxes[:, 2]) & (y < boxes[:, 3]))
    positive = (candidate_ious >= threshold) & inside  # (C, M)
    scores = torch.full_like(ious, -1.0)  # (R, M): the IoU where positive, else -1
    objects = torch.arange(len(boxes), device=points.device).expand_as(candidates)
    scores[candidates[positive], objects[positive]] = candidate_ious[positive]
    best, matched = scores.max(dim=1)  # (R,)
    return matched.masked_fill(best < 0, -1)
