"""``add_report_config``: the ``TEST.REPORT`` node, what is written after each evaluation."""
from typing import NamedTuple

from detectron2.config import CfgNode as CN

__all__ = ["ReportOptions", "add_report_config"]


def add_report_config(cfg: CN) -> None:
    """Adds ``TEST.REPORT`` to ``cfg`` in place (called by ``add_fcos_config``)."""
    if "REPORT" in cfg.TEST:
        return
    cfg.TEST.REPORT = _C = CN()
    # After each evaluation, beside summary.txt: report.html with precision-recall curves per
    # class and for all classes, the AP per class as bars (PNGs in report/), and the worst
    # images, predictions beside the ground truth. Costs a few hundred ms (docs/troubleshooting.md); False:
    # nothing is written.
    _C.ENABLED = True
    # How many of the images with the most errors (false detections + missed boxes) the
    # page shows; 0: none (the curves and bars are still drawn).
    _C.NUM_WORST_IMAGES = 8
    # Detections at or above this score are drawn and counted when images are ranked by
    # errors (the curves use every detection, as COCO's AP does).
    _C.SCORE_THRESH = 0.5
    # A detection is correct if it overlaps a box of its class by at least this IoU.
    _C.IOU_THRESH = 0.5


class ReportOptions(NamedTuple):
    """``TEST.REPORT``, checked (see ``add_report_config``)."""
    enabled: bool = True
    num_worst_images: int = 8
    score_thresh: float = 0.5
    iou_thresh: float = 0.5

    @classmethod
    def from_config(cls, cfg: CN) -> "ReportOptions":
        """Raises ValueError naming a ``TEST.REPORT`` key whose value is out of range."""
        node = cfg.TEST.REPORT
        if not isinstance(node.NUM_WORST_IMAGES, int) or node.NUM_WORST_IMAGES < 0:
            raise ValueError(f"TEST.REPORT.NUM_WORST_IMAGES: {node.NUM_WORST_IMAGES!r} is not a "
                             "count (an integer >= 0)")
        for key in ("SCORE_THRESH", "IOU_THRESH"):
            if not 0.0 <= float(node[key]) <= 1.0:
                raise ValueError(f"TEST.REPORT.{key}: {node[key]!r} is not in [0, 1]")
        return cls(bool(node.ENABLED), node.NUM_WORST_IMAGES, float(node.SCORE_THRESH),
                   float(node.IOU_THRESH))
