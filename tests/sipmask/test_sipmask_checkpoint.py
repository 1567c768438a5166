"""Conversion of SipMask-benchmark checkpoints, on state dicts generated in their layout
(the published files cannot be downloaded here): the key mapping, a complete R-50 and
R-101 checkpoint against the models of configs/SipMask/, and the errors."""
from pathlib import Path
from typing import Dict, Tuple

import pytest
import torch
from detectron2.config import get_cfg
from detectron2.modeling import build_model

from fcos_d2 import add_fcos_config
from fcos_d2.checkpoint import FROZEN_BN_EPS, CheckpointMismatchError, check_matches_model
from fcos_d2.modeling.sipmask import convert_sipmask_key, convert_sipmask_state_dict

REPO = Path(__file__).resolve().parents[2]
Shape = Tuple[int, ...]


def resnet_fpn_layout(depth: int) -> Dict[str, Shape]:
    """Keys and shapes of fcos_core's R-{depth}-FPN-RETINANET backbone (frozen BN: weight,
    bias, running_mean, running_var; FPN inner/layer 2-4 on C3-C5; P6/P7 from P5)."""
    bn = lambda prefix, c: {f"{prefix}.{k}": (c,) for k in
                            ("weight", "bias", "running_mean", "running_var")}
    keys = {"backbone.body.stem.conv1.weight": (64, 3, 7, 7), **bn("backbone.body.stem.bn1", 64)}
    blocks = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3)}[depth]
    in_channels = 64
    for stage, count in enumerate(blocks, start=1):
        width = 64 * 2 ** (stage - 1)
        for i in range(count):
            p = f"backbone.body.layer{stage}.{i}"
            keys.update({f"{p}.conv1.weight": (width, in_channels, 1, 1), **bn(f"{p}.bn1", width),
                         f"{p}.conv2.weight": (width, width, 3, 3), **bn(f"{p}.bn2", width),
                         f"{p}.conv3.weight": (4 * width, width, 1, 1),
                         **bn(f"{p}.bn3", 4 * width)})
            if i == 0:
                keys.update({f"{p}.downsample.0.weight": (4 * width, in_channels, 1, 1),
                             **bn(f"{p}.downsample.1", 4 * width)})
            in_channels = 4 * width
    for n, c in ((2, 512), (3, 1024), (4, 2048)):
        keys.update({f"backbone.fpn.fpn_inner{n}.weight": (256, c, 1, 1),
                     f"backbone.fpn.fpn_inner{n}.bias": (256,),
                     f"backbone.fpn.fpn_layer{n}.weight": (256, 256, 3, 3),
                     f"backbone.fpn.fpn_layer{n}.bias": (256,)})
    for p in ("p6", "p7"):
        keys.update({f"backbone.fpn.top_blocks.{p}.weight": (256, 256, 3, 3),
                     f"backbone.fpn.top_blocks.{p}.bias": (256,)})
    return keys


def sipmask_head_layout() -> Dict[str, Shape]:
    """Keys and shapes of SipMask-benchmark's SipMaskHead (COCO, NUM_CONVS 4, 256 channels):
    cls_tower of 3 conv-GN-ReLU, bbox_tower of 4, feature alignment, coefficients, basis."""
    keys = {}
    for tower, convs in (("cls_tower", 3), ("bbox_tower", 4)):
        for i in range(convs):
            keys.update({f"rpn.head.{tower}.{3 * i}.weight": (256, 256, 3, 3),
                         f"rpn.head.{tower}.{3 * i}.bias": (256,),
                         f"rpn.head.{tower}.{3 * i + 1}.weight": (256,),
                         f"rpn.head.{tower}.{3 * i + 1}.bias": (256,)})
    for name, out in (("cls_logits", 80), ("bbox_pred", 4), ("centerness", 1),
                      ("sip_cof", 128)):
        keys.update({f"rpn.head.{name}.weight": (out, 256, 3, 3), f"rpn.head.{name}.bias": (out,)})
    keys.update({f"rpn.head.scales.{i}.scale": (1,) for i in range(5)})
    keys.update({"rpn.head.feat_align.conv_offset.weight": (72, 4, 1, 1),
                 "rpn.head.feat_align.conv_adaption.weight": (256, 256, 3, 3),
                 "rpn.head.feat_align.conv_adaption.bias": (256,),
                 "rpn.head.feat_align.norm.weight": (256,), "rpn.head.feat_align.norm.bias": (256,),
                 "rpn.head.sip_mask_lat0.weight": (512, 768, 1, 1),
                 "rpn.head.sip_mask_lat0.bias": (512,),
                 "rpn.head.sip_mask_lat.weight": (32, 512, 3, 3),
                 "rpn.head.sip_mask_lat.bias": (32,)})
    return keys


def generated_checkpoint(depth: int) -> Dict[str, torch.Tensor]:
    """A state dict in SipMask-benchmark's layout, as DistributedDataParallel saved it
    ("module." prefixes), every tensor filled with its own index."""
    layout = {**resnet_fpn_layout(depth), **sipmask_head_layout()}
    return {f"module.{key}": torch.full(shape, float(i)) for i, (key, shape) in
            enumerate(layout.items())}


def sipmask_model(config: str):
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(str(REPO / "configs" / "SipMask" / config))
    cfg.MODEL.DEVICE = "cpu"
    return build_model(cfg)


