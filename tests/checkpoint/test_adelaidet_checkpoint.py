"""Conversion of AdelaiDet FCOS checkpoints and configs: key mapping, strictness, options.

The checkpoints are built by ``adelaidet_fcos_state_dict``, which lays out the parameter
names and shapes of AdelaiDet's R-50 FCOS as its modules create them (read from AdelaiDet's
adet/modeling/fcos/fcos.py, adet/modeling/backbone/fpn.py and detectron2's ResNet/FPN).
"""
import runpy
import sys
import textwrap
from pathlib import Path
from typing import Dict

import pytest
import torch
from detectron2.checkpoint import DetectionCheckpointer
from detectron2.config import get_cfg
from detectron2.modeling import build_model

from fcos_d2 import add_fcos_config, get_config_file
from fcos_d2.checkpoint import (AdelaiDetConfigError, CheckpointMismatchError,
                                check_matches_model, convert_adelaidet_key,
                                convert_adelaidet_state_dict, fcos_d2_config_from_adelaidet)
from fcos_d2.checkpoint.adelaidet_config import translate_fcos_options

REPO = Path(__file__).resolve().parents[2]
HEAD = "proposal_generator.fcos_head"


def _conv_bn(prefix: str, out_c: int, in_c: int, k: int) -> Dict[str, tuple]:
    """detectron2 Conv2d without bias + FrozenBN: weight, norm.{weight,bias,running_*}."""
    shapes = {f"{prefix}.weight": (out_c, in_c, k, k)}
    shapes.update({f"{prefix}.norm.{n}": (out_c,)
                   for n in ("weight", "bias", "running_mean", "running_var")})
    return shapes


def _resnet(depth: int, num_stages: int, prefix: str = "backbone.bottom_up") -> Dict[str, tuple]:
    """detectron2's ResNet-18 or -50 up to stage res{num_stages + 1}."""
    shapes = _conv_bn(f"{prefix}.stem.conv1", 64, 3, 7)
    blocks, expansion = {18: ((2, 2, 2, 2), 1), 50: ((3, 4, 6, 3), 4)}[depth]
    in_c = 64
    for stage, (num_blocks, width) in enumerate(zip(blocks[:num_stages], (64, 128, 256, 512)),
                                                start=2):
        out_c = width * expansion
        for i in range(num_blocks):
            block, block_in = f"{prefix}.res{stage}.{i}", in_c if i == 0 else out_c
            if i == 0 and in_c != out_c:
                shapes.update(_conv_bn(f"{block}.shortcut", out_c, in_c, 1))
            if depth == 18:  # BasicBlock
                shapes.update(_conv_bn(f"{block}.conv1", out_c, block_in, 3))
                shapes.update(_conv_bn(f"{block}.conv2", out_c, out_c, 3))
                continue
            shapes.update(_conv_bn(f"{block}.conv1", width, block_in, 1))
            shapes.update(_conv_bn(f"{block}.conv2", width, width, 3))
            shapes.update(_conv_bn(f"{block}.conv3", out_c, width, 1))
        in_c = out_c
    return shapes


def _head(num_classes: int, norm: str, levels: int, channels: int,
          num_convs: int) -> Dict[str, tuple]:
    """AdelaiDet's FCOSHead: towers of [conv, norm, ReLU] x num_convs (a per-level BN list
    when norm is "BN"), cls_logits, bbox_pred, ctrness, one Scale per level."""
    shapes = {}
    for tower in ("cls_tower", "bbox_tower"):
        for i in range(num_convs):
            shapes[f"{HEAD}.{tower}.{3 * i}.weight"] = (channels, channels, 3, 3)
            shapes[f"{HEAD}.{tower}.{3 * i}.bias"] = (channels,)
            norms = [f"{3 * i + 1}"] if norm == "GN" else [f"{3 * i + 1}.{lv}" for lv in range(levels)]
            names = ("weight", "bias") if norm == "GN" else ("weight", "bias", "running_mean",
                                                              "running_var")
            shapes.update({f"{HEAD}.{tower}.{n}.{p}": (channels,) for n in norms for p in names})
    for name, out_c in (("cls_logits", num_classes), ("bbox_pred", 4), ("ctrness", 1)):
        shapes[f"{HEAD}.{name}.weight"] = (out_c, channels, 3, 3)
        shapes[f"{HEAD}.{name}.bias"] = (out_c,)
    shapes.update({f"{HEAD}.scales.{lv}.scale": (1,) for lv in range(levels)})
    return shapes


