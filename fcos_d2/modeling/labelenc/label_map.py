"""The label map: ground-truth boxes drawn as a K-channel image, the input of the LEF.

Symbols: M boxes of one image, K classes, H x W the padded input size.

Inside a box of class k with center (cx, cy) and size (w, h), channel k holds
``1 - max(|x - cx| / w, |y - cy| / h)`` at pixel (x, y) (integer pixel coordinates, as in
the official code), which is 1 at the center and 0.5 on the box's border; values below 0.5
(outside the box) are 0. Each box's values may be scaled (step 1 draws a factor per box,
uniform on [0, 2] and clipped at 1); where boxes of one class overlap, the maximum counts.
"""
import math
from typing import Optional

import torch
from torch import Tensor


def label_map(boxes: Tensor, classes: Tensor, *, num_classes: int, height: int, width: int,
              scales: Optional[Tensor] = None) -> Tensor:
    """The (K, H, W) label map of one image.

    Args:
        boxes: (M, 4) boxes (x0, y0, x1, y1) in input pixels; empty ones draw nothing.
        classes: (M,) 0-based classes in [0, K).
        num_classes: K.
        height, width: H, W.
        scales: (M,) factors of each box's values; None: 1.
    """
    output = boxes.new_zeros(num_classes, height, width, dtype=torch.float32)
    if scales is None:
        scales = boxes.new_ones(len(boxes), dtype=torch.float32)
    for (x0, y0, x1, y1), k, scale in zip(boxes.tolist(), classes.tolist(), scales.tolist()):
        w, h = x1 - x0, y1 - y0
        # only pixels inside the box reach 0.5; a 1-pixel margin keeps rounding out
        left, right = max(math.floor(x0) - 1, 0), min(math.ceil(x1) + 2, width)
        top, bottom = max(math.floor(y0) - 1, 0), min(math.ceil(y1) + 2, height)
        if w <= 0 or h <= 0 or left >= right or top >= bottom:
            continue
        xs = torch.arange(left, right, dtype=torch.float32, device=output.device)
        ys = torch.arange(top, bottom, dtype=torch.float32, device=output.device)
        value = 1 - torch.maximum((xs[None, :] - (x0 + x1) / 2).abs() / w,
                                  (ys[:, None] - (y0 + y1) / 2).abs() / h)  # (h', w')
        value = torch.where(value >= 0.5, value * scale, torch.zeros_like(value))
        region = output[k, top:bottom, left:right]
        torch.maximum(region, value, out=region)
    return output


def random_label_scales(num_boxes: int, device: torch.device = torch.device("cpu")) -> Tensor:
    """(M,) step-1 factors: uniform on [0, 2], clipped at 1 (half the boxes keep their
    values), from torch's global generator (saved in checkpoints by ExactResume)."""
    return (torch.rand(num_boxes) * 2).clamp(max=1).to(device)
