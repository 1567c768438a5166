"""FCOS losses: sigmoid focal loss (or GFL's quality focal loss), IoU-family box loss,
centerness BCE.

Symbols: N images, R locations of all levels, K foreground classes (background is K),
P positive locations of the batch.
The normalizers follow the official FCOS: the positive count and the sum of centerness
targets are summed over all workers and divided by the number of workers, so that every
worker divides by the same number and gradients average correctly under DDP. An
``EMANormalizer`` can smooth both over iterations (``MODEL.FCOS.LOSS_NORMALIZER "ema"``).
Under autocast (SOLVER.AMP.ENABLED) the head's outputs may be bf16/fp16; the losses are
computed in float32 all the same (log, pow and the sums lose too much in 8 mantissa bits).
"""
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist
import torch.nn.functional as F
from detectron2.utils import comm
from torch import Tensor

LOC_LOSS_TYPES = ("iou", "linear_iou", "giou")
LOC_LOSS_WEIGHTINGS = ("centerness", "none")
LOSS_NORMALIZERS = ("num_pos", "ema")
CLS_LOSSES = ("focal", "quality_focal")
QUALITY_FOCAL_BETA = 2.0  # GFL's beta
_EPS = 1e-7


def centerness_targets(reg_targets: Tensor) -> Tensor:
    """sqrt(min(l, r) / max(l, r) * min(t, b) / max(t, b)) for (P, 4) targets -> (P,)."""
    left_right = reg_targets[:, [0, 2]]
    top_bottom = reg_targets[:, [1, 3]]
    ratio = (left_right.min(dim=1).values / left_right.max(dim=1).values) * (
        top_bottom.min(dim=1).values / top_bottom.max(dim=1).values)
    return torch.sqrt(ratio)


def iou_loss(pred: Tensor, target: Tensor, weight: Tensor, loss_type: str,
             smooth: float = 1.0) -> Tensor:
    """Summed IoU-family loss between (P, 4) (l, t, r, b) distances from the same points.

    IoU is smoothed as (intersection + smooth) / (union + smooth) (official: smooth 1, in
    the units of the distances) and GIoU subtracts (enclosing - union) / (enclosing + 1e-7),
    as in the official FCOS. With ``smooth`` 0 the IoU is exact (1e-7 guards the division
    and the log). ``weight`` (P,) multiplies each term unless it sums to zero.
    """
    if loss_type not in LOC_LOSS_TYPES:
        raise ValueError(f"MODEL.FCOS.LOC_LOSS_TYPE: unknown '{loss_type}', expected one of "
                         f"{LOC_LOSS_TYPES}")
    pred_area = (pred[:, 0] + pred[:, 2]) * (pred[:, 1] + pred[:, 3])
    target_area = (target[:, 0] + target[:, 2]) * (target[:, 1] + target[:, 3])
    inner = torch.minimum(pred, target)  # (P, 4)
    outer = torch.maximum(pred, target)  # (P, 4)
    intersection = (inner[:, 0] + inner[:, 2]) * (inner[:, 1] + inner[:, 3])
    union = pred_area + target_area - intersection
    iou = (intersection + smooth) / (union + (smooth or _EPS))
    if loss_type == "iou":
        losses = -torch.log(iou.clamp(min=_EPS))
    elif loss_type == "linear_iou":
        losses = 1 - iou
    else:
        enclosing = (outer[:, 0] + outer[:, 2]) * (outer[:, 1] + outer[:, 3]) + 1e-7
        losses = 1 - (iou - (enclosing - union) / enclosing)
    # chosen on the device: a Python branch on the sum would wait for it
    return torch.where(weight.sum() > 0, (losses * weight).sum(), losses.sum())


