#!/usr/bin/env python
"""Where does a detector's AP go: finding the objects, or naming them?

Reads a COCO results file (``coco_instances_results.json``, which ``COCOEvaluator`` writes
into ``OUTPUT_DIR/inference/<dataset>/``) and the dataset's COCO annotations, and prints

- box AP with classes (COCO's) and class-agnostic (``useCats = 0``): the difference is
  what wrong class labels cost;
- per object size (the box's longer side, px): the fraction of objects that some
  detection covers at IoU >= 0.5 ("found"), and the fraction whose best-scored covering
  detection has the right class ("named");
- the confusion matrix of that best-scored covering detection (rows: the object's class,
  columns: the detection's class, last column: no covering detection).

Usage:
    python tools/detection_errors.py --results OUT/inference/synthetic_masks_val/coco_instances_results.json \
        --dataset synthetic_masks_val        # or --annotations path/to/instances.json
"""
import argparse
import contextlib
import io
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Sequence

import numpy as np


SIZE_BINS = (("< 16", 0, 16), ("16-32", 16, 32), ("32-64", 32, 64), ("> 64", 64, float("inf")),
             ("all", 0, float("inf")))
MISSED = -1


def best_covering_classes(gt_boxes: np.ndarray, det_boxes: np.ndarray, det_classes: np.ndarray,
                          det_scores: np.ndarray, *, iou_threshold: float = 0.5) -> np.ndarray:
    """One image: for each object (M, 4), the class of the highest-scored detection (K, 4)
    that overlaps it at IoU >= iou_threshold, or MISSED -> (M,) int."""
    out = np.full(len(gt_boxes), MISSED, dtype=np.int64)
    if len(gt_boxes) == 0 or len(det_boxes) == 0:
        return out
    from pycocotools import mask as mask_util  # its iou() takes COCO (x, y, w, h) boxes
    iou = mask_util.iou(gt_boxes.tolist(), det_boxes.tolist(), [0] * len(det_boxes))
    covering = np.asarray(iou).reshape(len(gt_boxes), len(det_boxes)) >= iou_threshold
    ranked = np.where(covering, det_scores[None], -np.inf)
    best = ranked.argmax(axis=1)
    found = covering.any(axis=1)
    out[found] = det_classes[best[found]]
    return out


def size_bin_masks(gt_boxes: np.ndarray) -> Dict[str, np.ndarray]:
    """(M, 4) boxes -> {bin name: (M,) bool} by the longer side."""
    side = gt_boxes[:, 2:].max(axis=1) if len(gt_boxes) else np.zeros(0)
    return {name: (side >= low) & (side < high) for name, low, high in SIZE_BINS}


def error_table(gt: dict, detections: List[dict], *, iou_threshold: float = 0.5) -> dict:
    """COCO annotations dict and results list -> {"bins": {name: (objects, found, named)},
    "confusion": (C, C + 1) int array over the categories in ``gt["categories"]`` order}."""
    category_ids = [c["id"] for c in gt["categories"]]
    index = {cid: i for i, cid in enumerate(category_ids)}
    objects, dets = defaultdict(list), defaultdict(list)
    for a in gt["annotations"]:
        if not a.get("iscrowd", 0):
            objects[a["image_id"]].append(a)
    for d in detections:
        dets[d["image_id"]].append(d)
    truth, predicted, boxes = [], [], []
    for image_id, anns in objects.items():
        gt_boxes = np.array([a["bbox"] for a in anns], dtype=np.float64).reshape(-1, 4)
        ds = dets.get(image_id, [])
        det_boxes = np.array([d["bbox"] for d in ds], dtype=np.float64).reshape(-1, 4)
        det_classes = np.array([index[d["category_id"]] for d in ds], dtype=np.int64)
        det_scores = np.array([d["score"] for d in ds], dtype=np.float64)
        predicted.append(best_covering_classes(gt_boxes, det_boxes, det_classes, det_scores,
                                               iou_threshold=iou_threshold))
        truth.append(np.array([index[a["category_id"]] for a in anns], dtype=np.int64))
        boxes.append(gt_boxes)
    none = np.zeros(0, np.int64)
    truth, predicted = np.concatenate([none, *truth]), np.concatenate([none, *predicted])
    boxes = np.concatenate([np.zeros((0, 4)), *boxes])
    bins = {name: (int(m.sum()), int((predicted[m] != MISSED).sum()),
                   int((predicted[m] == truth[m]).sum()))
            for name, m in size_bin_masks(boxes).items()}
    confusion = np.zeros((len(category_ids), len(category_ids) + 1), dtype=np.int64)
    np.add.at(confusion, (truth, np.where(predicted == MISSED, len(category_ids), predicted)), 1)
    return {"bins": bins, "confusion": confusion}


