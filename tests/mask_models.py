"""Test helpers for mask models: ``FCOSWithBoxMasks``, an FCOS whose detections carry masks
(registered as a META_ARCH, so that a config builds it), and
``assert_masks_in_original_pixels``, the check that a mask model's ``pred_masks`` follow
detectron2's conventions in the original image."""
import torch
from detectron2.modeling import META_ARCH_REGISTRY
from detectron2.structures import Instances

from fcos_d2 import FCOS


class FCOSWithBoxMasks(FCOS):
    """FCOS whose detections also carry ``pred_masks``: each box filled, (R, H, W) bool in
    the size the detections are reported in (the original image's when "height" and
    "width" are given), as a mask model returns them."""

    def forward(self, batched_inputs):
        outputs = super().forward(batched_inputs)
        for output in [] if self.training else outputs:
            found = output["instances"]
            found.pred_masks = self.filled_boxes(found.pred_boxes.tensor, *found.image_size
                                                 ).to(found.scores.device)
        return outputs

    @staticmethod
    def filled_boxes(boxes: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """(R, 4) boxes -> (R, H, W) bool: the pixels each box touches."""
        ys, xs = torch.arange(height)[:, None], torch.arange(width)[None]  # (H, 1), (1, W)
        x0, y0, x1, y1 = boxes.T.cpu()[..., None, None]  # (R, 1, 1) each
        return (xs >= x0.floor()) & (xs < x1.ceil()) & (ys >= y0.floor()) & (ys < y1.ceil())


if "FCOSWithBoxMasks" not in META_ARCH_REGISTRY:
    META_ARCH_REGISTRY.register(FCOSWithBoxMasks)


def assert_masks_in_original_pixels(instances: Instances, height: int, width: int,
                                    margin: float = 0.0) -> None:
    """Asserts detectron2's conventions for ``pred_masks`` of detections reported at
    (height, width): one (H, W) bool mask per detection, each inside its box grown by
    ``margin`` pixels (rounded out to whole pixels): a model whose masks come from a coarser
    map than the image (SipMask: stride 2 of the input) may spill over by a cell or two."""
    masks = instances.pred_masks
    assert instances.image_size == (height, width)
    assert masks.dtype == torch.bool and tuple(masks.shape) == (len(instances), height, width)
    ys, xs = torch.arange(height)[:, None], torch.arange(width)[None]  # (H, 1), (1, W)
    for mask, box in zip(masks.cpu(), instances.pred_boxes.tensor.cpu()):
        x0, y0 = (box[:2] - margin).floor()
        x1, y1 = (box[2:] + margin).ceil()
        inside = (xs >= x0) & (xs < x1) & (ys >= y0) & (ys < y1)
        assert not (mask & ~inside).any(), f"a mask has pixels outside its box {box.tolist()}"
