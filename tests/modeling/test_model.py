"""The FCOS model built from configs: every shipped config builds, training and inference
run on tiny inputs, options (DCN, shared tower, centerness branch) take effect."""
import glob
import math
from pathlib import Path

import pytest
import torch
from detectron2.config import get_cfg
from detectron2.modeling import build_model
from detectron2.structures import Boxes, Instances

from fcos_d2 import add_fcos_config
from fcos_d2.modeling.layers import DeformConv2d

REPO = Path(__file__).resolve().parents[2]
# FCOS-RPN-*.yaml are two-stage models with FCOS proposals (tests/modeling/test_proposal_generator.py).
MODEL_CONFIGS = sorted(p for p in glob.glob(str(REPO / "configs" / "FCOS-*.yaml"))
                       if not Path(p).name.startswith("FCOS-RPN-"))


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
    # each level's stride is 2 ** its number: P2 (the small-data recipe) 4, P3 8 ... P7 128
    assert model.strides == [2 ** int(f[1:]) for f in model.head_in_features]


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


def test_exp_activation_without_scales_regresses_one_stride_at_zero_input():
    head = build_model(_tiny(_cfg(REG_ACTIVATION="exp", USE_SCALE=False))).head
    assert not any("scales" in name for name, _ in head.named_parameters())
    _, regression, _ = head([torch.zeros(1, 64, 4, 4)] * 5)
    # the predictor's bias is 0 and its input 0 after the towers' ReLU of zero: exp(0) = 1
    assert torch.allclose(regression[0], torch.ones_like(regression[0]))


def test_empty_reg_activation_keeps_the_official_choice_for_the_units():
    assert build_model(_tiny(_cfg())).head.reg_activation == "relu"
    original = _cfg(REPO / "configs" / "FCOS-R50-original.yaml")
    assert build_model(_tiny(original)).head.reg_activation == "exp"


@pytest.mark.parametrize("key, value", [
    ("LOSS_NORMALIZER", "mean"), ("LOC_LOSS_WEIGHTING", "iou"), ("INFERENCE_TH_ON", "logit"),
    ("REG_ACTIVATION", "tanh"), ("IOU_LOSS_SMOOTH", -1.0),
])
def test_invalid_small_data_options_are_rejected_with_the_key_named(key, value):
    with pytest.raises(ValueError, match=f"MODEL.FCOS.{key}"):
        build_model(_tiny(_cfg(**{key: value})))


def test_ema_normalizer_option_smooths_the_losses_over_iterations():
    model = build_model(_tiny(_cfg(LOSS_NORMALIZER="ema", LOSS_NORMALIZER_EMA_INIT=50.0)))
    model.train()
    model(_inputs([[[10, 10, 60, 50]], [[0, 0, 20, 20]]]))
    positives, _ = model.loss_normalizer.values
    assert 0.9 * 50 < positives < 50  # moved a tenth of the way to the batch's positives


def _synthetic_batch(indices):
    """Built-in synthetic shapes (128 x 128) as training inputs, 0-based classes."""
    from fcos_d2.data import synthetic

    inputs = []
    for index in indices:
        pixels, objects = synthetic.render_image(seed=synthetic.SPLIT_SEEDS["train"], index=index)
        instances = Instances(pixels.shape[:2])
        boxes = [synthetic.tight_box(o.visible_mask) for o in objects]  # XYWH
        instances.gt_boxes = Boxes(torch.tensor([[x, y, x + w, y + h] for x, y, w, h in boxes],
                                                dtype=torch.float32).reshape(-1, 4))
        instances.gt_classes = torch.tensor([o.class_index for o in objects], dtype=torch.long)
        image = torch.from_numpy(pixels[:, :, ::-1].copy()).permute(2, 0, 1).float()  # BGR
        inputs.append({"image": image, "instances": instances})
    return inputs


def _box_loss_gradient(reg_activation):
    """Gradient of the box loss on the box predictor's weights when every regression
    input is pushed far below zero (the state in which a ReLU regression has died)."""
    model = build_model(_tiny(_cfg(REG_ACTIVATION=reg_activation)))
    model.train()
    torch.nn.init.constant_(model.head.bbox_pred.bias, -5.0)
    losses = model(_inputs([[[10, 10, 60, 50], [30, 20, 120, 90]]]))
    losses["loss_fcos_loc"].backward()
    return model.head.bbox_pred.weight.grad.abs().sum().item()


def test_a_dead_relu_regression_gets_no_gradient_but_softplus_and_exp_recover():
    assert _box_loss_gradient("relu") == 0  # the failure torchvision's FCOS shows
    assert _box_loss_gradient("softplus") > 0
    assert _box_loss_gradient("exp") > 0


def test_softplus_regression_is_log_two_strides_at_zero_input():
    head = build_model(_tiny(_cfg(REG_ACTIVATION="softplus"))).head
    _, regression, _ = head([torch.zeros(1, 64, 4, 4)] * 5)
    assert torch.allclose(regression[0], torch.full_like(regression[0], math.log(2)))


def test_small_data_recipe_trained_from_scratch_keeps_regressing_boxes():
    """A few SGD steps from scratch on the recipe's model (head narrowed for speed): on
    held-out images the regression outputs stay clear of zero, the box loss falls well below
    its starting value instead of sticking near 1, and gradients still reach the box
    predictor."""
    cfg = _cfg(REPO / "configs" / "FCOS-R18-small-data.yaml")
    cfg.MODEL.FPN.OUT_CHANNELS, cfg.MODEL.FCOS.NUM_CONVS = 64, 2
    torch.manual_seed(0)
    model = build_model(cfg)
    model.train()
    held_out = _synthetic_batch(range(1000, 1004))

    def held_out_box_loss():  # divided by the batch's own positives, not the moving average
        normalizer, model.loss_normalizer = model.loss_normalizer, None
        with torch.no_grad():
            loss = model(held_out)["loss_fcos_loc"].item()
        model.loss_normalizer = normalizer
        return loss

    before = held_out_box_loss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    for step in range(12):
        losses = model(_synthetic_batch(range(4 * step, 4 * step + 4)))
        optimizer.zero_grad()
        sum(losses.values()).backward()
        optimizer.step()
    after = held_out_box_loss()
    print(f"held-out box loss {before:.3f} -> {after:.3f}")
    assert after < 0.9 * before
    with torch.no_grad():
        _, regression, _ = model.forward_head(model.preprocess_image(held_out))
    flat = torch.cat([r.permute(0, 2, 3, 1).reshape(-1, 4) for r in regression])  # (N*R, 4)
    assert (flat > 1e-3).float().mean() > 0.99, "regression outputs collapsed to zero"
    model.zero_grad()
    model(held_out)["loss_fcos_loc"].backward()
    assert model.head.bbox_pred.weight.grad.abs().sum() > 0


def test_parameters_are_ordered_backbone_first_so_older_optimizer_states_still_load():
    names = [name for name, _ in build_model(_tiny(_cfg())).named_parameters()]
    first_head = next(i for i, name in enumerate(names) if name.startswith("head."))
    assert all(name.startswith("backbone.") for name in names[:first_head])
    assert all(name.startswith("head.") for name in names[first_head:])
