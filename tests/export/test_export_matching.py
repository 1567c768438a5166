"""The export check compares two runs' detections as sets: ties in score may come out in any
order or be swapped at the detections-per-image cap; a real difference still fails."""
import numpy as np
import torch

from fcos_d2.export.files import agreement_line, compare
from fcos_d2.modeling.postprocess import ties_in_candidate_order


def _detections(rows):
    """rows of (x0, y0, x1, y1, score, class) -> (boxes, scores, classes)."""
    rows = np.array(rows, dtype=np.float64).reshape(-1, 6)
    return (rows[:, :4].astype(np.float32), rows[:, 4].astype(np.float32),
            rows[:, 5].astype(np.int64))


# Five detections, the cap of this test: the last two tie in score (1e-7 apart).
PYTORCH = [(10, 10, 50, 50, 0.9, 0), (60, 10, 90, 40, 0.8, 1), (0, 0, 20, 20, 0.5, 2),
           (30, 30, 70, 90, 0.30000001, 3), (5, 60, 25, 80, 0.3, 1)]


def _same(expected, got, cap=5):
    return compare([_detections(expected)], [_detections(got)], cap)


def test_tied_scores_in_another_order_agree():
    reordered = [PYTORCH[i] for i in (0, 1, 2, 4, 3)]
    result = _same(PYTORCH, reordered)
    assert result["same"] and result["box_diff"] == 0
    assert result["swapped_at_cap"] == [0]


def test_another_candidate_tied_at_the_cap_agrees():
    # onnxruntime kept a third candidate of the same score instead of PyTorch's last one
    swapped = PYTORCH[:4] + [(100, 100, 120, 130, 0.30000003, 4)]
    result = _same(PYTORCH, swapped)
    assert result["same"] and result["swapped_at_cap"] == [1]
    assert "1 tied at the 5-detection cap" in agreement_line(result, (129, 171))


def test_a_moved_box_differs():
    moved = PYTORCH[:2] + [(0, 0, 20, 90, 0.5, 2)] + PYTORCH[3:]
    result = _same(PYTORCH, moved)
    assert not result["same"] and result["unmatched"] == [(1, 1)]
    line = agreement_line(result, (129, 171))
    assert line.startswith("DIFFER at 129x171: 5 detections in PyTorch, 5 here")
    assert "without a match: 1 of PyTorch's, 1 of these" in line


def test_a_swap_away_from_the_cap_score_or_below_the_cap_differs():
    higher = PYTORCH[:4] + [(100, 100, 120, 130, 0.5, 2)]  # not tied with the lowest score
    assert not _same(PYTORCH, higher)["same"]
    other = PYTORCH[:4] + [(100, 100, 120, 130, 0.3, 4)]
    assert not _same(PYTORCH, other, cap=100)["same"]  # 5 < the cap: nothing was cut
    assert not _same(PYTORCH, PYTORCH[:4])["same"]  # one missing


def test_a_changed_class_or_score_differs():
    assert not _same(PYTORCH, PYTORCH[:1] + [(60, 10, 90, 40, 0.8, 2)] + PYTORCH[2:])["same"]
    assert not _same(PYTORCH, PYTORCH[:1] + [(60, 10, 90, 40, 0.81, 1)] + PYTORCH[2:])["same"]


def test_pytorch_orders_equal_scores_by_candidate_as_the_graph_does():
    scores = torch.tensor([0.9, 0.5, 0.5, 0.7, 0.5])
    kept = torch.tensor([0, 4, 1, 3, 2])  # NMS's order: ties in any order
    order = ties_in_candidate_order(scores[kept], kept)
    assert kept[order].tolist() == [0, 3, 1, 2, 4]
