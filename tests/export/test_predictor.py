"""fcos_d2.Predictor: a trained model from its config, one call from an image path or an
array in INPUT.FORMAT to Instances in the original image's pixels."""
from pathlib import Path

import numpy as np
import pytest
import torch
from detectron2.config import get_cfg
from detectron2.engine import DefaultPredictor
from detectron2.modeling import build_model
from PIL import Image

from fcos_d2 import Predictor, add_fcos_config
from fcos_d2.checkpoint import WeightsMismatchError

REPO = Path(__file__).resolve().parents[2]
TINY = ["MODEL.FPN.OUT_CHANNELS", "64", "MODEL.FCOS.NUM_CONVS", "1", "MODEL.DEVICE", "cpu",
        "MODEL.FCOS.INFERENCE_TH_TEST", "0.0", "TEST.DETECTIONS_PER_IMAGE", "20"]


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(str(REPO / "configs" / "quickstart.yaml"))  # resizes the short side to 128
    cfg.merge_from_list(TINY)
    torch.manual_seed(0)
    cfg.MODEL.WEIGHTS = str(tmp_path_factory.mktemp("weights") / "model.pth")
    torch.save({"model": build_model(cfg).state_dict()}, cfg.MODEL.WEIGHTS)
    return cfg


@pytest.fixture(scope="module")
def image_file(tmp_path_factory):
    rgb = np.random.default_rng(0).integers(0, 256, (80, 60, 3), dtype=np.uint8)
    path = tmp_path_factory.mktemp("images") / "image.png"
    Image.fromarray(rgb).save(path)
    return path, rgb


def test_path_and_array_give_default_predictors_detections_in_original_pixels(cfg, image_file):
    path, rgb = image_file
    predictor = Predictor(cfg)
    from_path, from_array = predictor(path), predictor(np.ascontiguousarray(rgb[:, :, ::-1]))
    expected = DefaultPredictor(cfg)(rgb[:, :, ::-1])["instances"]  # BGR, as it wants

    assert len(from_path) > 0 and from_path.image_size == (80, 60)
    for got in (from_path, from_array):  # the fast path (folded BN, NHWC): float rounding only
        assert torch.allclose(got.pred_boxes.tensor, expected.pred_boxes.tensor, atol=1e-3)
        assert torch.allclose(got.scores, expected.scores, atol=1e-4)
        assert got.pred_classes.equal(expected.pred_classes)
    boxes = from_path.pred_boxes.tensor
    assert (boxes[:, 2] <= 60).all() and (boxes[:, 3] <= 80).all() and boxes[:, 2].max() > 48


def test_predictor_runs_a_folded_nhwc_copy_unless_fast_inference_is_off(cfg, image_file):
    path, rgb = image_file
    fast = Predictor(cfg)
    assert fast.model.channels_last and not any(".norm." in k for k in fast.model.state_dict())
    plain_cfg = cfg.clone()
    plain_cfg.MODEL.FCOS.FAST_INFERENCE = False
    plain = Predictor(plain_cfg)
    assert any(".norm." in k for k in plain.model.state_dict())  # BN as trained
    expected = DefaultPredictor(plain_cfg)(rgb[:, :, ::-1])["instances"]
    assert plain(path).scores.equal(expected.scores)  # exactly the model as trained


def test_rgb_models_take_rgb_arrays(cfg, image_file):
    path, rgb = image_file
    rgb_cfg = cfg.clone()
    rgb_cfg.INPUT.FORMAT = "RGB"
    got = Predictor(rgb_cfg)(rgb)
    assert got.scores.equal(Predictor(rgb_cfg)(path).scores)
    # the model gets the array's channels in the given order: the same tensor a BGR model
    # gets from the same array
    assert got.scores.equal(Predictor(cfg)(rgb).scores)
    assert not got.scores.equal(Predictor(cfg)(np.ascontiguousarray(rgb[:, :, ::-1])).scores)


def test_array_of_wrong_shape_and_missing_weights_are_errors_that_say_what_is_expected(cfg):
    with pytest.raises(ValueError, match=r"\(H, W, 3\) array in INPUT.FORMAT BGR, got \(80, 60\)"):
        Predictor(cfg)(np.zeros((80, 60), dtype=np.uint8))
    no_weights = cfg.clone()
    no_weights.MODEL.WEIGHTS = ""
    with pytest.raises(ValueError, match="MODEL.WEIGHTS is empty"):
        Predictor(no_weights)


def test_weights_of_another_class_count_are_refused_naming_the_shapes(cfg, tmp_path):
    other = cfg.clone()
    other.MODEL.FCOS.NUM_CLASSES = cfg.MODEL.FCOS.NUM_CLASSES + 2
    other.MODEL.WEIGHTS = str(tmp_path / "other.pth")
    torch.save({"model": build_model(other).state_dict()}, other.MODEL.WEIGHTS)
    with pytest.raises(WeightsMismatchError, match=r"head\.cls_logits\.weight"):
        Predictor(_with_weights(cfg, other.MODEL.WEIGHTS))


def _with_weights(cfg, path):
    changed = cfg.clone()
    changed.MODEL.WEIGHTS = path
    return changed


def test_predictor_tells_auto_how_many_images_it_has_ahead(cfg):
    """MODEL.FCOS.INFERENCE_BACKEND "auto" weighs a compile against ``expected_images``
    (fcos_d2/modeling/backend_choice.py); 0 stands for unknown, a predictor kept to serve."""
    assert Predictor(cfg).model.expected_images == 0
    assert Predictor(cfg, expected_images=2).model.expected_images == 2
