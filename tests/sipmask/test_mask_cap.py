"""The mask cap (fcos_d2.modeling.sipmask.mask_cap): a perfect predictor run through the
SipMask model's own inference agrees with the cap, on a hand-made set."""
import pytest
import torch
from detectron2.config import get_cfg
from detectron2.modeling import build_model
from detectron2.structures import Boxes, Instances

from fcos_d2 import add_fcos_config
from fcos_d2.config import get_config_file
from fcos_d2.modeling.sipmask import mask_cap
from fcos_d2.modeling.sipmask.mask_cap import PipelineSettings

SIZE = 64  # the hand-made image; the basis masks are 32 x 32


def hand_made_set():
    """A 64 x 64 image: a one-pixel stroke (row 10, x 20-31), a ring, a rectangle with
    odd edges -> (3, 64, 64) bool masks, (3, 4) tight XYXY boxes."""
    masks = torch.zeros(3, SIZE, SIZE, dtype=torch.bool)
    masks[0, 10, 20:32] = True
    ys, xs = torch.meshgrid(torch.arange(SIZE).float(), torch.arange(SIZE).float(),
                            indexing="ij")
    radius = ((ys - 45.5) ** 2 + (xs - 44.5) ** 2).sqrt()
    masks[1] = (radius <= 9.0) & (radius > 4.0)
    masks[2, 33:58, 5:18] = True
    boxes = []
    for mask in masks:
        rows, cols = mask.nonzero(as_tuple=True)
        boxes.append([cols.min(), rows.min(), cols.max() + 1, rows.max() + 1])
    return masks, torch.tensor(boxes, dtype=torch.float32)


def model_for(settings: PipelineSettings):
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(get_config_file("quickstart-sipmask.yaml"))
    cfg.merge_from_list([
        "MODEL.DEVICE", "cpu", "MODEL.FPN.OUT_CHANNELS", "32", "MODEL.SIPMASK.NUM_BASIS", "3",
        "MODEL.SIPMASK.BASIS_HIDDEN_CHANNELS", "32", "MODEL.FCOS.CHANNELS_LAST", "False",
        "MODEL.SIPMASK.MASK_TARGET", settings.mask_target,
        "MODEL.SIPMASK.EMPTY_TARGETS", settings.empty_targets,
        "MODEL.SIPMASK.CROP_RULE", settings.crop_rule,
        "MODEL.SIPMASK.PASTE_STRIDE", str(settings.paste_stride),
        "MODEL.SIPMASK.MASK_THRESHOLD", str(settings.mask_threshold)])
    torch.manual_seed(0)
    return build_model(cfg).eval()


def run_perfect_predictor(model, masks, boxes, settings):
    """The model's inference with its head's basis and coefficients, and its detections,
    replaced by the perfect predictor's (ground-truth boxes; targets as masks)."""
    basis, coefficients = mask_cap.perfect_predictor(
        mask_cap.image_targets(masks, (SIZE // 2, SIZE // 2), settings))
    real_head = model.forward_head

    def perfect_head(images):
        logits, regression, centerness, coefs, _ = real_head(images)
        coefs = [torch.zeros_like(c) for c in coefs]
        coefs[0][0, :, 0, :len(masks)] = coefficients.T  # locations 0-2 of level 0
        return logits, regression, centerness, coefs, basis[None]

    def perfect_detections(locations, image_sizes, *args, **kwargs):
        found = Instances(image_sizes[0], pred_boxes=Boxes(boxes.clone()),
                          scores=torch.ones(len(boxes)), pred_classes=torch.arange(len(boxes)))
        return [(found, torch.arange(len(boxes)))]

    model.forward_head, model.select_with_locations = perfect_head, perfect_detections
    with torch.no_grad():
        (output,) = model([{"image": torch.zeros(3, SIZE, SIZE, dtype=torch.uint8),
                            "height": SIZE, "width": SIZE}])
    return output["instances"]


@pytest.mark.parametrize("settings", [
    PipelineSettings(), PipelineSettings(mask_threshold=0.5),
    PipelineSettings(mask_target="area", empty_targets="keep_peak", crop_rule="cell_centre"),
    PipelineSettings(mask_target="area", empty_targets="keep_peak", paste_stride=1,
                     box_shift=0.5)], ids=["official", "0.5", "defaults", "stride1+shift"])
def test_a_perfect_predictor_through_the_model_gets_the_tools_cap(settings):
    masks, boxes = hand_made_set()
    found = run_perfect_predictor(model_for(settings), masks, boxes + settings.box_shift,
                                  settings)
    assert torch.equal(found.pred_boxes.tensor, boxes + settings.box_shift)
    model_ious = mask_cap.mask_iou(found.pred_masks, masks)
    tool_ious = mask_cap.pipeline_ious([(masks, boxes)], settings)
    assert torch.equal(model_ious, tool_ious)
    assert model_ious.min() < 1.0  # the pipeline does cap these masks
    sides = torch.tensor([12.0, 19.0, 25.0])  # the bins above 32 px are empty (NaN)
    model_caps, tool_caps = (mask_cap.caps_by_size(ious, sides)
                             for ious in (model_ious, tool_ious))
    for label in ("< 16 px", "16-32 px", "all"):
        assert model_caps[label] == tool_caps[label]


def test_the_cap_of_a_one_pixel_stroke_by_hand():
    # Row 10 covers half of cell row 5: "threshold" makes an empty target (IoU 0); with
    # keep_peak cells (5, 10-15) are 1, which the x2 bilinear paste spreads to 0.75 on rows
    # 10-11 and 0.25 on rows 9 and 12: 24 pixels above 0.4 for 12 true, IoU 0.5, which
    # passes one COCO threshold of ten.
    masks, boxes = hand_made_set()
    stroke = [(masks[:1], boxes[:1])]
    assert mask_cap.pipeline_ious(stroke, PipelineSettings()).tolist() == [0.0]
    kept = mask_cap.pipeline_ious(stroke, PipelineSettings(empty_targets="keep_peak"))
    assert kept.tolist() == [0.5]
    assert mask_cap.oracle_ap(kept) == pytest.approx(10.0)


def test_oracle_ap_is_the_mean_fraction_over_the_coco_thresholds():
    # IoU 1 passes all ten thresholds, 0.72 the five up to 0.70: (10 + 5) / 20.
    assert mask_cap.oracle_ap(torch.tensor([1.0, 0.72])) == pytest.approx(75.0)
    caps = mask_cap.caps_by_size(torch.tensor([1.0, 0.72, 0.4]), torch.tensor([10.0, 40, 80]))
    assert {k: n for k, (n, _) in caps.items()} == {
        "< 16 px": 1, "16-32 px": 0, "32-64 px": 1, "> 64 px": 1, "all": 3}
    assert caps["> 64 px"][1] == 0.0 and caps["all"][1] == pytest.approx(50.0)


def test_a_coarser_basis_lowers_the_cap_of_a_ring():
    masks, boxes = hand_made_set()
    ring = [(masks[1:2], boxes[1:2])]
    free = mask_cap.pipeline_ious(ring, PipelineSettings(mask_target="area"))
    coarse = mask_cap.pipeline_ious(ring, PipelineSettings(mask_target="area", basis_stride=8))
    assert free.item() > 0.9 and coarse.item() < free.item() - 0.05


def test_settings_that_the_cap_cannot_model_are_refused():
    with pytest.raises(ValueError, match="EMPTY_TARGETS 'drop' is not one of"):
        PipelineSettings(empty_targets="drop")
    with pytest.raises(ValueError, match="basis stride 16 is not one of"):
        PipelineSettings(basis_stride=16)
