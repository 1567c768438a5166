"""COCO files as users bring them: category ids that are not 1..K (here 90, 1, 5, listed in
that order), images without annotation, and test sets without any annotation train and
evaluate, and the per-category AP is reported under the right class names."""
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from detectron2.config import get_cfg
from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.evaluation import COCOEvaluator
from detectron2.structures import Boxes, Instances
from PIL import Image

from fcos_d2 import add_fcos_config, compat
from fcos_d2.data.register import register_coco_dataset

REPO = Path(__file__).resolve().parents[2]
CATEGORIES = [{"id": 90, "name": "zebra"}, {"id": 1, "name": "ant"}, {"id": 5, "name": "bee"}]
CLASSES = ["ant", "bee", "zebra"]  # 0-based classes: category ids in increasing order
SIZE = 64
# image id -> [(category id, XYWH box)]; image 3 has no annotation
OBJECTS = {1: [(90, [4, 4, 20, 28]), (1, [30, 8, 12, 12]), (5, [36, 36, 24, 20])],
           2: [(5, [10, 30, 30, 30]), (1, [40, 2, 16, 16])],
           3: []}


def write_coco(folder: Path, objects, *, annotations_key: bool = True) -> Path:
    """A COCO dataset of SIZE x SIZE images, a filled rectangle of a class colour per box."""
    (folder / "images").mkdir(parents=True)
    images, annotations = [], []
    for image_id, boxes in objects.items():
        pixels = np.full((SIZE, SIZE, 3), 40, dtype=np.uint8)
        for category_id, (x, y, w, h) in boxes:
            pixels[y:y + h, x:x + w] = [category_id * 2, 250 - category_id, 128]
            annotations.append({"id": len(annotations) + 1, "image_id": image_id, "iscrowd": 0,
                                "category_id": category_id, "bbox": [x, y, w, h], "area": w * h})
        Image.fromarray(pixels).save(folder / "images" / f"{image_id}.png")
        images.append({"id": image_id, "file_name": f"{image_id}.png", "height": SIZE,
                       "width": SIZE})
    coco = {"images": images, "categories": CATEGORIES}
    if annotations_key:
        coco["annotations"] = annotations
    (folder / "annotations.json").write_text(json.dumps(coco))
    return folder


def register(name: str, folder: Path) -> str:
    register_coco_dataset(name, str(folder / "annotations.json"), str(folder / "images"))
    return name


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """'odd_ids_train' (images 1-3), 'odd_ids_val' (the same with every box as a prediction),
    and two test sets without annotations: an empty list, and no "annotations" key."""
    root = tmp_path_factory.mktemp("coco_edge_cases")
    names = [register("odd_ids_train", write_coco(root / "train", OBJECTS)),
             register("no_annotations", write_coco(root / "test", {7: [], 8: []})),
             register("no_annotations_key",
                      write_coco(root / "test_no_key", {9: []}, annotations_key=False))]
    yield names
    for name in names:
        DatasetCatalog.remove(name)
        MetadataCatalog.remove(name)


def test_non_contiguous_category_ids_become_0_based_classes_in_id_order(datasets):
    dicts = DatasetCatalog.get("odd_ids_train")
    assert MetadataCatalog.get("odd_ids_train").thing_classes == CLASSES
    assert [[a["category_id"] for a in d["annotations"]] for d in dicts] == [[2, 0, 1], [1, 0], []]


def evaluate(dataset: str, predictions, output_dir: Path):
    """COCOEvaluator's bbox results for `predictions`: image id -> [(class, XYXY box)]."""
    DatasetCatalog.get(dataset)  # fills the id mapping of the metadata, as training does
    evaluator = COCOEvaluator(dataset, tasks=("bbox",), output_dir=str(output_dir),
                              use_fast_impl=compat.HAS_D2_EXTENSION)
    evaluator.reset()
    for image_id, detections in predictions.items():
        instances = Instances((SIZE, SIZE))
        instances.pred_boxes = Boxes(torch.tensor([box for _, box in detections],
                                                  dtype=torch.float32).reshape(-1, 4))
        instances.pred_classes = torch.tensor([c for c, _ in detections], dtype=torch.int64)
        instances.scores = torch.ones(len(detections))
        evaluator.process([{"image_id": image_id}], [{"instances": instances}])
    return evaluator.evaluate()["bbox"]


