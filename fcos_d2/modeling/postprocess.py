"""FCOS inference: candidates per level, decoding, class-wise NMS. Pure functions.
``select_candidates_batched`` selects the candidates of a whole batch at once (what the
model runs); ``postprocess_image`` does one image, level by level; both give the same.

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
    return detections_of_candidates(boxes, scores, classes, location_idx, image_size,
                                    nms_thresh=nms_thresh, max_detections=max_detections)


def detections_of_candidates(boxes: Tensor, scores: Tensor, classes: Tensor,
                             location_idx: Tensor, image_size: Tuple[int, int], *,
                             nms_thresh: float, max_detections: int) -> Tuple[Instances, Tensor]:
    """One image's (C, 4) XYXY candidate boxes, (C,) scores (probability * centerness),
    classes and location indices -> its detections (clipped, square-rooted scores,
    class-wise NMS, the ``max_detections`` best, best first) and their location indices."""
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


def select_candidates_batched(
    logits: List[Tensor],
    ltrb: List[Tensor],
    ctr_logits: List[Tensor],
    locations: List[Tensor],
    *,
    score_thresh: float,
    topk: int,
    threshold_on: str = "probability",
) -> List[Tuple[Tensor, Tensor, Tensor, Tensor]]:
    """:func:`select_level_candidates_with_locations` on every level of every image, its
    candidates of the levels of each image concatenated, the location indices counted over
    all levels (as :func:`postprocess_image_with_locations` does), with two host syncs for
    the whole batch (a nonzero and the counts per image and level) instead of one per level
    and image. The same candidates, in the same order.

    Args:
        logits, ltrb, ctr_logits: per level (N, Ri, K), (N, Ri, 4) and (N, Ri).
        locations: per level (Ri, 2).

    Returns:
        per image: boxes (C, 4) XYXY, scores (C,), classes (C,), location indices (C,).
    """
    num_images, num_levels = len(logits[0]), len(logits)
    # per level and image, as postprocess_image does, then stacked: a kernel's vector and
    # scalar paths round differently, and a batched call would move which elements take
    # which; this way the scores are the same to the bit
    scores, candidates = (torch.stack(x) for x in zip(*(
        [torch.cat(x) for x in zip(*(
            candidate_scores(x[i], c[i], score_thresh=score_thresh, threshold_on=threshold_on)
            for x, c in zip(logits, ctr_logits)))]
        for i in range(num_images))))  # (N, R, K) each
    # image-major, then location (so level-major), then class: each level's own order
    image, location, classes = candidates.nonzero(as_tuple=True)  # (C,) each
    scores = scores[image, location, classes]  # (C,)
    sizes = torch.tensor([len(x) for x in locations], device=location.device)
    level = torch.repeat_interleave(torch.arange(num_levels, device=location.device),
                                    sizes)[location]  # (C,)
    counts = torch.bincount(image * num_levels + level, minlength=num_images * num_levels)
    counts = counts.tolist()  # the second and last sync
    chunks = zip(*(x.split(counts) for x in (scores, location, classes)))
    points, ltrb = torch.cat(locations), torch.cat(ltrb, 1)  # (R, 2), (N, R, 4)
    per_image = []
    for i in range(num_images):
        kept = []
        for _ in range(num_levels):
            level_scores, level_location, level_classes = next(chunks)
            if len(level_scores) > topk:
                level_scores, keep = level_scores.topk(topk, sorted=False)
                level_location, level_classes = level_location[keep], level_classes[keep]
            kept.append((level_scores, level_location, level_classes))
        image_scores, image_location, image_classes = (torch.cat(x) for x in zip(*kept))
        boxes = decode_boxes(points[image_location], ltrb[i, image_location])
        per_image.append((boxes, image_scores, image_classes, image_location))
    return per_image