def sigmoid_focal_loss_sparse(logits: Tensor, labels: Tensor, *, alpha: float,
                              gamma: float, rows: Optional[Tensor] = None) -> Tensor:
    """Summed sigmoid focal loss of (P, K) logits against (P,) labels in [0, K] (K: none).

    Equal to the focal loss against one-hot targets, computed without building them: every
    entry first counts as a negative, then the P' positive entries are corrected. The
    negative term -(1 - alpha) p^gamma log(1 - p) uses log(1 - p) = -softplus(x).
    ``rows``: the (P',) positive rows where the caller has them (saves a host sync).
    """
    probs = logits.sigmoid()
    negative = (1 - alpha) * probs.pow(gamma) * F.softplus(logits)  # (P, K)
    rows = positive_rows(labels, logits.shape[1]) if rows is None else rows  # (P',)
    x = logits[rows, labels[rows]]  # (P',)
    p = probs[rows, labels[rows]]
    positive = alpha * (1 - p).pow(gamma) * F.softplus(-x)
    return negative.sum() + (positive - negative[rows, labels[rows]]).sum()


def positive_rows(labels: Tensor, num_classes: int) -> Tensor:
    """(P,) labels in [0, K] -> the (P',) indices of those below K, in order. A nonzero:
    the one host sync of the losses, as P' sizes everything about the positives."""
    return (labels < num_classes).nonzero(as_tuple=True)[0]


def quality_focal_loss_sparse(logits: Tensor, labels: Tensor, quality: Tensor, *,
                              beta: float = QUALITY_FOCAL_BETA,
                              rows: Optional[Tensor] = None) -> Tensor:
    """Summed quality focal loss (GFL, Li et al. 2020) of (P, K) logits against (P,) labels
    in [0, K] (K: none), where the P' positives' targets are `quality` (P',) in [0, 1], in
    the order of the positive rows, instead of 1.

    Each entry with target y (y = quality at a positive's class, 0 elsewhere) and
    probability p = sigmoid(x) costs BCE(x, y) * |y - p| ** beta. Computed as
    :func:`sigmoid_focal_loss_sparse` is: every entry as a negative (BCE(x, 0) = softplus(x)),
    then the positive entries corrected.
    """
    probs = logits.sigmoid()
    negative = probs.pow(beta) * F.softplus(logits)  # (P, K)
    rows = positive_rows(labels, logits.shape[1]) if rows is None else rows  # (P',)
    x, p = logits[rows, labels[rows]], probs[rows, labels[rows]]  # (P',)
    positive = F.binary_cross_entropy_with_logits(x, quality, reduction="none") \
        * (quality - p).abs().pow(beta)
    return negative.sum() + (positive - negative[rows, labels[rows]]).sum()


def box_iou_ltrb(pred: Tensor, target: Tensor) -> Tensor:
    """The exact IoU of (P, 4) (l, t, r, b) boxes around the same points -> (P,), 0 where
    the union is empty."""
    inner = torch.minimum(pred, target)
    width = (inner[:, 0] + inner[:, 2]).clamp(min=0)
    height = (inner[:, 1] + inner[:, 3]).clamp(min=0)
    intersection = width * height
    area = lambda b: (b[:, 0] + b[:, 2]) * (b[:, 1] + b[:, 3])  # noqa: E731
    union = area(pred) + area(target) - intersection
    return torch.where(union > 0, intersection / union.clamp(min=1e-12), torch.zeros_like(union))


