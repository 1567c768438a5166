"""FCOS inference: candidates per level, decoding, class-wise NMS. Pure functions.

Symbols: K foreground classes; for one image and level i, Ri = Hi * Wi locations;
C candidates (location, class) that pass the score threshold; D final detections.
"""
import itertools
from typing import List, Tuple

import torch
from detectron2.layers import batched_nms
from detectron2.structures import Boxes, Instances
from torch import Tensor

THRESHOLD_ON = ("probability", "final_score")


def decode_boxes(locations: Tensor, ltrb: Tensor) -> Tensor:
    """(C, 2) (x, y) locations and (C, 4) (l, t, r, b) pixel distances -> (C, 4) XYXY."""
    return torch.cat([locations - ltrb[:, :2], locations + ltrb[:, 2:]], dim=1)


def candidate_scores(
    logits: Tensor, ctr_logits: Tensor, *, score_thresh: float, threshold_on: str = "probability"
) -> Tuple[Tensor, Tensor]:
    """Scores of every (location, class) pair and which pairs are candidates.

    Shared by :func:`select_level_candidates` and the exported graph
    (``fcos_d2.export.onnx_graph``), so that both threshold the same way.

    Args:
        logits: (..., Ri, K) classification logits.
        ctr_logits: (..., Ri) centerness logits.
        score_thresh: the threshold; on what, ``threshold_on`` says.
        threshold_on: "probability" (the class probability must exceed it, official) or
            "final_score" (sqrt(probability * sigmoid(centerness)) must exceed it).

    Returns:
        scores (..., Ri, K) = probability * sigmoid(centerness); candidates (..., Ri, K) bool.
    """
    probs = logits.sigmoid()  # (..., Ri, K)
    scores = probs * ctr_logits.sigmoid()[..., None]  # (..., Ri, K)
    if threshold_on == "probability":
        candidates = probs > score_thresh
    else:  # sqrt(scores) > score_thresh, without the square root of every entry
        candidates = scores > score_thresh ** 2
    return scores, candidates


def select_level_candidates(
    logits: Tensor,
    ltrb: Tensor,
    ctr_logits: Tensor,
    locations: Tensor,
    *,
    score_thresh: float,
    topk: int,
    threshold_on: str = "probability",
) -> Tuple[Tensor, Tensor, Tensor]:
    """Candidates of one level of one image: :func:`select_level_candidates_with_locations`
    without the location indices."""
    return select_level_candidates_with_locations(
        logits, ltrb, ctr_logits, locations, score_thresh=score_thresh, topk=topk,
        threshold_on=threshold_on)[:3]


def select_level_candidates_with_locations(
    logits: Tensor,
    ltrb: Tensor,
    ctr_logits: Tensor,
    locations: Tensor,
    *,
    score_thresh: float,
    topk: int,
    threshold_on: str = "probability",
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """Candidates of one level of one image.

    A (location, class) pair is a candidate when its class probability exceeds
    ``score_thresh`` (``threshold_on`` "probability", official) or when its final score
    sqrt(probability * sigmoid(centerness)) does ("final_score"); candidates are ranked by
    probability * sigmoid(centerness) and the best ``topk`` kept.

    Args:
        logits: (Ri, K) classification logits.
        ltrb: (Ri, 4) predicted distances in pixels.
        ctr_logits: (Ri,) centerness logits.
        locations: (Ri, 2) (x, y).
        score_thresh: threshold on the class probability.
        topk: at most this many candidates.
        threshold_on: "probability" or "final_score".

    Returns:
        boxes (C, 4) XYXY, scores (C,) = probability * centerness, classes (C,), and the
        index in [0, Ri) of each candidate's location (C,).
    """
    scores, candidates = candidate_scores(logits, ctr_logits, score_thresh=score_thresh,
                                          threshold_on=threshold_on)  # (Ri, K) each
    # One nonzero (one host sync) gives both indices; they index the scores in the same
    # row-major order as the boolean mask would, without a second sync for its count.
    location_idx, classes = candidates.nonzero(as_tuple=True)  # (C,) each
    scores = scores[location_idx, classes]  # (C,)
    if len(scores) > topk:
        scores, keep = scores.topk(topk, sorted=False)
        location_idx, classes = location_idx[keep], classes[keep]
    boxes = decode_boxes(locations[location_idx], ltrb[location_idx])
    return boxes, scores, classes, location_idx


def ties_in_candidate_order(scores: Tensor, index: Tensor) -> Tensor:
    """The order of the (D,) detections ``index`` (candidate numbers) with ``scores``: best
    first and, among equal scores, in candidate order (level, then location, then class),
    the order in which the exported graph's TopK keeps them. NMS alone leaves ties in any
    order, so that the cap could keep another of them than the graph."""
    by_candidate = index.argsort()
    return by_candidate[scores[by_candidate].argsort(descending=True, stable=True)]


def postprocess_image(
    logits: List[Tensor],
    ltrb: List[Tensor],
    ctr_logits: List[Tensor],
    locations: List[Tensor],
    image_size: Tuple[int, int],
    *,
    score_thresh: float,
    topk_candidates: int,
    nms_thresh: float,
    max_detections: int,
    threshold_on: str = "probability",
) -> Instances:
    """Detections of one image from its per-level head outputs (shapes as in
    :func:`select_level_candidates`, one list entry per level).

    Boxes are clipped to ``image_size`` (H, W); the score is sqrt(probability *
    centerness); NMS is class-wise; the ``max_detections`` best are kept, best first.
    ``score_thresh`` applies to what ``threshold_on`` says.
    """
    return postprocess_image_with_locations(
        logits, ltrb, ctr_logits, locations, image_size, score_thresh=score_thresh,
        topk_candidates=topk_candidates, nms_thresh=nms_thresh, max_detections=max_detections,
        threshold_on=threshold_on)[0]


def postprocess_image_with_locations(
    logits: List[Tensor],
    ltrb: List[Tensor],
    ctr_logits: List[Tensor],
    locations: List[Tensor],
    image_size: Tuple[int, int],
    *,
    score_thresh: float,
    topk_candidates: int,
    nms_thresh: float,
    max_detections: int,
    threshold_on: str = "probability",
) -> Tuple[Instances, Tensor]:
    """:func:`postprocess_image`, and for each detection (D,) the index of its location
    among the image's locations of all levels (R, in the order of ``locations``), so that
    per-location outputs of other branches (SipMask's coefficients) can be gathered."""
    per_level = [
        select_level_candidates_with_locations(
            *level, score_thresh=score_thresh, topk=topk_candidates, threshold_on=threshold_on)
        for level in zip(logits, ltrb, ctr_logits, locations)
    ]
    offsets = list(itertools.accumulate([0] + [len(x) for x in locations[:-1]]))
    boxes, scores, classes, location_idx = (torch.cat(parts) for parts in zip(*[
        (*level[:3], level[3] + offset) for level, offset in zip(per_level, offsets)]))
    boxes = Boxes(boxes)
    boxes.clip(image_size)
    scores = torch.sqrt(scores)
    keep = batched_nms(boxes.tensor, scores, classes, nms_thresh)
    keep = keep[ties_in_candidate_order(scores[keep], keep)][:max_detections]
    result = Instances(image_size)
    result.pred_boxes = boxes[keep]
    result.scores = scores[keep]
    result.pred_classes = classes[keep]
    return result, location_idx[keep]
