"""The SipMask meta-architecture: head layout, feature alignment, losses from bitmasks and
polygons, pred_masks at the original image size, config validation."""
import pytest
import torch
from detectron2.config import get_cfg
from detectron2.modeling import build_model
from detectron2.structures import BitMasks, Boxes, Instances, PolygonMasks
from detectron2.utils.events import EventStorage
from torch.nn import functional as F

from fcos_d2 import add_fcos_config
from fcos_d2.config import get_config_file
from fcos_d2.modeling.sipmask.head import FeatureAlign, SipMaskHead
from fcos_d2.modeling.sipmask.masks import paste_mask_probabilities, resize_and_threshold


SIPMASK_BASIS = ("MODEL.SIPMASK.BASIS_IN_FEATURE", "", "MODEL.FPN.IN_FEATURES",
                 "['res3', 'res4']", "MODEL.RESNETS.OUT_FEATURES", "['res3', 'res4']")


def tiny_cfg(*opts):
    """The mask quickstart made tiny: 32 channels, 8 basis masks, float32, plain layout,
    with SipMask's own basis masks (from the P3-P4 box towers; the config adds P2)."""
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(get_config_file("quickstart-sipmask.yaml"))
    cfg.merge_from_list(["MODEL.DEVICE", "cpu", "MODEL.FPN.OUT_CHANNELS", "32",
                         "MODEL.FCOS.CHANNELS_LAST", "False", "MODEL.SIPMASK.NUM_BASIS", "8",
                         "MODEL.SIPMASK.BASIS_HIDDEN_CHANNELS", "32",
                         "MODEL.FCOS.INFERENCE_TH_TEST", "0.0", *SIPMASK_BASIS, *opts])
    return cfg


def tiny_model(*opts):
    torch.manual_seed(0)
    return build_model(tiny_cfg(*opts))


def sample(masks_as: str = "bitmask", size: int = 64):
    """A (size x size) image with two rectangles of classes 0 and 2, and their masks."""
    image = torch.zeros(3, size, size, dtype=torch.uint8)
    image[:, 8:40, 4:28] = 200
    image[1, 30:60, 36:60] = 120
    instances = Instances((size, size))
    instances.gt_boxes = Boxes(torch.tensor([[4.0, 8, 28, 40], [36, 30, 60, 60]]))
    instances.gt_classes = torch.tensor([0, 2])
    polygons = PolygonMasks([[[4.0, 8, 28, 8, 28, 40, 4, 40]],
                             [[36.0, 30, 60, 30, 60, 60, 36, 60]]])
    instances.gt_masks = (polygons if masks_as == "polygon"
                          else BitMasks.from_polygon_masks(polygons, size, size))
    return {"image": image, "instances": instances}


def test_head_has_sipmasks_layout_and_output_shapes():
    model = tiny_model()
    head = model.head
    assert isinstance(head, SipMaskHead)
    convs = lambda tower: sum(isinstance(m, torch.nn.Conv2d) for m in tower)
    assert (convs(head.cls_tower), convs(head.bbox_tower)) == (1, 2)  # NUM_CONVS 2
    names = set(dict(head.named_parameters()))
    assert {"feat_align.conv_offset.weight", "feat_align.conv_adaption.weight",
            "feat_align.conv_adaption.bias", "feat_align.norm.weight", "sip_cof.weight",
            "sip_mask_lat0.weight", "sip_mask_lat.weight"} <= names
    assert head.feat_align.conv_offset.weight.shape == (4 * 2 * 9, 4, 1, 1)
    features = [torch.randn(2, 32, 8, 8), torch.randn(2, 32, 4, 4)]  # P3, P4 of 64 px
    logits, regression, centerness, coefficients, basis = head(features)
    assert [x.shape for x in logits] == [(2, 6, 8, 8), (2, 6, 4, 4)]
    assert [x.shape for x in coefficients] == [(2, 4 * 8, 8, 8), (2, 4 * 8, 4, 4)]
    assert basis.shape == (2, 8, 32, 32)  # stride 2
    assert head.sip_mask_lat0.in_channels == 2 * 32  # P3 and P4 box towers


P2_BASIS = ("MODEL.SIPMASK.BASIS_IN_FEATURE", "p2", "MODEL.FPN.IN_FEATURES",
            "['res2', 'res3', 'res4']", "MODEL.RESNETS.OUT_FEATURES", "['res2', 'res3', 'res4']")


