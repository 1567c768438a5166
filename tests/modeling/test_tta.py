"""Test-time augmentation for FCOS (TEST.AUG.*): valid merged detections, mirrored
detections for a mirrored image, plain inference when the only copy is the image itself,
and train_net.py --eval-only reporting "_TTA" results and a [TTA] summary block. For mask
models: the matching of a kept detection in each copy, a copy's masks mapped back through
a resize and a flip, the vote, and mirrored masks for a mirrored image.

The model is the quickstart config made tiny (64 FPN channels, one conv per tower),
trained for 10 SGD steps from a fixed seed on synthetic shapes rendered in memory.
"""
from pathlib import Path

import pytest
import torch
from detectron2.config import get_cfg
from detectron2.data import transforms as T
from detectron2.structures import Boxes, pairwise_iou

from fcos_d2 import FCOSWithTTA, add_fcos_config
from fcos_d2.data import synthetic
from fcos_d2.modeling.test_time_augmentation import masks_to_original, matching_detections
from mask_models import FCOSWithBoxMasks
from synthetic_samples import sample, train

REPO = Path(__file__).resolve().parents[2]
TINY = ["MODEL.FPN.OUT_CHANNELS", "64", "MODEL.FCOS.NUM_CONVS", "1"]


def _cfg(*opts: str):
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(str(REPO / "configs" / "quickstart.yaml"))
    cfg.merge_from_list([*TINY, "MODEL.DEVICE", "cpu", *opts])
    return cfg


def _tta(model, *opts: str) -> FCOSWithTTA:
    return FCOSWithTTA(_cfg("TEST.AUG.ENABLED", "True", *opts), model)


@pytest.fixture(scope="module")
def model():
    train_set = [sample("train", i) for i in range(40)]
    return train(_cfg(), train_set, iterations=10, batch_size=4)[0]


@pytest.fixture(scope="module")
def images():
    return [sample("val", i)["image"] for i in range(4)]


def test_tta_returns_valid_detections_in_the_requested_size(model, images):
    tta = _tta(model, "TEST.AUG.MIN_SIZES", "(96, 128, 160)", "TEST.AUG.MAX_SIZE", "400",
               "TEST.AUG.FLIP", "True", "TEST.DETECTIONS_PER_IMAGE", "10")
    outputs = tta([{"image": image, "height": 256, "width": 192} for image in images])
    assert len(outputs) == len(images)
    for output in outputs:
        found = output["instances"]
        assert found.image_size == (256, 192) and 0 < len(found) <= 10
        boxes = found.pred_boxes.tensor
        assert (boxes[:, :2] >= 0).all() and (boxes[:, 2] <= 192).all()
        assert (boxes[:, 3] <= 256).all() and (boxes[:, 2:] >= boxes[:, :2]).all()
        scores = found.scores
        assert ((scores >= 0) & (scores <= 1)).all() and (scores[:-1] >= scores[1:]).all()
        assert ((found.pred_classes >= 0)
                & (found.pred_classes < len(synthetic.CLASS_NAMES))).all()
    # The requested size only scales the boxes: x by 192 / 128, y by 256 / 128.
    native = tta([{"image": image} for image in images])
    for output, reference in zip(outputs, native):
        scale = torch.tensor([1.5, 2.0, 1.5, 2.0])
        assert torch.allclose(output["instances"].pred_boxes.tensor,
                              reference["instances"].pred_boxes.tensor * scale, atol=1e-3)


def test_tta_of_a_mirrored_image_gives_the_mirrored_detections(model, images):
    tta = _tta(model, "TEST.AUG.MIN_SIZES", "(96, 128)", "TEST.AUG.FLIP", "True")
    for image in images[:2]:
        (plain,), (mirrored,) = tta([{"image": image}]), tta([{"image": image.flip(-1)}])
        plain, mirrored = plain["instances"], mirrored["instances"]
        top = min(len(plain), 20)
        assert top > 0
        x1, y1, x2, y2 = plain.pred_boxes.tensor[:top].unbind(dim=1)
        expected = torch.stack([128 - x2, y1, 128 - x1, y2], dim=1)
        assert torch.allclose(mirrored.pred_boxes.tensor[:top], expected, atol=0.05)
        assert torch.allclose(mirrored.scores[:top], plain.scores[:top], atol=1e-4)
        assert torch.equal(mirrored.pred_classes[:top], plain.pred_classes[:top])


