"""LabelEnc's two training models, each an FCOS with training-only parts, registered as the
META_ARCHs "LabelEncStep1" and "LabelEncStep2" (``MODEL.LABELENC.STEP`` must agree).

Symbols: N images, L levels, C the FPN width, K classes, H x W the padded input size.

Both are ``FCOS`` subclasses: the detector's parameters keep FCOS's names (``backbone.``,
``head.``), the LEF is ``label_encoder.`` and the adapter ``adapter.``; inference is
FCOS's own. The current iteration, which switches the losses on and off, is read from
detectron2's event storage (``storage.iter``, restored on resume).

* ``LabelEncStep1``: the FCOS losses on the detector's features, the same head's FCOS losses
  on the LEF's features of the (randomly scaled) label map, and after
  ``distance_warmup_iters`` the distance loss between adapted detector features and the
  detached LEF features. With ``train_detector`` False, the head's losses on the LEF's
  features alone: the detector (backbone and adapter) is frozen and never runs.
* ``LabelEncStep2``: the FCOS losses, and during the first ``auxiliary_iters`` the same
  distance to the frozen LEF's features of the unscaled label map.
"""
from typing import Dict, List, Tuple

import torch
from detectron2.config import configurable
from detectron2.modeling import META_ARCH_REGISTRY
from detectron2.utils.events import get_event_storage
from torch import Tensor, nn

from ..assignment import compute_locations
from ..meta_arch import FCOS
from .config import check_labelenc_config
from .distance import feature_distance, make_adapter, touch
from .encoder import build_label_encoder
from .label_map import label_map, random_label_scales


class _LabelEncFCOS(FCOS):
    """FCOS with a label encoder and an adapter, and the pieces both steps share."""

    @configurable
    def __init__(self, *, label_encoder: nn.Module, adapter: nn.Module, **options):
        """``options``: the keyword arguments of ``FCOS``."""
        super().__init__(**options)
        self.label_encoder = label_encoder
        self.adapter = adapter

    @classmethod
    def from_config(cls, cfg):
        check_labelenc_config(cfg)
        options = super().from_config(cfg)
        return {**options, "label_encoder": build_label_encoder(cfg),
                "adapter": make_adapter(cfg.MODEL.FPN.OUT_CHANNELS)}

    def encode_labels(self, instances, size, *, scaled: bool) -> List[Tensor]:
        """The LEF's per-level features (N, C, Hi, Wi) of the batch's label maps at the
        padded input ``size`` (H, W); boxes scaled at random if ``scaled``."""
        maps = [label_map(x.gt_boxes.tensor, x.gt_classes, num_classes=self.num_classes,
                          height=size[0], width=size[1],
                          scales=random_label_scales(len(x), self.device) if scaled else None)
                for x in instances]
        features = self.label_encoder(torch.stack(maps))  # (N, K, H, W) in
        return [features[f] for f in self.head_in_features]

    def detect_from_labels(self, batched_inputs: List[Dict]) -> List[Dict]:
        """The head's detections on the LEF's features of each input's ground truth (the
        unscaled label map; "instances" at the input size), post-processed as FCOS's:
        how well the LEF encodes the labels for the head. The detector does not run."""
        images = self.preprocess_image(batched_inputs)
        targets = self.encode_labels(self.training_instances(batched_inputs),
                                     images.tensor.shape[-2:], scaled=False)
        return self.detections(batched_inputs, images, *self.head(targets))

    def training_instances(self, batched_inputs: List[Dict]) -> List:
        """The batch's ground-truth ``Instances`` on the device."""
        if "instances" not in batched_inputs[0]:
            raise ValueError("LabelEnc needs 'instances' in every input dict to train and to "
                             "detect from labels")
        return [x["instances"].to(self.device) for x in batched_inputs]

    def training_inputs(self, batched_inputs: List[Dict]):
        """(padded images, instances on the device, per-level detector features)."""
        instances = self.training_instances(batched_inputs)
        images = self.preprocess_image(batched_inputs)
        features = self.backbone(images.tensor)
        return images, instances, [features[f] for f in self.head_in_features]

    def detection_losses(self, instances, features: List[Tensor]) -> Dict[str, Tensor]:
        """FCOS's losses of the head on per-level ``features``."""
        logits, regression, centerness = self.head(features)
        locations = compute_locations([x.shape[-2:] for x in logits], self.strides, self.device)
        return self.losses(locations, instances, logits, regression, centerness)

    def distance(self, features: List[Tensor], targets: List[Tensor]) -> Tensor:
        """The distance of the adapted detector features to (detached) LEF features."""
        return feature_distance([self.adapter(x) for x in features], [t.detach() for t in targets])


