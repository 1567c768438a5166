"""FCOS-family training options, off by default: ATSS-style positives
(MODEL.FCOS.ASSIGNER "atss") and GFL's quality focal loss (MODEL.FCOS.CLS_LOSS
"quality_focal"), computed by hand on small inputs, and built from the config."""
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from detectron2.config import get_cfg
from detectron2.modeling import build_model
from detectron2.structures import Boxes, Instances

from fcos_d2 import add_fcos_config
from fcos_d2.modeling.assignment import compute_locations
from fcos_d2.modeling.atss import anchor_boxes, assign_targets_atss, pairwise_iou
from fcos_d2.modeling.losses import box_iou_ltrb, fcos_losses, quality_focal_loss_sparse

REPO = Path(__file__).resolve().parents[2]
K = 3
# one level of stride 8 on a 32 x 32 input: locations x, y in {4, 12, 20, 28}
LOCATIONS = compute_locations([(4, 4)], [8], torch.device("cpu"))


def _atss(boxes, classes, topk=3, anchor_scale=1.0):
    return assign_targets_atss(LOCATIONS, [torch.tensor(boxes, dtype=torch.float32)],
                               [torch.tensor(classes)], strides=[8], topk=topk, num_classes=K,
                               norm_reg_targets=True, anchor_scale=anchor_scale)


def test_anchor_of_a_location_is_a_square_of_eight_strides_around_it():
    anchors = anchor_boxes(torch.tensor([[4.0, 4.0], [24.0, 8.0]]), torch.tensor([8.0, 16.0]), 8.0)
    assert anchors.tolist() == [[-28, -28, 36, 36], [-40, -56, 88, 72]]


def test_atss_threshold_is_mean_plus_std_of_the_candidates_ious():
    # box [0, 0, 9, 8], center (4.5, 4); with 8 x 8 anchors (anchor_scale 1) its 3 nearest
    # locations are (4, 4), (12, 4), (4, 12), whose anchors overlap it by 64/72, 8/128 and 0.
    ious = torch.tensor([64 / 72, 8 / 128, 0.0])
    threshold = ious.mean() + ious.std()  # 0.3171 + 0.4961 = 0.8133: only (4, 4) passes
    assert threshold.item() == pytest.approx(0.81327, abs=1e-4)
    labels, targets, matched = _atss([[0, 0, 9, 8]], [2])
    assert labels[0].tolist() == [2] + [K] * 15
    assert matched[0].tolist() == [0] + [-1] * 15
    # (l, t, r, b) = (4, 4, 5, 4) px, in strides of 8
    assert targets[0, 0].tolist() == [0.5, 0.5, 0.625, 0.5]


def test_a_location_positive_for_two_objects_goes_to_the_one_its_anchor_overlaps_most():
    # (4, 4)'s anchor [0, 0, 8, 8] overlaps A = [0, 0, 9, 8] by 0.889 and B = [-1, -1, 9, 9]
    # by 0.64; both pass their thresholds (0.813 and 0.587) there.
    a, b = [0, 0, 9, 8], [-1, -1, 9, 9]
    for boxes, index_of_a in (([a, b], 0), ([b, a], 1)):
        labels, _, matched = _atss(boxes, [index_of_a, 1 - index_of_a])
        assert matched[0, 0].item() == index_of_a and labels[0, 0].item() == 0


def test_a_candidate_outside_its_box_is_never_positive():
    # a 3 x 3 box between locations: its nearest location (4, 4) overlaps it but lies outside
    labels, _, matched = _atss([[0, 0, 3, 3]], [1], anchor_scale=8.0)
    assert (labels == K).all() and (matched == -1).all()


def test_atss_puts_each_object_on_the_level_whose_anchors_match_its_size():
    # anchors of 64, 128 and 256 px: a 20-px object goes to stride 8, a 115-px one to 16
    locations = compute_locations([(16, 16), (8, 8), (4, 4)], [8, 16, 32], torch.device("cpu"))
    boxes = torch.tensor([[10.0, 10.0, 30.0, 28.0], [0.0, 0.0, 120.0, 110.0]])
    labels, targets, matched = assign_targets_atss(
        locations, [boxes], [torch.tensor([0, 1])], strides=[8, 16, 32], topk=9,
        num_classes=K, norm_reg_targets=False)
    levels = torch.arange(3).repeat_interleave(torch.tensor([256, 64, 16]))
    assert set(levels[matched[0] == 0].tolist()) == {0}
    assert set(levels[matched[0] == 1].tolist()) == {1}
    positive = matched[0] >= 0
    assert (targets[0][positive] > 0).all()  # every positive lies inside its box


def test_atss_on_an_image_without_boxes_gives_background():
    labels, targets, matched = assign_targets_atss(
        LOCATIONS, [torch.zeros(0, 4)], [torch.zeros(0, dtype=torch.int64)], strides=[8],
        topk=9, num_classes=K, norm_reg_targets=True)
    assert (labels == K).all() and (matched == -1).all() and labels.shape == (1, 16)


def test_pairwise_iou_of_hand_made_boxes():
    iou = pairwise_iou(torch.tensor([[0.0, 0, 2, 2]]), torch.tensor([[1.0, 1, 3, 3], [4, 4, 5, 5]]))
    assert iou.tolist() == [[pytest.approx(1 / 7), 0.0]]


