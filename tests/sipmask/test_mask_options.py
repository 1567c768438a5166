"""MODEL.SIPMASK's mask options beyond SipMask: area-averaged targets, the rule for objects
with an empty target (and its logged count), the cell-centre crop, the stride-1 paste."""
import pytest
import torch
from detectron2.config import get_cfg
from detectron2.modeling import build_model
from detectron2.structures import BitMasks, Boxes, Instances
from detectron2.utils.events import EventStorage

from fcos_d2 import add_fcos_config
from fcos_d2.config import get_config_file
from fcos_d2.modeling.sipmask.crop_split import box_inside_masks, crop_split
from fcos_d2.modeling.sipmask.loss import sipmask_mask_losses
from fcos_d2.modeling.sipmask.masks import mask_targets, paste_quadrant_probabilities
from fcos_d2.modeling.sipmask.meta_arch import EMPTY_TARGETS_METRIC

KNOWN = torch.tensor([[[1, 1, 0, 0],
                       [1, 0, 0, 0],
                       [0, 0, 1, 1],
                       [0, 1, 1, 1]],
                      [[1, 1, 1, 1],  # a one-pixel stroke
                       [0, 0, 0, 0],
                       [0, 0, 0, 0],
                       [0, 0, 0, 0]]], dtype=torch.bool)


def targets(target: str, empty_rule: str = "official"):
    return mask_targets(BitMasks(KNOWN), (4, 4), (2, 2), target=target, empty_rule=empty_rule)


def test_area_targets_are_the_covered_fraction_of_each_2x2_cell():
    area, empty = targets("area")
    assert area.tolist() == [[[0.75, 0.0], [0.25, 1.0]], [[0.5, 0.5], [0.0, 0.0]]]
    threshold, _ = targets("threshold")  # SipMask: fraction > 0.5
    assert threshold.tolist() == [[[1.0, 0.0], [0.0, 1.0]], [[0.0, 0.0], [0.0, 0.0]]]
    assert empty.tolist() == [False, True]  # no cell of the stroke is more than half covered


def test_keep_peak_gives_a_stroke_its_cells_and_leaves_other_objects_alone():
    threshold, empty = targets("threshold", "keep_peak")
    assert threshold.tolist() == [[[1.0, 0.0], [0.0, 1.0]], [[1.0, 1.0], [0.0, 0.0]]]
    area, _ = targets("area", "keep_peak")
    assert area.tolist() == [[[0.75, 0.0], [0.25, 1.0]], [[1.0, 1.0], [0.0, 0.0]]]
    assert empty.tolist() == [False, True]


def test_the_crop_rule_on_a_box_with_fractional_edges():
    # x in [1.4, 3.6), y in [0.6, 2.2). SipMask places a pixel by its index: x 2, 3 and y 1,
    # 2. By its centre (index + 0.5): x 1, 2, 3 (1.5, 2.5, 3.5) and y 1 only (1.5).
    box = torch.tensor([[1.4, 0.6, 3.6, 2.2]])
    official = box_inside_masks(box, 5, 5)[0]
    centre = box_inside_masks(box, 5, 5, cell_centre=True)[0]
    assert official.nonzero().tolist() == [[1, 2], [1, 3], [2, 2], [2, 3]]
    assert centre.nonzero().tolist() == [[1, 1], [1, 2], [1, 3]]
    # Quadrants: cell width (3.6 - 1.4 + 0.1) / 2 = 1.15. Official: x 2 -> 0.52 (left),
    # x 3 -> 1.39 (right). Centre: 1.5 -> 0.09, 2.5 -> 0.96 (left), 3.5 -> 1.83 (right);
    # rows: centre 1.5 -> (1.5 - 0.6) / 0.85 = 1.06 (bottom).
    quadrants = torch.tensor([1.0, 2.0, 3.0, 4.0])[None, :, None, None].expand(1, 4, 5, 5)
    assert crop_split(quadrants, box, cell_centre=True)[0, 1].tolist() == [0, 3, 3, 4, 0]
    assert crop_split(quadrants, box)[0, 1:3, 2:4].tolist() == [[1, 2], [3, 4]]


