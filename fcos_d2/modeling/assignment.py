"""Feature locations and FCOS training targets. Pure functions, no learnable state.

Symbols:
    N: images in the batch.        L: FPN levels the head runs on.
    Hi, Wi: height/width of level i.  R: locations of all levels, sum_i(Hi * Wi).
    M: ground-truth boxes of one image.  K: foreground classes (background is K).
Locations are concatenated level by level, each level in row-major (y, x) order.
"""
from typing import List, Sequence, Tuple

import torch
from torch import Tensor

INF = float("inf")


def compute_locations(
    shapes: Sequence[Tuple[int, int]], strides: Sequence[int], device: torch.device
) -> List[Tensor]:
    """(x, y) image coordinates of every feature location, per level.

    The location (i, j) of a level with stride s is ``(s * j + s // 2, s * i + s // 2)``,
    the center of the input cell it sees.

    Args:
        shapes: (Hi, Wi) per level.
        strides: stride per level.
        device: where to build the tensors.

    Returns:
        per level, a float tensor (Hi * Wi, 2) of (x, y).
    """
    locations = []
    for (height, width), stride in zip(shapes, strides):
        xs = torch.arange(width, device=device, dtype=torch.float32) * stride
        ys = torch.arange(height, device=device, dtype=torch.float32) * stride
        y, x = torch.meshgrid(ys, xs, indexing="ij")  # (Hi, Wi) each
        locations.append(torch.stack([x.reshape(-1), y.reshape(-1)], dim=1) + stride // 2)
    return locations


def level_size_ranges(sizes_of_interest: Sequence[float]) -> List[Tuple[float, float]]:
    """[64, 128] -> [(-1, 64), (64, 128), (128, inf)]: the regression range of each level."""
    bounds = [-1.0, *[float(s) for s in sizes_of_interest], INF]
    return list(zip(bounds[:-1], bounds[1:]))


def assign_targets(
    locations: List[Tensor],
    gt_boxes: List[Tensor],
    gt_classes: List[Tensor],
    *,
    strides: Sequence[int],
    size_ranges: Sequence[Tuple[float, float]],
    center_sampling_radius: float,
    num_classes: int,
    norm_reg_targets: bool,
) -> Tuple[Tensor, Tensor]:
    """Assigns each location of each image a class and an (l, t, r, b) regression target:
    :func:`assign_targets_with_matches` without the matched boxes."""
    labels, reg_targets, _ = assign_targets_with_matches(
        locations, gt_boxes, gt_classes, strides=strides, size_ranges=size_ranges,
        center_sampling_radius=center_sampling_radius, num_classes=num_classes,
        norm_reg_targets=norm_reg_targets)
    return labels, reg_targets


@torch.no_grad()
def assign_targets_with_matches(
    locations: List[Tensor],
    gt_boxes: List[Tensor],
    gt_classes: List[Tensor],
    *,
    strides: Sequence[int],
    size_ranges: Sequence[Tuple[float, float]],
    center_sampling_radius: float,
    num_classes: int,
    norm_reg_targets: bool,
) -> Tuple[Tensor, Tensor, Tensor]:
    """Assigns each location of each image a class, an (l, t, r, b) regression target and
    the ground-truth box they come from.

    A location is a candidate for a box when it lies strictly inside the box (or, with
    center sampling, inside the square of half-side ``radius * stride`` around the box
    center, clipped to the box) and its largest distance to the box sides lies in its
    level's size range, inclusive at both ends. Among candidates the smallest box wins.

    Args:
        locations: per level (Hi * Wi, 2), from :func:`compute_locations`.
        gt_boxes: per image (M, 4) XYXY in input pixels; M may be 0.
        gt_classes: per image (M,) in [0, K).
        strides: stride per level.
        size_ranges: (low, high) per level, from :func:`level_size_ranges`.
        center_sampling_radius: in strides; 0 means any location inside the box.
        num_classes: K; background locations get label K.
        norm_reg_targets: divide the regression targets by the level's stride.

    Returns:
        labels (N, R) int64 in [0, K]; reg_targets (N, R, 4) float, (l, t, r, b);
        matched (N, R) int64, the index of the box in its image's ``gt_boxes``, -1 where
        the label is background.
    """
    if len(strides) != len(locations) or len(size_ranges) != len(locations):
        raise ValueError(f"{len(locations)} levels, but {len(strides)} strides and "
                         f"{len(size_ranges)} size ranges")
    points = torch.cat(locations)  # (R, 2)
    per_level = torch.tensor([len(loc) for loc in locations], device=points.device)
    point_strides = points.new_tensor(strides).repeat_interleave(per_level)  # (R,)
    point_ranges = points.new_tensor(size_ranges).repeat_interleave(per_level, dim=0)  # (R, 2)
    boxes, classes = padded_boxes(gt_boxes, gt_classes, points)  # (N, M, 4), (N, M)
    labels, targets, matches = _assign_batch(points, point_strides, point_ranges, boxes,
                                             classes, center_sampling_radius, num_classes)
    for i, image_boxes in enumerate(gt_boxes):
        if len(image_boxes) == 0:  # no box to measure from: zeros, as background anywhere
            targets[i] = 0
    if norm_reg_targets:
        targets = targets / point_strides[None, :, None]
    return labels, targets, matches


def padded_boxes(gt_boxes: List[Tensor], gt_classes: List[Tensor],
                 like: Tensor) -> Tuple[Tensor, Tensor]:
    """Per image (Mi, 4) boxes and (Mi,) classes -> (N, M, 4) boxes as ``like``'s dtype and
    device and (N, M) int64 classes, M the largest Mi, padded with the all-zero box (which
    contains no point, in or out of center sampling) and class 0."""
    most = max([len(b) for b in gt_boxes], default=0)
    boxes = like.new_zeros((len(gt_boxes), most, 4))
    classes = torch.zeros((len(gt_boxes), most), dtype=torch.int64, device=like.device)
    for i, (image_boxes, image_classes) in enumerate(zip(gt_boxes, gt_classes)):
        boxes[i, :len(image_boxes)] = image_boxes.to(like)
        classes[i, :len(image_classes)] = image_classes.to(torch.int64)
    return boxes, classes


def _assign_batch(
    points: Tensor, strides: Tensor, ranges: Tensor, boxes: Tensor, classes: Tensor,
    radius: float, num_classes: int,
) -> Tuple[Tensor, Tensor, Tensor]:
    """Targets of the batch, before dividing by the strides: labels (N, R), (l, t, r, b)
    (N, R, 4) and matches (N, R), for (R,) locations and (N, M, 4) padded boxes.

    Works on (N, R, M) tensors one side at a time; the (l, t, r, b) of only the matched box
    is gathered at the end, which keeps a COCO-sized batch fast on the CPU.
    """
    num_images, num_points = len(boxes), len(points)
    if boxes.shape[1] == 0:
        return (torch.full((num_images, num_points), num_classes, dtype=torch.int64,
                           device=points.device),
                points.new_zeros((num_images, num_points, 4)),
                torch.full((num_images, num_points), -1, dtype=torch.int64,
                           device=points.device))
    x, y = points[:, 0:1], points[:, 1:2]  # (R, 1)
    x0, y0, x1, y1 = (side[:, None, :] for side in boxes.unbind(dim=2))  # (N, 1, M) each
    left, top, right, bottom = x - x0, y - y0, x1 - x, y1 - y  # (N, R, M) each
    max_distance = torch.maximum(torch.maximum(left, right), torch.maximum(top, bottom))
    if radius > 0:  # the square around the center, clipped to the box
        half = strides[:, None] * radius  # (R, 1)
        cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
        inside = ((x > torch.maximum(cx - half, x0)) & (x < torch.minimum(cx + half, x1))
                  & (y > torch.maximum(cy - half, y0)) & (y < torch.minimum(cy + half, y1)))
    else:
        inside = (left > 0) & (top > 0) & (right > 0) & (bottom > 0)
    inside &= (max_distance >= ranges[:, :1]) & (max_distance <= ranges[:, 1:])
    area = (x1 - x0) * (y1 - y0)  # (N, 1, M)
    cost = torch.where(inside, area, torch.full_like(max_distance, INF))
    min_area, matched = cost.min(dim=2)  # (N, R)
    background = min_area == INF
    labels = classes.gather(1, matched).masked_fill(background, num_classes)
    box = boxes.gather(1, matched[..., None].expand(-1, -1, 4))  # (N, R, 4)
    targets = torch.stack([points[:, 0] - box[..., 0], points[:, 1] - box[..., 1],
                           box[..., 2] - points[:, 0], box[..., 3] - points[:, 1]], dim=2)
    return labels, targets, matched.masked_fill(background, -1)
