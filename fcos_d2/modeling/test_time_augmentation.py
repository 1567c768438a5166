"""Test-time augmentation for FCOS: the model runs on resized and flipped copies of each
image (``TEST.AUG.MIN_SIZES``, ``TEST.AUG.MAX_SIZE``, ``TEST.AUG.FLIP``, detectron2's keys),
the detections go back to the original image and are merged by class-wise NMS
(``MODEL.FCOS.NMS_TH_TEST``), keeping the best ``TEST.DETECTIONS_PER_IMAGE``.

For a model whose detections carry ``pred_masks`` (SipMask), each kept detection's mask is
a vote in the original image: from every copy, the detection of its class whose box
overlaps its own most (IoU at least the NMS threshold; in its own copy, itself) gives its
mask, mapped back with the copy's inverse transforms (bilinear for a resize, a mirror for
a flip); a pixel is in the merged mask where at least half of these masks hold it. With the
image itself as the only copy this is the plain mask.

The copies come from detectron2's ``DatasetMapperTTA`` (public in v0.6 and main), which
records the transforms (``detectron2.data.transforms``) that map the original image to
each copy; their inverses map the boxes back. ``train_net.py --eval-only`` uses it when
``TEST.AUG.ENABLED``.

Symbols: A augmented copies of an image, D detections of one copy, B of all copies, K kept
after merging, (h, w) a copy's size, (H, W) the original image's.
"""
from typing import Callable, Dict, List, Tuple

import numpy as np

import torch
from detectron2.config import configurable
from detectron2.layers import batched_nms
from detectron2.modeling import DatasetMapperTTA
from detectron2.structures import Boxes, Instances, pairwise_iou
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
        found, boxes = [], []  # per copy: its detections, their boxes in the original image
        for start in range(0, len(copies), self.batch_size):
            batch = copies[start:start + self.batch_size]
            # Without "height"/"width", FCOS reports boxes in the copy's own size.
            outputs = self.model([{"image": c["image"]} for c in batch])
            for augmented, output in zip(batch, outputs):
                instances = output["instances"]  # D detections in the copy
                back = augmented["transforms"].inverse().apply_box(
                    instances.pred_boxes.tensor.cpu().numpy())  # (D, 4)
                found.append(instances)
                boxes.append(torch.as_tensor(back, dtype=torch.float32).to(
                    instances.scores.device))
        merged = self._merge(torch.cat(boxes), torch.cat([f.scores for f in found]),
                             torch.cat([f.pred_classes for f in found]), size)
        if all(f.has("pred_masks") for f in found):
            merged.pred_masks = self._merged_masks(merged, found, boxes, copies, size)
        return merged

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

    def _merged_masks(self, merged: Instances, found: List[Instances],
                      boxes: List[torch.Tensor], copies: List[Dict],
                      size: Tuple[int, int]) -> torch.Tensor:
        """(K, H, W) bool: each kept detection's mask voted over the copies (module doc)."""
        votes = torch.zeros((len(merged), *size), dtype=torch.float32)  # (K, H, W)
        voters = torch.zeros(len(merged), dtype=torch.float32)  # (K,)
        kept, kept_classes = Boxes(merged.pred_boxes.tensor.cpu()), merged.pred_classes.cpu()
        for instances, copy_boxes, augmented in zip(found, boxes, copies):
            match = matching_detections(kept, kept_classes, Boxes(copy_boxes.cpu()),
                                        instances.pred_classes.cpu(), self.nms_thresh)  # (K,)
            chosen = match >= 0
            if chosen.any():
                masks = instances.pred_masks[match[chosen]].cpu()  # (k, h, w)
                votes[chosen] += masks_to_original(masks, augmented["transforms"], size)
                voters[chosen] += 1
        masks = (2 * votes >= voters[:, None, None]) & (voters > 0)[:, None, None]
        return masks.to(merged.scores.device)


def matching_detections(kept: Boxes, kept_classes: torch.Tensor, boxes: Boxes,
                        classes: torch.Tensor, min_iou: float) -> torch.Tensor:
    """(K,) long: for each of the K kept boxes, the index of the box among `boxes` (D) of
    the same class that overlaps it most, if that IoU is at least `min_iou`; else -1."""
    if len(kept) == 0 or len(boxes) == 0:
        return torch.full((len(kept),), -1, dtype=torch.long)
    iou = pairwise_iou(kept, boxes)  # (K, D)
    iou[kept_classes[:, None] != classes[None, :]] = -1.0
    best_iou, best = iou.max(dim=1)  # (K,), (K,)
    return torch.where(best_iou >= min_iou, best, torch.full_like(best, -1))


def masks_to_original(masks: torch.Tensor, transforms, size: Tuple[int, int],
                      ) -> torch.Tensor:
    """(k, h, w) masks of a copy -> (k, H, W) float32 in [0, 1] in the original image, by the
    inverse of `transforms` (original -> copy): a resize interpolates bilinearly, a flip
    mirrors."""
    if len(masks) == 0:
        return torch.zeros((0, *size), dtype=torch.float32)
    stacked = masks.to(torch.float32).permute(1, 2, 0).numpy()  # (h, w, k)
    back = transforms.inverse().apply_image(np.ascontiguousarray(stacked))
    back = torch.as_tensor(np.ascontiguousarray(back)).reshape(*back.shape[:2], len(masks))
    if tuple(back.shape[:2]) != tuple(size):
        raise ValueError(f"FCOSWithTTA: a copy's masks mapped back to {tuple(back.shape[:2])} "
                         f"pixels, expected the original image's {tuple(size)}")
    return back.permute(2, 0, 1).clamp(0.0, 1.0)  # (k, H, W)
