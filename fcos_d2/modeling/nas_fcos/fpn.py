"""The searched NAS-FCOS FPN, built from any valid genotype, as a detectron2 backbone.

Symbols: N images, C the FPN width, Ck the backbone's k-th input feature (C2-C5, strides
4-32), fj the j-th pool entry (0-3: adapted C2-C5; 4 + i: cell i's output).

Forward: each backbone feature a cell reads is adapted to C channels (1x1 conv, BN, ReLU,
``adapt[j]``); each cell
reads two pool entries, applies its operations at their own resolutions and aggregates
them at the finer one; of the unused cell outputs, the last three become P5, P4 and P3
(each plus every earlier unused output resized to it, then resized to C5, C4 and C3's
size); P6 and P7 come from P5 by stride-2 3x3 convs (ReLU between), as in FCOS.
"""
from typing import Dict, List, Optional, Sequence

from detectron2.layers import ShapeSpec
from detectron2.modeling import BACKBONE_REGISTRY, Backbone
from detectron2.modeling.backbone import build_resnet_backbone
from detectron2.modeling.backbone.fpn import LastLevelP6P7
from torch import Tensor, nn
from torch.nn import functional as F

from .backbones import build_mobilenet_v2
from .genotypes import NUM_INPUTS, FPNGenotype, parse_fpn_genotype
from .ops import build_aggregation, build_fpn_op

BOTTOM_UPS = ("resnet", "mobilenet_v2")


class Cell(nn.Module):
    """Two operations on two pool entries, then an aggregation."""

    def __init__(self, inputs: Sequence[int], ops: Sequence[str], aggregation: str,
                 channels: int):
        super().__init__()
        self.inputs = tuple(inputs)
        self.ops = nn.ModuleList([build_fpn_op(op, channels) for op in ops])
        self.aggregate = build_aggregation(aggregation, channels)

    def forward(self, pool: List[Tensor]) -> Tensor:
        x, y = (op(pool[i]) for op, i in zip(self.ops, self.inputs))
        return self.aggregate(x, y)


def _resize(x: Tensor, size) -> Tensor:
    if tuple(x.shape[-2:]) == tuple(size):
        return x
    return F.interpolate(x, size=tuple(size), mode="bilinear", align_corners=False)


class NASFCOSFPN(Backbone):
    """The searched FPN on a bottom-up network giving four features, fine to coarse.

    Outputs "p3".."p5" (strides 8-32) and, with ``top_blocks``, "p6" and "p7", each with
    ``channels`` channels.
    """

    def __init__(self, *, bottom_up: Backbone, in_features: Sequence[str],
                 genotype: FPNGenotype, channels: int = 256, top_blocks: bool = True):
        super().__init__()
        shapes = bottom_up.output_shape()
        missing = [f for f in in_features if f not in shapes]
        if len(in_features) != NUM_INPUTS or missing:
            raise ValueError(f"MODEL.NAS_FCOS.IN_FEATURES: {list(in_features)} must be "
                             f"{NUM_INPUTS} features of the bottom-up network, which gives "
                             f"{sorted(shapes)}")
        self.bottom_up = bottom_up
        self.in_features = list(in_features)
        self.genotype = genotype
        # Adapters only for the inputs some cell reads (the published genotype never reads
        # C2): a parameter no output depends on would stall DistributedDataParallel.
        read = sorted({i for cell in genotype.cells for i in cell.inputs if i < NUM_INPUTS})
        self.adapt = nn.ModuleDict({
            str(i): nn.Sequential(nn.Conv2d(shapes[in_features[i]].channels, channels, 1,
                                            bias=False),
                                  nn.BatchNorm2d(channels), nn.ReLU())
            for i in read})
        self.cells = nn.ModuleList([Cell(c.inputs, c.ops, c.aggregation, channels)
                                    for c in genotype.cells])
        self.top_block = LastLevelP6P7(channels, channels, in_feature="p5") if top_blocks \
            else None
        strides = [shapes[f].stride for f in in_features[1:]]  # C3-C5: P3-P5
        if top_blocks:
            strides += [strides[-1] * 2, strides[-1] * 4]
        names = [f"p{k}" for k in range(3, 3 + len(strides))]
        self._out_features = names
        self._out_feature_channels = {name: channels for name in names}
        self._out_feature_strides = dict(zip(names, strides))
        self._size_divisibility = shapes[in_features[-1]].stride

    @property
    def size_divisibility(self) -> int:
        return self._size_divisibility

    def decode(self, inputs: List[Tensor]) -> List[Tensor]:
        """C2-C5 (N, Ck, Hk, Wk) -> [P3, P4, P5], each (N, C, Hk, Wk) for k = 3, 4, 5."""
        pool: List[Optional[Tensor]] = [self.adapt[str(i)](x) if str(i) in self.adapt
                                        else None for i, x in enumerate(inputs)]
        for cell in self.cells:
            pool.append(cell(pool))
        unused = self.genotype.unused()
        extra, outputs = unused[:-3], unused[-3:]
        pyramid = []
        for index, target in zip(outputs, (inputs[3], inputs[2], inputs[1])):  # P5, P4, P3
            out = pool[index]
            for e in extra:
                out = out + _resize(pool[e], out.shape[-2:])
            pyramid.append(_resize(out, target.shape[-2:]))
        return pyramid[::-1]

    def pyramid(self, bottom_up: Dict[str, Tensor]) -> Dict[str, Tensor]:
        """The outputs from given bottom-up features (the search trains on cached ones)."""
        pyramid = self.decode([bottom_up[f] for f in self.in_features])
        if self.top_block is not None:
            pyramid.extend(self.top_block(pyramid[-1]))
        return dict(zip(self._out_features, pyramid))

    def forward(self, x: Tensor) -> Dict[str, Tensor]:
        return self.pyramid(self.bottom_up(x))

    def output_shape(self) -> Dict[str, ShapeSpec]:
        return {name: ShapeSpec(channels=self._out_feature_channels[name],
                                stride=self._out_feature_strides[name])
                for name in self._out_features}


