"""Other projects' FCOS behind detectron2's model interface, for the training-quality
benchmark (``benchmarks.train_quality.contenders.OtherFCOS``).

Both take detectron2's batched inputs (list of dicts with "image" (3, H, W) in
``INPUT.FORMAT`` and, in training, "instances") and return a loss dict in training or
per image {"instances": Instances} in inference, so that the benchmark trains and
evaluates them with the same loader, optimizer and evaluator as fcos-d2. They sit on
fcos-d2's backbone (``MODEL.BACKBONE``), so only the detector on top differs.
"""
import math
from collections import OrderedDict
from typing import Dict, List

from detectron2.modeling.postprocessing import detector_postprocess
from detectron2.structures import Boxes, Instances
import torch
from torch import Tensor, nn


class _NamedFeatures(nn.Module):
    """A detectron2 backbone as torchvision wants one: an OrderedDict of the chosen
    features and an ``out_channels`` attribute."""

    def __init__(self, backbone: nn.Module, features: List[str]):
        super().__init__()
        self.body, self.features = backbone, list(features)
        self.out_channels = backbone.output_shape()[self.features[0]].channels

    def forward(self, x: Tensor) -> "OrderedDict[str, Tensor]":
        out = self.body(x)
        return OrderedDict((f, out[f]) for f in self.features)


class TorchvisionFCOS(nn.Module):
    """``torchvision.models.detection.FCOS`` with its own head, losses and inference
    defaults (score threshold 0.2 on sqrt(probability * centerness)), on our backbone."""

    def __init__(self, cfg, backbone: nn.Module):
        super().__init__()
        from torchvision.models.detection import FCOS
        from torchvision.models.detection.anchor_utils import AnchorGenerator

        features = cfg.MODEL.FCOS.IN_FEATURES
        strides = [backbone.output_shape()[f].stride for f in features]
        # Its transform takes [0, 1] pixels: mean and std in the same units make its
        # normalisation equal ours; the sizes equal the loader's, so it resizes nothing.
        self.fcos = FCOS(
            _NamedFeatures(backbone, features), num_classes=cfg.MODEL.FCOS.NUM_CLASSES,
            min_size=cfg.INPUT.MIN_SIZE_TEST, max_size=cfg.INPUT.MAX_SIZE_TEST,
            image_mean=[m / 255 for m in cfg.MODEL.PIXEL_MEAN],
            image_std=[s / 255 for s in cfg.MODEL.PIXEL_STD],
            anchor_generator=AnchorGenerator(tuple((s,) for s in strides), ((1.0,),) * len(strides)),
            center_sampling_radius=cfg.MODEL.FCOS.CENTER_SAMPLING_RADIUS,
            detections_per_img=cfg.TEST.DETECTIONS_PER_IMAGE)
        self.fcos.transform.size_divisible = backbone.size_divisibility or 32

    def forward(self, batched_inputs: List[Dict]):
        device = next(self.parameters()).device
        images = [x["image"].to(device).float() / 255 for x in batched_inputs]
        if self.training:
            targets = [{"boxes": x["instances"].gt_boxes.tensor.to(device),
                        "labels": x["instances"].gt_classes.to(device)} for x in batched_inputs]
            return self.fcos(images, targets)
        results = []
        for x, detections in zip(batched_inputs, self.fcos(images)):
            height, width = x["image"].shape[-2:]
            instances = Instances((height, width), pred_boxes=Boxes(detections["boxes"]),
                                  scores=detections["scores"], pred_classes=detections["labels"])
            results.append({"instances": detector_postprocess(
                instances, x.get("height", height), x.get("width", width))})
        return results


def build_torchvision_fcos(cfg, backbone: nn.Module) -> nn.Module:
    return TorchvisionFCOS(cfg, backbone)


def _group_norm(channels: int) -> nn.Module:
    """detectron2's "GN" (32 groups) for the head's widths. v0.6's RetinaNetHead probes its
    norm with 1 channel, which torch's GroupNorm(32, 1) now refuses; this one accepts it."""
    return nn.GroupNorm(math.gcd(32, channels), channels)


def _fcos_class() -> type:
    """detectron2's FCOS, taking training images without boxes as main does (all its
    locations background). v0.6's ``match_anchors`` fails on them (a max over 0 boxes);
    main's ``label_anchors`` gives such an image background labels and zero boxes."""
    from detectron2.modeling.meta_arch.fcos import FCOS

    if hasattr(FCOS, "_match_anchors"):  # main: handles them itself
        return FCOS

    class FCOSWithEmptyImages(FCOS):
        def label_anchors(self, anchors: List[Boxes], gt_instances: List[Instances]):
            labels, boxes = [], []
            for instances in gt_instances:
                if len(instances):
                    (label,), (box,) = super().label_anchors(anchors, [instances])
                else:
                    count = sum(len(a) for a in anchors)
                    box = Boxes(anchors[0].tensor.new_zeros(count, 4))
                    label = torch.full((count,), self.num_classes, dtype=torch.int64,
                                       device=box.device)
                labels.append(label)
                boxes.append(box)
            return labels, boxes

    return FCOSWithEmptyImages


def build_detectron2_fcos(cfg, backbone: nn.Module) -> nn.Module:
    """detectron2's built-in FCOS (in v0.6 and main) with its defaults (EMA loss
    normalizer, no per-level scale, score threshold 0.2 on sqrt(probability *
    centerness), classification prior 0.01) and the head width, depth and norm of
    ``MODEL.FCOS``."""
    from detectron2.modeling.meta_arch.fcos import FCOSHead

    fcos = cfg.MODEL.FCOS
    shapes = [backbone.output_shape()[f] for f in fcos.IN_FEATURES]
    head = FCOSHead(input_shape=shapes, conv_dims=[shapes[0].channels] * fcos.NUM_CONVS,
                    num_classes=fcos.NUM_CLASSES,
                    norm=_group_norm if fcos.NORM == "GN" else fcos.NORM)
    return _fcos_class()(backbone=backbone, head=head, head_in_features=fcos.IN_FEATURES,
                num_classes=fcos.NUM_CLASSES, center_sampling_radius=fcos.CENTER_SAMPLING_RADIUS,
                pixel_mean=cfg.MODEL.PIXEL_MEAN, pixel_std=cfg.MODEL.PIXEL_STD,
                max_detections_per_image=cfg.TEST.DETECTIONS_PER_IMAGE)
