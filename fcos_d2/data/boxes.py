"""Boxes that cannot be trained on, dropped when a dataset is loaded.

A box is dropped when a coordinate is NaN or infinite, when its width or height is zero or
negative, or when it lies entirely outside its image (no area in common with
[0, width] x [0, height]). A load that drops boxes logs one warning (the same warning only
once per process): how many, for which reason, and the first one (image file, image id and
box as stored).

``drop_invalid_boxes`` is the pure function; ``filter_invalid_boxes_on_load`` wraps a
registered dataset's loader with it, so every ``DatasetCatalog.get`` (hence training) only
sees the valid boxes. Only the dataset dicts change: an evaluator that reads the original
annotation file (COCOEvaluator with ``json_file``) still scores against it.

Symbols: N = images of a dataset, A = their annotations that have a box, all together.
"""
import functools
import logging
from typing import Callable, List, Sequence, Tuple

import numpy as np
from detectron2.data import DatasetCatalog
from detectron2.structures import BoxMode
from detectron2.utils.logger import log_first_n

__all__ = ["BOX_DEFECTS", "box_defects", "drop_invalid_boxes", "dropping_invalid_boxes",
           "filter_invalid_boxes_on_load"]

# The reasons a box is dropped, in the order they are checked (a box counts under the first).
BOX_DEFECTS = ("with non-finite coordinates", "with zero or negative size",
               "entirely outside the image")
_FILTERED = "_fcos_d2_drops_invalid_boxes"  # marks a loader already wrapped


def box_defects(boxes: np.ndarray, modes: np.ndarray, image_sizes: np.ndarray) -> np.ndarray:
    """Finds the boxes that cannot be trained on.

    Args:
        boxes: (A, 4) float, as stored (NaN where a coordinate was missing).
        modes: (A,) int ``BoxMode`` of each box; XYWH_ABS and XYXY_ABS are checked fully,
            other modes for non-finite coordinates only.
        image_sizes: (A, 2) float (height, width) of each box's image; NaN if unknown (the
            outside check is then skipped).

    Returns:
        (A,) int: -1 for a valid box, else the index of its defect in ``BOX_DEFECTS``.
    """
    x0, y0 = boxes[:, 0], boxes[:, 1]
    x1, y1 = boxes[:, 2].copy(), boxes[:, 3].copy()  # (A,) each; XYXY after the fix below
    xywh = modes == int(BoxMode.XYWH_ABS)
    x1[xywh] += x0[xywh]
    y1[xywh] += y0[xywh]
    absolute = xywh | (modes == int(BoxMode.XYXY_ABS))
    height, width = image_sizes[:, 0], image_sizes[:, 1]
    with np.errstate(invalid="ignore"):  # NaN sizes compare False: not outside
        checks = [
            ~np.isfinite(boxes).all(axis=1) | ~np.isfinite(x1) | ~np.isfinite(y1),
            absolute & ((x1 <= x0) | (y1 <= y0)),
            absolute & ((x1 <= 0) | (y1 <= 0) | (x0 >= width) | (y0 >= height)),
        ]
    defects = np.full(len(boxes), -1)
    for index in reversed(range(len(checks))):  # the first failed check wins
        defects[checks[index]] = index
    return defects


def drop_invalid_boxes(dataset_dicts: List[dict], dataset_name: str) -> List[dict]:
    """Returns the dataset without the boxes ``box_defects`` finds, with a warning if any.

    Args:
        dataset_dicts: detectron2 dataset dicts; not modified.
        dataset_name: named in the warning.

    Returns:
        The same dicts where nothing is dropped; shallow copies with shorter
        "annotations" lists for the images that lose boxes. Images are never dropped.
    """
    owners, annotations = _annotations(dataset_dicts)
    if not annotations:
        return dataset_dicts
    modes = np.fromiter((a.get("bbox_mode", BoxMode.XYWH_ABS) for a in annotations),
                        dtype=np.int64, count=len(annotations))  # (A,)
    image_sizes = np.array([_image_size(d) for d in dataset_dicts], dtype=float)  # (N, 2)
    defects = box_defects(_boxes(annotations), modes, image_sizes[owners])
    bad = np.flatnonzero(defects >= 0)
    if not len(bad):
        return dataset_dicts
    # Once per message: train_net loads a dataset twice (class count check, then loader).
    log_first_n(logging.WARNING, _report(dataset_name, dataset_dicts, owners, annotations,
                                         defects, bad), name=__name__, key="message")
    dropped = {id(annotations[i]) for i in bad}
    touched = {owners[i] for i in bad}
    return [dict(d, annotations=[a for a in d["annotations"] if id(a) not in dropped])
            if i in touched else d for i, d in enumerate(dataset_dicts)]


