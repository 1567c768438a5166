"""The model itself runs its folded channels_last form in eval mode (issue 52, item 0):
``FCOS`` in eval mode runs an ``InferenceCopy``, outside its modules, rebuilt whenever its
weights change; ``state_dict()`` and training see only the unfolded weights."""
import copy
from pathlib import Path

import torch
from detectron2.checkpoint import DetectionCheckpointer
from detectron2.config import get_cfg
from detectron2.layers import FrozenBatchNorm2d
from detectron2.modeling import build_model
from torch import nn

from fcos_d2 import add_fcos_config

REPO = Path(__file__).resolve().parents[2]


def _model(fast_inference: bool = True, seed: int = 0) -> nn.Module:
    """A small FCOS (R-18, 32 channels) whose frozen BNs are far from the identity."""
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(str(REPO / "configs" / "FCOS-R50.yaml"))
    cfg.MODEL.DEVICE, cfg.MODEL.WEIGHTS = "cpu", ""
    cfg.MODEL.RESNETS.DEPTH, cfg.MODEL.RESNETS.RES2_OUT_CHANNELS = 18, 64
    cfg.MODEL.FPN.OUT_CHANNELS, cfg.MODEL.FCOS.NUM_CONVS = 32, 2
    cfg.MODEL.FCOS.NUM_CLASSES, cfg.MODEL.FCOS.PRE_NMS_TOPK_TEST = 3, 50
    cfg.MODEL.FCOS.INFERENCE_TH_TEST = 0.0  # every candidate: detections of a random model
    cfg.MODEL.FCOS.FAST_INFERENCE = fast_inference
    torch.manual_seed(seed)
    model = build_model(cfg)
    for module in model.modules():
        if isinstance(module, FrozenBatchNorm2d):
            for name in ("weight", "bias", "running_mean"):
                getattr(module, name).normal_(0.2, 0.5)
            module.running_var.uniform_(0.5, 2.0)
    return model


def _inputs():
    image = torch.rand(3, 110, 150, generator=torch.Generator().manual_seed(0)) * 255
    return [{"image": image, "height": 110, "width": 150}]


def _detections(model):
    with torch.no_grad():
        instances = model(_inputs())[0]["instances"]
    return instances.pred_boxes.tensor, instances.scores, instances.pred_classes


def _plain_twin(model) -> nn.Module:
    """The same weights in a model that runs itself (FAST_INFERENCE False)."""
    plain = _model(fast_inference=False, seed=1)
    plain.load_state_dict(model.state_dict())
    return plain.eval()


def _assert_same_detections(model, reference):
    boxes, scores, classes = _detections(model)
    want_boxes, want_scores, want_classes = _detections(reference)
    assert len(scores) == len(want_scores) > 0
    assert torch.allclose(scores, want_scores, atol=1e-4)
    assert torch.allclose(boxes, want_boxes, atol=1e-4 * want_boxes.abs().max())
    assert torch.equal(classes, want_classes)


def _runs_folded_copy(model) -> bool:
    copy_ = model.inference_copy._copy
    return copy_ is not None and not any(isinstance(m, FrozenBatchNorm2d)
                                         for m in copy_.modules())


def test_eval_mode_runs_a_folded_channels_last_copy_with_the_plain_outputs():
    model = _model().eval()
    _assert_same_detections(model, _plain_twin(model))
    assert _runs_folded_copy(model) and model.inference_copy._copy.channels_last
    assert any(isinstance(m, FrozenBatchNorm2d) for m in model.modules())  # model unfolded
    assert not model.channels_last


def test_outputs_follow_weights_loaded_with_load_state_dict():
    model = _model().eval()
    before = _detections(model)[1]
    other = _model(seed=2)
    model.load_state_dict(other.state_dict())
    assert not torch.equal(_detections(model)[1], before)
    _assert_same_detections(model, _plain_twin(other))


def test_outputs_follow_an_optimizer_step_with_or_without_train():
    model = _model().eval()
    before = _detections(model)[1]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(0)
    for parameter in model.parameters():
        parameter.grad = torch.randn(parameter.shape, generator=generator)
    optimizer.step()  # in eval mode: only the version counters tell
    assert not torch.equal(_detections(model)[1], before)
    _assert_same_detections(model, _plain_twin(model))
    model.train()
    assert model.inference_copy._copy is None  # dropped on train()
    optimizer.step()
    model.eval()
    _assert_same_detections(model, _plain_twin(model))


def test_outputs_follow_weights_loaded_by_a_checkpointer(tmp_path):
    model = _model().eval()
    _detections(model)
    other = _model(seed=3)
    DetectionCheckpointer(other, save_dir=str(tmp_path)).save("other")
    DetectionCheckpointer(model).load(str(tmp_path / "other.pth"))
    _assert_same_detections(model, _plain_twin(other))


def test_evaluation_leaves_the_state_dict_keys_and_values_unchanged():
    model = _model().eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    parameters = len(list(model.parameters()))
    _detections(model)
    after = model.state_dict()
    assert list(after) == list(before)
    assert all(torch.equal(after[k], before[k]) for k in before)
    assert len(list(model.parameters())) == parameters and _runs_folded_copy(model)
    assert not any("inference_copy" in name for name, _ in model.named_modules())


def test_a_forward_hook_on_a_submodule_makes_the_model_run_itself():
    model = _model().eval()
    calls = []
    model.head.register_forward_hook(lambda m, args, out: calls.append(1))
    _detections(model)
    assert calls == [1] and model.inference_copy._copy is None


def test_copies_of_the_model_hold_no_inference_copy_and_fast_inference_false_runs_itself():
    model = _model().eval()
    _detections(model)
    assert copy.deepcopy(model).inference_copy._copy is None
    plain = _plain_twin(model)
    _detections(plain)
    assert plain.inference_copy._copy is None


def test_settings_changed_on_the_model_after_the_copy_was_made_hold():
    model = _model().eval()
    _, scores, _ = _detections(model)
    assert len(scores) > 5
    model.score_thresh = 1.0  # as a user sets a detectron2 model's threshold: no score above
    assert len(_detections(model)[1]) == 0
    model.score_thresh = 0.0
    assert torch.equal(_detections(model)[1], scores)
    model.inference_dtype = torch.bfloat16  # a dtype, not a number
    _detections(model)
    assert model.inference_copy._copy.inference_dtype is torch.bfloat16
    assert _runs_folded_copy(model) and model.inference_copy._copy.channels_last
    assert not model.channels_last  # the copy's own layout is not the model's


def test_the_copy_keeps_its_compiled_backend_runner_from_call_to_call(monkeypatch):
    from fcos_d2.modeling.inference_backends import BackendRunner

    runners = []

    def eager_run(self, model, images):  # no compiling in a test: the runner's identity
        runners.append(self)
        return model.forward_head(images)

    monkeypatch.setattr(BackendRunner, "__call__", eager_run)
    model = _model()
    model.inference_backend = "bf16_compiled"
    model.eval()
    for _ in range(3):
        _detections(model)
    assert len(runners) == 3 and runners[0] is runners[1] is runners[2]
    assert model.backend_runner is None  # the model itself never ran a backend
