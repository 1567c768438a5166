"""FCOS as the proposal generator of a two-stage detector, registered in detectron2's
``PROPOSAL_GENERATOR_REGISTRY`` as "FCOS": ``MODEL.PROPOSAL_GENERATOR.NAME: "FCOS"``
replaces the RPN of a ``GeneralizedRCNN`` (see ``configs/FCOS-RPN-R50.yaml``).

It is ``FCOSBase``: the same head, target assignment, losses and post-processing as the
FCOS detector, configured by the same ``MODEL.FCOS`` keys. Only the selection differs:
proposals are class-agnostic. Per location, the objectness is the best class score
max_k sqrt(p_k * centerness) (the FCOS score, so the logit of the best class is used and
no class is lost), the best ``MODEL.FCOS.PROPOSALS.PRE_NMS_TOPK_*`` per level go through a
class-agnostic NMS, the best ``POST_NMS_TOPK_*`` per image are kept.

Symbols: N images, L levels, Hi x Wi level sizes, K classes, P proposals of one image.
"""
from typing import Dict, List, Optional, Tuple

import torch
from detectron2.config import configurable
from detectron2.layers import ShapeSpec
from detectron2.modeling import PROPOSAL_GENERATOR_REGISTRY
from detectron2.structures import ImageList, Instances
from torch import Tensor

from .assignment import compute_locations
from .fcos_base import FCOSBase

_LOGIT_EPS = 1e-6  # keeps logit() finite for scores of exactly 0 or 1


@PROPOSAL_GENERATOR_REGISTRY.register()
class FCOS(FCOSBase):
    """FCOS proposals, called by ``GeneralizedRCNN`` as
    ``proposals, losses = generator(images, features, gt_instances)``.

    Output: per image, ``Instances`` with ``proposal_boxes`` (P, 4) XYXY in the (unpadded)
    input size and ``objectness_logits`` (P,), best first, as detectron2's ROI heads take
    them from the RPN; in training, also ``loss_fcos_cls``, ``loss_fcos_loc`` and
    ``loss_fcos_ctr`` (the proposals are then fixed: no gradient flows through them).
    """

    @configurable
    def __init__(
        self,
        *,
        pre_nms_topk: Tuple[int, int] = (2000, 1000),
        post_nms_topk: Tuple[int, int] = (1000, 1000),
        proposal_nms_thresh: float = 0.7,
        min_box_size: float = 0.0,
        **options,
    ):
        """
        Args:
            pre_nms_topk: candidates per level before NMS, (training, inference).
            post_nms_topk: proposals per image, (training, inference).
            proposal_nms_thresh: IoU threshold of the class-agnostic NMS.
            min_box_size: proposals with a side below this many pixels are dropped
                (``MODEL.PROPOSAL_GENERATOR.MIN_SIZE``, as the RPN).
            options: the keyword arguments of ``FCOSBase``.
        """
        super().__init__(**options)
        for key, values in (("PRE_NMS_TOPK", pre_nms_topk), ("POST_NMS_TOPK", post_nms_topk)):
            if min(values) < 1:
                raise ValueError(f"MODEL.FCOS.PROPOSALS.{key}_TRAIN/_TEST: must be >= 1, "
                                 f"got {list(values)}")
        if not 0 < proposal_nms_thresh <= 1:
            raise ValueError(f"MODEL.FCOS.PROPOSALS.NMS_THRESH: must lie in (0, 1], got "
                             f"{proposal_nms_thresh}")
        self.pre_nms_topk, self.post_nms_topk = tuple(pre_nms_topk), tuple(post_nms_topk)
        self.proposal_nms_thresh, self.min_box_size = proposal_nms_thresh, float(min_box_size)

    @classmethod
    def from_config(cls, cfg, input_shape: Dict[str, ShapeSpec]):
        fcos, roi_classes = cfg.MODEL.FCOS, cfg.MODEL.ROI_HEADS.NUM_CLASSES
        if fcos.NUM_CLASSES != roi_classes:
            raise ValueError(f"MODEL.FCOS.NUM_CLASSES ({fcos.NUM_CLASSES}) must equal "
                             f"MODEL.ROI_HEADS.NUM_CLASSES ({roi_classes}): the FCOS proposal "
                             f"generator learns the same classes as the ROI heads")
        proposals = fcos.PROPOSALS
        return {
            **super().from_config(cfg, input_shape),
            "pre_nms_topk": (proposals.PRE_NMS_TOPK_TRAIN, proposals.PRE_NMS_TOPK_TEST),
            "post_nms_topk": (proposals.POST_NMS_TOPK_TRAIN, proposals.POST_NMS_TOPK_TEST),
            "proposal_nms_thresh": proposals.NMS_THRESH,
            "min_box_size": cfg.MODEL.PROPOSAL_GENERATOR.MIN_SIZE,
        }

    def forward(self, images: ImageList, features: Dict[str, Tensor],
                gt_instances: Optional[List[Instances]] = None
                ) -> Tuple[List[Instances], Dict[str, Tensor]]:
        logits, regression, centerness = self.head([features[f] for f in self.head_in_features])
        locations = compute_locations([x.shape[-2:] for x in logits], self.strides,
                                      logits[0].device)
        losses = {}
        if self.training:
            if gt_instances is None:
                raise ValueError("FCOS proposal generator in training mode needs gt_instances "
                                 "('instances' in every input dict)")
            losses = self.losses(locations, gt_instances, logits, regression, centerness)
        with torch.no_grad():  # proposals are fixed inputs of the ROI heads, as the RPN's
            proposals = self.proposals(locations, images.image_sizes, logits, regression,
                                       centerness)
        return proposals, losses

    def proposals(self, locations: List[Tensor], image_sizes: List[Tuple[int, int]],
                  logits: List[Tensor], regression: List[Tensor],
                  centerness: List[Tensor]) -> List[Instances]:
        """Class-agnostic proposals per image (see the module docstring)."""
        # The best class of a location has the best score, as the score is monotonic in
        # the class logit: (N, K, Hi, Wi) -> (N, 1, Hi, Wi).
        best_logits = [x.max(dim=1, keepdim=True).values for x in logits]
        stage = 0 if self.training else 1
        detections = self.select(
            locations, image_sizes, best_logits, regression, centerness, score_thresh=0.0,
            topk_candidates=self.pre_nms_topk[stage], nms_thresh=self.proposal_nms_thresh,
            max_detections=self.post_nms_topk[stage])
        return [self._as_proposals(d) for d in detections]

    def _as_proposals(self, detections: Instances) -> Instances:
        keep = detections.pred_boxes.nonempty(threshold=self.min_box_size)
        proposals = Instances(detections.image_size)
        proposals.proposal_boxes = detections.pred_boxes[keep]
        proposals.objectness_logits = torch.logit(detections.scores[keep], eps=_LOGIT_EPS)
        return proposals


FCOSProposalGenerator = FCOS  # the public name; fcos_d2.FCOS is the meta-architecture