def adelaidet_fcos_state_dict(*, depth: int = 50, fpn_levels=(3, 4, 5), top_levels: int = 2,
                              channels: int = 256, num_convs: int = 4, num_classes: int = 80,
                              norm: str = "GN") -> Dict[str, torch.Tensor]:
    """The state dict of an AdelaiDet FCOS (by default R-50, as its
    configs/FCOS-Detection/R_50_1x.yaml), each tensor filled with its own index so that the
    mapping of values can be checked."""
    shapes = _resnet(depth, num_stages=max(fpn_levels) - 1)
    stage_channels = {18: (64, 128, 256, 512), 50: (256, 512, 1024, 2048)}[depth]
    for level in fpn_levels:
        shapes[f"backbone.fpn_lateral{level}.weight"] = (channels, stage_channels[level - 2], 1, 1)
        shapes[f"backbone.fpn_lateral{level}.bias"] = (channels,)
        shapes[f"backbone.fpn_output{level}.weight"] = (channels, channels, 3, 3)
        shapes[f"backbone.fpn_output{level}.bias"] = (channels,)
    for p in ("p6", "p7")[:top_levels]:
        shapes[f"backbone.top_block.{p}.weight"] = (channels, channels, 3, 3)
        shapes[f"backbone.top_block.{p}.bias"] = (channels,)
    shapes.update(_head(num_classes, norm, len(fpn_levels) + top_levels, channels, num_convs))
    return {key: torch.full(shape, float(i)) for i, (key, shape) in enumerate(shapes.items())}


def fcos_r50_cfg():
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(get_config_file("FCOS-R50.yaml"))
    cfg.MODEL.DEVICE = "cpu"
    return cfg


@pytest.fixture(scope="module")
def fcos_r50():
    return build_model(fcos_r50_cfg())


@pytest.mark.parametrize("adelaidet, ours", [
    ("module.backbone.bottom_up.res4.5.conv2.norm.running_var",
     "backbone.bottom_up.res4.5.conv2.norm.running_var"),
    ("backbone.bottom_up.res5.2.conv2_offset.weight", "backbone.bottom_up.res5.2.conv2.offset.weight"),
    ("backbone.fpn_lateral3.weight", "backbone.fpn_lateral3.weight"),
    ("backbone.top_block.p7.bias", "backbone.top_block.p7.bias"),
    (f"{HEAD}.cls_tower.10.weight", "head.cls_tower.10.weight"),
    (f"{HEAD}.bbox_tower.9.conv.weight", "head.bbox_tower.9.weight"),
    (f"{HEAD}.bbox_tower.9.offset.bias", "head.bbox_tower.9.offset.bias"),
    (f"{HEAD}.share_tower.1.bias", "head.share_tower.1.bias"),
    (f"{HEAD}.ctrness.weight", "head.centerness.weight"),
    (f"{HEAD}.scales.4.scale", "head.scales.4.scale"),
])
def test_adelaidet_keys_map_to_fcos_d2_keys(adelaidet, ours):
    assert convert_adelaidet_key(adelaidet) == ours


def test_adelaidet_r50_checkpoint_converts_to_every_parameter_of_the_fcos_r50_model(fcos_r50):
    source = adelaidet_fcos_state_dict()
    converted, pixels = convert_adelaidet_state_dict(source)
    check_matches_model(converted, fcos_r50)  # raises on any missing or unexpected key
    incompatible = fcos_r50.load_state_dict(converted, strict=False)
    assert not incompatible.missing_keys and not incompatible.unexpected_keys
    assert torch.equal(fcos_r50.head.centerness.weight, source[f"{HEAD}.ctrness.weight"])
    assert torch.equal(fcos_r50.backbone.bottom_up.res3[1].conv2.norm.running_var,
                       source["backbone.bottom_up.res3.1.conv2.norm.running_var"])  # no eps shift
    assert pixels == {"pixel_mean": None, "pixel_std": None}


def test_unknown_keys_are_an_error_that_lists_them():
    source = adelaidet_fcos_state_dict()
    source["roi_heads.box_predictor.cls_score.weight"] = torch.ones(1)
    source[f"{HEAD}.cls_tower.1.0.weight"] = torch.ones(256)  # a per-level BN of a BN head
    with pytest.raises(CheckpointMismatchError, match=r"(?s)2 keys .*roi_heads.box_predictor"
                       r".cls_score.weight.*cls_tower.1.0.weight.*1 of them are per-level norms"):
        convert_adelaidet_state_dict(source)


