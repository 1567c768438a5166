"""MODEL.FCOS.INFERENCE_BACKEND "auto" (fcos_d2/modeling/backend_choice.py): what it runs for
each kind of CPU (capabilities faked) and each amount of work, on a GPU, and pinned by the
environment; explicit values run as asked; the one log line, on a tiny model."""
import logging

import pytest
import torch

from fcos_d2.modeling import backend_choice, meta_arch
from fcos_d2.modeling.backend_choice import (AUTO_OVERRIDE_ENV, COLD_COMPILE_PAYS_AFTER,
                                             WARM_COMPILE_PAYS_AFTER, choose_backend,
                                             no_amx_images_needed)

AMX = {"amx": True, "native_bf16": True, "native_int8": True}
AVX512_BF16 = {"amx": False, "native_bf16": True, "native_int8": True}  # AMD Zen 4, say
AVX2 = {"amx": False, "native_bf16": False, "native_int8": False}
NO_PIN = {}  # auto's own choice, not the suite's FCOS_D2_AUTO_BACKEND
LARGE, MIDDLE = 800 * 1216, 512 * 768  # padded pixels


@pytest.mark.parametrize("capabilities, images, warm, pixels, backend, dtype", [
    (AMX, None, False, None, "bf16_compiled", None),  # a Predictor kept to serve
    (AMX, COLD_COMPILE_PAYS_AFTER, False, 128 * 128, "bf16_compiled", None),  # a dataset
    (AMX, COLD_COMPILE_PAYS_AFTER - 1, False, LARGE, "eager", torch.bfloat16),
    (AMX, 1, False, None, "eager", torch.bfloat16),  # one demo image
    (AMX, WARM_COMPILE_PAYS_AFTER, True, None, "bf16_compiled", None),  # cache holds it
    (AMX, WARM_COMPILE_PAYS_AFTER - 1, True, None, "eager", torch.bfloat16),
    # without AMX: a compile only for a dataset long enough for its inputs' size
    (AVX512_BF16, 1000, False, LARGE, "bf16_compiled", None),
    (AVX512_BF16, 1000, True, 2 * LARGE, "bf16_compiled", None),
    (AVX512_BF16, 999, True, LARGE, "eager", torch.bfloat16),
    (AVX512_BF16, 1000, False, LARGE - 1, "eager", torch.bfloat16),  # smaller: 2000 needed
    (AVX512_BF16, 2000, False, MIDDLE, "bf16_compiled", None),
    (AVX512_BF16, 1999, False, LARGE - 1, "eager", torch.bfloat16),
    (AVX512_BF16, 5000, True, MIDDLE - 1, "eager", torch.bfloat16),  # small: never
    (AVX512_BF16, 5000, False, None, "eager", torch.bfloat16),  # size unknown
    (AVX512_BF16, None, False, LARGE, "eager", torch.bfloat16),  # served: ~20 s first call
    (AVX512_BF16, None, False, None, "eager", torch.bfloat16),
    (AVX2, None, False, None, "eager", torch.float32),
    (AVX2, 5000, True, LARGE, "eager", torch.float32),
])
def test_auto_on_the_cpu_follows_its_units_the_work_ahead_and_the_input_size(
        capabilities, images, warm, pixels, backend, dtype):
    choice = choose_backend("auto", "cpu", images, warm=warm, pixels=pixels,
                            capabilities=capabilities, environ=NO_PIN)
    assert (choice.backend, choice.dtype) == (backend, dtype)
    assert choice.reason.startswith("MODEL.FCOS.INFERENCE_BACKEND auto: ")
    assert choice.warning == (capabilities is AVX2)


def test_auto_says_why_in_its_line():
    cold = choose_backend("auto", "cpu", 3, capabilities=AMX, environ=NO_PIN).reason
    assert "eager bfloat16" in cold and "3 images ahead" in cold and "nothing cached" in cold
    serving = choose_backend("auto", "cpu", None, capabilities=AMX, environ=NO_PIN).reason
    assert "bf16_compiled" in serving and "stays loaded" in serving
    emulated = choose_backend("auto", "cpu", None, capabilities=AVX2, environ=NO_PIN).reason
    assert "eager float32" in emulated and "no native bf16" in emulated
    small = choose_backend("auto", "cpu", 5000, pixels=MIDDLE - 1, capabilities=AVX512_BF16,
                           environ=NO_PIN).reason
    assert "without AMX" in small and "under 512x768" in small
    short = choose_backend("auto", "cpu", 50, pixels=MIDDLE, capabilities=AVX512_BF16,
                           environ=NO_PIN).reason
    assert "eager bfloat16" in short and "50 images ahead" in short
    assert "from 2000 images" in short
    dataset = choose_backend("auto", "cpu", 5000, pixels=LARGE, capabilities=AVX512_BF16,
                             environ=NO_PIN).reason
    assert "bf16_compiled" in dataset and "5000 images ahead" in dataset


def test_auto_on_a_gpu_runs_eager_float16():
    choice = choose_backend("auto", "cuda", None, capabilities=AMX, environ=NO_PIN)
    assert (choice.backend, choice.dtype, choice.warning) == ("eager", torch.float16, False)


