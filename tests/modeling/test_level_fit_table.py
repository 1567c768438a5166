"""The level-fit table, its warnings and the levels chosen from box sizes, on boxes whose
positives are worked out by hand (fcos_d2.modeling.level_fit, level_choice)."""
import numpy as np
import pytest

from fcos_d2.modeling.level_choice import choose_levels
from fcos_d2.modeling.level_fit import (ImageBoxes, bin_rows, fit_warnings, format_fit_table,
                                        image_positives, measure_fit)

# One 64x64 image. P3 (stride 8) has locations at 4, 12, ..., 60; P4 (stride 16) at 8, 24,
# 40, 56; P3 takes largest distances up to 32, P4 from 32; center radius 1 stride.
# A [0, 0, 16, 16]: P3 locations 4 and 12 on each axis lie in its center region (4
# positives, largest distance 12); P4's (8, 8) has distance 8, outside P4's range.
# B [16, 0, 64, 64]: P4 locations x 40, y 24 and 40 (2 positives, distance 40); its P3
# locations in the region all have distances of 36, outside P3's range.
# C [30, 50, 34, 54], 4 px inside B: no location of either level lies strictly inside it.
IMAGE = ImageBoxes(64, 64, np.array([[0, 0, 16, 16], [16, 0, 64, 64], [30, 50, 34, 54]],
                                    dtype=np.float64))
TWO_LEVELS = dict(levels=["p3", "p4"], strides=[8, 16], sizes_of_interest=[32],
                  center_sampling_radius=1.0)


def test_positives_per_box_and_level_are_the_assignments():
    counts = image_positives(IMAGE, strides=[8, 16], sizes_of_interest=[32],
                             center_sampling_radius=1.0)
    assert counts.tolist() == [[4, 0], [0, 2], [0, 0]]


def test_table_rows_give_levels_positives_and_shares_by_size():
    fit = measure_fit([IMAGE], **TWO_LEVELS)
    rows = {row["bin"]: row for row in bin_rows(fit)}
    assert sorted(rows) == ["16-32", "64-128", "< 16", "all"]  # A is 16 px, B 64, C 4
    assert rows["< 16"]["none"] == 1.0 and rows["< 16"]["levels"]["none"] == 1.0
    assert rows["16-32"]["levels"]["p3"] == 1.0 and rows["16-32"]["median_positives"] == 4
    assert rows["64-128"]["levels"]["p4"] == 1.0 and rows["64-128"]["median_positives"] == 2
    assert rows["all"]["objects"] == 3 and rows["all"]["median_positives"] == 2
    assert rows["all"]["none"] == pytest.approx(1 / 3) and rows["all"]["one"] == 0.0
    table = format_fit_table(fit)
    assert "| 16-32 | 1 | 100% | - | - | 4 | - | - |" in table
    assert "| all | 3 | 33% | 33% | 33% | 2 | 33% | - |" in table


def test_warnings_name_the_keys_to_change():
    warnings = fit_warnings(measure_fit([IMAGE], **TWO_LEVELS))
    assert len(warnings) == 1  # C gets no positive; both levels hold objects
    assert "33% of the objects get no positive location" in warnings[0]
    assert "< 16 px: 100%" in warnings[0]
    assert "MODEL.FCOS.SIZES_OF_INTEREST" in warnings[0]
    # a P5 above P4 whose range starts at 64: B's distance of 40 stays on P4
    three = measure_fit([IMAGE], levels=["p3", "p4", "p5"], strides=[8, 16, 32],
                        sizes_of_interest=[32, 64], center_sampling_radius=1.0)
    empty = [w for w in fit_warnings(three) if "get no objects" in w]
    assert len(empty) == 1 and empty[0].startswith("level(s) p5 ")
    assert "MODEL.FCOS.IN_FEATURES" in empty[0]


def test_single_positive_objects_ask_for_a_finer_level():
    # 10-px boxes centered between P3 locations: the center region (+-8 px clipped to the
    # box) holds one location per axis
    boxes = np.array([[x, 20, x + 10, 30] for x in (0, 32)], dtype=np.float64)
    fit = measure_fit([ImageBoxes(64, 64, boxes)], **TWO_LEVELS)
    assert fit.positives.sum(axis=1).tolist() == [1, 1]
    (warning,) = [w for w in fit_warnings(fit) if "single" in w]  # (and P4 holds none)
    assert "single positive location (< 16 px: 100%)" in warning
    assert "a finer level than p3" in warning and "res2 gives p2" in warning


def test_no_boxes_says_so():
    fit = measure_fit([ImageBoxes(64, 64, np.zeros((0, 4)))], **TWO_LEVELS)
    assert fit_warnings(fit) == ["the training set has no boxes: nothing to fit the levels to"]


def test_levels_chosen_from_a_hand_made_size_distribution():
    # a tenth of the objects 8 px: P2's 4-px stride spans them twice; the largest, 120 px,
    # reach 60 px from their center: P4's range (above 4 x 8 = 32) holds them
    sides = [8.0] * 20 + [20.0] * 70 + [120.0] * 10
    assert choose_levels(sides) == (["p2", "p3", "p4"], [16.0, 32.0])
    # 100-px objects: the coarsest level they span twice is P5 (32 px), which holds them all
    assert choose_levels([100.0] * 10) == (["p5"], [])
    # without P2 the finest level available is the first
    no_p2 = {f"p{i}": 2 ** i for i in range(3, 8)}
    assert choose_levels([8.0] * 10 + [300.0], available=no_p2, large_quantile=1.0) == \
        (["p3", "p4", "p5", "p6"], [32.0, 64.0, 128.0])


def test_choose_levels_refuses_no_boxes():
    with pytest.raises(ValueError, match="no boxes"):
        choose_levels([])
