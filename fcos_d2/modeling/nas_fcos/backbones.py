"""MobileNetV2 as a detectron2 bottom-up network for the NAS-FCOS FPN.

torchvision's MobileNetV2 ``features`` up to index 17 (the final 1x1 conv to 1280 channels
is dropped); the outputs of blocks 3, 6, 13 and 17 are "res2".."res5" (24, 32, 96 and 320
channels at strides 4, 8, 16 and 32), as the NAS-FCOS MobileNet models use them. Its
BatchNorm layers train. Nothing is downloaded: ImageNet or COCO weights come from
``MODEL.WEIGHTS`` (the NAS-FCOS checkpoint converter maps their MobileNet names).
"""
from typing import Dict

from detectron2.layers import ShapeSpec
from detectron2.modeling import Backbone
from torch import Tensor, nn
from torchvision.models import mobilenet_v2

# features index -> (output name, channels, stride)
MOBILENET_V2_OUTPUTS = {3: ("res2", 24, 4), 6: ("res3", 32, 8), 13: ("res4", 96, 16),
                        17: ("res5", 320, 32)}


class MobileNetV2Features(Backbone):
    """torchvision's MobileNetV2 blocks 0-17; outputs "res2".."res5" (see the module doc)."""

    def __init__(self, features: nn.Sequential):
        super().__init__()
        self.features = features
        self._out_features = [name for name, _, _ in MOBILENET_V2_OUTPUTS.values()]

    def forward(self, x: Tensor) -> Dict[str, Tensor]:
        outputs = {}
        for index, block in enumerate(self.features):
            x = block(x)
            if index in MOBILENET_V2_OUTPUTS:
                outputs[MOBILENET_V2_OUTPUTS[index][0]] = x
        return outputs

    def output_shape(self) -> Dict[str, ShapeSpec]:
        return {name: ShapeSpec(channels=channels, stride=stride)
                for name, channels, stride in MOBILENET_V2_OUTPUTS.values()}


def build_mobilenet_v2(input_channels: int = 3) -> MobileNetV2Features:
    """MobileNetV2 blocks 0-17 with torchvision's initialisation (no weights loaded)."""
    if input_channels != 3:
        raise ValueError(f"MobileNetV2 takes 3 input channels, the config gives "
                         f"{input_channels} (MODEL.PIXEL_MEAN)")
    features = mobilenet_v2(weights=None).features[:18]
    return MobileNetV2Features(features)