@pytest.mark.parametrize("capabilities", [AMX, AVX512_BF16, AVX2])
def test_explicit_values_run_as_asked_on_any_cpu(capabilities):
    for backend in ("eager", "bf16_compiled", "int8_pt2e"):
        choice = choose_backend(backend, "cpu", 1, capabilities=capabilities, environ=NO_PIN)
        assert (choice.backend, choice.dtype, choice.reason) == (backend, None, "")
    off_cpu = choose_backend("int8_pt2e", "cuda", None, environ=NO_PIN)
    assert off_cpu.backend == "eager" and "int8_pt2e: the model is on cuda" in off_cpu.reason


def test_the_environment_pins_auto_and_a_bad_pin_names_the_variable():
    pinned = choose_backend("auto", "cpu", None, capabilities=AMX,
                            environ={AUTO_OVERRIDE_ENV: "eager"})
    assert (pinned.backend, pinned.dtype) == ("eager", None)
    assert AUTO_OVERRIDE_ENV in pinned.reason
    with pytest.raises(ValueError, match=f"{AUTO_OVERRIDE_ENV}: unknown 'fast'"):
        choose_backend("auto", "cpu", None, environ={AUTO_OVERRIDE_ENV: "fast"})


def _tiny_model():
    from test_inference_backends import _model  # the R-18 FCOS with a 32-channel head
    return _model("auto")


def test_fallback_on_an_avx2_cpu_logs_one_line_and_runs_eager_float32(monkeypatch, caplog):
    from test_inference_backends import _detections, _inputs, _model
    monkeypatch.delenv(AUTO_OVERRIDE_ENV, raising=False)
    monkeypatch.setattr(backend_choice, "cpu_capabilities", lambda: AVX2)
    meta_arch._log_once.cache_clear()
    model, eager = _tiny_model(), _model("eager")
    with caplog.at_level(logging.INFO, logger=meta_arch.__name__):
        got = _detections(model, _inputs())
        _detections(model, _inputs(seed=1))
    lines = [r for r in caplog.records if "INFERENCE_BACKEND" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    assert "auto: eager float32" in lines[0].getMessage()
    assert model.inference_copy.of(model).backend_runner is None
    for a, b in zip(got, _detections(eager, _inputs())):
        assert torch.equal(a, b)


def test_a_demo_image_on_amx_runs_eager_bf16_without_compiling(monkeypatch, caplog, tmp_path):
    from test_inference_backends import _detections, _inputs
    monkeypatch.delenv(AUTO_OVERRIDE_ENV, raising=False)
    monkeypatch.setattr(backend_choice, "cpu_capabilities", lambda: AMX)
    meta_arch._log_once.cache_clear()
    model = _tiny_model()
    model.compile_cache_dir, model.expected_images = str(tmp_path), 1  # cold cache
    with caplog.at_level(logging.INFO, logger=meta_arch.__name__):
        boxes, scores, _ = _detections(model, _inputs())
    lines = [r.getMessage() for r in caplog.records if "INFERENCE_BACKEND" in r.getMessage()]
    assert lines == [lines[0]] and "auto: eager bfloat16" in lines[0]
    assert model.inference_copy.of(model).backend_runner is None  # nothing compiled
    assert len(scores) > 0 and scores.dtype == torch.float32


def test_the_images_a_compile_needs_without_amx_fall_with_the_input_size():
    assert [no_amx_images_needed(p) for p in (None, 320 * 480, MIDDLE - 1, MIDDLE, LARGE - 1,
                                              LARGE, 4 * LARGE)] == \
        [None, None, None, 2000, 2000, 1000, 1000]


def test_the_model_asks_with_its_padded_input_size_and_asks_again_when_it_grows(monkeypatch):
    from test_inference_backends import _detections, _inputs
    asked = []

    def choose(*args, pixels=None, **kwargs):
        asked.append(pixels)
        return backend_choice.BackendChoice("eager", torch.bfloat16)

    monkeypatch.setattr(meta_arch, "choose_backend", choose)
    model = _tiny_model()
    _detections(model, _inputs())
    _detections(model, _inputs(seed=1))  # same size class: the choice is kept
    assert len(asked) == 1 and asked[0] > 0
    height, width = _inputs()[0]["image"].shape[-2:]
    assert asked[0] >= height * width and asked[0] % 32 == 0  # padded to the stride
    assert model.backend_choice((800, 1216)) is not None and asked[-1] == LARGE
    assert model.backend_choice((800, 1344)) is not None and len(asked) == 2  # same class
    assert model.backend_choice((512, 768)) is not None and asked[-1] == MIDDLE


def test_evaluation_tells_auto_the_test_images_per_worker(dataset, monkeypatch):
    from detectron2.config import get_cfg
    from detectron2.utils import comm

    from fcos_d2.data.register import register_coco_dataset
    from fcos_d2.engine.trainer import test_images_per_worker

    register_coco_dataset("backend_choice_tiny_val", str(dataset / "annotations.json"),
                          str(dataset / "images"))
    cfg = get_cfg()
    cfg.DATASETS.TEST = ("backend_choice_tiny_val", "backend_choice_tiny_val")
    assert test_images_per_worker(cfg) == 8  # 4 images, twice
    monkeypatch.setattr(comm, "get_world_size", lambda: 3)
    assert test_images_per_worker(cfg) == 2