def test_missing_keys_are_an_error_that_lists_them(fcos_r50):
    source = adelaidet_fcos_state_dict()
    del source[f"{HEAD}.scales.4.scale"]
    converted, _ = convert_adelaidet_state_dict(source)
    with pytest.raises(CheckpointMismatchError, match=r"missing \(1\): head.scales.4.scale"):
        check_matches_model(converted, fcos_r50)


def test_pixel_normalization_stored_by_old_detectron2_is_returned_not_converted():
    source = adelaidet_fcos_state_dict()
    source["pixel_mean"] = torch.tensor([103.53, 116.28, 123.675]).view(3, 1, 1)
    converted, pixels = convert_adelaidet_state_dict(source)
    assert "pixel_mean" not in converted
    assert pixels["pixel_mean"] == pytest.approx([103.53, 116.28, 123.675])


def test_adelaidet_fcos_options_translate_or_fail_by_name():
    ours, errors, warnings = translate_fcos_options(
        {"TOP_LEVELS": 0, "THRESH_WITH_CTR": True, "INFERENCE_TH_TEST": 0.04,
         "CENTER_SAMPLE": False, "LOSS_NORMALIZER_CLS": "moving_fg", "NORM": "NaiveGN"})
    assert errors == []
    assert (ours["TOP_BLOCKS_IN"], ours["INFERENCE_TH_ON"], ours["INFERENCE_TH_TEST"]) == \
        ("", "final_score", pytest.approx(0.2))
    assert (ours["CENTER_SAMPLING_RADIUS"], ours["LOSS_NORMALIZER"], ours["NORM"]) == \
        (0.0, "ema", "GN")
    assert len(warnings) == 1 and "moving_fg" in warnings[0]
    _, errors, _ = translate_fcos_options({"TOP_LEVELS": 1, "NORM": "SyncBN",
                                           "NUM_CLS_CONVS": 2, "LOSS_WEIGHT_CLS": 2.0})
    assert [e.split(" ")[0] for e in errors] == ["NUM_CLS_CONVS", "TOP_LEVELS", "NORM",
                                                 "LOSS_WEIGHT_CLS"]


def _write_adelaidet_configs(folder: Path, model_extra: str = "") -> Path:
    """AdelaiDet's configs/FCOS-Detection/{Base-FCOS,R_50_1x}.yaml, as published, with
    ``model_extra`` lines added under MODEL."""
    (folder / "Base-FCOS.yaml").write_text(textwrap.dedent("""\
        MODEL:
          META_ARCHITECTURE: "OneStageDetector"
          BACKBONE:
            NAME: "build_fcos_resnet_fpn_backbone"
          RESNETS:
            OUT_FEATURES: ["res3", "res4", "res5"]
          FPN:
            IN_FEATURES: ["res3", "res4", "res5"]
          PROPOSAL_GENERATOR:
            NAME: "FCOS"
        DATASETS:
          TRAIN: ("coco_2017_train",)
          TEST: ("coco_2017_val",)
        SOLVER:
          IMS_PER_BATCH: 16
          BASE_LR: 0.01
          STEPS: (60000, 80000)
          MAX_ITER: 90000
        INPUT:
          MIN_SIZE_TRAIN: (640, 672, 704, 736, 768, 800)
        """))
    leaf = folder / "R_50_1x.yaml"
    leaf.write_text(textwrap.dedent("""\
        _BASE_: "Base-FCOS.yaml"
        MODEL:
          WEIGHTS: "detectron2://ImageNetPretrained/MSRA/R-50.pkl"
          RESNETS:
            DEPTH: 50
        {}INPUT:
          MIN_SIZE_TRAIN: (800,)
        OUTPUT_DIR: "output/fcos/R_50_1x"
        """).format(model_extra))
    return leaf


