"""benchmarks.masks by object size and re-evaluation: AP per longer-side bin on hand-made
detections, the stored runs scored again, and the tables that show both."""
import json
import math

import pytest
import torch

from benchmarks import tables
from benchmarks.masks import cli as mq, reevaluate as stored, sizes
from fcos_d2.modeling.sipmask.mask_cap import SIZE_LABELS


def _box(x, y, w, h):
    return [float(x), float(y), float(w), float(h)]


@pytest.fixture
def truth_json(tmp_path):
    """Two 64x64 images: a 10-px object (image 1) and a 40 x 20 px one (image 2)."""
    images = [{"id": i, "width": 64, "height": 64, "file_name": f"{i}.png"} for i in (1, 2)]
    objects = [(1, _box(5, 5, 10, 8)), (2, _box(10, 10, 40, 20))]
    annotations = [{"id": k + 1, "image_id": image, "category_id": 1, "bbox": bbox,
                    "area": bbox[2] * bbox[3], "iscrowd": 0}
                   for k, (image, bbox) in enumerate(objects)]
    path = tmp_path / "truth.json"
    path.write_text(json.dumps({"images": images, "annotations": annotations,
                                "categories": [{"id": 1, "name": "shape"}]}))
    return path


def test_ap_by_size_counts_each_object_under_its_longer_side(truth_json):
    small_found = {"image_id": 1, "category_id": 1, "bbox": _box(5, 5, 10, 8), "score": 0.9}
    aps = sizes.ap_by_size(truth_json, [small_found], "bbox")
    assert list(aps) == list(SIZE_LABELS)
    assert aps["< 16 px"] == pytest.approx(100.0)
    assert aps["32-64 px"] == pytest.approx(0.0)  # the 40-px object is missed
    assert math.isnan(aps["16-32 px"]) and math.isnan(aps["> 64 px"])  # no object there
    assert aps["all"] == pytest.approx(100 * 51 / 101)  # half the recall: 51 of 101 points


def test_an_unmatched_detection_of_another_size_is_ignored_in_a_bin(truth_json):
    small_found = {"image_id": 1, "category_id": 1, "bbox": _box(5, 5, 10, 8), "score": 0.5}
    large_wrong = {"image_id": 1, "category_id": 1, "bbox": _box(20, 20, 40, 40), "score": 0.9}
    aps = sizes.ap_by_size(truth_json, [small_found, large_wrong], "bbox")
    assert aps["< 16 px"] == pytest.approx(100.0)  # the 40-px false positive is not small
    assert aps["all"] < 100 * 51 / 101  # but it ranks first among all sizes
    assert sizes.ap_by_size(truth_json, [], "bbox")["all"] == 0.0


def test_assignments_parse_and_bad_ones_name_the_item():
    assert stored.parse_assignments(["MODEL.SIPMASK.MASK_THRESHOLD=0.5", "A.B=x=y"]) == \
        ["MODEL.SIPMASK.MASK_THRESHOLD", "0.5", "A.B", "x=y"]
    with pytest.raises(ValueError, match="'MODEL.SIPMASK.MASK_THRESHOLD' is not KEY=VALUE"):
        stored.parse_assignments(["MODEL.SIPMASK.MASK_THRESHOLD"])


def test_a_stored_run_is_scored_by_size_and_reevaluated_with_a_changed_key(
        tmp_path, monkeypatch, records_dir):
    monkeypatch.setenv("FCOS_D2_DATASETS_CACHE", str(tmp_path / "cache"))
    tiny = mq.val_dataset(2)
    run_dir = tmp_path / "out" / "runs" / "sipmask-0"
    opts = ["DATASETS.TRAIN", f"('{tiny}',)", "SOLVER.IMS_PER_BATCH", 2,
            "MODEL.FPN.OUT_CHANNELS", 32, "MODEL.FCOS.INFERENCE_TH_TEST", 0.0]
    threads = torch.get_num_threads()
    try:
        row = mq.run_one("sipmask", 0, str(run_dir), 2, opts, val_images=2)
        runs = stored.stored_runs(tmp_path / "out", ["sipmask", "mask-rcnn"], [0, 1])
        assert runs == [("sipmask", 0, run_dir)]
        (again,) = stored.reevaluate(tmp_path / "out", runs,
                                     ["MODEL.SIPMASK.MASK_THRESHOLD", "0.9"], 2, "cmd", opts,
                                     lambda *a: mq.setup_cfg(*a, val_images=2))
    finally:
        torch.set_num_threads(threads)
    assert row["mask_by_size"]["all"] == pytest.approx(row["mask"]["AP"])  # pycocotools' AP
    assert row["box_by_size"]["all"] == pytest.approx(row["box"]["AP"])
    assert again["run"] == {"kind": "reevaluate", "contender": "sipmask", "iters": 2,
                            "mask_regime": "quickstart"}
    assert again["overrides"][-2:] == ["MODEL.SIPMASK.MASK_THRESHOLD", "0.9"]
    assert again["metrics"]["box"]["AP"] == pytest.approx(row["box"]["AP"])  # boxes unchanged
    assert set(again["metrics"]["mask_by_size"]) == set(SIZE_LABELS)
    (written,) = [json.loads(line) for line in open(records_dir / "masks.jsonl")]
    assert json.dumps(written["metrics"], sort_keys=True) == \
        json.dumps(again["metrics"], sort_keys=True)  # (NaN for a size without objects)


def _record(seed, kind, mask_all, **run):
    metrics = {"mask_by_size": {"< 16 px": mask_all / 2, "all": mask_all},
               "box_by_size": {"< 16 px": 1.0, "all": 2.0}}
    if kind != "by_size":
        metrics.update(mask={"AP": mask_all}, box={"AP": 2.0})
    return {"benchmark": "masks", "seed": seed, "overrides": [], "metrics": metrics,
            "commit": "abcdef0123", "cpu": {"model": "test cpu"}, "dirty": False,
            "run": {"contender": "sipmask", "iters": 10, **({"kind": kind} if kind else {})}}


def test_the_tables_order_sizes_as_the_mask_cap_does():
    assert tables.SIZE_ORDER == SIZE_LABELS


def test_masks_table_shows_trained_reevaluated_and_by_size_rows():
    numbered = [(1, _record(0, None, 40.0)), (2, _record(1, None, 50.0)),
                (3, _record(0, "by_size", 44.0)),  # a later scoring of seed 0 wins
                (4, _record(0, "reevaluate", 60.0))]
    text = "\n".join(tables.masks_table(numbered))
    assert "| quickstart | sipmask | trained | none | 10 | 0, 1 | 45.0 / 7.1 |" in text
    assert "| quickstart | sipmask | re-evaluated | none | 10 | 0 | 60.0 / n/a |" in text
    assert ("| quickstart | sipmask | trained | none | 10 | 0, 1 | 23.5 | 47.0 | 1.0 | 2.0 | "
            "abcdef0 | test cpu | 3, 2 |") in text
