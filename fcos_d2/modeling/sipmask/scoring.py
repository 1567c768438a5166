"""SipMask++'s mask re-scoring (``rescoring_flag`` of SipMask-mmdetection; written anew):
a small branch predicts each mask's IoU with its object, and a detection's score is
multiplied by it, so that among detections of equal class confidence the better masks
rank first. The masks themselves are not changed.

Symbols: P masks, Hm x Wm the basis-mask size (stride 2), K classes.

The branch sees only the mask: the instance's cropped mask probabilities at stride 2
(detached), six 3x3 convs of stride 2 with ReLUs (16, 16, 16, 32, 64, 128 channels), a
1x1 conv to K outputs, a ReLU and a global max -> the predicted IoU of the instance's
class. Its target: the IoU at stride 2 of the mask (probabilities > 0.4) with the
object's target (> 0.5), ``intersection / (union + 0.1)``; only masks whose IoU lies in
(0.1, 1] and whose object covers at least 100 cells (20 x 20 input pixels) count. The
loss: squared error summed over them, times 10, divided by their count + 0.1 (all as
SipMask-mmdetection). fcos-d2 pads the convs by 1 (theirs: no padding, which maps under
~190 cells fail), so the branch runs on the quickstart's 64 x 64 maps. SipMask++ re-scores
every detection, also those smaller than any object the branch trained on; fcos-d2's
default (``MASK_RESCORING_SCOPE "trained"``) leaves their scores as they are.
"""
from typing import List, Optional

import torch
from torch import Tensor, nn
from torch.nn import functional as F

SCORING_CHANNELS = (16, 16, 16, 32, 64, 128)
MASK_THRESHOLD = 0.4  # the mask whose IoU is the target (SipMask-mmdetection's)
MIN_OBJECT_CELLS = 100  # objects smaller than this at stride 2 do not train the branch
LOSS_SCALE = 10.0  # SipMask-mmdetection's factor on the summed squared error


class MaskScoring(nn.Module):
    """(P, Hm, Wm) mask probabilities and (P,) classes -> (P,) predicted mask IoU >= 0."""

    def __init__(self, num_classes: int):
        super().__init__()
        layers: List[nn.Module] = []
        channels = 1
        for out in SCORING_CHANNELS:
            conv = nn.Conv2d(channels, out, 3, stride=2, padding=1)
            nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")
            nn.init.zeros_(conv.bias)
            layers += [conv, nn.ReLU()]
            channels = out
        self.convs = nn.Sequential(*layers)
        self.iou = nn.Conv2d(channels, num_classes, 1)
        nn.init.normal_(self.iou.weight, std=0.001)
        nn.init.zeros_(self.iou.bias)

    def forward(self, probabilities: Tensor, classes: Tensor) -> Tensor:
        if not len(probabilities):
            return probabilities.new_zeros((0,))
        x = self.convs(probabilities[:, None].float())  # (P, 128, Hm / 64, Wm / 64)
        x = F.relu(self.iou(x)).amax(dim=(2, 3))  # (P, K)
        return x[torch.arange(len(x), device=x.device), classes]


def mask_iou_targets(probabilities: Tensor, targets: Tensor):
    """(P, Hm, Wm) probabilities and the objects' (P, Hm, Wm) targets -> ((P,) IoU targets,
    (P,) float weights: 1 where the mask trains the branch)."""
    mask = (probabilities > MASK_THRESHOLD).float()
    truth = (targets > 0.5).float()
    overlap = (mask * truth).sum(dim=(1, 2))
    truth_area = truth.sum(dim=(1, 2))
    iou = overlap / (mask.sum(dim=(1, 2)) + truth_area - overlap + 0.1)
    weights = (iou > 0.1) & (iou <= 1.0) & (truth_area >= MIN_OBJECT_CELLS)
    return iou, weights.float()


class RescoringSums:
    """Accumulates the re-scoring loss over a batch's images (the squared errors and the
    count of masks that train the branch), then normalises once."""

    def __init__(self):
        self.errors: List[Tensor] = []
        self.count = 0.0

    def add(self, scoring: MaskScoring, probabilities: Tensor, targets: Tensor,
            classes: Tensor) -> None:
        """One image's kept positives: (P, Hm, Wm) detached probabilities, their objects'
        (P, Hm, Wm) targets, (P,) classes."""
        predicted = scoring(probabilities.detach(), classes)  # (P,)
        with torch.no_grad():
            iou, weights = mask_iou_targets(probabilities, targets)
        self.errors.append(((predicted - iou) ** 2 * weights).sum())
        self.count += float(weights.sum())

    def loss(self, scoring: MaskScoring) -> Tensor:
        """LOSS_SCALE x the summed squared error / (count + 0.1); zero connected to the
        branch's parameters when no image had a mask."""
        anchor = sum(p.sum() * 0 for p in scoring.parameters())
        total = torch.stack(self.errors).sum() if self.errors else anchor
        return LOSS_SCALE * (total + anchor) / (self.count + 0.1)


RESCORING_SCOPES = ("trained", "all")


def rescore(scores: Tensor, predicted_iou: Optional[Tensor], boxes: Optional[Tensor] = None,
            stride: int = 2) -> Tensor:
    """(D,) detection scores times their (D,) predicted mask IoU (unchanged for None).

    With (D, 4) ``boxes`` (input pixels), only the detections whose box covers at least
    ``MIN_OBJECT_CELLS`` cells of ``stride`` are re-scored: the branch never trains on
    smaller objects (``mask_iou_targets``), so its prediction there is untrained noise."""
    if predicted_iou is None:
        return scores
    factor = predicted_iou.to(scores.dtype)
    if boxes is not None:
        cells = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]) / stride ** 2
        factor = torch.where(cells >= MIN_OBJECT_CELLS, factor, torch.ones_like(factor))
    return scores * factor
