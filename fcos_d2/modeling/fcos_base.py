"""``FCOSBase``: FCOS without a backbone, configured by ``MODEL.FCOS``: the head on given
features, the training targets and losses, and the detections. The meta-architecture
``FCOS`` (``meta_arch.py``) adds the backbone and the input preprocessing; the proposal
generator (``proposal_generator.py``) adds class-agnostic proposals for two-stage models.
Glue only; the work is done by ``head``, ``assignment``, ``losses`` and ``postprocess``.

Symbols: N images, L levels, Hi x Wi level sizes, R = sum(Hi * Wi), K classes.
"""
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from detectron2.config import configurable
from detectron2.layers import ShapeSpec
from detectron2.structures import Instances
from torch import Tensor, nn

from ..precision import CPU_BF16_POLICIES
from .assignment import assign_targets_with_matches, level_size_ranges
from .atss import assign_targets_atss
from .head import FCOSHead
from .losses import (CLS_LOSSES, LOC_LOSS_TYPES, LOC_LOSS_WEIGHTINGS, LOSS_NORMALIZERS,
                     EMANormalizer, fcos_losses)
from .postprocess import THRESHOLD_ON, detections_of_candidates, select_candidates_batched

# MODEL.FCOS.ASSIGNER: who picks the positives (assignment.py or atss.py).
ASSIGNERS = ("fcos", "atss")
# MODEL.FCOS.INFERENCE_DTYPE: the autocast precision of backbone and head at inference.
INFERENCE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16,
                    "float16": torch.float16}



def flatten_levels(outputs: List[Tensor]) -> Tensor:
    """Per level (N, C, Hi, Wi) -> (N, R, C), locations in the order of compute_locations."""
    return torch.cat([x.permute(0, 2, 3, 1).reshape(x.shape[0], -1, x.shape[1])  # (N, HiWi, C)
                      for x in outputs], dim=1)


