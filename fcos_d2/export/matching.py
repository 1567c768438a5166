"""Whether two runs of a detector found the same detections, compared as sets.

Two runs of the same weights (PyTorch and onnxruntime, float32 and int8) round
differently, so detections whose scores (nearly) tie may come out in another order, and
at the ``TEST.DETECTIONS_PER_IMAGE`` cap one run may keep a detection that the other
drops for an equally scored one. Neither is a difference. A detection of one run is
matched to one of the other of the same class, with a score within the score tolerance
and every box coordinate within the box tolerance; what stays unmatched is allowed only
at a full cap, as many on each side, each scored within the score tolerance of its run's
lowest kept score (the candidates tied at the cap). Anything else is a real difference.

Symbols: D detections of one image in one run.
"""
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

Detections = Tuple[np.ndarray, np.ndarray, np.ndarray]  # boxes (D, 4), scores (D,), classes (D,)


def match_detections(expected: Detections, got: Detections, *, score_tolerance: float,
                     box_tolerance: float) -> Tuple[np.ndarray, np.ndarray]:
    """Pairs of matching detections, best expected scores first, each paired with the
    closest box among the unmatched candidates of ``got`` that fit.

    Returns:
        (M, 2) int array of (index in expected, index in got); (D_expected,) bool, which
        of ``expected`` are matched.
    """
    e_boxes, e_scores, e_classes = (np.asarray(x) for x in expected)
    g_boxes, g_scores, g_classes = (np.asarray(x) for x in got)
    box_gap = (np.abs(e_boxes[:, None, :] - g_boxes[None, :, :]).max(axis=2)
               if len(e_boxes) and len(g_boxes) else np.zeros((len(e_boxes), len(g_boxes))))
    fits = ((e_classes[:, None] == g_classes[None, :])
            & (np.abs(e_scores[:, None] - g_scores[None, :]) <= score_tolerance)
            & (box_gap <= box_tolerance))  # (D_expected, D_got)
    taken = np.zeros(len(g_scores), dtype=bool)
    pairs = []
    for i in np.argsort(-e_scores, kind="stable"):
        candidates = np.flatnonzero(fits[i] & ~taken)
        if len(candidates):
            j = candidates[np.argmin(box_gap[i, candidates])]
            taken[j] = True
            pairs.append((i, j))
    matched = np.zeros(len(e_scores), dtype=bool)
    matched[[i for i, _ in pairs]] = True
    return np.array(pairs, dtype=np.int64).reshape(-1, 2), matched


def _tied_at_cap(scores: np.ndarray, unmatched: np.ndarray, score_tolerance: float) -> bool:
    """Whether every unmatched detection scores within tolerance of the lowest kept one."""
    return bool((scores[unmatched] <= scores.min() + score_tolerance).all())


def _above(detections: Detections, floor: float) -> Detections:
    keep = np.asarray(detections[1]) >= floor
    return tuple(np.asarray(x)[keep] for x in detections)


def compare_image(expected: Detections, got: Detections, *, score_tolerance: float,
                  box_tolerance: float, max_detections: Optional[int] = None,
                  score_floor: Optional[float] = None) -> Dict[str, object]:
    """Compares one image's detections as sets (see the module docstring).

    Args:
        expected, got: the two runs' (boxes, scores, classes).
        score_tolerance, box_tolerance: how far a score, a box coordinate (pixels) may move.
        max_detections: the cap (``TEST.DETECTIONS_PER_IMAGE``); None: no swaps at a cap
            are allowed.
        score_floor: if given, only detections scoring at least this are compared, and
            one without a partner is allowed if it scores below floor + score tolerance
            (the other run may have scored it just below the floor). For runs far apart
            in rounding (int8 against float32), whose weak detections come and go.

    Returns:
        "same": bool; "counts": (D_expected, D_got); "swapped_at_cap": detections of each
        run tied at the cap without a partner in the other; "unmatched": (expected, got)
        detections without a partner that are not such ties; "score_diff", "box_diff": the
        largest differences between matched detections.
    """
    if score_floor is not None:
        expected, got = _above(expected, score_floor), _above(got, score_floor)
    pairs, matched = match_detections(expected, got, score_tolerance=score_tolerance,
                                      box_tolerance=box_tolerance)
    e_scores, g_scores = np.asarray(expected[1]), np.asarray(got[1])
    g_matched = np.zeros(len(g_scores), dtype=bool)
    g_matched[pairs[:, 1]] = True
    if score_floor is not None:  # partners that the other run scored just below the floor
        matched |= e_scores < score_floor + score_tolerance
        g_matched |= g_scores < score_floor + score_tolerance
    left = (int((~matched).sum()), int((~g_matched).sum()))
    at_cap = (max_detections is not None and len(e_scores) == len(g_scores) == max_detections
              and left[0] == left[1] and _tied_at_cap(e_scores, ~matched, score_tolerance)
              and _tied_at_cap(g_scores, ~g_matched, score_tolerance))
    swapped = left[0] if at_cap and left[0] else 0
    score_diff = float(np.abs(e_scores[pairs[:, 0]] - g_scores[pairs[:, 1]]).max()) \
        if len(pairs) else 0.0
    box_diff = float(np.abs(np.asarray(expected[0])[pairs[:, 0]]
                            - np.asarray(got[0])[pairs[:, 1]]).max()) if len(pairs) else 0.0
    unmatched = (0, 0) if swapped else left
    return {"same": unmatched == (0, 0), "counts": (len(e_scores), len(g_scores)),
            "swapped_at_cap": swapped, "unmatched": unmatched, "score_diff": score_diff,
            "box_diff": box_diff}


def compare(expected: Sequence[Detections], got: Sequence[Detections], *, score_tolerance: float,
            box_tolerance: float, max_detections: Optional[int] = None,
            score_floor: Optional[float] = None) -> Dict[str, object]:
    """:func:`compare_image` over images; "same" if every image is, the other entries per
    image ("counts", "swapped_at_cap", "unmatched") or the largest ("score_diff",
    "box_diff")."""
    results = [compare_image(e, g, score_tolerance=score_tolerance, box_tolerance=box_tolerance,
                             max_detections=max_detections, score_floor=score_floor)
               for e, g in zip(expected, got)]
    return {"same": all(r["same"] for r in results),
            "counts": [r["counts"] for r in results],
            "swapped_at_cap": [r["swapped_at_cap"] for r in results],
            "unmatched": [r["unmatched"] for r in results],
            "score_diff": max([r["score_diff"] for r in results], default=0.0),
            "box_diff": max([r["box_diff"] for r in results], default=0.0)}
