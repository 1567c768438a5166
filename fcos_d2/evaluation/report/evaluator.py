"""``ReportingCOCOEvaluator``: detectron2's COCOEvaluator, which also writes report.html.

It records each image's detections while the evaluation runs (``process``), keeps
COCOeval's precision array of each task it evaluates ("bbox", and "segm" for mask models)
and, after the metrics, writes ``report.html`` and its pictures (``report/``) beside
COCOEvaluator's files: see ``write_report``.

COCOEvaluator does not hand out its COCOeval object: the precision array is taken in
``_derive_coco_results``, the method that receives it, which has the same signature in
detectron2 v0.6 and main (tests/evaluation/test_evaluation_report.py fails if that changes).
"""
import logging
import os
import time
from typing import Dict, List

import numpy as np
from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.evaluation import COCOEvaluator
from detectron2.utils import comm

from ...data.images import read_image
from .config import ReportOptions
from .curves import save_ap_bars, save_png, save_pr_plots
from .errors import draw_side_by_side, ground_truth_boxes, match_image, worst_images
from .page import write_report_page

__all__ = ["ReportingCOCOEvaluator", "write_report"]

logger = logging.getLogger(__name__)


class ReportingCOCOEvaluator(COCOEvaluator):
    """COCOEvaluator (same arguments) that writes ``<output_dir>/report.html``.

    Args:
        report: what to write (``ReportOptions.from_config(cfg)``); nothing when disabled
            or without ``output_dir``.
    """

    def __init__(self, dataset_name: str, *args, report: ReportOptions = ReportOptions(),
                 output_dir: str = None, **kwargs):
        self._report = report
        self._report_dir = output_dir
        super().__init__(dataset_name, *args, output_dir=output_dir, **kwargs)
        self._report_dataset = dataset_name

    def reset(self):
        super().reset()
        self._records: List[dict] = []
        self._precisions: Dict[str, np.ndarray] = {}

    def process(self, inputs, outputs):
        super().process(inputs, outputs)
        if not self._report.enabled:
            return
        for item, output in zip(inputs, outputs):
            if "instances" not in output:
                continue
            instances = output["instances"].to("cpu")
            keep = instances.scores >= self._report.score_thresh
            self._records.append({
                "image_id": item["image_id"], "file_name": item.get("file_name", ""),
                "boxes": instances.pred_boxes.tensor[keep].numpy().astype(np.float64),
                "scores": instances.scores[keep].numpy(),
                "classes": instances.pred_classes[keep].numpy()})

    def _derive_coco_results(self, coco_eval, iou_type, class_names=None):
        if coco_eval is not None and self._report.enabled:
            self._precisions[iou_type] = coco_eval.eval["precision"]
        return super()._derive_coco_results(coco_eval, iou_type, class_names=class_names)

    def evaluate(self, img_ids=None):
        results = super().evaluate(img_ids)
        if not self._report.enabled or not self._report_dir:
            return results
        gathered = comm.gather(self._records, dst=0) if self._distributed else [self._records]
        if comm.is_main_process() and results:
            records = [r for part in gathered for r in part]
            try:
                write_report(self._report_dir, self._report_dataset, results, self._precisions,
                             records, self._report)
            except Exception as error:  # a picture must not cost the evaluation's results
                logger.warning(f"report.html not written in {self._report_dir}: {error!r}")
        return results


def write_report(folder: str, dataset_name: str, results: Dict[str, Dict[str, float]],
                 precisions: Dict[str, np.ndarray], records: List[dict],
                 options: ReportOptions) -> str:
    """Writes ``<folder>/report.html`` and its pictures in ``<folder>/report/`` (the
    previous evaluation's pictures are replaced).

    Args:
        folder: the evaluation's output folder (beside summary.txt).
        dataset_name: a registered dataset: its ground truth and class names.
        results: task -> metric -> value, as COCOEvaluator returns them.
        precisions: task -> COCOeval's ``eval["precision"]`` (T, R, K, A, M).
        records: per image, "image_id", "file_name" and its detections at or above
            ``options.score_thresh``: "boxes" (D, 4) XYXY, "scores" (D,), "classes" (D,).

    Returns:
        The path of the page.
    """
    start = time.perf_counter()
    pictures = os.path.join(folder, "report")
    os.makedirs(pictures, exist_ok=True)
    for old in os.listdir(pictures):
        if old.endswith(".png"):
            os.remove(os.path.join(pictures, old))
    class_names = list(MetadataCatalog.get(dataset_name).get("thing_classes", []))
    plots = {}
    for task, precision in precisions.items():
        per_class = {k[len("AP-"):]: v for k, v in results.get(task, {}).items()
                     if k.startswith("AP-")}
        plots[task] = save_pr_plots(precision, class_names, pictures, f"pr_{task}")
        if per_class:
            plots[task].append(save_ap_bars(per_class, os.path.join(pictures, f"ap_{task}.png"),
                                            f"{task} AP per class"))
    worst = _save_worst_images(dataset_name, records, class_names, options, pictures)
    page = write_report_page(
        os.path.join(folder, "report.html"), title=f"{dataset_name}: evaluation of "
        f"{time.strftime('%Y-%m-%d %H:%M:%S')}", results=results, plots=plots, worst=worst,
        notes=[f"Worst images: the {options.num_worst_images} with the most false detections "
               f"and missed boxes, detections with score >= {options.score_thresh}, matched "
               f"at IoU >= {options.iou_thresh}."] + ([] if precisions else [
                   "No precision-recall curves: COCOeval had no detections to score."]))
    logger.info(f"Wrote {page} in {time.perf_counter() - start:.2f} s")
    return page


def _save_worst_images(dataset_name, records, class_names, options, pictures):
    """Pictures of the worst images; returns (path, caption) pairs, worst first."""
    if not options.num_worst_images or not records:
        return []
    truth = {d["image_id"]: d for d in DatasetCatalog.get(dataset_name)}
    by_id = {r["image_id"]: r for r in records if r["image_id"] in truth}
    gt = {i: ground_truth_boxes(truth[i]) for i in by_id}
    outcomes = [match_image(i, r["boxes"], r["scores"], r["classes"], gt[i],
                            options.iou_thresh) for i, r in by_id.items()]
    worst = []
    for rank, outcome in enumerate(worst_images(outcomes, options.num_worst_images)):
        record = by_id[outcome.image_id]
        file_name = truth[outcome.image_id].get("file_name", record["file_name"])
        image = read_image(file_name, format="RGB", image_id=outcome.image_id)
        path = os.path.join(pictures, f"worst_{rank:02d}.png")
        save_png(draw_side_by_side(image, gt[outcome.image_id], record, outcome, class_names),
                 path)
        worst.append((path, f"{os.path.basename(file_name)} (image id {outcome.image_id}): "
                            f"{outcome.missed} missed, {outcome.false_positives} false of "
                            f"{len(record['scores'])} detections"))
    return worst
