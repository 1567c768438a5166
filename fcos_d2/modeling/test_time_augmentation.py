"""Test-time augmentation for FCOS: the model runs on resized and flipped copies of each
image (``TEST.AUG.MIN_SIZES``, ``TEST.AUG.MAX_SIZE``, ``TEST.AUG.FLIP``, detectron2's keys),
the detections go back to the original image and are merged by class-wise NMS
(``MODEL.FCOS.NMS_TH_TEST``), keeping the best ``TEST.DETECTIONS_PER_IMAGE``.

The copies come from detectron2's ``DatasetMapperTTA`` (public in v0.6 and main), which
records the transforms (``detectron2.data.transforms``) that map the original image to
each copy; their inverses map the boxes back. ``train_net.py --eval-only`` uses it when
``TEST.AUG.ENABLED``.

Symbols: A augmented copies of an image, D detections of one copy, B of all copies.
"""
from typing import Callable, Dict, List, Tuple

import torch
from detectron2.config import configurable
from detectron2.layers import batched_nms
from detectron2.modeling import DatasetMapperTTA
from detectron2.structures import Boxes, Instances
from torch import nn
from ..parallel import unwrap_ddp

from .meta_arch import FCOS


class FCOSWithTTA(nn.Module):
    """Wraps a trained ``FCOS`` for inference with test-time augmentation.

    Input: detectron2's list of dicts, each with "image" (C, H, W) as the test loader gives
    it and optionally "height"/"width", the size to report detections in (default: the
    image's). Output: per image {"instances": Instances} with ``pred_boxes``, ``scores``
    and ``pred_classes``, best first, as ``FCOS`` returns them.
    """

    @configurable
    def __init__(
        self,
        *,
        model: FCOS,
        tta_mapper: Callable[[Dict], List[Dict]],
        nms_thresh: float = 0.6,
        max_detections_per_image: int = 100,
        batch_size: int = 3,
    ):
        """
        Args:
            model: the FCOS model (unwrapped from DistributedDataParallel).
            tta_mapper: input dict -> its augmented copies, each with "image" and
                "transforms" (original image -> copy), as ``DatasetMapperTTA``.
            nms_thresh: IoU threshold of the class-wise NMS that merges the copies.
            max_detections_per_image: detections kept per image after merging.
            batch_size: copies run through the model at once.
        """
        super().__init__()
        model = unwrap_ddp(model)
        if not isinstance(model, FCOS):
            raise TypeError(f"FCOSWithTTA: needs an FCOS model (MODEL.META_ARCHITECTURE "
                            f"'FCOS'), got {type(model).__name__}")
        self.model, self.tta_mapper = model, tta_mapper
        self.nms_thresh, self.max_detections_per_image = nms_thresh, max_detections_per_image
        self.batch_size = batch_size

    @classmethod
    def from_config(cls, cfg, model: nn.Module, batch_size: int = 3):
        if not cfg.TEST.AUG.MIN_SIZES:
            raise ValueError("TEST.AUG.MIN_SIZES: empty; test-time augmentation needs at "
                             "least one shorter-side size")
        return {
            "model": model,
            "tta_mapper": DatasetMapperTTA(cfg),
            "nms_thresh": cfg.MODEL.FCOS.NMS_TH_TEST,
            "max_detections_per_image": cfg.TEST.DETECTIONS_PER_IMAGE,
            "batch_size": batch_size,
        }

    def forward(self, batched_inputs: List[Dict]) -> List[Dict[str, Instances]]:
        return [{"instances": self._inference_one_image(x)} for x in batched_inputs]

    @torch.no_grad()
    def _inference_one_image(self, inputs: Dict) -> Instances:
        size = (inputs.get("height", inputs["image"].shape[1]),
                inputs.get("width", inputs["image"].shape[2]))
        copies = self.tta_mapper({**inputs, "height": size[0], "width": size[1]})  # A dicts
        boxes, scores, classes = [], [], []
        for start in range(0, len(copies), self.batch_size):
            batch = copies[start:start + self.batch_size]
            # Without "height"/"width", FCOS reports boxes in the copy's own size.
            outputs = self.model([{"image": c["image"]} for c in batch])
            for augmented, output in zip(batch, outputs):
                found = output["instances"]  # D detections in the copy
                to_original = augmented["transforms"].inverse()
                back = to_original.apply_box(found.pred_boxes.tensor.cpu().numpy())  # (D, 4)
                boxes.append(torch.as_tensor(back, dtype=torch.float32).to(found.scores.device))
                scores.append(found.scores)
                classes.append(found.pred_classes)
        return self._merge(torch.cat(boxes), torch.cat(scores), torch.cat(classes), size)

    def _merge(self, boxes: torch.Tensor, scores: torch.Tensor, classes: torch.Tensor,
               size: Tuple[int, int]) -> Instances:
        """Class-wise NMS over the (B, 4) boxes of all copies, in the original image."""
        boxes = Boxes(boxes)
        boxes.clip(size)
        keep = batched_nms(boxes.tensor, scores, classes, self.nms_thresh)
        keep = keep[:self.max_detections_per_image]
        result = Instances(size)
        result.pred_boxes, result.scores, result.pred_classes = \
            boxes[keep], scores[keep], classes[keep]
        return result
