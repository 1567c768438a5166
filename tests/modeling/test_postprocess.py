"""Inference selection and decoding on small inputs computed by hand."""
import math

import pytest
import torch

from fcos_d2.modeling.postprocess import decode_boxes, postprocess_image, select_level_candidates


def _logit(p: float) -> float:
    return math.log(p / (1 - p))


def test_decode_subtracts_left_top_and_adds_right_bottom():
    boxes = decode_boxes(torch.tensor([[50.0, 40.0]]), torch.tensor([[10.0, 5.0, 20.0, 15.0]]))
    assert boxes.tolist() == [[40, 35, 70, 55]]


def test_threshold_applies_to_class_probability_before_centerness():
    logits = torch.tensor([[_logit(0.06), _logit(0.04)]])  # one location, two classes
    ctr = torch.tensor([_logit(0.01)])  # would sink 0.06 far below the threshold
    boxes, scores, classes = select_level_candidates(
        logits, torch.ones(1, 4), ctr, torch.tensor([[8.0, 8.0]]), score_thresh=0.05, topk=10)
    assert classes.tolist() == [0]
    assert scores.tolist() == pytest.approx([0.06 * 0.01])
    assert boxes.tolist() == [[7, 7, 9, 9]]


def test_topk_keeps_the_best_by_probability_times_centerness():
    logits = torch.tensor([[_logit(0.9)], [_logit(0.5)], [_logit(0.6)]])
    ctr = torch.tensor([_logit(0.1), _logit(0.9), _logit(0.9)])  # products .09, .45, .54
    locations = torch.tensor([[0.0, 0.0], [100.0, 0.0], [200.0, 0.0]])
    _, scores, _ = select_level_candidates(logits, torch.ones(3, 4), ctr, locations,
                                           score_thresh=0.05, topk=2)
    assert sorted(scores.tolist()) == pytest.approx([0.45, 0.54])


def _image(logits, ltrb, ctr, locations, **kwargs):
    options = dict(score_thresh=0.05, topk_candidates=100, nms_thresh=0.6, max_detections=100)
    options.update(kwargs)
    return postprocess_image([torch.tensor(logits)], [torch.tensor(ltrb)], [torch.tensor(ctr)],
                             [torch.tensor(locations)], (100, 100), **options)


def test_final_score_is_sqrt_and_nms_is_class_wise():
    # Two near-identical boxes of class 0 and one of class 1 at the same place.
    logits = [[_logit(0.8), -20.0], [_logit(0.5), -20.0], [-20.0, _logit(0.4)]]
    ltrb = [[10.0, 10, 10, 10], [10, 10, 11, 10], [10, 10, 10, 10]]
    ctr = [_logit(0.5)] * 3
    locations = [[50.0, 50.0], [50.0, 50.0], [50.0, 50.0]]
    result = _image(logits, ltrb, ctr, locations)
    assert result.pred_classes.tolist() == [0, 1]
    assert result.scores.tolist() == pytest.approx([math.sqrt(0.4), math.sqrt(0.2)])


def test_boxes_are_clipped_to_the_image_and_cut_to_max_detections():
    logits = [[_logit(0.9)], [_logit(0.7)]]
    ltrb = [[30.0, 30, 30, 30], [5.0, 5, 5, 5]]
    locations = [[90.0, 10.0], [20.0, 20.0]]
    result = _image(logits, ltrb, [0.0, 0.0], locations, max_detections=1)
    assert len(result) == 1
    assert result.pred_boxes.tensor.tolist() == [[60, 0, 100, 40]]


def test_no_candidates_give_an_empty_result():
    result = _image([[-20.0]], [[1.0, 1, 1, 1]], [0.0], [[5.0, 5.0]])
    assert len(result) == 0 and result.pred_boxes.tensor.shape == (0, 4)


