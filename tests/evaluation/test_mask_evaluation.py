"""Mask evaluation: with MODEL.MASK_ON, the library Trainer scores boxes ("bbox") and
masks ("segm") with COCOEvaluator and writes both to summary.txt; test-time augmentation
scores a mask model's boxes and its voted masks.

The segm case is a tiny COCO set scored against hand-made predictions, its AP computed by
hand: two 20 x 20 images, one 10 x 10 square each (a polygon in image 1, RLE in image 2).
Both predicted boxes are exact. Image 1's predicted mask misses 22 of the square's 100
pixels (mask IoU 0.78) and scores higher; image 2's mask is exact. For the IoU thresholds
0.50 ... 0.75 both masks match: AP 1. For 0.80 ... 0.95 image 1's mask is a false positive
ranked first, so the precision is 1/2 up to recall 1/2 and nothing beyond: COCO's 101-point
AP is 51 * 0.5 / 101. Mask AP = (6 * 1 + 4 * 25.5 / 101) / 10; AP50 = AP75 = 100.
"""
import json

import numpy as np
import pytest
import torch
from PIL import Image

from detectron2.config import get_cfg
from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.structures import Boxes, Instances

from fcos_d2 import add_fcos_config
from fcos_d2.data import register_coco_dataset
from fcos_d2.data.masks import mask_to_rle
from fcos_d2.evaluation import format_summary, summary_path

NAME = "tiny_masks_for_evaluation"
SIZE = 20
EXPECTED_MASK_AP = 100 * (6 + 4 * 25.5 / 101) / 10  # 70.099...


def _square(y0: int, x0: int) -> np.ndarray:
    mask = np.zeros((SIZE, SIZE), dtype=bool)
    mask[y0:y0 + 10, x0:x0 + 10] = True
    return mask


@pytest.fixture(scope="module")
def tiny_masks(tmp_path_factory):
    """Registers the two-image set; yields its folder."""
    folder = tmp_path_factory.mktemp("tiny_masks")
    (folder / "images").mkdir()
    for name in ("1.png", "2.png"):
        Image.fromarray(np.full((SIZE, SIZE, 3), 128, np.uint8)).save(folder / "images" / name)
    square_polygon = [[0, 0, 10, 0, 10, 10, 0, 10]]  # pixels 0..9: same as _square(0, 0)
    coco = {"images": [{"id": i, "file_name": f"{i}.png", "height": SIZE, "width": SIZE}
                       for i in (1, 2)],
            "categories": [{"id": 1, "name": "square"}],
            "annotations": [
                {"id": 1, "image_id": 1, "category_id": 1, "iscrowd": 0, "area": 100,
                 "bbox": [0, 0, 10, 10], "segmentation": square_polygon},
                {"id": 2, "image_id": 2, "category_id": 1, "iscrowd": 0, "area": 100,
                 "bbox": [10, 10, 10, 10],
                 "segmentation": mask_to_rle(_square(10, 10))}]}
    (folder / "coco.json").write_text(json.dumps(coco))
    register_coco_dataset(NAME, str(folder / "coco.json"), str(folder / "images"))
    yield folder
    DatasetCatalog.remove(NAME)
    MetadataCatalog.remove(NAME)


def _prediction(box, mask: np.ndarray, score: float) -> Instances:
    return Instances((SIZE, SIZE), pred_boxes=Boxes(torch.tensor([box], dtype=torch.float32)),
                     scores=torch.tensor([score]), pred_classes=torch.tensor([0]),
                     pred_masks=torch.from_numpy(mask)[None])  # (1, H, W) bool


class HandMadePredictions(torch.nn.Module):
    """A "model" that answers each image id with fixed detections."""

    def __init__(self):
        super().__init__()
        partial = _square(0, 0)
        partial[0:2, 0:10] = partial[2, 0:2] = False  # 22 pixels missed: IoU 78 / 100
        self.by_image_id = {1: _prediction([0, 0, 10, 10], partial, 0.9),
                            2: _prediction([10, 10, 20, 20], _square(10, 10), 0.8)}

    def forward(self, batched_inputs):
        return [{"instances": self.by_image_id[x["image_id"]]} for x in batched_inputs]


def _cfg(tmp_path, mask_on: bool, *opts: str, base: str = ""):
    cfg = get_cfg()
    add_fcos_config(cfg)
    if base:
        cfg.merge_from_file(base)
    cfg.merge_from_list(["MODEL.DEVICE", "cpu", "MODEL.MASK_ON", str(mask_on),
                         "MODEL.FCOS.NUM_CLASSES", "1", "DATASETS.TEST", f"('{NAME}',)",
                         "INPUT.MIN_SIZE_TEST", str(SIZE), "DATALOADER.NUM_WORKERS", "0",
                         "OUTPUT_DIR", str(tmp_path), *opts])
    return cfg


