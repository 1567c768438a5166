"""tools/detection_errors.py: objects found and named, the confusion matrix, class-agnostic AP."""
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "detection_errors.py"
spec = importlib.util.spec_from_file_location("detection_errors", TOOL)
detection_errors = importlib.util.module_from_spec(spec)
spec.loader.exec_module(detection_errors)

CATEGORIES = [{"id": 1, "name": "circle"}, {"id": 2, "name": "square"}, {"id": 3, "name": "ring"}]


def _gt() -> dict:
    # image 1: a 10-px circle and a 40-px square; image 2: a 70-px ring
    boxes = {1: [[0, 0, 10, 10, 1], [50, 50, 40, 30, 2]], 2: [[5, 5, 70, 60, 3]]}
    annotations = [{"id": 10 * image + k, "image_id": image, "bbox": b[:4], "category_id": b[4],
                    "area": b[2] * b[3], "iscrowd": 0}
                   for image, bs in boxes.items() for k, b in enumerate(bs)]
    return {"images": [{"id": i, "width": 128, "height": 128} for i in (1, 2)],
            "annotations": annotations, "categories": CATEGORIES}


def _det(image, box, category, score):
    return {"image_id": image, "bbox": box, "category_id": category, "score": score}


def test_best_covering_class_is_the_highest_scored_overlap():
    gt = np.array([[0, 0, 10, 10], [50, 50, 40, 30], [0, 100, 8, 8]], dtype=float)
    dets = np.array([[0, 0, 10, 10], [1, 1, 10, 10], [50, 50, 40, 30], [90, 90, 5, 5]], float)
    classes, scores = np.array([0, 1, 2, 1]), np.array([0.3, 0.9, 0.5, 0.99])
    out = detection_errors.best_covering_classes(gt, dets, classes, scores)
    # object 0: both first detections cover it (IoU 1 and 81/119 = 0.68); the 0.9 one wins;
    # object 1: only the third; object 2: nothing covers it (the 0.99 one lies elsewhere)
    assert out.tolist() == [1, 2, detection_errors.MISSED]


def test_error_table_counts_found_named_and_confusion():
    detections = [_det(1, [0, 0, 10, 10], 2, 0.8),    # circle called square
                  _det(1, [0, 0, 10, 10], 1, 0.6),    # ... also circle, lower score
                  _det(1, [50, 50, 40, 30], 2, 0.7)]  # square named; the ring is missed
    table = detection_errors.error_table(_gt(), detections)
    assert table["bins"]["< 16"] == (1, 1, 0)
    assert table["bins"]["32-64"] == (1, 1, 1)
    assert table["bins"]["> 64"] == (1, 0, 0)
    assert table["bins"]["all"] == (3, 2, 1)
    assert table["confusion"].tolist() == [[0, 1, 0, 0], [0, 1, 0, 0], [0, 0, 0, 1]]


def test_class_agnostic_ap_forgives_wrong_labels_only():
    gt = _gt()
    perfect = [_det(a["image_id"], a["bbox"], a["category_id"], 0.9) for a in gt["annotations"]]
    shifted = [dict(d, category_id=d["category_id"] % 3 + 1) for d in perfect]  # all wrong
    assert detection_errors.coco_box_ap(gt, perfect, use_categories=True) == pytest.approx(100)
    assert detection_errors.coco_box_ap(gt, shifted, use_categories=True) == pytest.approx(0)
    assert detection_errors.coco_box_ap(gt, shifted, use_categories=False) == pytest.approx(100)


def test_cli_prints_the_report_and_names_a_bad_category(tmp_path, capsys):
    gt_file, results = tmp_path / "gt.json", tmp_path / "results.json"
    gt_file.write_text(json.dumps(_gt()))
    results.write_text(json.dumps([_det(1, [0, 0, 10, 10], 1, 0.9)]))
    assert detection_errors.main(["--results", str(results), "--annotations", str(gt_file)]) == 0
    report = capsys.readouterr().out
    assert "| all | 3 | 33.3% | 33.3% |" in report
    assert "| circle | 1 | 0 | 0 | 0 |" in report
    results.write_text(json.dumps([_det(1, [0, 0, 10, 10], 7, 0.9)]))
    with pytest.raises(SystemExit, match=r"category_id \[7\]"):
        detection_errors.main(["--results", str(results), "--annotations", str(gt_file)])