def test_quality_focal_loss_weights_bce_against_the_iou_by_the_squared_gap():
    logits = torch.tensor([[0.0, math.log(3.0)], [0.0, 0.0]])  # p = 0.5, 0.75 / 0.5, 0.5
    labels = torch.tensor([1, 2])  # row 0 positive for class 1; row 1 background (K = 2)
    loss = quality_focal_loss_sparse(logits, labels, torch.tensor([0.25]), beta=2.0)
    softplus = F.softplus
    # negatives: BCE(x, 0) * p^2 = softplus(x) p^2 for the 3 background entries
    negatives = 3 * softplus(torch.tensor(0.0)) * 0.25
    # the positive: BCE with target 0.25 at p = 0.75, times |0.25 - 0.75|^2
    bce = -(0.25 * math.log(0.75) + 0.75 * math.log(0.25))
    assert loss.item() == pytest.approx(negatives.item() + bce * 0.25, rel=1e-6)


def test_quality_target_is_the_exact_iou_of_predicted_and_target_boxes():
    pred, target = torch.tensor([[1.0, 1, 1, 1], [0, 0, 0, 0]]), torch.tensor([[2.0, 2, 2, 2]] * 2)
    assert box_iou_ltrb(pred, target).tolist() == [0.25, 0.0]


def test_quality_focal_option_changes_only_the_classification_loss():
    torch.manual_seed(0)
    inputs = dict(logits=torch.randn(1, 4, K), reg_pred=torch.rand(1, 4, 4) + 0.5,
                  ctr_logits=torch.zeros(1, 4), labels=torch.tensor([[0, K, 2, K]]),
                  reg_targets=torch.rand(1, 4, 4) + 0.5, num_classes=K, focal_alpha=0.25,
                  focal_gamma=2.0, loc_loss_type="giou")
    focal = fcos_losses(**inputs)
    quality = fcos_losses(**inputs, cls_loss="quality_focal")
    iou = box_iou_ltrb(inputs["reg_pred"][0, [0, 2]], inputs["reg_targets"][0, [0, 2]])
    expected = quality_focal_loss_sparse(inputs["logits"][0], inputs["labels"][0], iou) / 2
    assert quality["loss_fcos_cls"].item() == pytest.approx(expected.item(), rel=1e-6)
    assert quality["loss_fcos_cls"].item() != pytest.approx(focal["loss_fcos_cls"].item())
    for key in ("loss_fcos_loc", "loss_fcos_ctr"):
        assert quality[key].item() == focal[key].item()


def _tiny_cfg(**fcos):
    cfg = get_cfg()
    add_fcos_config(cfg)
    # the recipe on P3-P7, as these options were measured (FCOS-R18-small-data-P3-P7.yaml)
    cfg.merge_from_file(str(REPO / "configs" / "FCOS-R18-small-data-P3-P7.yaml"))
    cfg.MODEL.DEVICE = "cpu"
    cfg.MODEL.FPN.OUT_CHANNELS, cfg.MODEL.FCOS.NUM_CONVS, cfg.MODEL.FCOS.NUM_CLASSES = 32, 1, K
    for key, value in fcos.items():
        setattr(cfg.MODEL.FCOS, key, value)
    return cfg


def test_defaults_are_the_official_fcos():
    cfg = get_cfg()
    add_fcos_config(cfg)
    fcos = cfg.MODEL.FCOS
    assert (fcos.ASSIGNER, fcos.ATSS_TOPK, fcos.ATSS_ANCHOR_SCALE, fcos.CLS_LOSS) == \
        ("fcos", 9, 8.0, "focal")


def test_a_model_with_both_options_trains_with_finite_losses_and_gradients():
    model = build_model(_tiny_cfg(ASSIGNER="atss", CLS_LOSS="quality_focal"))
    model.train()
    torch.manual_seed(0)
    instances = Instances((64, 64), gt_boxes=Boxes(torch.tensor([[8.0, 8, 40, 30]])),
                          gt_classes=torch.tensor([1]))
    # two images: BN needs more than one value per channel on the 1 x 1 P7
    losses = model([{"image": torch.rand(3, 64, 64) * 255, "instances": instances}] * 2)
    sum(losses.values()).backward()
    assert all(torch.isfinite(v) for v in losses.values())
    assert losses["loss_fcos_loc"] > 0  # ATSS found positives
    assert model.head.cls_logits.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("key, value", [("ASSIGNER", "simota"), ("CLS_LOSS", "varifocal"),
                                        ("ATSS_TOPK", 0), ("ATSS_ANCHOR_SCALE", 0.0)])
def test_invalid_values_are_rejected_with_the_key_named(key, value):
    with pytest.raises(ValueError, match=f"MODEL.FCOS.{key}"):
        build_model(_tiny_cfg(**{key: value}))


def test_the_atss_anchor_scale_of_the_config_decides_the_level_of_an_object():
    instances = Instances((128, 128), gt_boxes=Boxes(torch.tensor([[30.0, 30, 90, 90]])),
                          gt_classes=torch.tensor([0]))
    levels = []
    for scale in (8.0, 4.0):  # anchors of 64 / 128 px or 32 / 64 px on P3 / P4
        model = build_model(_tiny_cfg(ASSIGNER="atss", ATSS_ANCHOR_SCALE=scale))
        shapes = [(128 // s, 128 // s) for s in model.strides]
        locations = compute_locations(shapes, model.strides, torch.device("cpu"))
        _, _, matched = model.targets(locations, [instances])
        level_of = torch.arange(len(shapes)).repeat_interleave(
            torch.tensor([h * w for h, w in shapes]))
        levels.append(set(level_of[matched[0] == 0].tolist()))
    assert levels == [{0}, {1}]
