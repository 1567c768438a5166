"""Test-time augmentation for FCOS (TEST.AUG.*): valid merged detections, mirrored
detections for a mirrored image, plain inference when the only copy is the image itself,
and train_net.py --eval-only reporting "_TTA" results and a [TTA] summary block.

The model is the quickstart config made tiny (64 FPN channels, one conv per tower),
trained for 10 SGD steps from a fixed seed on synthetic shapes rendered in memory.
"""
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from detectron2.config import get_cfg

from fcos_d2 import FCOSWithTTA, add_fcos_config
from fcos_d2.data import synthetic
from synthetic_samples import sample, train

REPO = Path(__file__).resolve().parents[1]
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


def test_eval_only_with_tta_writes_tta_results_and_a_tta_summary_block(model, tmp_path):
    synthetic.write_split(tmp_path / "data", split="val", num_images=4)
    torch.save({"model": model.state_dict()}, tmp_path / "model.pth")
    command = [sys.executable, "train_net.py", "--config-file", "configs/quickstart.yaml",
               "--eval-only", "--register-coco", "tiny", str(tmp_path / "data/annotations.json"),
               str(tmp_path / "data/images"), *TINY, "MODEL.WEIGHTS", str(tmp_path / "model.pth"),
               "DATASETS.TEST", "('tiny',)", "DATALOADER.NUM_WORKERS", "0",
               "TEST.AUG.ENABLED", "True", "TEST.AUG.MIN_SIZES", "(96, 128)",
               # verify_results reads results["bbox_TTA"] (KeyError without it); any finite
               # AP passes
               "TEST.EXPECTED_RESULTS", "[['bbox_TTA', 'AP', 50, 51]]",
               "OUTPUT_DIR", str(tmp_path / "out")]
    run = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    summary = (tmp_path / "out/inference/tiny/summary.txt").read_text()
    headers = [line.split(" | ")[0] for line in summary.splitlines() if line.startswith("==")]
    assert headers == ["== tiny", "== tiny [TTA]"]
    assert (tmp_path / "out/inference_TTA/tiny/coco_instances_results.json").is_file()
    log = run.stdout + run.stderr
    assert "Running inference with test-time augmentation" in log
    assert "Results verification passed" in log
