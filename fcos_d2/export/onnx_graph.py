"""The whole FCOS detector as one traceable module: images in, detections out.

Traced by ``tools/export_onnx.py`` into one ONNX graph (and, with ``--torchscript``, into a
TorchScript file). It runs the model's own pieces (``FCOS.forward_head``,
``compute_locations``, ``regression_in_pixels``, ``candidate_scores``, ``decode_boxes``) and
replaces only the data-dependent parts of ``postprocess_image`` by equivalents with fixed
shapes: a masked top-k per level instead of nonzero-then-top-k, one NMS over the batch with
a box offset per (image, class) instead of a loop over images.

Symbols: N images, H x W the input batch, L levels, Ri = Hi * Wi locations of level i,
K classes, T = ``PRE_NMS_TOPK_TEST`` candidate slots per level, S = L * T slots per image,
D detections of the whole batch.

Contract of the graph:
    inputs:
        images (N, 3, H, W) float32 (or uint8) pixels in ``INPUT.FORMAT``; any N, H, W.
            Image i lies at the top-left, the rest is padding. Resizing to
            ``INPUT.MIN_SIZE_TEST`` / ``MAX_SIZE_TEST`` stays outside the graph; padding to
            the backbone's size divisibility happens inside. Pad a batch only up to its
            largest image, as ``ImageList`` does: more padding means more locations.
        image_sizes (N, 2) int64: (h_i, w_i), the valid size of each image.
    outputs:
        boxes (D, 4) float32 XYXY in input pixels, clipped to the image's (h_i, w_i);
        scores (D,) float32 = sqrt(class probability * centerness);
        classes (D,) int64, 0-based;
        batch_index (D,) int64, the image each detection belongs to.
    Detections are grouped by image in batch order, each image's best first, at most
    ``TEST.DETECTIONS_PER_IMAGE`` per image. They equal ``FCOS`` (eval mode) on the images at
    their own size: ``postprocess_image``, then ``detector_postprocess`` at scale 1, which
    drops empty boxes. Rescaling to the original image size is the caller's business.
"""
from typing import List, Tuple

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torchvision.ops import nms

from ..modeling.assignment import compute_locations
from ..modeling.meta_arch import FCOS, flatten_levels
from ..modeling.postprocess import candidate_scores, decode_boxes
from .dense import PaddedImages

INPUT_NAMES = ["images", "image_sizes"]
OUTPUT_NAMES = ["boxes", "scores", "classes", "batch_index"]
# Metadata key of the exported ONNX file: the training iterations of the exported weights
# (written by ``files.export_onnx``, read by ``runtime.ONNXRuntimeDetector``).
ITERATION_KEY = "fcos_d2.iterations_trained"


