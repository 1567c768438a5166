"""The SipMask meta-architecture: FCOS (backbone, assignment, box losses, detections,
all shared with ``FCOS``) with SipMask's head and masks.

Symbols: N images, L levels, R locations of all levels, K classes, B basis masks,
D detections of one image, H x W its input size, H0 x W0 its original size.
"""
from typing import Dict, List, Optional, Tuple

import torch
from detectron2.config import configurable
from detectron2.layers import ShapeSpec
from detectron2.modeling import META_ARCH_REGISTRY
from detectron2.modeling.postprocessing import detector_postprocess
from detectron2.structures import ImageList, Instances
from detectron2.utils.events import get_event_storage
from torch import Tensor, nn

from ..assignment import compute_locations
from ..meta_arch import FCOS, flatten_levels
from .crop_split import CROP_RULES, crop_split
from .head import SipMaskHead
from .loss import sipmask_mask_losses
from .masks import (EMPTY_TARGET_RULES, MASK_STRIDE, MASK_TARGETS, PASTE_STRIDES,
                    paste_mask_probabilities, quadrant_logits, resize_and_threshold)
from .scoring import RESCORING_SCOPES, MaskScoring, rescore

_PROBS = "sipmask_mask_probs"  # temporary fields: probabilities at the input size,
_ROW = "sipmask_row"  # and the row of each detection before detector_postprocess
_PASTE_CHUNK = 32  # detections pasted at a time (bounds memory at COCO sizes)
EMPTY_TARGETS_METRIC = "sipmask/empty_mask_targets"  # objects per batch with an empty target


