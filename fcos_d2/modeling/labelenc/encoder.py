"""The label-encoding function (LEF): a small ResNet-style encoder of the label map with
an FPN of the detector's kind on top, giving features at the detector's levels and width.

Symbols: N images, K classes, H x W the padded input size, w = LEF width.

The encoder follows the official one: a 7x7 stride-2 conv (K -> 2w channels, no norm, no
ReLU), then stages res2-res5 of bottleneck blocks without norms, each stage starting with
stride 2 (strides 4, 8, 16, 32), bottleneck channels w, 2w, 4w, 8w and outputs 4x those.
"""
from typing import Dict, Sequence

import torch.nn.functional as F
from detectron2.layers import Conv2d, ShapeSpec
from detectron2.modeling import Backbone
from detectron2.modeling.backbone.fpn import FPN
from fvcore.nn import weight_init
from torch import Tensor, nn

from ..backbone import fcos_fpn

STAGES = ("res2", "res3", "res4", "res5")


class _Bottleneck(nn.Module):
    """1x1 -> 3x3 (stride) -> 1x1 convs with biases and ReLUs, no norms; a 1x1 shortcut
    conv (no bias) where the channels change."""

    def __init__(self, in_channels: int, mid_channels: int, out_channels: int, stride: int):
        super().__init__()
        self.conv1 = Conv2d(in_channels, mid_channels, 1)
        self.conv2 = Conv2d(mid_channels, mid_channels, 3, stride=stride, padding=1)
        self.conv3 = Conv2d(mid_channels, out_channels, 1)
        self.shortcut = (Conv2d(in_channels, out_channels, 1, stride=stride, bias=False)
                         if in_channels != out_channels else None)
        for conv in (self.conv1, self.conv2, self.conv3, self.shortcut):
            if conv is not None:
                weight_init.c2_xavier_fill(conv)  # kaiming-uniform (a=1), as the official

    def forward(self, x: Tensor) -> Tensor:
        out = self.conv3(F.relu(self.conv2(F.relu(self.conv1(x)))))
        return F.relu(out + (self.shortcut(x) if self.shortcut is not None else x))


class LabelEncodingFunction(Backbone):
    """The LEF's encoder: (N, K, H, W) label maps -> {"res2": (N, 4w, H/4, W/4), ...,
    "res5": (N, 32w, H/32, W/32)} (those of ``out_features``), a detectron2 backbone so
    that detectron2's FPN takes it."""

    def __init__(self, *, in_channels: int, width: int = 64,
                 depth: Sequence[int] = (1, 2, 2, 1), out_features: Sequence[str] = STAGES):
        """``out_features``: the stages returned; none deeper than the deepest is built
        (unused parameters would stop DistributedDataParallel)."""
        super().__init__()
        unknown = [f for f in out_features if f not in STAGES]
        if unknown:
            raise ValueError(f"LabelEnc's LEF gives {STAGES}, not {unknown} "
                             "(MODEL.FPN.IN_FEATURES)")
        self.stages = list(STAGES[:max(STAGES.index(f) for f in out_features) + 1])
        self.stem = nn.Conv2d(in_channels, 2 * width, 7, stride=2, padding=3)
        channels = 2 * width
        self._out_feature_channels, self._out_feature_strides = {}, {}
        for i, (name, blocks) in enumerate(zip(self.stages, depth)):
            mid = width * 2 ** i
            stage = [_Bottleneck(channels if b == 0 else 4 * mid, mid, 4 * mid, 2 if b == 0 else 1)
                     for b in range(blocks)]
            self.add_module(name, nn.Sequential(*stage))
            channels = 4 * mid
            self._out_feature_channels[name] = channels
            self._out_feature_strides[name] = 2 ** (i + 2)
        self._out_features = list(out_features)

    def forward(self, x: Tensor) -> Dict[str, Tensor]:
        x = self.stem(x)
        outputs = {}
        for name in self.stages:
            x = getattr(self, name)(x)
            outputs[name] = x
        return {name: outputs[name] for name in self._out_features}

    def output_shape(self) -> Dict[str, ShapeSpec]:
        return {name: ShapeSpec(channels=self._out_feature_channels[name],
                                stride=self._out_feature_strides[name])
                for name in self._out_features}


def build_label_encoder(cfg) -> FPN:
    """The LEF of ``MODEL.LABELENC`` with the FPN (and P6/P7) the detector's backbone builder
    puts on its ResNet: its outputs have the detector's feature names, strides and width,
    and its FPN's parameters the names of the detector's FPN."""
    node = cfg.MODEL.LABELENC
    out_features = list(cfg.MODEL.FPN.IN_FEATURES)
    if cfg.MODEL.FCOS.TOP_BLOCKS_IN == "res5" and "res5" not in out_features:
        out_features.append("res5")  # P6 from C5 (original FCOS)
    encoder = LabelEncodingFunction(in_channels=cfg.MODEL.FCOS.NUM_CLASSES, width=node.LEF_WIDTH,
                                    depth=node.LEF_DEPTH, out_features=out_features)
    return fcos_fpn(cfg, encoder)
