"""The FCOS model built from configs: every shipped config builds, training and inference
run on tiny inputs, options (DCN, shared tower, centerness branch) take effect."""
import glob
from pathlib import Path

import pytest
import torch
from detectron2.config import get_cfg
from detectron2.modeling import build_model
from detectron2.structures import Boxes, Instances

from fcos_d2 import add_fcos_config
from fcos_d2.layers import DeformConv2d

REPO = Path(__file__).resolve().parents[1]
MODEL_CONFIGS = sorted(glob.glob(str(REPO / "configs" / "FCOS-*.yaml")))


def _cfg(config_file=REPO / "configs" / "FCOS-R50.yaml", **fcos):
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(str(config_file))
    cfg.MODEL.DEVICE, cfg.MODEL.WEIGHTS = "cpu", ""
    for key, value in fcos.items():
        setattr(cfg.MODEL.FCOS, key, value)
    return cfg


def _tiny(cfg):
    """A small network with the same structure: R-18-like widths, 64 FPN channels."""
    cfg.MODEL.RESNETS.DEPTH, cfg.MODEL.RESNETS.RES2_OUT_CHANNELS = 18, 64
    cfg.MODEL.RESNETS.DEFORM_ON_PER_STAGE = [False] * 4
    cfg.MODEL.FPN.OUT_CHANNELS, cfg.MODEL.FCOS.NUM_CONVS, cfg.MODEL.FCOS.NUM_CLASSES = 64, 1, 3
    return cfg


def _inputs(boxes_per_image):
    torch.manual_seed(0)
    inputs = []
    for boxes in boxes_per_image:
        instances = Instances((96, 128))
        instances.gt_boxes = Boxes(torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4))
        instances.gt_classes = torch.arange(len(boxes)) % 3
        inputs.append({"image": torch.rand(3, 96, 128) * 255, "instances": instances})
    return inputs


@pytest.mark.parametrize("config_file", MODEL_CONFIGS, ids=lambda p: Path(p).name)
def test_every_shipped_config_builds_fcos(config_file):
    model = build_model(_cfg(config_file))
    assert type(model).__name__ == "FCOS"
    assert model.strides == [8, 16, 32, 64, 128][:len(model.head_in_features)]


def test_training_returns_the_three_finite_losses_and_gradients():
    model = build_model(_tiny(_cfg()))
    model.train()
    losses = model(_inputs([[[10, 10, 60, 50], [30, 20, 120, 90]], [[0, 0, 20, 20]]]))
    assert set(losses) == {"loss_fcos_cls", "loss_fcos_loc", "loss_fcos_ctr"}
    assert all(torch.isfinite(v) and v > 0 for v in losses.values())
    sum(losses.values()).backward()
    assert torch.isfinite(model.head.cls_logits.weight.grad).all()


def test_images_without_boxes_train_with_finite_losses():
    model = build_model(_tiny(_cfg()))
    model.train()
    losses = model(_inputs([[], []]))
    assert all(torch.isfinite(v) for v in losses.values())
    assert losses["loss_fcos_loc"].item() == 0 and losses["loss_fcos_ctr"].item() == 0


def test_inference_returns_instances_in_the_requested_output_size():
    model = build_model(_tiny(_cfg(INFERENCE_TH_TEST=0.0)))
    model.eval()
    inputs = [{"image": torch.rand(3, 96, 128) * 255, "height": 192, "width": 256}]
    with torch.no_grad():
        (result,) = model(inputs)
    instances = result["instances"]
    assert instances.image_size == (192, 256)
    assert 0 < len(instances) <= 100
    assert (instances.pred_boxes.tensor[:, 2] <= 256).all()
    assert (instances.scores[:-1] >= instances.scores[1:]).all()


def test_deformable_options_use_torchvision_deform_conv_in_backbone_and_towers():
    model = build_model(_cfg(REPO / "configs" / "FCOS-R50-DCNv2.yaml"))
    deform = [name for name, m in model.named_modules() if isinstance(m, DeformConv2d)]
    assert "backbone.bottom_up.res3.0.conv2" in deform and "head.cls_tower.9" in deform
    assert not any(".res2." in name for name in deform)


def test_deform_conv_with_zero_offsets_equals_a_plain_conv():
    torch.manual_seed(0)
    deform = DeformConv2d(4, 6, 3, padding=1, modulated=False)
    plain = torch.nn.Conv2d(4, 6, 3, padding=1)
    plain.weight.data.copy_(deform.weight.data)
    plain.bias.data.copy_(deform.bias.data)
    x = torch.randn(2, 4, 9, 11)
    torch.testing.assert_close(deform(x), plain(x), rtol=1e-5, atol=1e-5)


def test_shared_tower_and_centerness_branch_options_change_the_head():
    head = build_model(_tiny(_cfg(NUM_SHARE_CONVS=2, CENTERNESS_ON_REG=False))).head
    assert len(head.share_tower) == 6  # 2 x (conv, GN, ReLU)
    assert not head.centerness_on_reg


def test_original_fcos_regresses_pixels_with_exp_and_p6_from_c5():
    model = build_model(_tiny(_cfg(REPO / "configs" / "FCOS-R50-original.yaml")))
    assert model.backbone.top_block.in_feature == "res5"
    model.eval()
    features = [torch.zeros(1, 64, 4, 4)] * 5
    _, regression, _ = model.head(features)
    assert torch.allclose(regression[0], torch.ones_like(regression[0]))  # exp(0) pixels


@pytest.mark.parametrize("key, value, message", [
    ("LOC_LOSS_TYPE", "l1", "LOC_LOSS_TYPE"),
    ("NORM", "LN", "MODEL.FCOS.NORM"),
    ("SIZES_OF_INTEREST", [64, 128], "SIZES_OF_INTEREST"),
    ("IN_FEATURES", ["p3", "p9"], "p9"),
    ("TOP_BLOCKS_IN", "p4", "TOP_BLOCKS_IN"),
])
def test_invalid_options_are_rejected_with_the_key_named(key, value, message):
    with pytest.raises(ValueError, match=message):
        build_model(_tiny(_cfg(**{key: value})))