def test_a_finer_basis_feature_joins_the_basis_input_and_sets_their_stride():
    head = tiny_model(*P2_BASIS).head
    assert head.sip_mask_lat0.in_channels == 32 + 2 * 32  # P2, then the P3 and P4 box towers
    features = [torch.randn(2, 32, 8, 8), torch.randn(2, 32, 4, 4)]  # P3, P4 of 64 px
    basis = head(features, torch.randn(2, 32, 16, 16))[-1]  # P2 at stride 4
    assert basis.shape == (2, 8, 32, 32)  # stride 2, from P2's 16 x 16 upsampled x2
    with pytest.raises(ValueError, match="built with a basis feature .* called without"):
        head(features)
    with pytest.raises(ValueError, match="built without a basis feature .* called with"):
        tiny_model().head(features, torch.randn(2, 32, 16, 16))


def test_the_finer_basis_feature_learns_from_the_mask_loss():
    model = tiny_model(*P2_BASIS)
    # Boxes of e^2 strides: at initialisation they are under a basis pixel, and positives
    # without a box area give no mask loss.
    torch.nn.init.constant_(model.head.bbox_pred.bias, 2.0)
    model.train()
    with EventStorage():
        losses = model([sample("bitmask"), sample("polygon")])
    assert all(torch.isfinite(v) for v in losses.values()) and losses["loss_sipmask_mask"] > 0
    losses["loss_sipmask_mask"].backward()
    p2_output = model.backbone.fpn_output2.weight.grad  # only the basis masks read P2
    assert p2_output is not None and p2_output.abs().sum() > 0
    model.eval()
    with torch.no_grad():
        (output,) = model([dict(sample(), height=96, width=128)])
    assert output["instances"].pred_masks.shape[1:] == (96, 128)


def test_basis_masks_come_at_stride_2_whatever_the_first_levels_stride():
    # The head on P2-P3 (strides 4, 8): basis masks from P2 upsampled x2, not x4.
    model = tiny_model("MODEL.FCOS.IN_FEATURES", "['p2', 'p3']", "MODEL.FPN.IN_FEATURES",
                       "['res2', 'res3']", "MODEL.RESNETS.OUT_FEATURES", "['res2', 'res3']")
    basis = model.head([torch.randn(1, 32, 16, 16), torch.randn(1, 32, 8, 8)])[-1]
    assert basis.shape == (1, 8, 32, 32)


def test_feature_alignment_starts_as_a_plain_conv_and_moves_with_the_box_distances():
    torch.manual_seed(0)
    align = FeatureAlign(32)
    x, ltrb = torch.randn(1, 32, 6, 6), torch.rand(1, 4, 6, 6, requires_grad=True)
    plain = F.relu(align.norm(F.conv2d(x, align.conv_adaption.weight,
                                       align.conv_adaption.bias, padding=1)))
    assert torch.allclose(align(x, ltrb), plain, atol=1e-5)
    torch.nn.init.normal_(align.conv_offset.weight, std=1.0)
    moved = align(x, ltrb)
    assert not torch.allclose(moved, plain, atol=1e-3)
    moved.sum().backward()
    assert ltrb.grad is None  # the offsets see the box distances detached


def test_training_gives_the_fcos_losses_and_a_mask_loss_from_either_mask_type():
    model = tiny_model()
    model.train()
    with EventStorage():
        losses = model([sample("bitmask"), sample("polygon")])
    assert set(losses) == {"loss_fcos_cls", "loss_fcos_loc", "loss_fcos_ctr", "loss_sipmask_mask"}
    assert all(torch.isfinite(v) for v in losses.values())
    sum(losses.values()).backward()
    assert model.head.sip_cof.weight.grad is not None


def test_an_image_without_objects_trains_with_a_finite_connected_loss():
    empty = sample()
    empty["instances"] = empty["instances"][[]]
    model = tiny_model()
    model.train()
    with EventStorage():
        losses = model([empty])
    assert losses["loss_sipmask_mask"].item() == 0
    sum(losses.values()).backward()
    assert model.head.sip_mask_lat.weight.grad is not None


