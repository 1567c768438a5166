"""ResNet/ResNeXt + FPN backbones for FCOS, registered in detectron2's BACKBONE_REGISTRY.

Outputs P3-P7 (strides 8-128). P6/P7 come from P5 (improved FCOS) or from C5 (original
FCOS, like RetinaNet), per ``MODEL.FCOS.TOP_BLOCKS_IN``. Deformable convolution in the
ResNet stages (``MODEL.RESNETS.DEFORM_ON_PER_STAGE``) runs on torchvision's op, so it needs
no detectron2 C++ extension.
"""
from detectron2.layers import ShapeSpec
from detectron2.modeling import BACKBONE_REGISTRY
from detectron2.modeling.backbone import FPN, ResNet, build_resnet_backbone
from detectron2.modeling.backbone.fpn import LastLevelP6P7
from detectron2.modeling.backbone.resnet import BottleneckBlock

from .layers import DeformConv2d

TOP_BLOCKS_INPUTS = ("p5", "res5", "")  # "": no P6/P7 (FCOS-RT uses P3-P5)


def make_stages_deformable(resnet: ResNet, on_per_stage, *, modulated: bool,
                           deform_groups: int) -> None:
    """Turns the 3x3 conv of every bottleneck in the chosen stages (res2..res5) into a
    deformable conv, keeping its weights, norm and frozen state."""
    for stage, deformable in zip(resnet.stages, on_per_stage):
        if not deformable:
            continue
        for block in stage:
            if not isinstance(block, BottleneckBlock):
                raise ValueError("MODEL.RESNETS.DEFORM_ON_PER_STAGE needs bottleneck blocks "
                                 "(ResNet-50 or deeper)")
            conv = block.conv2
            deform = DeformConv2d(
                conv.in_channels, conv.out_channels, conv.kernel_size[0], stride=conv.stride[0],
                padding=conv.padding[0], dilation=conv.dilation[0], groups=conv.groups,
                deform_groups=deform_groups, modulated=modulated, bias=conv.bias is not None,
                norm=conv.norm)
            deform.weight.data.copy_(conv.weight.data)
            deform.requires_grad_(conv.weight.requires_grad)
            block.conv2 = deform


@BACKBONE_REGISTRY.register()
def build_fcos_resnet_fpn_backbone(cfg, input_shape: ShapeSpec) -> FPN:
    """detectron2's ResNet (``MODEL.RESNETS``) + FPN (``MODEL.FPN``) + P6/P7."""
    on_per_stage = list(cfg.MODEL.RESNETS.DEFORM_ON_PER_STAGE)
    plain = cfg.clone()
    plain.defrost()
    plain.MODEL.RESNETS.DEFORM_ON_PER_STAGE = [False] * 4  # detectron2's own needs _C
    bottom_up = build_resnet_backbone(plain, input_shape)
    make_stages_deformable(bottom_up, on_per_stage, modulated=cfg.MODEL.RESNETS.DEFORM_MODULATED,
                           deform_groups=cfg.MODEL.RESNETS.DEFORM_NUM_GROUPS)
    return fcos_fpn(cfg, bottom_up)


def fcos_fpn(cfg, bottom_up) -> FPN:
    """detectron2's FPN (``MODEL.FPN``) + P6/P7 (``MODEL.FCOS.TOP_BLOCKS_IN``) on any
    backbone that gives ``MODEL.FPN.IN_FEATURES`` (LabelEnc puts it on its label encoder)."""
    top_in = cfg.MODEL.FCOS.TOP_BLOCKS_IN
    if top_in not in TOP_BLOCKS_INPUTS:
        raise ValueError(f"MODEL.FCOS.TOP_BLOCKS_IN: unknown '{top_in}', expected one of "
                         f"{TOP_BLOCKS_INPUTS}")
    out_channels = cfg.MODEL.FPN.OUT_CHANNELS
    top_block = None
    if top_in:
        top_channels = out_channels if top_in == "p5" else bottom_up.output_shape()["res5"].channels
        top_block = LastLevelP6P7(top_channels, out_channels, in_feature=top_in)
    return FPN(
        bottom_up=bottom_up,
        in_features=cfg.MODEL.FPN.IN_FEATURES,
        out_channels=out_channels,
        norm=cfg.MODEL.FPN.NORM,
        top_block=top_block,
        fuse_type=cfg.MODEL.FPN.FUSE_TYPE,
    )