def _iteration() -> int:
    """The 0-based iteration of the running training (detectron2's event storage)."""
    try:
        return get_event_storage().iter
    except AssertionError:
        raise RuntimeError("LabelEnc trains inside a detectron2 trainer (or an EventStorage "
                           "context): its losses depend on the iteration") from None


@META_ARCH_REGISTRY.register()
class LabelEncStep1(_LabelEncFCOS):
    """LabelEnc step 1: the detector and the LEF learn together (see the module docstring)."""

    @configurable
    def __init__(self, *, lef_loss_weight: float = 1.0, distance_loss_weight: float = 1.0,
                 distance_warmup_iters: int = 0, train_detector: bool = True, **options):
        super().__init__(**options)
        self.lef_loss_weight = lef_loss_weight
        self.distance_loss_weight = distance_loss_weight
        self.distance_warmup_iters = distance_warmup_iters
        self.train_detector = train_detector
        if not train_detector:  # frozen: no optimizer state, nothing unused for DDP
            self.backbone.requires_grad_(False)
            self.adapter.requires_grad_(False)

    @classmethod
    def from_config(cls, cfg):
        node = cfg.MODEL.LABELENC
        return {**super().from_config(cfg), "lef_loss_weight": node.LEF_LOSS_WEIGHT,
                "distance_loss_weight": node.DISTANCE_LOSS_WEIGHT,
                "distance_warmup_iters": node.DISTANCE_LOSS_WARMUP_ITERS,
                "train_detector": node.STEP1_DETECTOR}

    def lef_losses(self, instances, size) -> Tuple[List[Tensor], Dict[str, Tensor]]:
        """The LEF's per-level features of the randomly scaled label maps at the padded
        input ``size`` (H, W), and the weighted head losses on them (``loss_labelenc_*``)."""
        targets = self.encode_labels(instances, size, scaled=True)
        losses = self.detection_losses(instances, targets)
        return targets, {k.replace("loss_fcos", "loss_labelenc"): v * self.lef_loss_weight
                         for k, v in losses.items()}

    def forward(self, batched_inputs: List[Dict]):
        if not self.training:
            return super().forward(batched_inputs)
        if not self.train_detector:
            instances = self.training_instances(batched_inputs)
            size = self.preprocess_image(batched_inputs).tensor.shape[-2:]  # padded (H, W)
            return self.lef_losses(instances, size)[1]
        images, instances, features = self.training_inputs(batched_inputs)
        losses = self.detection_losses(instances, features)
        targets, lef_losses = self.lef_losses(instances, images.tensor.shape[-2:])
        losses.update(lef_losses)
        if _iteration() < self.distance_warmup_iters:
            # no distance yet: the adapter gets no gradient but its weight decay (official:
            # none; ~3% over the COCO warm-up) and stays in the graph for DDP
            losses["loss_labelenc_distance"] = touch(self.adapter)
        else:
            losses["loss_labelenc_distance"] = self.distance_loss_weight * self.distance(
                features, targets)
        return losses


@META_ARCH_REGISTRY.register()
class LabelEncStep2(_LabelEncFCOS):
    """LabelEnc step 2: the final detector, with the frozen LEF as an auxiliary target for
    the first ``auxiliary_iters`` iterations (see the module docstring)."""

    @configurable
    def __init__(self, *, auxiliary_loss_weight: float = 1.0, auxiliary_iters: int = 0,
                 **options):
        super().__init__(**options)
        self.label_encoder.requires_grad_(False)
        self.label_encoder.eval()
        self.auxiliary_loss_weight = auxiliary_loss_weight
        self.auxiliary_iters = auxiliary_iters

    @classmethod
    def from_config(cls, cfg):
        node = cfg.MODEL.LABELENC
        return {**super().from_config(cfg), "auxiliary_loss_weight": node.AUXILIARY_LOSS_WEIGHT,
                "auxiliary_iters": node.AUXILIARY_LOSS_ITERS}

    def train(self, mode: bool = True):
        super().train(mode)
        self.label_encoder.eval()  # frozen: also its norms (if MODEL.FPN.NORM has any)
        return self

    def forward(self, batched_inputs: List[Dict]):
        if not self.training:
            return super().forward(batched_inputs)
        images, instances, features = self.training_inputs(batched_inputs)
        losses = self.detection_losses(instances, features)
        if _iteration() < self.auxiliary_iters:
            with torch.no_grad():
                targets = self.encode_labels(instances, images.tensor.shape[-2:], scaled=False)
            losses["loss_labelenc_auxiliary"] = self.auxiliary_loss_weight * self.distance(
                features, targets)
        else:  # the detector alone; the adapter stays in the graph for DDP
            losses["loss_labelenc_auxiliary"] = touch(self.adapter)
        return losses