@pytest.mark.parametrize("theirs, ours", [
    ("module.rpn.head.feat_align.conv_offset.weight", "head.feat_align.conv_offset.weight"),
    ("rpn.head.feat_align.conv_adaption.bias", "head.feat_align.conv_adaption.bias"),
    ("rpn.head.feat_align.norm.weight", "head.feat_align.norm.weight"),
    ("rpn.head.sip_cof.weight", "head.sip_cof.weight"),
    ("rpn.head.sip_mask_lat0.bias", "head.sip_mask_lat0.bias"),
    ("rpn.head.sip_mask_lat.weight", "head.sip_mask_lat.weight"),
    ("rpn.head.cls_tower.7.bias", "head.cls_tower.7.bias"),
    ("backbone.body.layer3.22.bn2.running_var",
     "backbone.bottom_up.res4.22.conv2.norm.running_var"),
    ("backbone.fpn.top_blocks.p6.weight", "backbone.top_block.p6.weight"),
])
def test_sipmask_benchmark_keys_map_to_fcos_d2_keys(theirs, ours):
    assert convert_sipmask_key(theirs) == ours


@pytest.mark.parametrize("depth, config", [(50, "SipMask-R50-1x.yaml"),
                                           (101, "SipMask-R101-3x-MS.yaml")])
def test_a_whole_checkpoint_fills_every_tensor_of_the_config_model_and_nothing_else(depth, config):
    source = generated_checkpoint(depth)
    converted = convert_sipmask_state_dict(source)
    model = sipmask_model(config)
    check_matches_model(converted, model)  # no key missing, none left over
    if depth == 50:  # R-50 weights do not fit the R-101 model: its extra blocks are missing
        with pytest.raises(CheckpointMismatchError, match=r"missing \(\d+\): .*res4\.22"):
            check_matches_model(converted, sipmask_model("SipMask-R101-3x-MS.yaml"))
    model.load_state_dict(converted)  # and every shape fits
    state = model.state_dict()
    for theirs, value in source.items():
        ours = convert_sipmask_key(theirs)
        expected = value - FROZEN_BN_EPS if theirs.endswith("running_var") else value
        assert torch.equal(state[ours], expected), theirs


def test_keys_of_another_model_are_listed_and_an_fcos_checkpoint_is_named_as_such():
    source = generated_checkpoint(50)
    source["module.rpn.head.mask_head.weight"] = torch.ones(1)
    with pytest.raises(CheckpointMismatchError,
                       match="1 keys of the SipMask-benchmark checkpoint.*rpn.head.mask_head"):
        convert_sipmask_state_dict(source)
    fcos_only = {k: v for k, v in source.items()
                 if "sip_" not in k and "feat_align" not in k and "mask_head" not in k}
    with pytest.raises(CheckpointMismatchError, match="not a SipMask-benchmark checkpoint.*"
                                                      "convert_official_fcos.py"):
        convert_sipmask_state_dict(fcos_only)


def test_converter_cli_writes_weights_that_the_r50_config_loads(tmp_path, scripts):
    source, target = tmp_path / "SipMask_R50_1x.pth", tmp_path / "converted.pth"
    torch.save({"model": generated_checkpoint(50), "iteration": 90000}, source)
    result = scripts.run("tools/convert_sipmask.py", str(source), str(target),
                         "--config-file", "configs/SipMask/SipMask-R50-1x.yaml")
    assert result.returncode == 0, result.stderr
    converted = torch.load(target, weights_only=True)["model"]
    assert converted["head.sip_cof.weight"].shape == (128, 256, 3, 3)


@pytest.mark.parametrize("config, sizes, style, schedule", [
    ("SipMask-R50-1x.yaml", (800,), "choice", (90000, (60000, 80000))),
    ("SipMask-R101-3x-MS.yaml", (640, 800), "range", (270000, (240000, 260000))),
])
def test_configs_match_sipmask_benchmarks(config, sizes, style, schedule):
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(str(REPO / "configs" / "SipMask" / config))
    assert (cfg.MODEL.META_ARCHITECTURE, cfg.MODEL.MASK_ON) == ("SipMask", True)
    assert (tuple(cfg.INPUT.MIN_SIZE_TRAIN), cfg.INPUT.MIN_SIZE_TRAIN_SAMPLING) == (sizes, style)
    assert (cfg.SOLVER.MAX_ITER, tuple(cfg.SOLVER.STEPS)) == schedule
    assert (cfg.SOLVER.IMS_PER_BATCH, cfg.SOLVER.BASE_LR, cfg.INPUT.MIN_SIZE_TEST) == (16, 0.01, 800)
    fcos = cfg.MODEL.FCOS  # the improved FCOS of their configs
    assert (fcos.CENTER_SAMPLING_RADIUS, fcos.LOC_LOSS_TYPE, fcos.NORM_REG_TARGETS,
            fcos.CENTERNESS_ON_REG, fcos.NUM_CONVS) == (1.5, "giou", True, True, 4)
    assert (cfg.MODEL.SIPMASK.NUM_BASIS, cfg.MODEL.SIPMASK.MASK_THRESHOLD) == (32, 0.4)


def test_model_weights_take_a_sipmask_benchmark_file_as_published(tmp_path):
    from fcos_d2.checkpoint import FCOSCheckpointer, checkpoint_layout

    source = generated_checkpoint(50)
    assert checkpoint_layout(source) == "sipmask"
    path = tmp_path / "SipMask_R50_1x.pth"
    torch.save({"model": source, "optimizer": {}, "iteration": 89999}, path)
    model = sipmask_model("SipMask-R50-1x.yaml")
    loaded = FCOSCheckpointer(model).load(str(path))
    assert "iteration" not in loaded  # their run's iteration is not ours
    state = model.state_dict()
    for theirs in ("module.rpn.head.sip_cof.weight", "module.rpn.head.feat_align.norm.bias",
                   "module.backbone.body.layer1.0.conv1.weight"):
        assert torch.equal(state[convert_sipmask_key(theirs)], source[theirs]), theirs