def test_a_stride_1_paste_cuts_the_mask_at_the_boxs_pixels():
    # A map of ones at stride 2 and a box [1, 1, 5, 5): at stride 2 the crop keeps cells
    # 1-2 (0.5 <= x < 2.5), pixels 2-5 after the x2 bilinear (1 and 6 get 0.25): the mask
    # is a pixel off. At stride 1 the crop keeps exactly pixels 1-4.
    ones = torch.ones(1, 4, 4, 4)
    box = torch.tensor([[1.0, 1.0, 5.0, 5.0]])
    fine = paste_quadrant_probabilities(ones, box, (8, 8), paste_stride=1)[0]
    assert (fine > 0.4).nonzero()[:, 1].unique().tolist() == [1, 2, 3, 4]
    coarse = paste_quadrant_probabilities(ones, box, (8, 8))[0]
    assert (coarse > 0.4).nonzero()[:, 1].unique().tolist() == [2, 3, 4, 5]
    with pytest.raises(ValueError, match="MODEL.SIPMASK.PASTE_STRIDE: 4 is not one of"):
        paste_quadrant_probabilities(ones, box, (8, 8), paste_stride=4)


def stroke_image():
    """A 64 x 64 training image: a rectangle and a one-pixel horizontal stroke (row 20)."""
    masks = torch.zeros(2, 64, 64, dtype=torch.bool)
    masks[0, 8:40, 4:28] = True
    masks[1, 20, 30:60] = True
    instances = Instances((64, 64))
    instances.gt_boxes = Boxes(torch.tensor([[4.0, 8, 28, 40], [30, 20, 60, 21]]))
    instances.gt_classes = torch.tensor([0, 1])
    instances.gt_masks = BitMasks(masks)
    image = (masks.any(0) * 200).to(torch.uint8).expand(3, 64, 64).clone()
    return {"image": image, "instances": instances}


def tiny_model(*opts):
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(get_config_file("quickstart-sipmask.yaml"))
    cfg.merge_from_list(["MODEL.DEVICE", "cpu", "MODEL.FPN.OUT_CHANNELS", "32",
                         "MODEL.SIPMASK.NUM_BASIS", "8", "MODEL.SIPMASK.BASIS_HIDDEN_CHANNELS",
                         "32", "MODEL.FCOS.CHANNELS_LAST", "False", *opts])
    torch.manual_seed(0)
    return build_model(cfg)


@pytest.mark.parametrize("rule", ["official", "keep_peak", "drop"])
def test_objects_with_an_empty_target_are_counted_in_the_event_storage(rule):
    model = tiny_model("MODEL.SIPMASK.MASK_TARGET", "threshold",
                       "MODEL.SIPMASK.EMPTY_TARGETS", rule).train()
    with EventStorage() as storage:
        losses = model([stroke_image(), stroke_image()])
    assert torch.isfinite(losses["loss_sipmask_mask"])
    assert storage.history(EMPTY_TARGETS_METRIC).latest() == 2  # the stroke, in each image


def test_drop_leaves_the_empty_objects_positives_out_of_the_mask_loss():
    # One image, one location on the stroke with its exact box: kept, it adds cross-entropy;
    # dropped, nothing is left (exactly zero).
    image = stroke_image()["instances"]
    common = dict(basis=torch.zeros(1, 1, 32, 32), coefficients=torch.zeros(1, 1, 4),
                  pred_boxes=torch.tensor([[[30.0, 20, 60, 24]]]),
                  logits=torch.zeros(1, 1, 2), labels=torch.tensor([[1]]),
                  matched=torch.tensor([[1]]), instances=[image], num_classes=2,
                  target="threshold")
    kept = sipmask_mask_losses(empty_rule="official", **common)
    dropped = sipmask_mask_losses(empty_rule="drop", **common)
    assert kept.mask.item() > 0 and kept.empty_targets == 1
    assert dropped.mask.item() == 0.0 and dropped.empty_targets == 1


def test_unknown_option_values_are_refused_naming_the_key():
    for key, value in (("MASK_TARGET", "soft"), ("EMPTY_TARGETS", "skeleton"),
                       ("CROP_RULE", "round"), ("PASTE_STRIDE", "4")):
        with pytest.raises(ValueError, match=f"MODEL.SIPMASK.{key}: .* is not one of"):
            tiny_model(f"MODEL.SIPMASK.{key}", value)