def test_threshold_on_final_score_uses_sqrt_of_probability_times_centerness():
    # probabilities 0.5 and 0.3, centerness 0.1: final scores sqrt(.05) = .224 and .173
    logits = torch.tensor([[_logit(0.5), _logit(0.3)]])
    ctr = torch.tensor([_logit(0.1)])
    _, scores, classes = select_level_candidates(
        logits, torch.ones(1, 4), ctr, torch.tensor([[8.0, 8.0]]), score_thresh=0.2, topk=10,
        threshold_on="final_score")
    assert classes.tolist() == [0]
    assert scores.tolist() == pytest.approx([0.05])
    # on the probability, both pass 0.2
    _, _, classes = select_level_candidates(
        logits, torch.ones(1, 4), ctr, torch.tensor([[8.0, 8.0]]), score_thresh=0.2, topk=10)
    assert classes.tolist() == [0, 1]


def test_detections_name_their_location_among_all_levels():
    from fcos_d2.modeling.postprocess import postprocess_image_with_locations

    # Level 0 has 2 locations, level 1 has 3: a detection at level 1's third location is
    # location 2 + 2 = 4 of the image.
    logits = [torch.tensor([[-20.0], [_logit(0.6)]]),
              torch.tensor([[-20.0], [-20.0], [_logit(0.9)]])]
    ltrb = [torch.full((2, 4), 5.0), torch.full((3, 4), 5.0)]
    ctr = [torch.zeros(2), torch.zeros(3)]
    locations = [torch.tensor([[10.0, 10.0], [40.0, 10.0]]),
                 torch.tensor([[10.0, 60.0], [40.0, 60.0], [80.0, 80.0]])]
    result, location_idx = postprocess_image_with_locations(
        logits, ltrb, ctr, locations, (100, 100), score_thresh=0.05, topk_candidates=10,
        nms_thresh=0.6, max_detections=10)
    assert result.pred_boxes.tensor.tolist() == [[75, 75, 85, 85], [35, 5, 45, 15]]
    assert location_idx.tolist() == [4, 1]


def test_batched_candidates_are_each_images_levels_concatenated_with_the_per_level_topk():
    from fcos_d2.modeling.postprocess import (select_candidates_batched,
                                              select_level_candidates_with_locations)

    # 2 images, level 0 with 3 locations and level 1 with 1, 2 classes; logit > 0 passes 0.5
    no = -9.0
    logits = [torch.tensor([[[2.0, no], [1.0, 3.0], [no, no]], [[no, no]] * 3]),
              torch.tensor([[[0.5, no]], [[no, 4.0]]])]
    ltrb = [torch.ones(2, 3, 4), torch.full((2, 1, 4), 2.0)]
    ctr = [torch.zeros(2, 3), torch.zeros(2, 1)]  # centerness 0.5 everywhere
    locations = [torch.tensor([[4.0, 4.0], [12.0, 4.0], [20.0, 4.0]]), torch.tensor([[8.0, 8.0]])]
    first, second = select_candidates_batched(logits, ltrb, ctr, locations, score_thresh=0.5,
                                              topk=2)
    boxes, scores, classes, location_idx = first
    # level 0 has 3 candidates, its 2 best kept (class 1 at location 1, class 0 at 0)
    kept = sorted(zip(location_idx.tolist(), classes.tolist()))
    assert kept == [(0, 0), (1, 1), (3, 0)]
    assert location_idx[-1] == 3 and boxes[-1].tolist() == [6.0, 6.0, 10.0, 10.0]
    assert scores[-1].item() == pytest.approx(torch.sigmoid(torch.tensor(0.5)).item() * 0.5)
    boxes, scores, classes, location_idx = second
    assert location_idx.tolist() == [3] and classes.tolist() == [1]
    for image, result in enumerate((first, second)):  # the per-level function, image by image
        per_level = [select_level_candidates_with_locations(
            x[image], r[image], c[image], p, score_thresh=0.5, topk=2)
            for x, r, c, p in zip(logits, ltrb, ctr, locations)]
        offsets = (0, 3)  # level 1's locations come after level 0's 3
        expected = [torch.cat([level[k] + (offset if k == 3 else 0)
                               for level, offset in zip(per_level, offsets)]) for k in range(4)]
        assert all(torch.equal(a, b) for a, b in zip(result, expected))
