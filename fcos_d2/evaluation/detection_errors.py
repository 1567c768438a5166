"""Where a detector's AP goes: finding the objects or naming them, by object size.

Pure functions over COCO annotation dicts and COCO results lists (what ``COCOEvaluator``
writes as ``coco_instances_results.json``); ``tools/detection_errors.py`` prints them and
``benchmarks.size_breakdown`` records them.

- :func:`error_table`: per object size (the box's longer side, px), the share of objects
  that some detection covers at IoU >= 0.5 ("found") and the share whose best-scored
  covering detection has the right class ("named"); and the confusion matrix of that
  detection;
- :func:`coco_box_ap`: COCO box AP with classes or class-agnostic;
- :func:`coco_size_metrics`: COCO's AP, AP50, AP75 and AR@100 per size bin of the longer
  side.

Symbols: M objects of an image, K its detections, C categories.
"""
import contextlib
import io
from collections import defaultdict
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


def coco_size_metrics(gt: dict, detections: List[dict], *,
                      use_categories: bool = True) -> Dict[str, Dict[str, float]]:
    """COCO box metrics (0-100) per size bin of :data:`SIZE_BINS`: {bin: {"AP", "AP50",
    "AP75", "AR100"}}. A bin is an area range (its sides squared), COCO's own notion of an
    object's size, so "< 16" holds boxes of area under 256 px^2; -1 where a bin has no
    object."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval
    out = {}
    with contextlib.redirect_stdout(io.StringIO()):
        coco_gt = COCO()
        coco_gt.dataset = gt
        coco_gt.createIndex()
        if not detections:
            return {name: {"AP": 0.0, "AP50": 0.0, "AP75": 0.0, "AR100": 0.0}
                    for name, _, _ in SIZE_BINS}
        evaluation = COCOeval(coco_gt, coco_gt.loadRes(detections), "bbox")
        evaluation.params.useCats = int(use_categories)
        evaluation.params.areaRng = [[low ** 2, min(high, 1e5) ** 2] for _, low, high in SIZE_BINS]
        evaluation.params.areaRngLbl = [name for name, _, _ in SIZE_BINS]
        evaluation.evaluate()
        evaluation.accumulate()
    precision = evaluation.eval["precision"]  # (T IoUs, R recalls, C, A areas, M max dets)
    recall = evaluation.eval["recall"]  # (T, C, A, M)
    for a, (name, _, _) in enumerate(SIZE_BINS):
        out[name] = {"AP": _mean(precision[:, :, :, a, -1]),
                     "AP50": _mean(precision[0, :, :, a, -1]),
                     "AP75": _mean(precision[5, :, :, a, -1]),
                     "AR100": _mean(recall[:, :, a, -1])}
    return out


def _mean(values: np.ndarray) -> float:
    valid = values[values > -1]
    return 100.0 * float(valid.mean()) if valid.size else -1.0