def filter_invalid_boxes_on_load(name: str) -> None:
    """Makes ``DatasetCatalog.get(name)`` return its dicts through ``drop_invalid_boxes``.

    Does nothing if the loader of `name` already does (calling it again is harmless).
    The metadata of `name` is kept.
    """
    loader = DatasetCatalog[name]  # KeyError if not registered, as DatasetCatalog.get
    if getattr(loader, _FILTERED, False):
        return
    DatasetCatalog.remove(name)
    DatasetCatalog.register(name, dropping_invalid_boxes(name, loader))


def dropping_invalid_boxes(name: str, loader: Callable[[], List[dict]]) -> Callable[[], List[dict]]:
    """Returns `loader` (of dataset `name`) followed by ``drop_invalid_boxes``, marked so
    that ``filter_invalid_boxes_on_load`` does not wrap it twice."""
    @functools.wraps(loader)
    def load() -> List[dict]:
        return drop_invalid_boxes(loader(), name)

    setattr(load, _FILTERED, True)
    return load


def _annotations(dataset_dicts: Sequence[dict]) -> Tuple[List[int], List[dict]]:
    """(A,) index of the image of each annotation, and the A annotations that have a box."""
    owners, annotations = [], []
    for index, record in enumerate(dataset_dicts):
        for annotation in record.get("annotations", ()):
            if "bbox" in annotation:
                owners.append(index)
                annotations.append(annotation)
    return owners, annotations


def _boxes(annotations: Sequence[dict]) -> np.ndarray:
    """(A, 4) float boxes; NaN where a coordinate is missing or not a number."""
    try:  # fast when every box is four numbers (None becomes NaN)
        boxes = np.array([a["bbox"] for a in annotations], dtype=float)
        if boxes.shape == (len(annotations), 4):
            return boxes
    except (TypeError, ValueError):
        pass
    return np.array([_coordinates(a["bbox"]) for a in annotations], dtype=float)


def _coordinates(bbox) -> List[float]:
    """The first four numbers of a box; NaN where a coordinate is missing or not a number."""
    values = list(bbox)[:4] if isinstance(bbox, (list, tuple, np.ndarray)) else []
    return [_float(v) for v in values] + [float("nan")] * (4 - len(values))


def _float(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def _image_size(record: dict) -> Tuple[float, float]:
    return (_float(record.get("height")), _float(record.get("width")))


def _report(name: str, dataset_dicts: Sequence[dict], owners: Sequence[int],
            annotations: Sequence[dict], defects: np.ndarray, bad: np.ndarray) -> str:
    """The warning: counts per defect, then the first dropped box and its image."""
    counts = np.bincount(defects[bad], minlength=len(BOX_DEFECTS))
    reasons = ", ".join(f"{n} {reason}" for n, reason in zip(counts, BOX_DEFECTS) if n)
    first = int(bad[0])
    record, annotation = dataset_dicts[owners[first]], annotations[first]
    mode = BoxMode(int(annotation.get("bbox_mode", BoxMode.XYWH_ABS))).name
    return (f"dataset '{name}': dropped {len(bad)} of {len(annotations)} boxes that cannot "
            f"be trained on ({reasons}); the first: image file {record.get('file_name')} "
            f"(image id {record.get('image_id')}, size {_size_text(record)}), box "
            f"{annotation.get('bbox')} ({mode}) {BOX_DEFECTS[defects[first]]}")


def _size_text(record: dict) -> str:
    if "width" in record and "height" in record:
        return f"{record['width']}x{record['height']}"
    return "unknown"
