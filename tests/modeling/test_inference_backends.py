"""MODEL.FCOS.INFERENCE_BACKEND (fcos_d2/modeling/inference_backends.py): the compiled bf16
and PT2E int8 backends give fp32's detections within stated tolerances on a tiny model;
a bad value is an error naming the key and the allowed values. "auto"'s choice:
test_backend_choice.py; the compile cache and size buckets: test_compile_cache.py."""
from pathlib import Path

import pytest
import torch
from detectron2.config import get_cfg
from detectron2.layers import FrozenBatchNorm2d
from detectron2.modeling import build_model

from fcos_d2 import add_fcos_config
from fcos_d2.modeling.inference_backends import (INFERENCE_BACKENDS, INT8_CALIBRATION_BATCHES,
                                                 torchao_available)

REPO = Path(__file__).resolve().parents[2]


# FCOS-R50.yaml made tiny: R-18, a 32-channel head (GroupNorm's 32 groups need 32
# channels) of one conv a tower, on P3 and P4 only (as configs/quickstart.yaml): each level
# is a graph of its own shapes for inductor to compile, and five took a third longer cold
TINY = ["MODEL.DEVICE", "cpu", "MODEL.WEIGHTS", "", "MODEL.RESNETS.DEPTH", 18,
        "MODEL.RESNETS.RES2_OUT_CHANNELS", 64, "MODEL.RESNETS.OUT_FEATURES", ["res3", "res4"],
        "MODEL.FPN.IN_FEATURES", ["res3", "res4"], "MODEL.FPN.OUT_CHANNELS", 32,
        "MODEL.FCOS.IN_FEATURES", ["p3", "p4"], "MODEL.FCOS.TOP_BLOCKS_IN", "",
        "MODEL.FCOS.SIZES_OF_INTEREST", [64], "MODEL.FCOS.NUM_CONVS", 1,
        "MODEL.FCOS.NUM_CLASSES", 3, "MODEL.FCOS.PRE_NMS_TOPK_TEST", 50,
        "MODEL.FCOS.INFERENCE_TH_TEST", 0.0]


def _tiny_cfg(backend: str, *opts):
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(str(REPO / "configs" / "FCOS-R50.yaml"))
    cfg.merge_from_list([*TINY, "MODEL.FCOS.INFERENCE_BACKEND", backend, *opts])
    return cfg


def _model(backend: str):
    """The tiny FCOS (``TINY``) whose frozen BNs are far from the identity, in eval mode."""
    cfg = _tiny_cfg(backend)
    torch.manual_seed(0)
    model = build_model(cfg)
    for module in model.modules():
        if isinstance(module, FrozenBatchNorm2d):
            for name in ("weight", "bias", "running_mean"):
                getattr(module, name).normal_(0.2, 0.5)
            module.running_var.uniform_(0.5, 2.0)
    return model.eval()


def _inputs(seed: int = 0):
    image = torch.rand(3, 128, 160, generator=torch.Generator().manual_seed(seed)) * 255
    return [{"image": image, "height": 128, "width": 160}]


def _detections(model, inputs):
    with torch.no_grad():
        instances = model(inputs)[0]["instances"]
    return instances.pred_boxes.tensor, instances.scores, instances.pred_classes


def _assert_top_detections_agree(got, want, top: int, box_tol: float, min_found: int):
    """At least ``min_found`` of fp32's ``top`` best detections have a detection of the same
    class in ``got``'s 2 * ``top`` best whose corners are within ``box_tol`` pixels."""
    boxes, _, classes = (t[: 2 * top] for t in got)
    found = 0
    for box, cls in zip(want[0][:top], want[2][:top]):
        close = (boxes - box).abs().max(dim=1).values <= box_tol
        found += bool((close & (classes == cls)).any())
    assert found >= min_found, f"{found} of fp32's top {top} detections matched"


def test_bad_backend_is_an_error_naming_the_key_and_allowed_values():
    with pytest.raises(ValueError) as error:
        _model("fast")
    message = str(error.value)
    assert "MODEL.FCOS.INFERENCE_BACKEND" in message and "'fast'" in message
    assert all(f"'{b}'" in message for b in INFERENCE_BACKENDS)


def test_bf16_compiled_agrees_with_float32():
    want = _detections(_model("eager"), _inputs())
    model = _model("bf16_compiled")
    got = _detections(model, _inputs())
    assert model.inference_copy.of(model).backend_runner is not None  # the copy compiled
    assert model.state_dict().keys() == _model("eager").state_dict().keys()
    # bf16 keeps 8 bits of mantissa: a box corner of ~100 px moves by under 2 px.
    _assert_top_detections_agree(got, want, top=10, box_tol=2.0, min_found=8)


@pytest.mark.skipif(not torchao_available(), reason="PT2E quantization needs torchao "
                    "(moved out of torch.ao.quantization in torch 2.10): pip install torchao")
def test_int8_pt2e_agrees_with_float32_after_calibration():
    want = _detections(_model("eager"), _inputs())
    model = _model("int8_pt2e")
    for seed in range(1, INT8_CALIBRATION_BATCHES):  # calibration: float32 outputs
        _detections(model, _inputs(seed))
    calibrating = _detections(model, _inputs())  # the last calibration batch
    for a, b in zip(calibrating, want):
        assert torch.allclose(a, b, atol=1e-3)
    got = _detections(model, _inputs())  # the int8 graph
    runner = model.inference_copy.of(model).backend_runner
    assert len(runner._int8) == 1
    # uint8 activations: one step is 1/256 of a layer's range; corners move by under 4 px.
    _assert_top_detections_agree(got, want, top=10, box_tol=4.0, min_found=7)


def test_predictor_runs_the_configured_backend(tmp_path):
    """Predictor (and so demo/demo.py) and --eval-only run the model's own forward, which
    takes the key: its inference copy holds the compiled runner."""
    from fcos_d2 import Predictor

    eager = _model("eager")
    weights = tmp_path / "model.pth"
    torch.save({"model": eager.state_dict()}, weights)
    predictors = {}
    for backend in ("eager", "bf16_compiled"):
        cfg = _tiny_cfg(backend, "MODEL.WEIGHTS", str(weights), "INPUT.MIN_SIZE_TEST", 128,
                        "INPUT.MAX_SIZE_TEST", 160)
        predictors[backend] = Predictor(cfg)
    image = (torch.rand(128, 160, 3, generator=torch.Generator().manual_seed(0)) * 255)
    image = image.to(torch.uint8).numpy()
    want, got = (predictors[b](image) for b in ("eager", "bf16_compiled"))
    assert predictors["eager"].model.backend_runner is None
    assert predictors["bf16_compiled"].model.backend_runner.backend == "bf16_compiled"
    _assert_top_detections_agree((got.pred_boxes.tensor, got.scores, got.pred_classes),
                                 (want.pred_boxes.tensor, want.scores, want.pred_classes),
                                 top=10, box_tol=2.0, min_found=8)