def test_tta_with_only_the_test_size_and_no_flip_is_plain_inference(model, images):
    tta = _tta(model, "TEST.AUG.MIN_SIZES", "(128,)", "TEST.AUG.FLIP", "False")
    inputs = [{"image": image} for image in images]
    with torch.no_grad():
        expected = model(inputs)
    for ours, theirs in zip(tta(inputs), expected):
        ours, theirs = ours["instances"], theirs["instances"]
        assert len(ours) == len(theirs) > 0
        assert torch.allclose(ours.pred_boxes.tensor, theirs.pred_boxes.tensor, atol=1e-4)
        assert torch.allclose(ours.scores, theirs.scores)
        assert torch.equal(ours.pred_classes, theirs.pred_classes)


def test_tta_refuses_a_model_that_is_not_fcos_and_empty_sizes(model):
    with pytest.raises(TypeError, match="FCOSWithTTA: needs an FCOS model"):
        _tta(torch.nn.Linear(1, 1))
    with pytest.raises(ValueError, match="TEST.AUG.MIN_SIZES: empty"):
        _tta(model, "TEST.AUG.MIN_SIZES", "()")


def test_eval_only_with_tta_writes_tta_results_and_a_tta_summary_block(model, tmp_path, scripts):
    synthetic.write_split(tmp_path / "data", split="val", num_images=4)
    torch.save({"model": model.state_dict()}, tmp_path / "model.pth")
    command = ["--config-file", "configs/quickstart.yaml", "--eval-only",
               "--register-coco", "tiny", str(tmp_path / "data/annotations.json"),
               str(tmp_path / "data/images"), *TINY, "MODEL.WEIGHTS", str(tmp_path / "model.pth"),
               "DATASETS.TEST", "('tiny',)", "DATALOADER.NUM_WORKERS", "0",
               "TEST.AUG.ENABLED", "True", "TEST.AUG.MIN_SIZES", "(96, 128)",
               # verify_results reads results["bbox_TTA"] (KeyError without it); any finite
               # AP passes
               "TEST.EXPECTED_RESULTS", "[['bbox_TTA', 'AP', 50, 51]]",
               "OUTPUT_DIR", str(tmp_path / "out")]
    run = scripts.run("train_net.py", *command)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    summary = (tmp_path / "out/inference/tiny/summary.txt").read_text()
    headers = [line.split(" | ")[0] for line in summary.splitlines() if line.startswith("==")]
    assert headers == ["== tiny", "== tiny [TTA]"]
    assert (tmp_path / "out/inference_TTA/tiny/coco_instances_results.json").is_file()
    log = run.stdout + run.stderr
    assert "Running inference with test-time augmentation" in log
    assert "Results verification passed" in log


def test_matching_takes_the_most_overlapping_box_of_the_same_class_above_the_threshold():
    kept = Boxes(torch.tensor([[0., 0., 10., 10.], [20., 20., 30., 30.], [50., 50., 60., 60.]]))
    kept_classes = torch.tensor([0, 1, 0])
    boxes = Boxes(torch.tensor([
        [0., 0., 10., 9.],    # 0: class 0, IoU 0.9 with kept 0
        [0., 0., 10., 10.],   # 1: class 1, IoU 1 with kept 0 but another class
        [21., 21., 30., 30.], # 2: class 1, IoU 0.81 with kept 1
        [20., 20., 30., 25.], # 3: class 1, IoU 0.5 with kept 1
        [50., 50., 60., 55.], # 4: class 0, IoU 0.5 with kept 2: below 0.6
    ]))
    classes = torch.tensor([0, 1, 1, 1, 0])
    match = matching_detections(kept, kept_classes, boxes, classes, min_iou=0.6)
    assert match.tolist() == [0, 2, -1]
    assert matching_detections(kept, kept_classes, boxes, classes, 0.5).tolist() == [0, 2, 4]
    empty = Boxes(torch.zeros((0, 4)))
    assert matching_detections(kept, kept_classes, empty, classes[:0], 0.5).tolist() == [-1] * 3


