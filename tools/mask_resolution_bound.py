#!/usr/bin/env python
"""How fine must SipMask's basis masks be? An upper bound on mask quality per stride.

SipMask's mask of an instance is the sigmoid of maps made at the basis masks' source
stride (stride 8 in SipMask: the box towers of P3-P5), upsampled bilinearly and cut to the
instance's box. For every ground-truth mask of a dataset this fits the best such map
that is free (one logit per cell of a grid at stride s, not a combination of 32 shared
basis masks): bilinear upsampling to the image, binary cross-entropy over the box, Adam.
Where even that map misses the mask, no training of SipMask can get it.

Printed per object size (the box's longer side, px): the mean IoU of the fitted masks
(> 0.5, inside the box) with the truth, and an oracle mask AP: the mean over the COCO IoU
thresholds 0.50:0.95 of the fraction of masks that reach it, i.e. the mask AP of perfect
boxes and scores with these masks.

Usage:
    python tools/mask_resolution_bound.py [--dataset synthetic_masks_val] [--strides 8 4 2]
"""
import argparse
import sys
import time
from typing import Dict, List, Sequence, Tuple

import torch
from torch import Tensor
from torch.nn import functional as F


SIZE_BINS = ((0, 16), (16, 32), (32, 64), (64, float("inf")), (0, float("inf")))
IOU_THRESHOLDS = torch.arange(0.5, 0.951, 0.05)  # COCO's ten


def inside_boxes(boxes: Tensor, height: int, width: int) -> Tensor:
    """(M, 4) XYXY boxes -> (M, H, W) float, 1 at pixels x1 <= x < x2, y1 <= y < y2."""
    ys = torch.arange(height, dtype=boxes.dtype)
    xs = torch.arange(width, dtype=boxes.dtype)
    in_y = (ys[None] >= boxes[:, 1:2]) & (ys[None] < boxes[:, 3:4])  # (M, H)
    in_x = (xs[None] >= boxes[:, 0:1]) & (xs[None] < boxes[:, 2:3])  # (M, W)
    return (in_y[:, :, None] & in_x[:, None, :]).float()


def fit_masks(masks: Tensor, inside: Tensor, stride: int, *, steps: int = 150,
              lr: float = 0.5) -> Tensor:
    """Fits one free logit map per mask at ``stride``: (M, H, W) 0/1 masks and their box
    regions (H and W multiples of ``stride``) -> (M, H, W) bool, the upsampled fit > 0
    inside the box."""
    num, height, width = masks.shape
    if height % stride or width % stride:
        raise ValueError(f"mask size {height} x {width} is not a multiple of stride {stride}")
    grid = torch.zeros(num, 1, height // stride, width // stride, requires_grad=True)
    optimizer = torch.optim.Adam([grid], lr=lr)
    for _ in range(steps):
        up = F.interpolate(grid, scale_factor=stride, mode="bilinear", align_corners=False)[:, 0]
        bce = F.binary_cross_entropy_with_logits(up, masks, reduction="none") * inside
        loss = bce.sum() / inside.sum().clamp(min=1)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        up = F.interpolate(grid, scale_factor=stride, mode="bilinear", align_corners=False)[:, 0]
    return (up > 0) & inside.bool()


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


def by_size(ious: Tensor, sides: Tensor) -> List[Tuple[str, int, float, float]]:
    """(label, count, mean IoU, oracle AP) per ``SIZE_BINS`` of the boxes' longer sides."""
    rows = []
    for low, high in SIZE_BINS:
        keep = (sides >= low) & (sides < high)
        label = "all" if low == 0 and high == float("inf") else f"{low}-{high:g} px"
        mean = ious[keep].mean().item() if keep.any() else float("nan")
        rows.append((label, int(keep.sum()), mean, oracle_ap(ious[keep])))
    return rows


def load_masks(dataset: str) -> Tuple[Tensor, Tensor]:
    """Every annotation's mask (M, H, W) float and XYXY box (M, 4) of a registered COCO
    dataset whose images all have one size."""
    import fcos_d2  # noqa: F401  registers the built-in datasets
    from detectron2.data import DatasetCatalog
    from pycocotools import mask as mask_util

    masks, boxes = [], []
    for record in DatasetCatalog.get(dataset):
        for ann in record["annotations"]:
            segm = ann["segmentation"]
            if not isinstance(segm, dict):  # polygons
                segm = mask_util.merge(mask_util.frPyObjects(segm, record["height"],
                                                             record["width"]))
            masks.append(torch.from_numpy(mask_util.decode(segm)).float())
            x, y, w, h = ann["bbox"]
            boxes.append([x, y, x + w, y + h])
    if len({m.shape for m in masks}) > 1:
        raise ValueError(f"{dataset}: images of several sizes; this tool needs one size")
    return torch.stack(masks), torch.tensor(boxes, dtype=torch.float32)


def main(argv: Sequence[str] = None) -> Dict[int, list]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="synthetic_masks_val")
    parser.add_argument("--strides", type=int, nargs="+", default=[8, 4, 2])
    parser.add_argument("--steps", type=int, default=150, help="Adam steps of the fit")
    args = parser.parse_args(argv)
    masks, boxes = load_masks(args.dataset)
    inside = inside_boxes(boxes, *masks.shape[1:])
    sides = torch.maximum(boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1])
    print(f"{args.dataset}: {len(masks)} masks of {masks.shape[1]} x {masks.shape[2]} px")
    print("| stride | objects | masks | mean IoU | oracle mask AP |")
    print("| --- | --- | --- | --- | --- |")
    tables = {}
    for stride in args.strides:
        start = time.time()
        ious = mask_iou(fit_masks(masks, inside, stride, steps=args.steps), masks.bool())
        tables[stride] = by_size(ious, sides)
        for label, count, mean, ap in tables[stride]:
            print(f"| {stride} | {label} | {count} | {mean:.3f} | {ap:.1f} |")
        print(f"(stride {stride}: {time.time() - start:.0f} s)", file=sys.stderr)
    return tables


if __name__ == "__main__":
    main()
