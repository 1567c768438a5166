"""A traceable view of FCOS for ONNX export: image batch in, dense boxes and scores out.

The exported graph holds preprocessing (pixel normalization), backbone, head and box
decoding. It leaves score thresholding, top-k and NMS to the runtime, where they are cheap
and where every deployment wants its own thresholds. The input size is fixed at export
(feature locations are constants of the graph).

Symbols: N images, R locations of all levels, K classes.
"""
from typing import Tuple

import torch
from torch import Tensor, nn

from ..modeling.assignment import compute_locations
from ..modeling.meta_arch import FCOS, flatten_levels
from ..modeling.postprocess import decode_boxes


class FCOSDenseOutputs(nn.Module):
    """Wraps a trained FCOS: ``forward(images)`` -> (boxes, scores).

    Args:
        model: the FCOS model (its weights are shared, not copied).

    Forward:
        images: (N, 3, H, W) float pixels in the model's input format, H and W divisible by
            the backbone's size divisibility.
    Returns:
        boxes (N, R, 4) XYXY in input pixels, not clipped; scores (N, R, K) =
        sqrt(sigmoid(class logit) * sigmoid(centerness)), the score FCOS ranks by. To match
        ``FCOS`` inference, keep pairs whose class probability (score^2 / centerness)
        exceeds ``MODEL.FCOS.INFERENCE_TH_TEST``, then top-k per level and class-wise NMS.
    """

    def __init__(self, model: FCOS):
        super().__init__()
        self.model = model

    def forward(self, images: Tensor) -> Tuple[Tensor, Tensor]:
        model = self.model
        logits, regression, centerness = model.forward_head(
            PaddedImages((images - model.pixel_mean) / model.pixel_std))
        locations = torch.cat(compute_locations([x.shape[-2:] for x in logits], model.strides,
                                                images.device))  # (R, 2)
        logits, regression, centerness = map(
            flatten_levels, (logits, model.regression_in_pixels(regression), centerness))
        boxes = decode_boxes(locations.expand(len(images), -1, -1).reshape(-1, 2),
                             regression.reshape(-1, 4)).reshape(len(images), -1, 4)
        scores = torch.sqrt(logits.sigmoid() * centerness.sigmoid())  # (N, R, K)
        return boxes, scores


class PaddedImages:
    """The part of ImageList that ``FCOS.forward_head`` reads: an already padded batch."""

    def __init__(self, tensor: Tensor):
        self.tensor = tensor