def means_over_workers(values: Sequence[float]) -> List[float]:
    """Each value summed over all workers and divided by the number of workers, in one
    all-reduce."""
    world_size = comm.get_world_size()
    if world_size == 1:
        return list(values)
    total = torch.tensor(values, dtype=torch.float64,
                         device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(total)
    return (total / world_size).tolist()


def mean_over_workers(value: float) -> float:
    """Sum of ``value`` over all workers divided by the number of workers."""
    return means_over_workers([value])[0]


def loss_normalizers(num_positives: float, weight_sum: Tensor,
                     over_workers: bool = True) -> Tuple[float, Tensor]:
    """The batch's (positives, box-loss weight sum), each averaged over workers (with
    ``over_workers`` False, this worker's own: a worker that trains a model of its own).

    One worker: as they are, the weight sum left a tensor on its device, so that the step
    never waits for it (the positives' count is on the host already: boolean indexing gave
    it). Several workers: one all-reduce of both (every worker takes part, also one without
    positives), read back to the host as floats.
    """
    if not over_workers or comm.get_world_size() == 1:
        return num_positives, weight_sum
    num_positives, total = means_over_workers([num_positives, float(weight_sum)])
    return num_positives, weight_sum.new_tensor(total)


class EMANormalizer:
    """Exponential moving averages of the two loss normalizers (positives, box-loss weight
    sum), as detectron2's dense detectors smooth theirs: ``new = m * old + (1 - m) * x``.

    The positives start at ``initial``; the weight sum starts at ``initial`` times the
    first batch's mean weight, so that both start equally far from their batch values.
    The averages are training state: a resumed training restores them
    (``loss_normalizer_states``), or it would start again from ``initial`` and, at momentum
    0.99, divide its next hundreds of losses by a different number.
    """

    def __init__(self, initial: float = 300.0, momentum: float = 0.9):
        self.initial, self.momentum = initial, momentum
        self.values: Optional[Tuple[float, float]] = None

    def __call__(self, num_positives: float, weight_sum: Union[float, Tensor]
                 ) -> Tuple[float, Union[float, Tensor]]:
        """A tensor ``weight_sum`` stays a tensor (no host sync), in float64 so that the
        averages are those of Python floats."""
        if isinstance(weight_sum, Tensor):
            weight_sum = weight_sum.double()
        if self.values is None:
            mean_weight = weight_sum / num_positives if num_positives > 0 else 1.0
            self.values = (self.initial, self.initial * mean_weight)
        m = self.momentum
        self.values = tuple(m * old + (1 - m) * new
                            for old, new in zip(self.values, (num_positives, weight_sum)))
        return self.values

    def state_dict(self) -> Dict[str, Optional[List[float]]]:
        """The two averages as Python floats (None before the first batch); a float64
        tensor's value is its float's, so a restored normalizer goes on bit for bit."""
        return {"values": None if self.values is None else [float(v) for v in self.values]}

    def load_state_dict(self, state: Dict[str, Optional[List[float]]]) -> None:
        values = state["values"]
        self.values = None if values is None else (float(values[0]), float(values[1]))


def loss_normalizer_states(model: torch.nn.Module) -> Dict[str, dict]:
    """{module name: its EMA normalizer's state} of every module of `model` (not wrapped in
    DDP) that has one (FCOS with ``LOSS_NORMALIZER "ema"``, each member built on it)."""
    return {name: module.loss_normalizer.state_dict()
            for name, module in model.named_modules()
            if isinstance(getattr(module, "loss_normalizer", None), EMANormalizer)}


def load_loss_normalizer_states(model: torch.nn.Module,
                                states: Dict[str, dict]) -> Tuple[List[str], List[str]]:
    """Restores ``loss_normalizer_states``; returns the names of `model`'s EMA normalizers
    that `states` has nothing for (they start again) and of the modules in `states` that
    have none in `model` (MODEL.FCOS.LOSS_NORMALIZER changed), as load_state_dict's
    missing and unexpected keys."""
    here = loss_normalizer_states(model)
    modules = dict(model.named_modules())
    for name in set(states) & set(here):
        modules[name].loss_normalizer.load_state_dict(states[name])
    return sorted(set(here) - set(states)), sorted(set(states) - set(here))


def fcos_losses(
    *,
    logits: Tensor,
    reg_pred: Tensor,
    ctr_logits: Tensor,
    labels: Tensor,
    reg_targets: Tensor,
    num_classes: int,
    focal_alpha: float,
    focal_gamma: float,
    loc_loss_type: str,
    loc_weighting: str = "centerness",
    iou_smooth: float = 1.0,
    normalizer: Optional[Callable[[float, float], Tuple[float, float]]] = None,
    cls_loss: str = "focal",
    over_workers: bool = True,
) -> Dict[str, Tensor]:
    """The three FCOS losses of one batch.

    Args:
        logits: (N, R, K) classification logits.
        reg_pred: (N, R, 4) predicted (l, t, r, b), in the same units as ``reg_targets``.
        ctr_logits: (N, R) centerness logits.
        labels: (N, R) assigned classes in [0, K]; K is background.
        reg_targets: (N, R, 4) assigned (l, t, r, b).
        num_classes: K.
        focal_alpha, focal_gamma: focal loss parameters.
        loc_loss_type: "iou", "linear_iou" or "giou".
        loc_weighting: box-loss weight of each positive: its centerness target
            ("centerness", official) or 1 ("none").
        iou_smooth: the IoU smoothing of :func:`iou_loss` (official: 1).
        normalizer: maps the batch's (positives, box-loss weight sum), both averaged over
            workers, to the divisors used; None uses them as they are (official), an
            :class:`EMANormalizer` smooths them.
        cls_loss: "focal" (official) or "quality_focal": GFL's quality focal loss, the
            positives' target being the IoU of their predicted box with their box
            (detached), beta 2 (``focal_alpha``/``focal_gamma`` then unused).
        over_workers: average the normalizers over the workers (data-parallel training);
            False: this worker's own (see :func:`loss_normalizers`).

    Returns:
        ``loss_fcos_cls``, ``loss_fcos_loc`` and ``loss_fcos_ctr``, float32 scalars.
    """
    with torch.autocast(logits.device.type, enabled=False):
        return _fcos_losses(
            logits.float(), reg_pred.float(), ctr_logits.float(), labels, reg_targets.float(),
            num_classes=num_classes, focal_alpha=focal_alpha, focal_gamma=focal_gamma,
            loc_loss_type=loc_loss_type, loc_weighting=loc_weighting, iou_smooth=iou_smooth,
            normalizer=normalizer, cls_loss=cls_loss, over_workers=over_workers)


def _fcos_losses(logits: Tensor, reg_pred: Tensor, ctr_logits: Tensor, labels: Tensor,
                 reg_targets: Tensor, *, num_classes: int, focal_alpha: float,
                 focal_gamma: float, loc_loss_type: str, loc_weighting: str, iou_smooth: float,
                 normalizer: Optional[Callable[[float, float], Tuple[float, float]]],
                 cls_loss: str = "focal", over_workers: bool = True) -> Dict[str, Tensor]:
    """:func:`fcos_losses` on float32 inputs, outside autocast."""
    if cls_loss not in CLS_LOSSES:
        raise ValueError(f"MODEL.FCOS.CLS_LOSS: unknown '{cls_loss}', expected one of "
                         f"{CLS_LOSSES}")
    labels = labels.reshape(-1)  # (N * R,)
    rows = positive_rows(labels, num_classes)  # (P,), the same order as a boolean mask's
    reg_pred = reg_pred.reshape(-1, 4)[rows]  # (P, 4)
    ctr_logits = ctr_logits.reshape(-1)[rows]  # (P,)
    reg_targets = reg_targets.reshape(-1, 4)[rows]  # (P, 4)
    if cls_loss == "focal":
        loss_cls = sigmoid_focal_loss_sparse(logits.reshape(-1, num_classes), labels,
                                             alpha=focal_alpha, gamma=focal_gamma, rows=rows)
    else:  # positives in the order of labels' positive rows, as reg_pred's
        quality = box_iou_ltrb(reg_pred.detach(), reg_targets)
        loss_cls = quality_focal_loss_sparse(logits.reshape(-1, num_classes), labels, quality,
                                             rows=rows)
    ctr_targets = centerness_targets(reg_targets)
    loc_weights = ctr_targets if loc_weighting == "centerness" else torch.ones_like(ctr_targets)
    num_positives, weight_sum = loss_normalizers(float(len(ctr_targets)), loc_weights.sum(),
                                                 over_workers)
    if normalizer is not None:
        num_positives, weight_sum = normalizer(num_positives, weight_sum)
    if len(ctr_targets) > 0:
        # float32 divisor: the value a Python float divisor would have been rounded to
        loss_loc = iou_loss(reg_pred, reg_targets, loc_weights, loc_loss_type,
                            iou_smooth) / torch.as_tensor(weight_sum, dtype=reg_pred.dtype)
        loss_ctr = F.binary_cross_entropy_with_logits(ctr_logits, ctr_targets, reduction="sum")
    else:  # zero, but keeps the graph connected so that DDP sees every parameter used
        loss_loc, loss_ctr = reg_pred.sum() * 0, ctr_logits.sum() * 0
    num_positives = max(num_positives, 1.0)
    return {
        "loss_fcos_cls": loss_cls / num_positives,
        "loss_fcos_loc": loss_loc,
        "loss_fcos_ctr": loss_ctr / num_positives,
    }
