"""Box and mask AP per object size from a run's saved detections (the mask benchmark,
``benchmarks.masks``).

COCO's small / medium / large split areas at 32² and 96² pixels; on 128-px images nearly
every object is "small". The sizes here are the mask cap tool's
(``fcos_d2.modeling.sipmask.mask_cap.SIZE_BINS``: the box's longer side under 16 px,
16-32, 32-64, over 64, and all), so that a trained model's AP per size reads beside the cap
of the same size. pycocotools does the scoring; only the size each object counts under
changes: the ``area`` of every ground truth and every detection is set to the square of
its box's longer side before ``COCOeval`` runs, and the area ranges are the bins squared.
A ground truth outside a bin is ignored in that bin, and so is an unmatched detection
outside it, as COCOeval treats its own area ranges.
"""
import contextlib
import io
import json
import math
from pathlib import Path
from typing import Dict, List

from fcos_d2.modeling.sipmask.mask_cap import SIZE_BINS, SIZE_LABELS

RESULTS_FILE = "coco_instances_results.json"  # in OUTPUT_DIR/inference/<dataset>/
IOU_TYPES = {"box": "bbox", "mask": "segm"}


def _longer_side_area(annotation: dict) -> float:
    _, _, width, height = annotation["bbox"]
    return float(max(width, height)) ** 2


def load_truth(truth_json: Path):
    """pycocotools' COCO of ``truth_json`` with each object's ``area`` its box's longer side
    squared (read once, scored against as often as needed)."""
    from pycocotools.coco import COCO

    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its progress
        truth = COCO(str(truth_json))
        for annotation in truth.dataset["annotations"]:
            annotation["area"] = _longer_side_area(annotation)
        truth.createIndex()
    return truth


def ap_by_size(truth, detections: List[dict], iou_type: str) -> Dict[str, float]:
    """{size label: AP x 100} of ``detections`` (COCO result dicts) against ``truth`` (a
    COCO file, or ``load_truth``'s answer), ``iou_type`` "bbox" or "segm"; NaN for a bin
    without ground truth, 0 everywhere without detections."""
    import numpy as np
    from pycocotools.cocoeval import COCOeval

    if not hasattr(truth, "loadRes"):
        truth = load_truth(truth)
    if not detections:
        return {label: 0.0 for label in SIZE_LABELS}
    with contextlib.redirect_stdout(io.StringIO()):
        found = truth.loadRes([{k: v for k, v in d.items() if k != "area"} for d in detections])
        for annotation in found.dataset["annotations"]:
            annotation["area"] = _longer_side_area(annotation)
        found.createIndex()
        evaluation = COCOeval(truth, found, iou_type)
        evaluation.params.areaRng = [[low ** 2, min(high, 1e5) ** 2] for low, high in SIZE_BINS]
        evaluation.params.areaRngLbl = list(SIZE_LABELS)
        evaluation.evaluate()
        evaluation.accumulate()
    # precision: (IoU thresholds, recall points, classes, area ranges, max detections)
    precision = evaluation.eval["precision"][:, :, :, :, -1]
    aps = {}
    for index, label in enumerate(SIZE_LABELS):
        values = precision[:, :, :, index]
        values = values[values > -1]
        aps[label] = float(100 * np.mean(values)) if values.size else math.nan
    return aps


def run_by_size(run_dir: Path, dataset_name: str) -> Dict[str, Dict[str, float]]:
    """{"box": {size: AP}, "mask": {size: AP}} on ``dataset_name`` of the run in
    ``run_dir`` from its saved detections (``RESULTS_FILE``, written by detectron2's
    COCOEvaluator); a box-only file gives no "mask"."""
    path = run_dir / "inference" / dataset_name / RESULTS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"benchmarks.masks: {path} is missing: the run saved no "
                                "detections (its evaluation did not run or OUTPUT_DIR moved)")
    detections, truth = json.loads(path.read_text()), load_truth(truth_file(dataset_name))
    scores = {"box": ap_by_size(truth, detections, "bbox")}
    if not detections or "segmentation" in detections[0]:
        scores["mask"] = ap_by_size(truth, detections, "segm")
    return scores


def truth_file(dataset_name: str) -> Path:
    """The COCO annotation file of a registered dataset (its metadata's ``json_file``)."""
    from detectron2.data import DatasetCatalog, MetadataCatalog

    DatasetCatalog.get(dataset_name)  # registers lazily made splits' files
    return Path(MetadataCatalog.get(dataset_name).json_file)