def test_pred_masks_are_booleans_at_the_original_image_size():
    model = tiny_model().eval()
    inputs = dict(sample(), height=96, width=128)  # the 64-px input was resized from 96 x 128
    with torch.no_grad():
        (output,) = model([inputs])
    instances = output["instances"]
    assert instances.image_size == (96, 128) and len(instances) > 0
    assert instances.pred_masks.shape == (len(instances), 96, 128)
    assert instances.pred_masks.dtype == torch.bool
    assert set(instances.get_fields()) == {"pred_boxes", "scores", "pred_classes", "pred_masks"}


def test_masks_are_pasted_at_input_resolution_then_resized_to_the_original():
    # Coefficients of +10 on one basis mask of ones: probability ~1 inside the box. The box
    # [0, 8) of a 16-px input is [0, 4) at stride 2; upsampled x2 (bilinear), pixel 7 is
    # 0.75 and pixel 8 0.25; resized to 32 px, pixel 15 is 0.625 and 16 is 0.375: the box
    # [0, 16), but its far corner (15, 15), where the two edges multiply (0.39).
    probs = paste_mask_probabilities(torch.ones(1, 8, 8), torch.full((1, 4), 10.0),
                                     torch.tensor([[0.0, 0.0, 8.0, 8.0]]), (16, 12))
    assert probs.shape == (1, 16, 12)  # cut to the unpadded input
    masks = resize_and_threshold(probs, (32, 24), 0.5)[0]
    expected = torch.zeros(32, 24, dtype=torch.bool)
    expected[:16, :16] = True
    expected[15, 15] = False
    assert torch.equal(masks, expected)
    assert resize_and_threshold(probs[:0], (32, 24), 0.5).shape == (0, 32, 24)


@pytest.mark.parametrize("opts, message", [
    (["MODEL.MASK_ON", "False"], "MODEL.MASK_ON: SipMask predicts masks"),
    (["MODEL.SIPMASK.MASK_THRESHOLD", "1.5"], "MODEL.SIPMASK.MASK_THRESHOLD: 1.5 is outside"),
    (["MODEL.SIPMASK.BASIS_LEVELS", "3"], r"MODEL.SIPMASK.BASIS_LEVELS: 3 must lie in \[1, 2\]"),
    (["MODEL.SIPMASK.FEATURE_ALIGN_GROUPS", "5"], "MODEL.SIPMASK.FEATURE_ALIGN_GROUPS: 5"),
    (["MODEL.SIPMASK.NUM_BASIS", "0"], "MODEL.SIPMASK.NUM_BASIS: must be >= 1"),
    (["MODEL.SIPMASK.BASIS_IN_FEATURE", "p2"],
     r"MODEL.SIPMASK.BASIS_IN_FEATURE: the backbone gives no 'p2' \(it gives \['p3', 'p4'\]"),
    (["MODEL.SIPMASK.BASIS_IN_FEATURE", "p3"],
     "MODEL.SIPMASK.BASIS_IN_FEATURE: its stride 8 must be a multiple of 2 below the head's "
     r"first level's \(8\)"),
])
def test_bad_sipmask_settings_are_refused_naming_the_key(opts, message):
    with pytest.raises(ValueError, match=message):
        build_model(tiny_cfg(*opts))


def test_the_p2_p4_quickstart_puts_the_head_on_p2_and_its_basis_masks_at_stride_2():
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(get_config_file("SipMask/quickstart-sipmask-P2-P4.yaml"))
    cfg.merge_from_list(["MODEL.DEVICE", "cpu", "MODEL.FPN.OUT_CHANNELS", "32",
                         "MODEL.SIPMASK.NUM_BASIS", "8", "MODEL.SIPMASK.BASIS_HIDDEN_CHANNELS",
                         "32", "MODEL.FCOS.CHANNELS_LAST", "False"])
    torch.manual_seed(0)
    model = build_model(cfg)
    assert model.head_in_features == ["p2", "p3", "p4"] and not model.basis_in_feature
    features = model.backbone(torch.zeros(1, 3, 64, 64))
    *_, basis = model.head([features[f] for f in model.head_in_features])
    assert basis.shape == (1, 8, 32, 32)  # stride 2: P2's box tower upsampled x2
    with EventStorage():
        losses = model([sample()])
    assert {"loss_fcos_cls", "loss_sipmask_mask"} <= set(losses)
    assert all(torch.isfinite(v) for v in losses.values())