def coco_box_ap(gt: dict, detections: List[dict], *, use_categories: bool) -> float:
    """COCO box AP (0-100), with classes or class-agnostic."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval
    with contextlib.redirect_stdout(io.StringIO()):
        coco_gt = COCO()
        coco_gt.dataset = gt
        coco_gt.createIndex()
        if not detections:
            return 0.0
        evaluation = COCOeval(coco_gt, coco_gt.loadRes(detections), "bbox")
        evaluation.params.useCats = int(use_categories)
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    return 100.0 * float(evaluation.stats[0])


def format_report(table: dict, names: Sequence[str], ap: float, agnostic_ap: float) -> str:
    lines = [f"box AP {ap:.1f} with classes, {agnostic_ap:.1f} class-agnostic "
             f"(wrong labels cost {agnostic_ap - ap:.1f})", "",
             "| objects | count | found (IoU >= 0.5) | named (best-scored covering detection "
             "has the class) |", "| --- | --- | --- | --- |"]
    for name, (count, found, named) in table["bins"].items():
        share = (lambda k: f"{100.0 * k / count:.1f}%") if count else (lambda k: "-")
        lines.append(f"| {name} | {count} | {share(found)} | {share(named)} |")
    lines += ["", "confusion (rows: object's class; columns: best-scored covering detection's)",
              "| | " + " | ".join(list(names) + ["missed"]) + " |",
              "| --- " * (len(names) + 2) + "|"]
    for name, row in zip(names, table["confusion"]):
        lines.append(f"| {name} | " + " | ".join(str(v) for v in row) + " |")
    return "\n".join(lines)


def annotations_of(dataset: str) -> Path:
    """The COCO json of a registered dataset (the built-in synthetic sets are generated)."""
    import fcos_d2  # noqa: F401  (registers the built-in datasets)
    from detectron2.data import MetadataCatalog
    from fcos_d2.data.synthetic import is_synthetic, prepare_synthetic_shapes
    if is_synthetic(dataset):
        prepare_synthetic_shapes(dataset)
    json_file = MetadataCatalog.get(dataset).get("json_file", None)
    if not json_file:
        raise ValueError(f"--dataset {dataset}: no json_file in its metadata; "
                         f"pass --annotations instead")
    return Path(json_file)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", required=True, help="coco_instances_results.json")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--dataset", help="a registered dataset name")
    group.add_argument("--annotations", help="a COCO annotation json")
    parser.add_argument("--iou", type=float, default=0.5, help="IoU that counts as covering")
    args = parser.parse_args(argv)
    path = Path(args.annotations) if args.annotations else annotations_of(args.dataset)
    for label, file in (("--annotations", path), ("--results", Path(args.results))):
        if not file.is_file():
            raise SystemExit(f"{label}: {file} not found")
    gt = json.loads(path.read_text())
    detections = json.loads(Path(args.results).read_text())
    known = {c["id"] for c in gt["categories"]}
    unknown = sorted({d["category_id"] for d in detections} - known)
    if unknown:
        raise SystemExit(f"--results {args.results}: category_id {unknown} not in {path}")
    table = error_table(gt, detections, iou_threshold=args.iou)
    names = [c["name"] for c in gt["categories"]]
    print(format_report(table, names, coco_box_ap(gt, detections, use_categories=True),
                        coco_box_ap(gt, detections, use_categories=False)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
