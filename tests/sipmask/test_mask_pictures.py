"""Masks in pictures and deployment: ``fcos_d2.visualization`` lists each mask as RLE and
draws it, ``fcos_d2.Predictor`` returns ``pred_masks`` in the original image's pixels, and
demo/demo.py writes both, for any model whose detections carry ``pred_masks`` (here
``FCOSWithBoxMasks`` of tests/mask_models.py)."""
import importlib.util
import json
from pathlib import Path

import numpy as np
import pycocotools.mask as mask_util
import pytest
import torch
from detectron2.config import get_cfg
from detectron2.data import MetadataCatalog
from detectron2.modeling import build_model
from detectron2.structures import Boxes, Instances
from PIL import Image

from fcos_d2 import Predictor, add_fcos_config
from fcos_d2.visualization import detections_to_dicts, draw_detections
from mask_models import assert_masks_in_original_pixels

REPO = Path(__file__).resolve().parents[2]
# The quickstart model made tiny, every candidate kept, so that random weights detect.
TINY_MASK_MODEL = ["MODEL.META_ARCHITECTURE", "FCOSWithBoxMasks", "MODEL.MASK_ON", "True",
                   "MODEL.FPN.OUT_CHANNELS", "64", "MODEL.FCOS.NUM_CONVS", "1",
                   "MODEL.FCOS.INFERENCE_TH_TEST", "0.0", "TEST.DETECTIONS_PER_IMAGE", "4",
                   "MODEL.DEVICE", "cpu"]


def _instances(with_masks: bool) -> Instances:
    found = Instances((20, 30), pred_boxes=Boxes(torch.tensor([[2.0, 3.0, 12.0, 15.0]])),
                      scores=torch.tensor([0.9]), pred_classes=torch.tensor([0]))
    if with_masks:
        mask = torch.zeros(1, 20, 30, dtype=torch.bool)
        mask[0, 4:14, 3:11] = True
        found.pred_masks = mask
    return found


def test_detections_with_masks_list_each_mask_as_rle_in_image_pixels():
    detection = detections_to_dicts(_instances(True), ["shape"])[0]
    assert detection["box_xyxy"] == [2.0, 3.0, 12.0, 15.0]
    json.dumps(detection)  # JSON-ready: the counts are a string
    np.testing.assert_array_equal(mask_util.decode(detection["mask_rle"]).astype(bool),
                                  _instances(True).pred_masks[0].numpy())
    assert "mask_rle" not in detections_to_dicts(_instances(False), ["shape"])[0]


def test_masks_are_drawn_inside_the_mask_only():
    image = np.full((20, 30, 3), 100, dtype=np.uint8)
    metadata = MetadataCatalog.get("__mask_pictures_test").set(thing_classes=["shape"])
    with_masks = draw_detections(image, _instances(True), metadata, min_side=20)
    without = draw_detections(image, _instances(False), metadata, min_side=20)
    changed = np.abs(with_masks.astype(int) - without.astype(int)).sum(axis=2) > 0  # (H, W)
    assert changed[5:13, 4:10].mean() > 0.9  # inside the mask, away from its edge and label
    assert not changed[16:, 20:].any()  # far from the mask and its box


@pytest.fixture(scope="module")
def mask_cfg(tmp_path_factory):
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(str(REPO / "configs" / "quickstart.yaml"))  # short side to 128
    cfg.merge_from_list(TINY_MASK_MODEL)
    torch.manual_seed(0)
    cfg.MODEL.WEIGHTS = str(tmp_path_factory.mktemp("weights") / "model.pth")
    torch.save({"model": build_model(cfg).state_dict()}, cfg.MODEL.WEIGHTS)
    return cfg


def test_predictor_returns_masks_in_the_original_pixels_after_resizing(mask_cfg):
    image = np.random.default_rng(0).integers(0, 256, (80, 60, 3), dtype=np.uint8)
    found = Predictor(mask_cfg)(image)  # resized to 128 x 96 for the model
    assert len(found) > 0
    assert_masks_in_original_pixels(found, 80, 60)
    assert found.pred_masks.any(dim=(1, 2)).all()


def test_sipmask_predictor_returns_masks_in_the_original_pixels_after_resizing(tmp_path):
    config = REPO / "configs" / "quickstart-sipmask.yaml"
    if not config.is_file():
        pytest.skip("configs/quickstart-sipmask.yaml is missing (the SipMask model is not here)")
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(str(config))
    # random weights: keep every candidate, and every pixel of positive mask probability
    cfg.merge_from_list(["MODEL.DEVICE", "cpu", "MODEL.FCOS.INFERENCE_TH_TEST", "0.0",
                         "TEST.DETECTIONS_PER_IMAGE", "10", "MODEL.SIPMASK.MASK_THRESHOLD", "0.0"])
    torch.manual_seed(0)
    cfg.MODEL.WEIGHTS = str(tmp_path / "sipmask.pth")
    torch.save({"model": build_model(cfg).state_dict()}, cfg.MODEL.WEIGHTS)
    image = np.random.default_rng(0).integers(0, 256, (80, 60, 3), dtype=np.uint8)
    found = Predictor(cfg)(image)  # the model sees it at 128 x 96
    assert len(found) > 0 and found.pred_masks.any()
    # masks come from a stride-2 map: two of its cells, in original pixels
    assert_masks_in_original_pixels(found, 80, 60, margin=2 * 2 * 80 / 128)


def test_demo_writes_masks_into_its_picture_and_json(mask_cfg, tmp_path):
    spec = importlib.util.spec_from_file_location("demo_script", REPO / "demo" / "demo.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    path = tmp_path / "image.png"
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (64, 48, 3), np.uint8)).save(path)
    args = demo.argument_parser().parse_args(
        ["--config-file", str(REPO / "configs" / "quickstart.yaml"), "--input", str(path),
         "--output", str(tmp_path / "out"), "--confidence-threshold", "0",
         *TINY_MASK_MODEL, "MODEL.WEIGHTS", mask_cfg.MODEL.WEIGHTS])
    demo.main(args)
    record = json.loads((tmp_path / "out" / "image.json").read_text())
    assert record["detections"]
    for detection in record["detections"]:
        assert mask_util.decode(detection["mask_rle"]).shape == (64, 48)
    assert (tmp_path / "out" / "image.png").is_file()