def test_adelaidet_config_becomes_the_equivalent_fcos_d2_config(tmp_path):
    cfg, warnings = fcos_d2_config_from_adelaidet(str(_write_adelaidet_configs(tmp_path)))
    assert warnings == []
    assert (cfg.MODEL.META_ARCHITECTURE, cfg.MODEL.RESNETS.DEPTH, cfg.INPUT.MIN_SIZE_TRAIN) == \
        ("FCOS", 50, (800,))
    assert list(cfg.MODEL.PIXEL_MEAN) == [103.53, 116.28, 123.675]  # detectron2's, as AdelaiDet
    assert (cfg.MODEL.FCOS.TOP_BLOCKS_IN, cfg.MODEL.FCOS.NORM, cfg.TEST.DETECTIONS_PER_IMAGE) == \
        ("p5", "GN", 100)
    bad = _write_adelaidet_configs(tmp_path, "  FCOS:\n    TOP_LEVELS: 1\n    NORM: BN\n")
    with pytest.raises(AdelaiDetConfigError, match=r"(?s)R_50_1x.yaml: 2 options .*TOP_LEVELS 1"
                                                   r".*NORM 'BN'"):
        fcos_d2_config_from_adelaidet(str(bad))


# A small FCOS-RT-like AdelaiDet model (R-18 to res4, P3-P4, 64 channels, one conv per
# tower), to keep the command-line run cheap.
TINY_ADELAIDET = """\
  RESNETS:
    DEPTH: 18
    RES2_OUT_CHANNELS: 64
    OUT_FEATURES: ["res3", "res4"]
  FPN:
    IN_FEATURES: ["res3", "res4"]
    OUT_CHANNELS: 64
  FCOS:
    NUM_CLASSES: 6
    TOP_LEVELS: 0
    IN_FEATURES: ["p3", "p4"]
    FPN_STRIDES: [8, 16]
    SIZES_OF_INTEREST: [64]
    NUM_CLS_CONVS: 1
    NUM_BOX_CONVS: 1
    THRESH_WITH_CTR: True
"""


def test_converter_cli_writes_weights_and_config_that_detectron2_loads(tmp_path, monkeypatch,
                                                                     capsys):
    source, target = tmp_path / "adelaidet.pth", tmp_path / "converted.pth"
    torch.save({"model": adelaidet_fcos_state_dict(
        depth=18, fpn_levels=(3, 4), top_levels=0, channels=64, num_convs=1, num_classes=6),
        "iteration": 99}, source)
    adelaidet_config = _write_adelaidet_configs(tmp_path, TINY_ADELAIDET)
    monkeypatch.setattr(sys, "argv", ["convert_adelaidet_fcos.py", str(source), str(target),
                                      "--adelaidet-config", str(adelaidet_config)])
    runpy.run_path(str(REPO / "tools" / "convert_adelaidet_fcos.py"), run_name="__main__")
    assert f"wrote {target}.yaml" in capsys.readouterr().out
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(f"{target}.yaml")
    assert cfg.MODEL.WEIGHTS == str(target)
    assert (cfg.MODEL.FCOS.INFERENCE_TH_ON, cfg.MODEL.FCOS.TOP_BLOCKS_IN) == ("final_score", "")
    cfg.MODEL.DEVICE = "cpu"
    model = build_model(cfg)
    DetectionCheckpointer(model).load(cfg.MODEL.WEIGHTS)
    loaded, written = model.state_dict(), torch.load(target, weights_only=True)["model"]
    assert sorted(loaded) == sorted(written)
    assert all(torch.equal(loaded[k], written[k]) for k in loaded)


def test_converter_warns_when_the_config_normalizes_input_unlike_adelaidet():
    pixel_warnings = runpy.run_path(str(REPO / "tools" / "convert_adelaidet_fcos.py"))[
        "pixel_warnings"]
    cfg = fcos_r50_cfg()  # the official FCOS mean, not detectron2's that AdelaiDet keeps
    no_pixels = {"pixel_mean": None, "pixel_std": None}
    assert pixel_warnings(cfg, no_pixels) == [
        "MODEL.PIXEL_MEAN: AdelaiDet's default config normalizes with [103.53, 116.28, 123.675],"
        " the config with [102.9801, 115.9465, 122.7717]; evaluate with MODEL.PIXEL_MEAN "
        "'[103.53, 116.28, 123.675]'"]
    cfg.MODEL.PIXEL_MEAN = [103.53, 116.28, 123.675]
    assert pixel_warnings(cfg, no_pixels) == []
    assert len(pixel_warnings(cfg, {"pixel_mean": None, "pixel_std": [57.4, 57.1, 58.4]})) == 1