def test_a_copys_masks_go_back_through_its_resize_and_flip():
    # original 4 x 6 -> copy 8 x 12 (x2), then mirrored; a mask of the copy's left 4
    # columns, rows 2-5, is the original's right 2 columns, rows 1-2
    transforms = T.TransformList([T.ResizeTransform(4, 6, 8, 12), T.HFlipTransform(12)])
    copy_mask = torch.zeros((1, 8, 12), dtype=torch.bool)
    copy_mask[0, 2:6, 0:4] = True
    back = masks_to_original(copy_mask, transforms, (4, 6))  # (1, 4, 6)
    expected = torch.zeros((1, 4, 6))
    expected[0, 1:3, 4:6] = 1.0
    assert back.shape == (1, 4, 6) and back.dtype == torch.float32
    assert torch.equal(back >= 0.5, expected.bool())
    assert ((back >= 0) & (back <= 1)).all()
    assert masks_to_original(copy_mask[:0], transforms, (4, 6)).shape == (0, 4, 6)
    with pytest.raises(ValueError, match=r"expected the original image's \(5, 6\)"):
        masks_to_original(copy_mask, transforms, (5, 6))


@pytest.fixture(scope="module")
def mask_model(model):
    """The trained tiny FCOS whose detections carry their boxes, filled, as masks."""
    masked = FCOSWithBoxMasks(_cfg("MODEL.META_ARCHITECTURE", "FCOSWithBoxMasks"))
    masked.load_state_dict(model.state_dict())
    return masked.eval()


def test_tta_masks_are_plain_on_one_copy_and_mirrored_for_a_mirrored_image(mask_model,
                                                                              images):
    inputs = [{"image": image} for image in images[:2]]
    one_copy = _tta(mask_model, "TEST.AUG.MIN_SIZES", "(128,)", "TEST.AUG.FLIP", "False")
    with torch.no_grad():
        expected = mask_model(inputs)
    for ours, theirs in zip(one_copy(inputs), expected):
        assert len(ours["instances"]) > 0
        assert torch.equal(ours["instances"].pred_masks, theirs["instances"].pred_masks)
    # two sizes, as the box test above: with a third, near-tied scores of the untrained
    # model make NMS keep different boxes for the two images (float rounding)
    tta = _tta(mask_model, "TEST.AUG.MIN_SIZES", "(96, 128)", "TEST.AUG.FLIP", "True")
    for image in images[:2]:
        (plain,), (mirrored,) = tta([{"image": image}]), tta([{"image": image.flip(-1)}])
        plain, mirrored = plain["instances"], mirrored["instances"]
        assert len(plain) > 0 and plain.pred_masks.shape == (len(plain), 128, 128)
        assert plain.pred_masks.flatten(1).any(dim=1).all()  # no detection left maskless
        # each mask is a vote of boxes overlapping its own by IoU >= NMS_TH_TEST, filled
        filled = FCOSWithBoxMasks.filled_boxes(plain.pred_boxes.tensor, 128, 128)
        overlap = (filled & plain.pred_masks).flatten(1).sum(dim=1) \
            / (filled | plain.pred_masks).flatten(1).sum(dim=1)
        assert overlap.median() >= 0.9 and overlap.min() >= 0.4, overlap
        # pair the detections by mirrored box and class (near-equal scores may order
        # them differently)
        x0, y0, x1, y1 = plain.pred_boxes.tensor.unbind(dim=1)
        expected = Boxes(torch.stack([128 - x1, y0, 128 - x0, y1], dim=1))
        iou = pairwise_iou(expected, mirrored.pred_boxes)  # (K, K')
        iou[plain.pred_classes[:, None] != mirrored.pred_classes[None, :]] = 0.0
        iou, pair = iou.max(dim=1)  # (K,) each
        paired = iou > 0.999
        assert paired.sum() >= 0.9 * len(plain)
        # voted masks of boxes filled in copies of 2 sizes: the box, give or take a pixel
        # at its edges (each copy rounds its box to its own pixels)
        ours, theirs = plain.pred_masks[paired].flip(-1), mirrored.pred_masks[pair[paired]]
        differ = (ours ^ theirs).flatten(1).sum(dim=1)
        area = ours.flatten(1).sum(dim=1)
        assert (differ <= 0.02 * area + 4).all(), (differ, area)