@META_ARCH_REGISTRY.register()
class SipMask(FCOS):
    """SipMask (Cao et al., ECCV 2020), configured by ``MODEL.FCOS`` and ``MODEL.SIPMASK``
    (see ``add_sipmask_config``); needs ``MODEL.MASK_ON True``.

    Input: as ``FCOS``; in training, "instances" also carry ``gt_masks`` (BitMasks or
    PolygonMasks at the input size, as detectron2's mappers make them with masks on).
    Output: in training, the FCOS losses and ``loss_sipmask_mask``; in inference, per image
    {"instances": Instances} with ``pred_boxes``, ``scores``, ``pred_classes`` and
    ``pred_masks`` (D, H0, W0) bool at the original image size (the input dict's
    "height"/"width"): mask probabilities at the input resolution, cut to the unpadded
    image, resized to the original size, then > ``mask_threshold``. With re-scoring each
    score is multiplied by its mask's predicted IoU (``scoring.py``); the masks are the same.
    Training also logs ``EMPTY_TARGETS_METRIC`` to the event storage.
    """

    @configurable
    def __init__(self, *, mask_loss_weight: float = 1.0, mask_sample_nms_thresh: float = 0.9,
                 mask_threshold: float = 0.4, basis_in_feature: str = "",
                 mask_target: str = "threshold", empty_targets: str = "official",
                 crop_rule: str = "official", paste_stride: int = MASK_STRIDE,
                 mask_rescoring: bool = False, rescoring_loss_weight: float = 1.0,
                 rescoring_scope: str = "all", **fcos_options):
        """``basis_in_feature``: the backbone feature that joins the basis masks' input
        ("" none, SipMask's); the head must have been built for it. ``mask_target``,
        ``empty_targets``, ``crop_rule``, ``paste_stride``: ``MODEL.SIPMASK``'s options
        beyond SipMask (the defaults here are SipMask's); ``mask_rescoring``: SipMask++'s
        re-scoring branch, its loss times ``rescoring_loss_weight``, applied to every
        detection (``rescoring_scope`` "all", SipMask++) or to those of the sizes it trains
        on ("trained", fcos-d2's default). ``fcos_options``: the
        keyword arguments of ``FCOS``; ``head`` a SipMaskHead."""
        super().__init__(**fcos_options)
        for key, value, allowed in (("MASK_TARGET", mask_target, MASK_TARGETS),
                                    ("EMPTY_TARGETS", empty_targets, EMPTY_TARGET_RULES),
                                    ("CROP_RULE", crop_rule, CROP_RULES),
                                    ("PASTE_STRIDE", paste_stride, PASTE_STRIDES),
                                    ("MASK_RESCORING_SCOPE", rescoring_scope,
                                     RESCORING_SCOPES)):
            if value not in allowed:
                raise ValueError(f"MODEL.SIPMASK.{key}: {value!r} is not one of {allowed}")
        self.mask_target, self.empty_targets = mask_target, empty_targets
        self.cell_centre, self.paste_stride = crop_rule == "cell_centre", paste_stride
        self.mask_scoring = MaskScoring(self.num_classes) if mask_rescoring else None
        self.rescoring_loss_weight = rescoring_loss_weight
        self.rescore_trained_sizes_only = rescoring_scope == "trained"
        self.basis_in_feature = basis_in_feature
        if not isinstance(self.head, SipMaskHead):
            raise TypeError(f"SipMask needs a SipMaskHead, got {type(self.head).__name__}")
        for key, value, low, high in (("MASK_LOSS_WEIGHT", mask_loss_weight, 0.0, float("inf")),
                                      ("MASK_SAMPLE_NMS_TH", mask_sample_nms_thresh, 0.0, 1.0),
                                      ("MASK_THRESHOLD", mask_threshold, 0.0, 1.0),
                                      ("MASK_RESCORING_LOSS_WEIGHT", rescoring_loss_weight, 0.0,
                                       float("inf"))):
            if not low <= value <= high:
                raise ValueError(f"MODEL.SIPMASK.{key}: {value} is outside [{low}, {high}]")
        self.mask_loss_weight = mask_loss_weight
        self.mask_sample_nms_thresh = mask_sample_nms_thresh
        self.mask_threshold = mask_threshold

    @classmethod
    def build_head(cls, cfg, input_shape: List[ShapeSpec],
                   features: Optional[Dict[str, ShapeSpec]] = None) -> nn.Module:
        name = cfg.MODEL.SIPMASK.BASIS_IN_FEATURE
        if not name:
            return SipMaskHead(cfg, input_shape)
        if name not in (features or {}):
            raise ValueError(f"MODEL.SIPMASK.BASIS_IN_FEATURE: the backbone gives no '{name}' "
                             f"(it gives {sorted(features or {})}; FPN's p2 needs res2 in "
                             f"MODEL.FPN.IN_FEATURES and MODEL.RESNETS.OUT_FEATURES)")
        return SipMaskHead(cfg, input_shape, basis_feature_shape=features[name])

    @classmethod
    def from_config(cls, cfg):
        if not cfg.MODEL.MASK_ON:
            raise ValueError("MODEL.MASK_ON: SipMask predicts masks, set it True (the data "
                             "mapper then loads gt_masks and the evaluator scores segm)")
        sipmask = cfg.MODEL.SIPMASK
        return {
            **super().from_config(cfg),
            "mask_loss_weight": sipmask.MASK_LOSS_WEIGHT,
            "mask_sample_nms_thresh": sipmask.MASK_SAMPLE_NMS_TH,
            "mask_threshold": sipmask.MASK_THRESHOLD,
            "basis_in_feature": sipmask.BASIS_IN_FEATURE,
            "mask_target": sipmask.MASK_TARGET,
            "empty_targets": sipmask.EMPTY_TARGETS,
            "crop_rule": sipmask.CROP_RULE,
            "paste_stride": sipmask.PASTE_STRIDE,
            "mask_rescoring": sipmask.MASK_RESCORING,
            "rescoring_loss_weight": sipmask.MASK_RESCORING_LOSS_WEIGHT,
            "rescoring_scope": sipmask.MASK_RESCORING_SCOPE,
        }

    def forward_head(self, images: ImageList) -> Tuple[List[Tensor], List[Tensor], List[Tensor],
                                                      List[Tensor], Tensor]:
        """Backbone and head on a padded batch: per level logits, regression, centerness,
        coefficients; the basis masks."""
        features = self.backbone(images.tensor)
        extra = features[self.basis_in_feature] if self.basis_in_feature else None
        return self.head([features[f] for f in self.head_in_features], extra)

    def forward(self, batched_inputs: List[Dict]):
        images = self.preprocess_image(batched_inputs)
        with self._inference_autocast():
            logits, regression, centerness, coefficients, basis = self.forward_head(images)
        locations = compute_locations([x.shape[-2:] for x in logits], self.strides, self.device)
        if self.training:
            if "instances" not in batched_inputs[0]:
                raise ValueError("SipMask in training mode needs 'instances' in every input dict")
            instances = [x["instances"].to(self.device) for x in batched_inputs]
            return self.sipmask_losses(locations, instances, logits, regression, centerness,
                                       coefficients, basis)
        results = self.inference_with_masks(locations, images, logits, regression, centerness,
                                            coefficients, basis)
        return [{"instances": self._to_original_size(r, x.get("height", size[0]),
                                                     x.get("width", size[1]))}
                for r, x, size in zip(results, batched_inputs, images.image_sizes)]

    def sipmask_losses(self, locations: List[Tensor], instances: List[Instances],
                       logits: List[Tensor], regression: List[Tensor], centerness: List[Tensor],
                       coefficients: List[Tensor], basis: Tensor) -> Dict[str, Tensor]:
        """The FCOS losses (shared assignment), the weighted mask loss and, with re-scoring,
        ``loss_sipmask_rescoring``; logs the objects with an empty mask target."""
        labels, reg_targets, matched = self.targets(locations, instances)  # (N, R) ...
        losses = self.box_losses(labels, reg_targets, logits, regression, centerness)
        points = torch.cat(locations)  # (R, 2)
        ltrb = flatten_levels(self.regression_in_pixels(regression)).float()  # (N, R, 4)
        pred_boxes = torch.cat([points - ltrb[..., :2], points + ltrb[..., 2:]], dim=-1)
        masks = sipmask_mask_losses(
            basis=basis, coefficients=flatten_levels(coefficients), pred_boxes=pred_boxes,
            logits=flatten_levels(logits), labels=labels, matched=matched,
            instances=instances, num_classes=self.num_classes,
            sample_nms_thresh=self.mask_sample_nms_thresh, target=self.mask_target,
            empty_rule=self.empty_targets, cell_centre=self.cell_centre,
            scoring=self.mask_scoring)
        losses["loss_sipmask_mask"] = self.mask_loss_weight * masks.mask
        if masks.rescoring is not None:
            losses["loss_sipmask_rescoring"] = self.rescoring_loss_weight * masks.rescoring
        get_event_storage().put_scalar(EMPTY_TARGETS_METRIC, masks.empty_targets)
        return losses

    def inference_with_masks(self, locations: List[Tensor], images: ImageList,
                             logits: List[Tensor], regression: List[Tensor],
                             centerness: List[Tensor], coefficients: List[Tensor],
                             basis: Tensor) -> List[Instances]:
        """FCOS detections per image in the input size, with the mask probabilities of
        each (D, H, W) in a temporary field (see ``_to_original_size``)."""
        detections = self.select_with_locations(
            locations, images.image_sizes, logits, regression, centerness,
            score_thresh=self.score_thresh, topk_candidates=self.topk_candidates,
            nms_thresh=self.nms_thresh, max_detections=self.max_detections_per_image)
        coefficients = flatten_levels(coefficients).float()  # (N, R, 4B)
        basis = basis.float()
        for i, (result, location_idx) in enumerate(detections):
            chosen, boxes = coefficients[i, location_idx], result.pred_boxes.tensor
            result.set(_PROBS, _mask_probabilities(
                basis[i], chosen, boxes, result.image_size, cell_centre=self.cell_centre,
                paste_stride=self.paste_stride))
            if self.mask_scoring is not None:
                result.scores = rescore(
                    result.scores, self.predicted_mask_iou(basis[i], chosen, boxes,
                                                           result.pred_classes),
                    boxes if self.rescore_trained_sizes_only else None, MASK_STRIDE)
        return [result for result, _ in detections]

    def predicted_mask_iou(self, basis: Tensor, coefficients: Tensor, boxes: Tensor,
                           classes: Tensor) -> Tensor:
        """The re-scoring branch on D detections: (B, Hm, Wm) basis, (D, 4B) coefficients,
        (D, 4) boxes in input pixels, (D,) classes -> (D,) predicted mask IoU; the branch
        sees the cropped probabilities at stride 2, as in training."""
        chunks = [self.mask_scoring(
            crop_split(quadrant_logits(basis, coefficients[s:s + _PASTE_CHUNK]).sigmoid(),
                       boxes[s:s + _PASTE_CHUNK] / MASK_STRIDE, cell_centre=self.cell_centre),
            classes[s:s + _PASTE_CHUNK]) for s in range(0, len(boxes), _PASTE_CHUNK)]
        return torch.cat(chunks) if chunks else boxes.new_zeros((0,))

    def _to_original_size(self, result: Instances, height: int, width: int) -> Instances:
        """detector_postprocess (boxes scaled to (height, width), empty ones dropped), then
        the masks: probabilities resized to the original size, > ``mask_threshold``."""
        probs = result.get(_PROBS)
        result.remove(_PROBS)
        result.set(_ROW, torch.arange(len(result), device=probs.device))
        result = detector_postprocess(result, height, width)
        rows = result.get(_ROW)
        result.remove(_ROW)
        result.pred_masks = resize_and_threshold(probs[rows], (height, width),
                                                 self.mask_threshold)
        return result


def _mask_probabilities(basis: Tensor, coefficients: Tensor, boxes: Tensor,
                        image_size: Tuple[int, int], *, cell_centre: bool = False,
                        paste_stride: int = MASK_STRIDE) -> Tensor:
    """``paste_mask_probabilities`` of (D, 4B) coefficients and (D, 4) boxes, a chunk of
    detections at a time -> (D, H, W)."""
    chunks = [paste_mask_probabilities(basis, coefficients[s:s + _PASTE_CHUNK],
                                       boxes[s:s + _PASTE_CHUNK], image_size,
                                       cell_centre=cell_centre, paste_stride=paste_stride)
              for s in range(0, len(boxes), _PASTE_CHUNK)]
    return torch.cat(chunks) if chunks else basis.new_zeros((0, *image_size))