def test_per_category_ap_is_reported_under_the_right_class_names(datasets, tmp_path):
    """Every bee is found exactly; every ant is found but called a zebra."""
    index = {c["id"]: CLASSES.index(c["name"]) for c in CATEGORIES}
    predictions = {
        image_id: [(index[5] if category == 5 else index[90], [x, y, x + w, y + h])
                   for category, (x, y, w, h) in boxes if category != 90]
        for image_id, boxes in OBJECTS.items()}
    results = evaluate("odd_ids_train", predictions, tmp_path)
    assert results["AP-bee"] == pytest.approx(100.0)
    assert results["AP-ant"] == 0.0  # no ant predicted
    assert results["AP-zebra"] == 0.0  # two false zebras, the one zebra missed


def tiny_cfg(output_dir: Path):
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(str(REPO / "configs/quickstart.yaml"))
    cfg.merge_from_list([
        "MODEL.DEVICE", "cpu", "MODEL.FPN.OUT_CHANNELS", 32, "MODEL.FCOS.NUM_CONVS", 1,
        "MODEL.FCOS.NUM_CLASSES", 3, "MODEL.FCOS.INFERENCE_TH_TEST", 0.0,
        "DATASETS.TRAIN", ("odd_ids_train",),
        "DATASETS.TEST", ("odd_ids_train", "no_annotations", "no_annotations_key"),
        "DATALOADER.FILTER_EMPTY_ANNOTATIONS", False, "DATALOADER.NUM_WORKERS", 0,
        "SOLVER.IMS_PER_BATCH", 3, "SOLVER.MAX_ITER", 2, "SOLVER.WARMUP_ITERS", 1,
        "SOLVER.CHECKPOINT_PERIOD", 100, "TEST.EVAL_PERIOD", 0,
        "INPUT.MIN_SIZE_TRAIN", (SIZE,), "INPUT.MAX_SIZE_TRAIN", SIZE,
        "INPUT.MIN_SIZE_TEST", SIZE, "INPUT.MAX_SIZE_TEST", SIZE, "OUTPUT_DIR", str(output_dir)])
    return cfg


def test_training_with_odd_ids_and_an_empty_image_evaluates_every_test_set(datasets, tmp_path):
    from fcos_d2.engine.trainer import Trainer

    trainer = Trainer(tiny_cfg(tmp_path))
    trainer.resume_or_load(resume=False)
    trainer.train()  # 2 iterations (batches of all 3 images), then the final evaluation
    assert trainer.iter == 2  # iterations done
    latest = {k: v for k, (v, _) in trainer.storage.latest().items()}
    losses = [v for k, v in latest.items() if k.startswith("loss_")]
    assert len(losses) == 3 and all(math.isfinite(v) for v in losses)
    for name in ("odd_ids_train", "no_annotations"):  # the evaluation hook's metrics
        per_category = {k for k in latest if k.startswith(f"{name}/bbox/AP-")}
        assert per_category == {f"{name}/bbox/AP-{c}" for c in CLASSES}
    assert math.isnan(latest["no_annotations/bbox/AP"])  # no ground truth, nothing to score
    assert not any(k.startswith("no_annotations_key/") for k in latest)  # evaluated: no metric
    assert (tmp_path / "inference/no_annotations_key/coco_instances_results.json").is_file()
    summary = (tmp_path / "inference/odd_ids_train/summary.txt").read_text()
    assert [line.split()[0] for line in summary.splitlines()[-4:-1]] == CLASSES
