"""MODEL.FCOS.COMPILE (fcos_d2/engine/compile.py): the key's default and validation, the
message where no compiler is available, and a compiled training step of a tiny FCOS that
equals the eager one and keeps the state dict's keys."""
import copy
import logging
import shutil
from pathlib import Path

import pytest
import torch
from detectron2.config import get_cfg
from detectron2.modeling import build_model
from detectron2.structures import Boxes, Instances
from torch import nn

from fcos_d2 import add_fcos_config
from fcos_d2.engine import compile as compile_module
from fcos_d2.engine.compile import compile_in_place, compiler_missing
from fcos_d2.engine.trainer import Trainer
from tiny_training import register_two_images

REPO = Path(__file__).resolve().parents[2]


def _tiny_cfg(*opts):
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(str(REPO / "configs" / "quickstart.yaml"))
    cfg.merge_from_list(["MODEL.DEVICE", "cpu", "MODEL.FPN.OUT_CHANNELS", 32,
                         "MODEL.FCOS.NUM_CONVS", 1, "MODEL.FCOS.CHANNELS_LAST", False, *opts])
    return cfg


def _batch():
    """Two 128-px images, the size of the training test below (one compilation for both
    where inductor's cache holds it)."""
    generator = torch.Generator().manual_seed(0)
    instances = Instances((128, 128))
    instances.gt_boxes = Boxes(torch.tensor([[4.0, 6.0, 40.0, 50.0], [30, 30, 90, 122]]))
    instances.gt_classes = torch.tensor([0, 5])
    return [{"image": torch.rand(3, 128, 128, generator=generator) * 255,
             "instances": instances} for _ in range(2)]


def test_the_key_is_off_by_default_and_takes_only_booleans():
    cfg = _tiny_cfg()
    assert cfg.MODEL.FCOS.COMPILE is False
    with pytest.raises(ValueError):  # yacs: the type of the default
        cfg.merge_from_list(["MODEL.FCOS.COMPILE", "'yes'"])


def test_without_a_cpu_compiler_the_key_fails_naming_itself(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert "no C++ compiler" in compiler_missing("cpu")
    model = build_model(_tiny_cfg())
    with pytest.raises(RuntimeError, match=r"MODEL\.FCOS\.COMPILE True: no C\+\+ compiler "
                                           r".*set MODEL\.FCOS\.COMPILE False"):
        compile_in_place(model, "cpu")


def test_a_model_without_backbone_or_head_is_refused():
    if compiler_missing("cpu"):
        pytest.skip(f"no compiler here: {compiler_missing('cpu')}")
    with pytest.raises(RuntimeError, match=r"MODEL\.FCOS\.COMPILE True: Linear has no "
                                           r"backbone or head"):
        compile_in_place(nn.Linear(2, 2), "cpu")


def _loss_and_gradients(model):
    losses = model(_batch())
    total = sum(losses.values())
    total.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return {k: v.item() for k, v in losses.items()}, grads


def test_a_compiled_training_step_equals_the_eager_one_and_keeps_the_keys():
    missing = compiler_missing("cpu")
    if missing:
        pytest.skip(f"torch.compile cannot run here: {missing}")
    torch.manual_seed(0)
    eager = build_model(_tiny_cfg()).train()
    compiled = copy.deepcopy(eager)
    keys = list(compiled.state_dict())
    assert compile_in_place(compiled, "cpu") == ["backbone", "head"]
    assert list(compiled.state_dict()) == keys  # checkpoints unchanged
    eager_losses, eager_grads = _loss_and_gradients(eager)
    compiled_losses, compiled_grads = _loss_and_gradients(compiled)
    assert compiled_losses.keys() == eager_losses.keys()
    for name, value in eager_losses.items():
        assert compiled_losses[name] == pytest.approx(value, rel=1e-4, abs=1e-5), name
    assert compiled_grads.keys() == eager_grads.keys()
    largest = max(float(g.abs().max()) for g in eager_grads.values())
    # biases before a norm get rounding noise alone; the compiled kernels reorder float32
    # sums: within 1e-3 of each gradient's largest on a CPU with native bf16. On an
    # AVX2-only one, up to 1.3e-2 (res3.1.conv2): eager float32 leaves one of res3.1's
    # 65536 activations (5e-6 in float64) on the other side of its ReLU, where the compiled
    # step agrees with float64 within 2e-5. A wrong or missing term is off by O(1).
    for name, grad in eager_grads.items():
        tolerance = 3e-2 * float(grad.abs().max()) + 1e-6 * largest
        assert float((compiled_grads[name] - grad).abs().max()) <= tolerance, name
    # the evaluation copy (fcos_d2.modeling.fast_inference deep-copies) runs eager
    assert getattr(copy.deepcopy(compiled.head), "_compiled_call_impl", None) is None


def test_the_hook_reports_the_first_iteration_once(caplog, monkeypatch):
    times = iter([10.0, 52.5, 60.0, 61.0])
    monkeypatch.setattr(compile_module.time, "perf_counter", lambda: next(times))
    hook = compile_module.ReportCompileTime(["backbone", "head"])
    with caplog.at_level(logging.INFO, logger="fcos_d2.engine.compile"):
        for _ in range(2):
            hook.before_step()
            hook.after_step()
    said = [r.message for r in caplog.records]
    assert said == ["MODEL.FCOS.COMPILE: the first iteration, which compiled the backbone "
                    "and head, took 42.5 s"]


def test_train_net_trains_compiled_and_saves_the_plain_keys(tmp_path, caplog):
    missing = compiler_missing("cpu")
    if missing:
        pytest.skip(f"torch.compile cannot run here: {missing}")
    register_two_images(tmp_path, "compile_tiny")
    cfg = _tiny_cfg("MODEL.FCOS.COMPILE", True, "SOLVER.AMP.ENABLED", False,
                    "SOLVER.IMS_PER_BATCH", 2, "SOLVER.MAX_ITER", 2,
                    "DATALOADER.NUM_WORKERS", 0, "DATASETS.TRAIN", ("compile_tiny",),
                    "DATASETS.TEST", (), "OUTPUT_DIR", str(tmp_path / "output"))
    with caplog.at_level(logging.INFO, logger="fcos_d2"):
        trainer = Trainer(cfg, skip_final_eval=True)
        trainer.resume_or_load(resume=False)
        trainer.train()
    said = [r.message for r in caplog.records if r.message.startswith("MODEL.FCOS.COMPILE")]
    assert len(said) == 2 and "took" in said[1]
    saved = torch.load(tmp_path / "output" / "model_final.pth", weights_only=False)["model"]
    assert list(saved) == list(build_model(_tiny_cfg()).state_dict())
