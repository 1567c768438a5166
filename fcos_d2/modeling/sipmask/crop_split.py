"""Crop-split: SipMask's assembly of an instance mask from four quadrant maps, and the
matching crop of ground-truth masks. Plain PyTorch (CPU and GPU), vectorised over
instances, differentiable with respect to the maps.

Symbols: P instances, H x W the mask map (SipMask: the input at stride 2), boxes (P, 4)
XYXY in the map's pixel units.

A pixel (x, y) (integer indices, no half-pixel shift) belongs to a box when
``x1 <= x < x2`` and ``y1 <= y < y2``. Inside, its quadrant column is
``floor((x - x1) / ((x2 - x1 + 0.1) / 2))`` (0 left, 1 right) and its row likewise; the
+0.1 keeps the last pixel in the second half. These are the rules of SipMask's CUDA
kernels (``crop_split`` and ``crop_split_gt``), the widths rounded as there: the sum
``x2 - x1 + 0.1`` in double precision, the cell width in the maps' precision.

fcos-d2's option, not SipMask's (``cell_centre=True``, ``MODEL.SIPMASK.CROP_RULE
"cell_centre"``): a pixel is placed by its centre ``x + 0.5`` instead of its left edge
``x``, in both rules above. Pixel x covers [x, x + 1), so the official rule drops a pixel
whose centre lies inside the box's left (top) edge and keeps one whose centre lies past
its right (bottom) edge: at stride 2 a box off by half a pixel loses or gains a whole
row of cells.
"""
from typing import Tuple

import torch
from torch import Tensor

# Quadrant order of the maps and of SipMask's 4 coefficient sets: row-major over the
# 2 x 2 cells of the box.
QUADRANTS = ("top-left", "top-right", "bottom-left", "bottom-right")


CROP_RULES = ("official", "cell_centre")  # MODEL.SIPMASK.CROP_RULE's values


def _cells_1d(lo: Tensor, hi: Tensor, size: int, dtype: torch.dtype,
              cell_centre: bool = False) -> Tuple[Tensor, Tensor]:
    """For (P,) box sides on one axis of ``size`` pixels: (P, size) bool, inside the box;
    (P, size) int64, the cell (0 or 1) of each pixel (meaningful inside only). A pixel is
    placed by its index (SipMask) or, with ``cell_centre``, by its centre (index + 0.5)."""
    coords = torch.arange(size, device=lo.device, dtype=dtype)  # (size,)
    if cell_centre:
        coords = coords + 0.5
    inside = (coords[None, :] >= lo[:, None]) & (coords[None, :] < hi[:, None])
    cell = ((hi.double() - lo.double() + 0.1) / 2).to(dtype)  # (P,)
    index = ((coords[None, :] - lo[:, None]) / cell[:, None]).floor()
    return inside, index.clamp(0, 1).long()


def box_inside_masks(boxes: Tensor, height: int, width: int, *,
                     cell_centre: bool = False) -> Tensor:
    """(P, 4) boxes -> (P, H, W) bool, True where a pixel lies inside its box."""
    x_in, _ = _cells_1d(boxes[:, 0], boxes[:, 2], width, boxes.dtype, cell_centre)  # (P, W)
    y_in, _ = _cells_1d(boxes[:, 1], boxes[:, 3], height, boxes.dtype, cell_centre)  # (P, H)
    return y_in[:, :, None] & x_in[:, None, :]


def crop_split(quadrant_maps: Tensor, boxes: Tensor, *, cell_centre: bool = False) -> Tensor:
    """Assembles one map per instance from its four quadrant maps, zero outside its box.

    Args:
        quadrant_maps: (P, 4, H, W), per instance the maps of its four quadrants in the
            order of ``QUADRANTS`` (SipMask: the sigmoid of each coefficient set times the
            basis masks).
        boxes: (P, 4) XYXY in map pixels, the same dtype as the maps.
        cell_centre: place pixels by their centres (fcos-d2's rule) instead of SipMask's
            left/top edges (module docstring).

    Returns:
        (P, H, W): at a pixel inside the box, the map of the quadrant the pixel lies in;
        zero outside. Gradients flow to the selected quadrant only.
    """
    num, four, height, width = quadrant_maps.shape
    if four != 4 or boxes.shape != (num, 4):
        raise ValueError(f"crop_split: maps must be (P, 4, H, W) and boxes (P, 4), got "
                         f"{tuple(quadrant_maps.shape)} and {tuple(boxes.shape)}")
    boxes = boxes.to(quadrant_maps.dtype)
    x_in, col = _cells_1d(boxes[:, 0], boxes[:, 2], width, boxes.dtype, cell_centre)  # (P, W)
    y_in, row = _cells_1d(boxes[:, 1], boxes[:, 3], height, boxes.dtype, cell_centre)  # (P, H)
    quadrant = row[:, :, None] * 2 + col[:, None, :]  # (P, H, W)
    picked = quadrant_maps.gather(1, quadrant[:, None]).squeeze(1)  # (P, H, W)
    inside = y_in[:, :, None] & x_in[:, None, :]  # (P, H, W)
    return picked * inside.to(picked.dtype)


def crop_to_boxes(masks: Tensor, boxes: Tensor, *, cell_centre: bool = False) -> Tensor:
    """(P, H, W) masks, zero outside their (P, 4) boxes (SipMask's ground-truth crop)."""
    if masks.dim() != 3 or boxes.shape != (len(masks), 4):
        raise ValueError(f"crop_to_boxes: masks must be (P, H, W) and boxes (P, 4), got "
                         f"{tuple(masks.shape)} and {tuple(boxes.shape)}")
    inside = box_inside_masks(boxes.to(masks.dtype if masks.is_floating_point() else
                                       torch.float32), *masks.shape[1:],
                              cell_centre=cell_centre)
    return masks * inside.to(masks.dtype)
