"""Human-readable reports of COCO box (and mask) evaluations.

``append_summaries`` appends one block per evaluated dataset to
``<output_dir>/inference/<dataset>/summary.txt``, so that a training run leaves the history
of its evaluations in one small file (``append_summary_note`` adds one-line notes between
the blocks: the best evaluation so far, an early stop). A block holds the box table, or, when masks were
evaluated too ("segm" results), one row per task ("bbox", "segm") and a per-category table
with a column per task. ``expected_results_verdict`` states in one line whether
``TEST.EXPECTED_RESULTS`` holds, by the rule of detectron2's ``verify_results``.
``proposal_recall`` measures how many ground-truth boxes a proposal generator's best
proposals find.
"""
import datetime
import math
import os
from typing import List, Mapping, Optional, Sequence

import torch
from detectron2.structures import Boxes, pairwise_iou
from detectron2.utils.events import get_event_storage
from detectron2.utils.file_io import PathManager

__all__ = ["SUMMARY_METRICS", "append_summary_note", "append_summaries", "append_summary",
           "expected_results_verdict", "format_summary", "iterations_trained", "proposal_recall",
           "summary_path"]

# The COCO box metrics of a summary, in COCOEvaluator's names and order.
SUMMARY_METRICS = ("AP", "AP50", "AP75", "APs", "APm", "APl")


def summary_path(output_dir: str, dataset_name: str) -> str:
    """Where the summaries of ``dataset_name`` go: next to COCOEvaluator's output."""
    return os.path.join(output_dir, "inference", dataset_name, "summary.txt")


def format_summary(dataset_name: str, bbox_results: Mapping[str, float],
                   iterations: Optional[int], time: Optional[datetime.datetime] = None,
                   label: str = "", model: Optional[str] = None,
                   segm_results: Optional[Mapping[str, float]] = None) -> str:
    """Formats one evaluation as a block of text.

    Args:
        dataset_name: the evaluated dataset.
        bbox_results: COCOEvaluator's ``results["bbox"]``: the metrics of
            ``SUMMARY_METRICS`` and "AP-<class name>" per category, in percent.
        iterations: training iterations the evaluated weights had; None if unknown.
        time: the time stamp of the block; now if None.
        label: how the detections were made, after the dataset name in the block's
            first line (e.g. "TTA" for test-time augmentation); "" for plain inference.
        model: what was evaluated, when not the PyTorch model (e.g. "ONNX fcos.onnx"); it
            then gets a "model: ..." field after the iterations.
        segm_results: COCOEvaluator's ``results["segm"]`` (mask AP), in the same form;
            None when masks were not evaluated.

    Returns:
        The block, ending with an empty line. Missing or NaN metrics read "nan".
    """
    time = time or datetime.datetime.now()
    done = "unknown" if iterations is None else str(iterations)
    title = f"{dataset_name} [{label}]" if label else dataset_name
    evaluated = f"model: {model} | " if model else ""
    lines = [f"== {title} | iterations trained: {done} | {evaluated}"
             f"{time:%Y-%m-%d %H:%M:%S} =="]
    if segm_results is not None:
        return "\n".join(lines + _task_tables({"bbox": bbox_results, "segm": segm_results}))
    lines += ["  " + " ".join(f"{name:>6}" for name in SUMMARY_METRICS),
              "  " + " ".join(_number(bbox_results.get(name)) for name in SUMMARY_METRICS)]
    per_category = [(key[len("AP-"):], value) for key, value in bbox_results.items()
                    if key.startswith("AP-")]
    if per_category:
        width = max(len(name) for name, _ in per_category)
        lines.append("  AP per category:")
        lines += [f"    {name:<{width}} {_number(value)}" for name, value in per_category]
    return "\n".join(lines) + "\n\n"


def _task_tables(results: Mapping[str, Mapping[str, float]]) -> List[str]:
    """The lines of a block with several tasks: a metrics row per task, then the AP per
    category in a column per task; the block's last line is empty."""
    lines = ["  task " + " ".join(f"{name:>6}" for name in SUMMARY_METRICS)]
    lines += [f"  {task:<4} " + " ".join(_number(metrics.get(name)) for name in SUMMARY_METRICS)
              for task, metrics in results.items()]
    names = list(dict.fromkeys(key[len("AP-"):] for metrics in results.values()
                               for key in metrics if key.startswith("AP-")))
    if names:
        width = max(14, *(len(name) for name in names))  # the header fits above the names
        lines.append(f"  {'AP per category:':<{width + 3}}"
                     + " ".join(f"{task:>6}" for task in results))
        lines += [f"    {name:<{width}} "
                  + " ".join(_number(metrics.get("AP-" + name)) for metrics in results.values())
                  for name in names]
    return lines + ["", ""]