class FCOSBase(nn.Module):
    """FCOS after the backbone, configured by ``MODEL.FCOS`` (see ``add_fcos_config``): the
    head on the features ``head_in_features``, training targets and losses, detections.

    Subclasses decide where the features come from and what to return.
    """

    @configurable
    def __init__(
        self,
        *,
        input_shape: Dict[str, ShapeSpec],
        head: FCOSHead,
        head_in_features: Sequence[str],
        num_classes: int,
        sizes_of_interest: Sequence[float] = (64, 128, 256, 512),
        center_sampling_radius: float = 1.5,
        focal_loss_alpha: float = 0.25,
        focal_loss_gamma: float = 2.0,
        loc_loss_type: str = "giou",
        norm_reg_targets: bool = True,
        loss_normalizer: str = "num_pos",
        loss_normalizer_ema: Tuple[float, float] = (300.0, 0.9),
        loc_loss_weighting: str = "centerness",
        iou_loss_smooth: float = 1.0,
        assigner: str = "fcos",
        atss_topk: int = 9,
        atss_anchor_scale: float = 8.0,
        cls_loss: str = "focal",
        score_thresh: float = 0.05,
        score_thresh_on: str = "probability",
        topk_candidates: int = 1000,
        nms_thresh: float = 0.6,
        max_detections_per_image: int = 100,
        inference_dtype: str = "float32",
        cpu_bf16: str = "auto",
        channels_last: bool = False,
        normalize_over_workers: bool = True,
    ):
        """``input_shape``: the features available (a backbone's ``output_shape()``);
        ``normalize_over_workers`` False: the loss normalizers are this worker's own, for a
        model that a worker of a job trains alone (NAS-FCOS's search proxies)."""
        super().__init__()
        missing = [f for f in head_in_features if f not in input_shape]
        if missing:
            raise ValueError(f"MODEL.FCOS.IN_FEATURES: {missing} not produced by the backbone, "
                             f"which gives {sorted(input_shape)}")
        if len(sizes_of_interest) != len(head_in_features) - 1:
            raise ValueError(f"MODEL.FCOS.SIZES_OF_INTEREST: {len(head_in_features)} levels need "
                             f"{len(head_in_features) - 1} boundaries, got {list(sizes_of_interest)}")
        for key, value, allowed in (("LOC_LOSS_TYPE", loc_loss_type, LOC_LOSS_TYPES),
                                    ("LOSS_NORMALIZER", loss_normalizer, LOSS_NORMALIZERS),
                                    ("LOC_LOSS_WEIGHTING", loc_loss_weighting, LOC_LOSS_WEIGHTINGS),
                                    ("ASSIGNER", assigner, ASSIGNERS),
                                    ("CLS_LOSS", cls_loss, CLS_LOSSES),
                                    ("INFERENCE_TH_ON", score_thresh_on, THRESHOLD_ON),
                                    ("INFERENCE_DTYPE", inference_dtype, tuple(INFERENCE_DTYPES)),
                                    ("CPU_BF16", cpu_bf16, CPU_BF16_POLICIES)):
            if value not in allowed:
                raise ValueError(f"MODEL.FCOS.{key}: unknown '{value}', expected one of "
                                 f"{allowed}")
        if iou_loss_smooth < 0:
            raise ValueError(f"MODEL.FCOS.IOU_LOSS_SMOOTH: must be >= 0, got {iou_loss_smooth}")
        if atss_topk < 1:
            raise ValueError(f"MODEL.FCOS.ATSS_TOPK: must be >= 1, got {atss_topk}")
        if atss_anchor_scale <= 0:
            raise ValueError(f"MODEL.FCOS.ATSS_ANCHOR_SCALE: must be > 0, got {atss_anchor_scale}")
        self.head = head
        self.head_in_features = list(head_in_features)
        self.strides = [input_shape[f].stride for f in head_in_features]
        self.num_classes = num_classes
        self.size_ranges = level_size_ranges(sizes_of_interest)
        self.center_sampling_radius = center_sampling_radius
        self.focal_loss_alpha, self.focal_loss_gamma = focal_loss_alpha, focal_loss_gamma
        self.loc_loss_type = loc_loss_type
        self.norm_reg_targets = norm_reg_targets
        self.loss_normalizer = EMANormalizer(*loss_normalizer_ema) if loss_normalizer == "ema" \
            else None
        self.normalize_over_workers = normalize_over_workers
        self.loc_loss_weighting, self.iou_loss_smooth = loc_loss_weighting, iou_loss_smooth
        self.assigner, self.atss_topk, self.cls_loss = assigner, atss_topk, cls_loss
        self.atss_anchor_scale = atss_anchor_scale
        self.score_thresh, self.topk_candidates = score_thresh, topk_candidates
        self.score_thresh_on = score_thresh_on
        self.nms_thresh, self.max_detections_per_image = nms_thresh, max_detections_per_image
        self.inference_dtype = INFERENCE_DTYPES[inference_dtype]
        self.cpu_bf16 = cpu_bf16
        self.channels_last = channels_last
        if channels_last:  # 4-D weights only; loading a checkpoint copies into this layout
            self.to(memory_format=torch.channels_last)

    @classmethod
    def from_config(cls, cfg, input_shape: Dict[str, ShapeSpec]):
        fcos = cfg.MODEL.FCOS
        return {
            "input_shape": input_shape,
            "head": cls.build_head(cfg, [input_shape[f] for f in fcos.IN_FEATURES
                                         if f in input_shape], input_shape),
            "head_in_features": fcos.IN_FEATURES,
            "num_classes": fcos.NUM_CLASSES,
            "sizes_of_interest": fcos.SIZES_OF_INTEREST,
            "center_sampling_radius": fcos.CENTER_SAMPLING_RADIUS,
            "focal_loss_alpha": fcos.FOCAL_LOSS_ALPHA,
            "focal_loss_gamma": fcos.FOCAL_LOSS_GAMMA,
            "loc_loss_type": fcos.LOC_LOSS_TYPE,
            "norm_reg_targets": fcos.NORM_REG_TARGETS,
            "loss_normalizer": fcos.LOSS_NORMALIZER,
            "loss_normalizer_ema": (fcos.LOSS_NORMALIZER_EMA_INIT,
                                    fcos.LOSS_NORMALIZER_EMA_MOMENTUM),
            "loc_loss_weighting": fcos.LOC_LOSS_WEIGHTING,
            "iou_loss_smooth": fcos.IOU_LOSS_SMOOTH,
            "assigner": fcos.ASSIGNER,
            "atss_topk": fcos.ATSS_TOPK,
            "atss_anchor_scale": fcos.ATSS_ANCHOR_SCALE,
            "cls_loss": fcos.CLS_LOSS,
            "score_thresh": fcos.INFERENCE_TH_TEST,
            "score_thresh_on": fcos.INFERENCE_TH_ON,
            "topk_candidates": fcos.PRE_NMS_TOPK_TEST,
            "nms_thresh": fcos.NMS_TH_TEST,
            "max_detections_per_image": cfg.TEST.DETECTIONS_PER_IMAGE,
            "inference_dtype": fcos.INFERENCE_DTYPE,
            "cpu_bf16": fcos.CPU_BF16,
            "channels_last": fcos.CHANNELS_LAST,
        }

    @classmethod
    def build_head(cls, cfg, input_shape: List[ShapeSpec],
                   features: Optional[Dict[str, ShapeSpec]] = None) -> nn.Module:
        """The head on the features ``input_shape`` (models built on FCOS return theirs);
        ``features``: all the backbone gives, for heads that read more than their levels."""
        return FCOSHead(cfg, input_shape)

    def regression_in_pixels(self, regression: List[Tensor]) -> List[Tensor]:
        """The head's per-level (l, t, r, b) in pixels (it predicts stride units when
        ``norm_reg_targets``)."""
        if not self.norm_reg_targets:
            return regression
        return [r * s for r, s in zip(regression, self.strides)]

    def losses(self, locations: List[Tensor], instances: List[Instances], logits: List[Tensor],
               regression: List[Tensor], centerness: List[Tensor]) -> Dict[str, Tensor]:
        """Training targets for the batch, then the three losses."""
        labels, reg_targets, _ = self.targets(locations, instances)
        return self.box_losses(labels, reg_targets, logits, regression, centerness)

    def targets(self, locations: List[Tensor],
                instances: List[Instances]) -> Tuple[Tensor, Tensor, Tensor]:
        """labels (N, R), regression targets (N, R, 4) and matched box indices (N, R) of
        the batch (``assign_targets_with_matches``, or ``assign_targets_atss`` with the
        "atss" assigner)."""
        boxes = [x.gt_boxes.tensor for x in instances]
        classes = [x.gt_classes for x in instances]
        if self.assigner == "atss":
            return assign_targets_atss(locations, boxes, classes, strides=self.strides,
                                       topk=self.atss_topk, num_classes=self.num_classes,
                                       norm_reg_targets=self.norm_reg_targets,
                                       anchor_scale=self.atss_anchor_scale)
        return assign_targets_with_matches(
            locations, boxes, classes,
            strides=self.strides, size_ranges=self.size_ranges,
            center_sampling_radius=self.center_sampling_radius, num_classes=self.num_classes,
            norm_reg_targets=self.norm_reg_targets)

    def box_losses(self, labels: Tensor, reg_targets: Tensor, logits: List[Tensor],
                   regression: List[Tensor], centerness: List[Tensor]) -> Dict[str, Tensor]:
        """The three FCOS losses for given targets (shapes as :meth:`targets` returns)."""
        return fcos_losses(
            logits=flatten_levels(logits), reg_pred=flatten_levels(regression),
            ctr_logits=flatten_levels(centerness)[..., 0], labels=labels,
            reg_targets=reg_targets, num_classes=self.num_classes,
            focal_alpha=self.focal_loss_alpha, focal_gamma=self.focal_loss_gamma,
            loc_loss_type=self.loc_loss_type, loc_weighting=self.loc_loss_weighting,
            iou_smooth=self.iou_loss_smooth, normalizer=self.loss_normalizer,
            cls_loss=self.cls_loss, over_workers=self.normalize_over_workers)

    def inference(self, locations: List[Tensor], image_sizes: List[Tuple[int, int]],
                  logits: List[Tensor], regression: List[Tensor],
                  centerness: List[Tensor]) -> List[Instances]:
        """Per image detections in the (unpadded) input size."""
        return self.select(locations, image_sizes, logits, regression, centerness,
                           score_thresh=self.score_thresh, topk_candidates=self.topk_candidates,
                           nms_thresh=self.nms_thresh, max_detections=self.max_detections_per_image)

    def select(self, locations: List[Tensor], image_sizes: List[Tuple[int, int]],
               logits: List[Tensor], regression: List[Tensor], centerness: List[Tensor], *,
               score_thresh: float, topk_candidates: int, nms_thresh: float,
               max_detections: int) -> List[Instances]:
        """``postprocess_image`` on every image with these thresholds; per level ``logits``
        (N, K', Hi, Wi) may have any K' (the proposal generator passes K' = 1). Computed in
        float32 whatever precision the head ran in."""
        return [result for result, _ in self.select_with_locations(
            locations, image_sizes, logits, regression, centerness, score_thresh=score_thresh,
            topk_candidates=topk_candidates, nms_thresh=nms_thresh,
            max_detections=max_detections)]

    def select_with_locations(
        self, locations: List[Tensor], image_sizes: List[Tuple[int, int]],
        logits: List[Tensor], regression: List[Tensor], centerness: List[Tensor], *,
        score_thresh: float, topk_candidates: int, nms_thresh: float, max_detections: int,
    ) -> List[Tuple[Instances, Tensor]]:
        """:meth:`select`, with each detection's location index (D,) among the R locations
        of all levels: ``postprocess_image_with_locations`` on every image, its candidate
        selection batched (``select_candidates_batched``: two host syncs per batch)."""
        logits, regression, centerness = ([x.float() for x in outputs]
                                          for outputs in (logits, regression, centerness))
        regression = self.regression_in_pixels(regression)
        per_level = lambda outputs: [x.flatten(2).transpose(1, 2) for x in outputs]  # (N, HiWi, C)
        logits, regression, centerness = map(per_level, (logits, regression, centerness))
        candidates = select_candidates_batched(
            logits, regression, [x[..., 0] for x in centerness], locations,
            score_thresh=score_thresh, topk=topk_candidates, threshold_on=self.score_thresh_on)
        return [detections_of_candidates(*image_candidates, image_size, nms_thresh=nms_thresh,
                                         max_detections=max_detections)
                for image_candidates, image_size in zip(candidates, image_sizes)]