def test_mask_on_scores_boxes_and_masks_to_the_hand_computed_ap(tiny_masks, tmp_path):
    from fcos_d2.engine.trainer import Trainer

    results = Trainer.test(_cfg(tmp_path, True), HandMadePredictions(), iterations=5)
    assert results["bbox"]["AP"] == pytest.approx(100.0)
    segm = results["segm"]
    assert segm["AP"] == pytest.approx(EXPECTED_MASK_AP, abs=1e-6)
    assert segm["AP50"] == pytest.approx(100.0) and segm["AP75"] == pytest.approx(100.0)
    lines = open(summary_path(str(tmp_path), NAME)).read().splitlines()
    assert lines[1].split() == ["task", "AP", "AP50", "AP75", "APs", "APm", "APl"]
    assert lines[2].split()[:4] == ["bbox", "100.00", "100.00", "100.00"]
    assert lines[3].split()[:4] == ["segm", f"{EXPECTED_MASK_AP:.2f}", "100.00", "100.00"]


def test_without_mask_on_only_boxes_are_scored(tiny_masks, tmp_path):
    from fcos_d2.engine.trainer import Trainer

    results = Trainer.test(_cfg(tmp_path, False), HandMadePredictions(), iterations=5)
    assert set(results) == {"bbox"}
    lines = open(summary_path(str(tmp_path), NAME)).read().splitlines()
    assert lines[1].split() == ["AP", "AP50", "AP75", "APs", "APm", "APl"]  # box-only block


def test_summary_with_masks_has_a_row_per_task_and_a_column_per_task_per_category():
    import datetime

    bbox = {"AP": 52.13, "AP50": 80.0, "AP75": 55.5, "APs": 40.0, "APm": 60.25, "APl": 71.0,
            "AP-circle": 61.0, "AP-triangle": 43.25}
    segm = {"AP": 40.0, "AP50": 70.0, "AP75": 45.5, "APs": 30.0, "APm": 50.25,
            "APl": float("nan"), "AP-circle": 51.0, "AP-triangle": 33.25}
    block = format_summary("d", bbox, 200, time=datetime.datetime(2024, 6, 1, 12),
                           segm_results=segm)
    assert block == ("== d | iterations trained: 200 | 2024-06-01 12:00:00 ==\n"
                     "  task     AP   AP50   AP75    APs    APm    APl\n"
                     "  bbox  52.13  80.00  55.50  40.00  60.25  71.00\n"
                     "  segm  40.00  70.00  45.50  30.00  50.25    nan\n"
                     "  AP per category:   bbox   segm\n"
                     "    circle          61.00  51.00\n"
                     "    triangle        43.25  33.25\n"
                     "\n")


def test_tta_of_a_mask_model_scores_boxes_and_masks_as_plain_inference_on_one_copy(
        tiny_masks, tmp_path):
    from fcos_d2.engine.trainer import Trainer
    from fcos_d2 import get_config_file
    from mask_models import FCOSWithBoxMasks

    # untrained: every score is about PRIOR_PROB, so no threshold keeps detections coming
    cfg = _cfg(tmp_path, True, "TEST.AUG.ENABLED", "True", "TEST.AUG.MIN_SIZES", f"({SIZE},)",
               "TEST.AUG.FLIP", "False", "MODEL.FCOS.INFERENCE_TH_TEST", "0.0",
               base=get_config_file("quickstart.yaml"))
    torch.manual_seed(0)
    model = FCOSWithBoxMasks(cfg).eval()
    with torch.no_grad():  # every location a box about a stride from it on each side
        model.head.bbox_pred.bias.fill_(1.0)
    found = model([{"image": torch.zeros(3, SIZE, SIZE)}])[0]["instances"]
    assert len(found) and found.pred_masks.shape == (len(found), SIZE, SIZE)
    plain = Trainer.test(cfg, model, iterations=1)
    results = Trainer.test_with_TTA(cfg, model, iterations=1)
    assert set(results) == {"bbox_TTA", "segm_TTA"}
    assert plain["segm"]["AP"] > 0  # the equality below compares something
    # The only copy is the image itself: the same detections, so the same AP.
    for task in ("bbox", "segm"):
        assert results[f"{task}_TTA"]["AP"] == pytest.approx(plain[task]["AP"], abs=1e-9)
    blocks = open(summary_path(str(tmp_path), NAME)).read().split("\n\n")
    tta_block = next(b for b in blocks if f"== {NAME} [TTA] | iterations trained: 1 |" in b)
    assert "\n  segm " in tta_block