def build_bottom_up(cfg, input_shape: ShapeSpec) -> Backbone:
    """detectron2's ResNet/ResNeXt (``MODEL.RESNETS``) or torchvision's MobileNetV2, per
    ``MODEL.NAS_FCOS.BOTTOM_UP``."""
    kind = cfg.MODEL.NAS_FCOS.BOTTOM_UP
    if kind == "resnet":
        if any(cfg.MODEL.RESNETS.DEFORM_ON_PER_STAGE):
            raise ValueError("MODEL.RESNETS.DEFORM_ON_PER_STAGE: the NAS-FCOS models have no "
                             "deformable backbone stages; set it to [False] * 4")
        return build_resnet_backbone(cfg, input_shape)
    if kind == "mobilenet_v2":
        return build_mobilenet_v2(input_channels=input_shape.channels)
    raise ValueError(f"MODEL.NAS_FCOS.BOTTOM_UP: unknown '{kind}', expected one of {BOTTOM_UPS}")


@BACKBONE_REGISTRY.register()
def build_nas_fcos_backbone(cfg, input_shape: ShapeSpec) -> NASFCOSFPN:
    """The bottom-up network and the searched FPN of ``MODEL.NAS_FCOS``; P6/P7 when
    ``MODEL.FCOS.TOP_BLOCKS_IN`` is "p5", none when it is ""."""
    node = cfg.MODEL.NAS_FCOS
    top_in = cfg.MODEL.FCOS.TOP_BLOCKS_IN
    if top_in not in ("p5", ""):
        raise ValueError(f"MODEL.FCOS.TOP_BLOCKS_IN: NAS-FCOS builds P6/P7 from P5 ('p5') or "
                         f"none (''), got '{top_in}'")
    return NASFCOSFPN(bottom_up=build_bottom_up(cfg, input_shape),
                      in_features=node.IN_FEATURES,
                      genotype=parse_fpn_genotype(node.FPN_GENOTYPE),
                      channels=node.CHANNELS, top_blocks=top_in == "p5")


def fpn_parameter_count(model: nn.Module) -> int:
    """Parameters of the FPN only (adapters, cells, top blocks), for the search's log."""
    skip = {id(p) for p in model.bottom_up.parameters()}
    return sum(p.numel() for p in model.parameters() if id(p) not in skip)


__all__ = ["Cell", "NASFCOSFPN", "build_nas_fcos_backbone", "build_bottom_up", "BOTTOM_UPS",
           "fpn_parameter_count"]
