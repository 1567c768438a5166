"""benchmarks.size_breakdown: per-size COCO metrics, found and named, on hand-made detections."""
import argparse

import pytest

from benchmarks.size_breakdown import breakdown, format_breakdowns, parse_run


def _gt():
    boxes = [[0, 0, 10, 10], [20, 20, 40, 30], [0, 40, 100, 50]]  # XYWH: 10, 40, 100 px
    return {"images": [{"id": 1, "height": 128, "width": 128}],
            "categories": [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}],
            "annotations": [{"id": i + 1, "image_id": 1, "bbox": b, "area": b[2] * b[3],
                             "category_id": 1 + (i == 2), "iscrowd": 0}
                            for i, b in enumerate(boxes)]}


def test_each_size_keeps_its_own_ap_and_counts():
    gt = _gt()
    # the 10-px object found with the wrong class, the 40-px one exactly, the 100-px one missed
    detections = [{"image_id": 1, "bbox": [0, 0, 10, 10], "category_id": 2, "score": 0.9},
                  {"image_id": 1, "bbox": [20, 20, 40, 30], "category_id": 1, "score": 0.8}]
    metrics = breakdown(gt, detections)
    by_size = metrics["by_size"]
    assert by_size["< 16"]["AP"] == 0.0 and metrics["by_size_agnostic"]["< 16"]["AP"] == \
        pytest.approx(100.0)
    assert by_size["32-64"]["AP"] == pytest.approx(100.0)  # 40x30: an area of 34.6^2
    assert by_size["> 64"]["AP"] == 0.0 and by_size["> 64"]["AR100"] == 0.0
    assert metrics["found_named"]["< 16"] == {"objects": 1, "found": 1.0, "named": 0.0}
    assert metrics["found_named"]["> 64"] == {"objects": 1, "found": 0.0, "named": 0.0}
    assert metrics["confusion"] == [[1, 1, 0], [0, 0, 1]]  # rows a, b; columns a, b, missed
    table = format_breakdowns([("x", metrics)])
    assert "| x | < 16 | 1 | 0.0 |" in table and "| x | 32-64 | 1 | 100.0 |" in table


def test_runs_are_name_colon_seed():
    assert parse_run("fcos-d2 recipe:2") == ("fcos-d2 recipe", 2, "fcos-d2 recipe")
    assert parse_run("fcos-d2 recipe:0@fcos-d2 recipe+sgd") == \
        ("fcos-d2 recipe", 0, "fcos-d2 recipe+sgd")
    with pytest.raises(argparse.ArgumentTypeError, match="NAME:SEED"):
        parse_run("fcos-d2 recipe")


def test_latencies_time_the_models_in_turn_image_by_image():
    from benchmarks.size_breakdown import latencies

    calls = []
    models = [lambda inputs, k=k: calls.append((k, int(inputs[0]["image"]))) for k in "ab"]
    ms = latencies(models, [1, 2], rounds=2)
    assert len(ms) == 2 and all(m >= 0 for m in ms)
    # a warm-up call each, then per image: a, b
    assert calls == [("a", 1), ("b", 1)] + [("a", 1), ("b", 1), ("a", 2), ("b", 2)] * 2
