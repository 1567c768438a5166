"""Which images a model gets most wrong, and pictures of them: predictions beside the truth.

Per image, the detections at or above a score threshold are matched to the ground-truth
boxes of their class, best score first, each box at most once, at an IoU threshold (COCO's
greedy matching at one threshold). Errors = false positives (detections that match no box)
+ missed boxes. Crowd boxes are neither missed nor make a detection on them false.
"""
import functools
from typing import Dict, List, NamedTuple, Sequence

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from detectron2.structures import BoxMode

__all__ = ["ImageErrors", "match_image", "worst_images", "ground_truth_boxes",
           "draw_side_by_side"]

_GOOD, _FALSE, _MISSED = (40, 170, 60), (220, 40, 40), (255, 150, 0)


class ImageErrors(NamedTuple):
    """The outcome of one image: which detections matched and which boxes were found."""
    image_id: int
    matched: np.ndarray  # (D,) bool: detection d matched a box (or a crowd box)
    found: np.ndarray  # (M,) bool: box m was matched (crowd boxes: True)

    @property
    def false_positives(self) -> int:
        return int((~self.matched).sum())

    @property
    def missed(self) -> int:
        return int((~self.found).sum())

    @property
    def errors(self) -> int:
        return self.false_positives + self.missed


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(D, M) IoU of XYXY boxes a (D, 4) and b (M, 4)."""
    low = np.maximum(a[:, None, :2], b[None, :, :2])  # (D, M, 2)
    high = np.minimum(a[:, None, 2:], b[None, :, 2:])  # (D, M, 2)
    inter = np.prod(np.clip(high - low, 0, None), axis=2)
    area_a, area_b = np.prod(a[:, 2:] - a[:, :2], 1), np.prod(b[:, 2:] - b[:, :2], 1)
    return inter / np.maximum(area_a[:, None] + area_b[None] - inter, 1e-9)


def match_image(image_id: int, boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray,
                gt: Dict[str, np.ndarray], iou_thresh: float) -> ImageErrors:
    """Matches one image's detections (D, 4) XYXY, (D,), (D,) to its ground truth
    (``ground_truth_boxes``), best score first."""
    iou = _iou(boxes.reshape(-1, 4), gt["boxes"].reshape(-1, 4))  # (D, M)
    same_class = classes[:, None] == gt["classes"][None, :]
    found = gt["crowd"].copy()
    matched = np.zeros(len(boxes), dtype=bool)
    for d in np.argsort(-scores, kind="stable"):
        candidates = np.where(same_class[d] & ~found & (iou[d] >= iou_thresh), iou[d], -1.0)
        if len(candidates) and candidates.max() >= 0:
            found[int(candidates.argmax())] = True
            matched[d] = True
        elif np.any(same_class[d] & gt["crowd"] & (iou[d] >= iou_thresh)):
            matched[d] = True  # on a crowd box: not a false positive
    return ImageErrors(image_id, matched, found)


def worst_images(outcomes: Sequence[ImageErrors], count: int) -> List[ImageErrors]:
    """The ``count`` images with the most errors (ties: the lower image id), errors only."""
    ranked = sorted((o for o in outcomes if o.errors), key=lambda o: (-o.errors, o.image_id))
    return ranked[:count]


def ground_truth_boxes(record: dict) -> Dict[str, np.ndarray]:
    """A dataset dict's annotations as arrays: "boxes" (M, 4) XYXY, "classes" (M,), "crowd"
    (M,) bool."""
    annotations = record.get("annotations", [])
    modes = {a["bbox_mode"] for a in annotations}
    if len(modes) == 1:  # as loaded from a COCO file: one conversion for the whole image
        boxes = BoxMode.convert(np.asarray([a["bbox"] for a in annotations], dtype=np.float64),
                                modes.pop(), BoxMode.XYXY_ABS)
    else:
        boxes = [BoxMode.convert(a["bbox"], a["bbox_mode"], BoxMode.XYXY_ABS) for a in annotations]
    return {"boxes": np.asarray(boxes, dtype=np.float64).reshape(-1, 4),
            "classes": np.asarray([a["category_id"] for a in annotations], dtype=np.int64),
            "crowd": np.asarray([bool(a.get("iscrowd", 0)) for a in annotations], dtype=bool)}


def draw_side_by_side(image_rgb: np.ndarray, gt: Dict[str, np.ndarray], detections: dict,
                      outcome: ImageErrors, class_names: Sequence[str],
                      min_side: int = 256) -> Image.Image:
    """The ground truth (left: found boxes green, missed orange) beside the detections
    (right: matched green, false red, with their scores), enlarged to ``min_side``."""
    scale = max(1.0, min_side / min(image_rgb.shape[:2]))
    base = Image.fromarray(image_rgb).resize(
        (round(image_rgb.shape[1] * scale), round(image_rgb.shape[0] * scale)))
    left, right = base.copy(), base.copy()
    draw_left, draw_right, font = ImageDraw.Draw(left), ImageDraw.Draw(right), _font()
    for box, k, ok in zip(gt["boxes"], gt["classes"], outcome.found):
        _box(draw_left, font, box * scale, _name(class_names, k), _GOOD if ok else _MISSED)
    for box, k, score, ok in zip(detections["boxes"], detections["classes"],
                                 detections["scores"], outcome.matched):
        _box(draw_right, font, box * scale, f"{_name(class_names, k)} {score:.2f}",
             _GOOD if ok else _FALSE)
    picture = Image.new("RGB", (2 * base.width + 8, base.height), (255, 255, 255))
    picture.paste(left, (0, 0))
    picture.paste(right, (base.width + 8, 0))
    return picture


def _name(class_names: Sequence[str], k: int) -> str:
    return class_names[k] if 0 <= k < len(class_names) else str(k)


@functools.lru_cache(maxsize=1)
def _font() -> ImageFont.ImageFont:
    return ImageFont.load_default()


def _box(draw: ImageDraw.ImageDraw, font, box: np.ndarray, label: str, color) -> None:
    x0, y0, x1, y1 = (float(v) for v in box)
    draw.rectangle([x0, y0, x1, y1], outline=color, width=2)
    text_box = draw.textbbox((x0 + 2, y0 + 1), label, font=font)
    draw.rectangle(text_box, fill=color)
    draw.text((x0 + 2, y0 + 1), label, fill=(255, 255, 255), font=font)
