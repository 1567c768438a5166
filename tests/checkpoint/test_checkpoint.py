"""Conversion of official FCOS checkpoints: key mapping, the norm epsilon, clear errors."""
from pathlib import Path

import pytest
import torch
from detectron2.checkpoint import DetectionCheckpointer

from fcos_d2.checkpoint import (FROZEN_BN_EPS, CheckpointMismatchError, check_matches_model,
                                convert_official_key, convert_official_state_dict)
from reference_case import case_dirs, reference_dir

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("official, ours", [
    ("module.backbone.body.stem.bn1.running_var", "backbone.bottom_up.stem.conv1.norm.running_var"),
    ("backbone.body.layer1.0.downsample.0.weight", "backbone.bottom_up.res2.0.shortcut.weight"),
    ("backbone.body.layer3.5.bn2.bias", "backbone.bottom_up.res4.5.conv2.norm.bias"),
    ("backbone.body.layer4.2.conv2.offset.weight", "backbone.bottom_up.res5.2.conv2.offset.weight"),
    ("backbone.body.layer4.2.conv2.conv.weight", "backbone.bottom_up.res5.2.conv2.weight"),
    ("backbone.fpn.fpn_inner2.weight", "backbone.fpn_lateral3.weight"),
    ("backbone.fpn.fpn_layer4.bias", "backbone.fpn_output5.bias"),
    ("backbone.fpn.top_blocks.p7.weight", "backbone.top_block.p7.weight"),
    ("rpn.head.cls_tower.10.weight", "head.cls_tower.10.weight"),
    ("rpn.head.bbox_tower.9.conv.weight", "head.bbox_tower.9.weight"),
    ("rpn.head.bbox_tower.9.offset.bias", "head.bbox_tower.9.offset.bias"),
    ("rpn.head.scales.4.scale", "head.scales.4.scale"),
])
def test_official_keys_map_to_fcos_d2_keys(official, ours):
    assert convert_official_key(official) == ours


def test_frozen_bn_variance_absorbs_detectron2_epsilon():
    converted = convert_official_state_dict({
        "backbone.body.stem.bn1.running_var": torch.tensor([1.0, 0.5], dtype=torch.float16),
        "rpn.head.cls_tower.1.weight": torch.tensor([2.0]),  # GN: untouched
    })
    assert converted["backbone.bottom_up.stem.conv1.norm.running_var"].dtype == torch.float32
    assert torch.allclose(converted["backbone.bottom_up.stem.conv1.norm.running_var"] + FROZEN_BN_EPS,
                          torch.tensor([1.0, 0.5]), rtol=0, atol=1e-8)
    assert converted["head.cls_tower.1.weight"].tolist() == [2.0]


def test_unknown_keys_are_listed_in_the_error():
    with pytest.raises(CheckpointMismatchError, match="2 keys.*roi_heads.box.weight.*rpn.anchor"):
        convert_official_state_dict({"roi_heads.box.weight": torch.ones(1),
                                     "rpn.anchor": torch.ones(1),
                                     "rpn.head.scales.0.scale": torch.ones(1)})


def test_missing_and_unexpected_keys_are_listed():
    model = torch.nn.Linear(2, 2)
    with pytest.raises(CheckpointMismatchError, match=r"(?s)missing \(1\): bias.*unexpected \(1\): extra"):
        check_matches_model({"weight": torch.ones(2, 2), "extra": torch.ones(1)}, model)


def _reference_checkpoint() -> Path:
    cases = case_dirs()
    if not cases:
        pytest.skip(f"no official checkpoint to convert: no reference case under {reference_dir()}")
    return cases[0] / "official_fp16.pth"


def test_converter_cli_output_loads_through_detectron2_with_no_unmatched_keys(tmp_path, scripts):
    source, target = _reference_checkpoint(), tmp_path / "converted.pth"
    result = scripts.run("tools/convert_official_fcos.py", str(source), str(target),
                         "--config-file", "configs/FCOS-R50.yaml")
    assert result.returncode == 0, result.stderr
    from detectron2.config import get_cfg
    from detectron2.modeling import build_model
    from fcos_d2 import add_fcos_config

    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(str(REPO / "configs/FCOS-R50.yaml"))
    cfg.MODEL.DEVICE = "cpu"
    model = build_model(cfg)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.fill_(float("nan"))  # anything not loaded stays NaN
    # public API only (v0.6 and main): load() logs unmatched keys, so check the model itself
    DetectionCheckpointer(model).load(str(target))
    converted = torch.load(str(target), map_location="cpu", weights_only=True)["model"]
    state = model.state_dict()
    assert sorted(converted) == sorted(state)  # no key missing, none left over
    for name, parameter in model.named_parameters():
        assert torch.equal(parameter, converted[name].to(parameter.dtype)), name


def test_converter_cli_rejects_a_checkpoint_of_another_model(tmp_path, scripts):
    source = tmp_path / "other.pth"
    torch.save({"model": {"roi_heads.box_predictor.weight": torch.ones(1)}}, source)
    result = scripts.run("tools/convert_official_fcos.py", str(source), str(tmp_path / "out.pth"))
    assert result.returncode != 0
    assert "roi_heads.box_predictor.weight" in result.stderr and "other.pth" in result.stderr
