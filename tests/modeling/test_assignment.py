"""Target assignment on small inputs computed by hand."""
import math

import torch

from fcos_d2.modeling.assignment import assign_targets, compute_locations, level_size_ranges

BG = 5  # num_classes in these tests; background label


def _assign(points, boxes, classes, *, strides=(8,), ranges=((-1, math.inf),), radius=0.0,
            norm=False):
    locations = [torch.tensor(p, dtype=torch.float32) for p in points]
    labels, targets = assign_targets(
        locations, [torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4)],
        [torch.tensor(classes, dtype=torch.int64)], strides=strides, size_ranges=ranges,
        center_sampling_radius=radius, num_classes=BG, norm_reg_targets=norm)
    return labels[0], targets[0]


def test_locations_are_cell_centers_in_row_major_order():
    (level,) = compute_locations([(2, 3)], [8], torch.device("cpu"))
    expected = [[4, 4], [12, 4], [20, 4], [4, 12], [12, 12], [20, 12]]
    assert level.tolist() == expected


def test_size_ranges_open_at_both_ends():
    assert level_size_ranges([64, 128]) == [(-1, 64), (64, 128), (128, math.inf)]


def test_location_inside_box_gets_its_class_and_ltrb_distances():
    labels, targets = _assign([[[30, 20], [5, 5]]], [[10, 10, 50, 40]], [2])
    assert labels.tolist() == [2, BG]
    assert targets[0].tolist() == [20, 10, 20, 20]


def test_center_sampling_square_is_clipped_to_the_box():
    # Box 100 x 20 centered at (50, 10); stride 8 * radius 1.5 = 12: the square spans
    # x in (38, 62) and y in (-2, 22), clipped by the box to y in (0, 20).
    points = [[[44, 2], [61, 19], [37, 10], [63, 10], [50, 21]]]
    labels, _ = _assign(points, [[0, 0, 100, 20]], [1], radius=1.5)
    assert labels.tolist() == [1, 1, BG, BG, BG]


def test_size_ranges_are_inclusive_at_both_ends():
    # The location of each level has largest distance exactly 64 to the box.
    box = [[0, 0, 128, 40]]
    ranges = [(-1, 64), (64, 128)]
    labels, _ = _assign([[[64, 20]], [[64, 20]]], box, [3], strides=(8, 16), ranges=ranges)
    assert labels.tolist() == [3, 3]
    labels, _ = _assign([[[64, 20]]], box, [3], ranges=[(-1, 63.99)])
    assert labels.tolist() == [BG]


def test_smallest_box_wins_and_equal_areas_keep_the_first():
    boxes = [[0, 0, 100, 100], [20, 20, 60, 60], [30, 30, 70, 70]]  # areas 10000, 1600, 1600
    labels, targets = _assign([[[40, 40], [10, 10]]], boxes, [0, 1, 2])
    assert labels.tolist() == [1, 0]
    assert targets[0].tolist() == [20, 20, 20, 20]


def test_image_without_boxes_is_all_background():
    labels, targets = assign_targets(
        [torch.tensor([[4.0, 4.0], [12.0, 4.0]])], [torch.zeros((0, 4))],
        [torch.zeros((0,), dtype=torch.int64)], strides=[8], size_ranges=[(-1, math.inf)],
        center_sampling_radius=1.5, num_classes=BG, norm_reg_targets=True)
    assert labels.tolist() == [[BG, BG]]
    assert targets.shape == (1, 2, 4) and not targets.any()


def test_normalized_targets_are_in_stride_units():
    _, targets = _assign([[[30, 20]]], [[10, 10, 50, 40]], [2], strides=(16,), norm=True)
    assert targets[0].tolist() == [20 / 16, 10 / 16, 20 / 16, 20 / 16]


def test_matches_name_the_box_each_positive_was_assigned_and_minus_one_for_background():
    from fcos_d2.modeling.assignment import assign_targets_with_matches

    # (30, 20) lies in both boxes and takes the smaller (index 1); the others in box 0 only.
    boxes = torch.tensor([[0.0, 0.0, 100.0, 100.0], [10.0, 10.0, 50.0, 40.0]])
    labels, _, matched = assign_targets_with_matches(
        [torch.tensor([[30.0, 20.0], [5.0, 5.0], [80.0, 80.0]])], [boxes, boxes[:0]],
        [torch.tensor([3, 2]), torch.tensor([], dtype=torch.int64)], strides=(8,),
        size_ranges=((-1, math.inf),), center_sampling_radius=0.0, num_classes=BG,
        norm_reg_targets=False)
    assert labels.tolist() == [[2, 3, 3], [BG, BG, BG]]
    assert matched.tolist() == [[1, 0, 0], [-1, -1, -1]]


def test_a_batch_of_unequal_box_counts_assigns_each_image_as_if_alone():
    """The images are assigned together, their boxes padded to the largest count: padding
    is never matched, and an image without boxes keeps zero targets."""
    from fcos_d2.modeling.assignment import assign_targets_with_matches

    points = [torch.tensor([[30.0, 20.0], [5.0, 5.0], [80.0, 80.0]])]
    boxes = [torch.tensor([[0.0, 0.0, 100.0, 100.0], [10.0, 10.0, 50.0, 40.0]]),
             torch.tensor([[0.0, 0.0, 40.0, 30.0]]), torch.zeros((0, 4))]
    classes = [torch.tensor([3, 2]), torch.tensor([1]), torch.zeros((0,), dtype=torch.int64)]
    options = dict(strides=(8,), size_ranges=((-1, math.inf),), center_sampling_radius=0.0,
                   num_classes=BG, norm_reg_targets=False)
    labels, targets, matched = assign_targets_with_matches(points, boxes, classes, **options)
    assert labels.tolist() == [[2, 3, 3], [1, 1, BG], [BG, BG, BG]]
    assert matched.tolist() == [[1, 0, 0], [0, 0, -1], [-1, -1, -1]]
    # (30, 20) in box [0, 0, 40, 30]: l, t, r, b = 30, 20, 10, 10
    assert targets[1, 0].tolist() == [30, 20, 10, 10] and not targets[2].any()
    for i in range(3):  # each image alone gives the same
        alone = assign_targets_with_matches(points, boxes[i:i + 1], classes[i:i + 1], **options)
        assert all(torch.equal(a[0], b[i]) for a, b in zip(alone, (labels, targets, matched)))