class FCOSDetectorGraph(nn.Module):
    """Wraps a trained FCOS (weights shared): ``forward(images, image_sizes)`` ->
    (boxes, scores, classes, batch_index), as the module docstring says."""

    def __init__(self, model: FCOS):
        super().__init__()
        self.model = model

    def forward(self, images: Tensor,
                image_sizes: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        model = self.model
        logits, regression, centerness = model.forward_head(
            PaddedImages(self.normalize(images, image_sizes)))
        locations = compute_locations([x.shape[-2:] for x in logits], model.strides,
                                      images.device)
        per_level = [self.level_candidates(*level) for level in zip(
            logits, model.regression_in_pixels(regression), centerness, locations)]
        boxes, scores, classes, valid = (torch.cat(parts, dim=1) for parts in zip(*per_level))
        boxes = clip_to_sizes(boxes, image_sizes)  # (N, S, 4)
        return self.select(boxes, torch.sqrt(scores), classes, valid, image_sizes)

    def normalize(self, images: Tensor, image_sizes: Tensor) -> Tensor:
        """Normalized pixels, zero outside each image's size and in the padding up to the
        size divisibility, as ``FCOS.preprocess_image`` pads with ``ImageList``."""
        model = self.model
        x = (images.float() - model.pixel_mean) / model.pixel_std  # (N, 3, H, W)
        height, width = x.shape[-2:]
        rows = torch.arange(height, device=x.device)[None, :, None]  # (1, H, 1)
        cols = torch.arange(width, device=x.device)[None, None, :]  # (1, 1, W)
        inside = (rows < image_sizes[:, 0, None, None]) & (cols < image_sizes[:, 1, None, None])
        x = torch.where(inside[:, None], x, torch.zeros_like(x))  # (N, 3, H, W)
        divisor = model.backbone.size_divisibility
        if divisor > 1:
            x = F.pad(x, [0, (divisor - width % divisor) % divisor,
                          0, (divisor - height % divisor) % divisor])
        return x

    def level_candidates(self, logits: Tensor, ltrb: Tensor, ctr_logits: Tensor,
                         locations: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        """The T best candidates of one level per image, as ``select_level_candidates``
        finds them, in T fixed slots (``valid`` marks the slots that hold one).

        Args:
            logits (N, K, Hi, Wi), ltrb (N, 4, Hi, Wi) in pixels, ctr_logits (N, 1, Hi, Wi),
            locations (Ri, 2).

        Returns:
            boxes (N, T, 4) XYXY, scores (N, T) = probability * centerness, classes (N, T),
            valid (N, T) bool.
        """
        model, slots = self.model, self.model.topk_candidates
        logits, ltrb, ctr_logits = (flatten_levels([x]) for x in (logits, ltrb, ctr_logits))
        num_classes = logits.shape[2]
        scores, candidates = candidate_scores(  # (N, Ri, K) each
            logits, ctr_logits[..., 0], score_thresh=model.score_thresh,
            threshold_on=model.score_thresh_on)
        ranked = torch.where(candidates, scores, torch.full_like(scores, -1.0)).flatten(1)
        # T padding slots, so that top-k of T always exists, whatever Ri * K is.
        ranked = torch.cat([ranked, ranked.new_full((ranked.shape[0], slots), -1.0)], dim=1)
        top, index = ranked.topk(slots, dim=1)  # (N, T); candidates first: scores >= 0
        valid = top >= 0
        index = torch.where(valid, index, torch.zeros_like(index))  # padding slots -> 0
        location = torch.div(index, num_classes, rounding_mode="floor")  # (N, T)
        box_ltrb = ltrb.gather(1, location[..., None].expand(-1, -1, 4))  # (N, T, 4)
        boxes = decode_boxes(locations.index_select(0, location.flatten()),  # (N * T, 4)
                             box_ltrb.reshape(-1, 4))
        # (padding slots score -1: clamped, so that the square root stays a number)
        return boxes.reshape(-1, slots, 4), top.clamp(min=0), index % num_classes, valid

    def select(self, boxes: Tensor, scores: Tensor, classes: Tensor, valid: Tensor,
               image_sizes: Tensor) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        """Class-wise NMS per image, the best ``max_detections_per_image`` per image, then
        non-empty boxes only. Inputs (N, S, ...) as from :meth:`level_candidates`, all
        levels; outputs as the module docstring says."""
        model = self.model
        slots = model.topk_candidates * len(model.strides)  # S, a constant of the graph
        # Flat indices and index_select throughout: ONNX Gather, no advanced indexing.
        flat_scores, flat_boxes = scores.flatten(), boxes.reshape(-1, 4)  # (N * S,), (N * S, 4)
        position = valid.flatten().nonzero()[:, 0]  # (V,) the valid slots
        image = torch.div(position, slots, rounding_mode="floor")
        group = image * model.num_classes + classes.flatten().index_select(0, position)  # (V,)
        keep = class_wise_nms(flat_boxes.index_select(0, position),
                              flat_scores.index_select(0, position), group,
                              extent=image_sizes.max(), iou_threshold=model.nms_thresh)
        kept = position.index_select(0, keep)
        kept_scores = torch.full_like(flat_scores, -1.0).scatter(
            0, kept, flat_scores.index_select(0, kept))
        most = min(model.max_detections_per_image, slots)
        top, index = kept_scores.reshape(-1, slots).topk(most, dim=1)  # (N, most) each
        boxes = boxes.gather(1, index[..., None].expand(-1, -1, 4)).reshape(-1, 4)  # (N * most, 4)
        classes, top = classes.gather(1, index).flatten(), top.flatten()  # (N * most,)
        widths, heights = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
        # detector_postprocess keeps non-empty boxes only (Boxes.nonempty, threshold 0)
        chosen = ((top >= 0) & (widths > 0) & (heights > 0)).nonzero()[:, 0]  # (D,) image-major
        return (boxes.index_select(0, chosen), top.index_select(0, chosen),
                classes.index_select(0, chosen), torch.div(chosen, most, rounding_mode="floor"))


def clip_to_sizes(boxes: Tensor, image_sizes: Tensor) -> Tensor:
    """(N, S, 4) XYXY boxes clipped to [0, w_i] x [0, h_i] as ``Boxes.clip`` does;
    image_sizes (N, 2) (h, w)."""
    height, width = image_sizes[:, 0:1], image_sizes[:, 1:2]  # (N, 1) each
    limits = torch.cat([width, height, width, height], dim=1).to(boxes.dtype)[:, None]  # (N, 1, 4)
    return torch.minimum(boxes.clamp(min=0), limits)


def class_wise_nms(boxes: Tensor, scores: Tensor, groups: Tensor, *, extent: Tensor,
                   iou_threshold: float) -> Tensor:
    """NMS within each group, as one NMS (ONNX ``NonMaxSuppression``) over boxes moved
    apart by ``group * (extent + 1)``, the coordinate trick of torchvision's
    ``batched_nms``. The offset comes from the image sizes, not from the boxes, so that
    no reduction runs over a possibly empty set.

    Args:
        boxes: (V, 4) XYXY within [0, extent].
        scores: (V,).
        groups: (V,) int64, e.g. image * K + class.
        extent: scalar tensor, the largest coordinate a box can have.
        iou_threshold: boxes overlapping a better one of their group by more are dropped.

    Returns:
        (V',) indices of the kept boxes, best first.
    """
    offsets = groups.to(boxes.dtype) * (extent.to(boxes.dtype) + 1)  # (V,)
    return nms(boxes + offsets[:, None], scores, iou_threshold)


def split_by_image(outputs: List, num_images: int) -> List[Tuple]:
    """The graph's flat outputs (numpy arrays or tensors) -> per image (boxes, scores,
    classes)."""
    boxes, scores, classes, batch_index = outputs
    return [(boxes[batch_index == i], scores[batch_index == i], classes[batch_index == i])
            for i in range(num_images)]