def append_summary(output_dir: str, dataset_name: str, bbox_results: Mapping[str, float],
                   iterations: Optional[int], label: str = "",
                   model: Optional[str] = None,
                   segm_results: Optional[Mapping[str, float]] = None) -> str:
    """Appends ``format_summary(...)`` to ``summary_path(output_dir, dataset_name)``.

    Returns:
        The path of the summary file.
    """
    path = summary_path(output_dir, dataset_name)
    PathManager.mkdirs(os.path.dirname(path))
    with PathManager.open(path, "a") as f:
        f.write(format_summary(dataset_name, bbox_results, iterations, label=label, model=model,
                               segm_results=segm_results))
    return path


def append_summaries(output_dir: str, dataset_names: Sequence[str], results: Mapping,
                     iterations: Optional[int], label: str = "",
                     model: Optional[str] = None) -> None:
    """``append_summary`` for each dataset of ``DefaultTrainer.test``'s results that has
    "bbox" results (with its "segm" results, where masks were evaluated too).

    Args:
        output_dir: the run's output folder.
        dataset_names: the evaluated datasets (``DATASETS.TEST``), in order.
        results: dataset -> task -> metrics; for a single dataset, task -> metrics, as
            ``DefaultTrainer.test`` returns it then.
        iterations: training iterations the evaluated weights had; None if unknown.
        label, model: as in :func:`format_summary`.
    """
    per_dataset = {dataset_names[0]: results} if len(dataset_names) == 1 else results
    for name, result in per_dataset.items():
        if "bbox" in result:
            append_summary(output_dir, name, result["bbox"], iterations, label, model,
                           segm_results=result.get("segm"))


def append_summary_note(output_dir: str, dataset_name: str, note: str) -> str:
    """Appends ``== <note> ==`` after the last block of ``dataset_name``'s summary, e.g.
    which iteration is the best so far, or why the training stopped early
    (fcos_d2.engine.best). Returns the file's path."""
    path = summary_path(output_dir, dataset_name)
    PathManager.mkdirs(os.path.dirname(path))
    with PathManager.open(path, "a") as f:
        f.write(f"== {note} ==\n\n")
    return path


def iterations_trained(max_iter: int) -> Optional[int]:
    """How many iterations the running training has done, or None outside training.

    Args:
        max_iter: the training's iteration count (``SOLVER.MAX_ITER``).
    """
    try:
        storage = get_event_storage()
    except AssertionError:  # no EventStorage, so no training loop (e.g. --eval-only)
        return None
    # Periodic evaluations run after iteration storage.iter (0-based); the final one runs
    # after training, when storage.iter is max_iter.
    return min(storage.iter + 1, max_iter)


def expected_results_verdict(expected_results: Sequence[Sequence], results: Mapping) -> str:
    """One PASS/FAIL line for ``TEST.EXPECTED_RESULTS``, by ``verify_results``' rule.

    Args:
        expected_results: (task, metric, expected value, tolerance) tuples.
        results: task -> {metric -> value}, as ``DefaultTrainer.test`` returns for one
            dataset.

    Returns:
        "TEST.EXPECTED_RESULTS: PASS" or "...: FAIL", then every check with its value.
        A metric passes when it is present, finite and within the tolerance.
    """
    checks, ok = [], True
    for task, metric, expected, tolerance in expected_results:
        actual = results.get(task, {}).get(metric)
        passed = (actual is not None and math.isfinite(actual)
                  and abs(actual - expected) <= tolerance)
        ok &= passed
        got = "missing" if actual is None else f"{actual:.4f}"
        checks.append(f"{task}/{metric} = {got} (expected {expected} +- {tolerance})"
                      f"{'' if passed else ' <- out of range'}")
    return f"TEST.EXPECTED_RESULTS: {'PASS' if ok else 'FAIL'}: " + "; ".join(checks)


def _number(value: Optional[float]) -> str:
    return f"{float('nan') if value is None else value:6.2f}"


def proposal_recall(proposals: Sequence[torch.Tensor], gt_boxes: Sequence[torch.Tensor], *,
                    top_k: int = 100, iou_thresh: float = 0.5) -> float:
    """Recall of the best ``top_k`` proposals per image (e.g. AR@100 at IoU 0.5): the
    fraction of all ground-truth boxes that overlap one of their image's first ``top_k``
    proposals with IoU >= ``iou_thresh``. A proposal may cover several boxes.

    Args:
        proposals: per image, (P, 4) XYXY boxes, best first.
        gt_boxes: per image, (M, 4) XYXY boxes.
        top_k: proposals per image that count.
        iou_thresh: the IoU a box needs with a proposal to count as found.

    Returns:
        Found boxes over all boxes; NaN when there are no boxes at all.
    """
    if len(proposals) != len(gt_boxes):
        raise ValueError(f"proposal_recall: {len(proposals)} images of proposals but "
                         f"{len(gt_boxes)} images of ground truth")
    found, total = 0, 0
    for boxes, gt in zip(proposals, gt_boxes):
        total += len(gt)
        if len(gt) and len(boxes):
            iou = pairwise_iou(Boxes(gt), Boxes(boxes[:top_k]))  # (M, min(P, top_k))
            found += int((iou.max(dim=1).values >= iou_thresh).sum())
    return found / total if total else float("nan")
