"""tools/mask_resolution_bound.py: the free-map fit per stride, the IoU and the oracle AP."""
import importlib.util
from pathlib import Path

import pytest
import torch

TOOL = Path(__file__).resolve().parents[2] / "tools" / "mask_resolution_bound.py"
spec = importlib.util.spec_from_file_location("mask_resolution_bound", TOOL)
bound = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bound)


def ring(size: int = 32, center: float = 15.5, outer: float = 7.0, inner: float = 3.0):
    """A ring mask (size x size) and its tight XYXY box."""
    ys, xs = torch.meshgrid(torch.arange(size).float(), torch.arange(size).float(),
                            indexing="ij")
    radius = ((ys - center) ** 2 + (xs - center) ** 2).sqrt()
    mask = ((radius <= outer) & (radius > inner)).float()
    rows, cols = mask.nonzero(as_tuple=True)
    box = torch.tensor([[cols.min(), rows.min(), cols.max() + 1, rows.max() + 1]]).float()
    return mask[None], box


def test_a_ring_hole_is_lost_at_stride_8_and_kept_at_stride_2():
    mask, box = ring()
    inside = bound.inside_boxes(box, 32, 32)
    assert torch.equal(inside.bool() | ~mask.bool(), torch.ones_like(inside).bool())
    coarse = bound.mask_iou(bound.fit_masks(mask, inside, 8), mask.bool())
    fine = bound.mask_iou(bound.fit_masks(mask, inside, 2), mask.bool())
    exact = bound.mask_iou(bound.fit_masks(mask, inside, 1), mask.bool())
    assert coarse.item() < 0.9 and fine.item() > 0.95 and exact.item() == 1.0


def test_the_fit_stays_inside_the_box():
    mask = torch.ones(1, 16, 16)
    box = torch.tensor([[2.0, 3.0, 9.0, 14.0]])
    fitted = bound.fit_masks(mask, bound.inside_boxes(box, 16, 16), 4)
    assert fitted.sum() == 7 * 11 and fitted[0, 3:14, 2:9].all()


def test_oracle_ap_is_the_mean_fraction_over_the_coco_thresholds():
    # IoU 1 passes all ten thresholds, 0.72 the five up to 0.70: (10 + 5) / 20.
    assert bound.oracle_ap(torch.tensor([1.0, 0.72])) == pytest.approx(75.0)
    rows = bound.by_size(torch.tensor([1.0, 0.72, 0.4]), torch.tensor([10.0, 40.0, 80.0]))
    assert [(label, count) for label, count, _, _ in rows] == [
        ("0-16 px", 1), ("16-32 px", 0), ("32-64 px", 1), ("64-inf px", 1), ("all", 3)]
    assert rows[4][2] == pytest.approx(0.70667, abs=1e-4) and rows[3][3] == 0.0


def test_a_size_that_the_stride_does_not_divide_is_refused():
    with pytest.raises(ValueError, match="mask size 30 x 32 is not a multiple of stride 8"):
        bound.fit_masks(torch.zeros(1, 30, 32), torch.ones(1, 30, 32), 8)
