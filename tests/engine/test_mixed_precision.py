"""Reduced precision: MODEL.FCOS.INFERENCE_DTYPE (backbone and head under autocast,
post-processing in float32), losses computed in float32 under autocast, and
SOLVER.AMP.ENABLED on the CPU (bf16 autocast in CPUAMPTrainer)."""
import itertools
from pathlib import Path

import pytest
import torch
from detectron2.config import get_cfg
from detectron2.modeling import build_model
from detectron2.structures import Boxes, Instances

from fcos_d2 import add_fcos_config
from fcos_d2.engine import CPUAMPTrainer
from fcos_d2.engine.trainer import Trainer
from fcos_d2.modeling.losses import fcos_losses
from tiny_training import register_two_images

REPO = Path(__file__).resolve().parents[2]
BF16 = torch.bfloat16


def _tiny_cfg(**fcos):
    """The quickstart config (R-18, P3-P4) made narrow: 32 FPN channels, one tower conv."""
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(str(REPO / "configs" / "quickstart.yaml"))
    cfg.MODEL.DEVICE = "cpu"
    cfg.MODEL.FPN.OUT_CHANNELS, cfg.MODEL.FCOS.NUM_CONVS = 32, 1
    for key, value in fcos.items():
        setattr(cfg.MODEL.FCOS, key, value)
    return cfg


def _images(boxes_per_image, size=64):
    generator = torch.Generator().manual_seed(0)
    inputs = []
    for boxes in boxes_per_image:
        instances = Instances((size, size))
        instances.gt_boxes = Boxes(torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4))
        instances.gt_classes = torch.arange(len(boxes)) % 6
        image = torch.rand(3, size, size, generator=generator) * 255
        inputs.append({"image": image, "instances": instances})
    return inputs


def test_inference_dtype_rejects_an_unknown_name_and_names_the_key():
    with pytest.raises(ValueError, match=r"MODEL\.FCOS\.INFERENCE_DTYPE: unknown 'fp8'"):
        build_model(_tiny_cfg(INFERENCE_DTYPE="fp8"))


def _head_outputs_and_detections(inference_dtype: str):
    torch.manual_seed(0)
    # CPU_BF16 "always": these are bf16's numbers, on any CPU (tests/engine/test_cpu_bf16.py covers
    # the float32 fallback of CPUs without native bf16).
    model = build_model(_tiny_cfg(INFERENCE_DTYPE=inference_dtype, INFERENCE_TH_TEST=0.0,
                                  CPU_BF16="always")).eval()
    captured = []
    model.head.register_forward_hook(lambda module, args, out: captured.append(out))
    with torch.no_grad():
        detections = model(_images([[]]))[0]["instances"]
    return captured[0], detections


def test_bf16_inference_runs_the_head_in_bf16_and_returns_float32_detections_close_to_fp32():
    (logits32, reg32, ctr32), fp32 = _head_outputs_and_detections("float32")
    (logits16, reg16, ctr16), bf16 = _head_outputs_and_detections("bfloat16")
    assert logits16[0].dtype == BF16 and logits32[0].dtype == torch.float32
    assert bf16.pred_boxes.tensor.dtype == torch.float32 and bf16.scores.dtype == torch.float32
    # Tolerance: bf16 keeps 8 significant bits (relative rounding 2^-9 = 0.2% per op);
    # through the R-18 + FPN + head, the outputs stay within 2% of their range.
    for ours, reference in zip((logits16, reg16, ctr16), (logits32, reg32, ctr32)):
        for x, y in zip(ours, reference):
            assert (x.float() - y).abs().max() <= 0.02 * y.abs().max()
    # The detections: same count, and the k-th best score within 0.002 of fp32's k-th best
    # (scores lie near the 0.01 prior of an untrained head).
    assert len(bf16) == len(fp32) > 0
    assert torch.allclose(bf16.scores.sort().values, fp32.scores.sort().values, atol=2e-3)


def _loss_inputs(dtype):
    generator = torch.Generator().manual_seed(0)
    labels = torch.full((2, 50), 6)
    labels[0, :5], labels[1, 10:13] = torch.tensor([0, 1, 2, 3, 4]), 5
    reg_targets = torch.rand(2, 50, 4, generator=generator) * 4 + 0.1
    reg_targets[1, 12] = torch.tensor([0.0625, 0.0625, 0.0625, 0.0625])  # a 1-px box at stride 8
    return dict(logits=torch.randn(2, 50, 6, generator=generator).to(dtype),
                reg_pred=(torch.rand(2, 50, 4, generator=generator) * 4).to(dtype),
                ctr_logits=torch.randn(2, 50, generator=generator).to(dtype),
                labels=labels, reg_targets=reg_targets, num_classes=6, focal_alpha=0.25,
                focal_gamma=2.0, loc_loss_type="giou")


def test_losses_under_bf16_autocast_are_float32_and_equal_the_fp32_losses():
    reference = fcos_losses(**_loss_inputs(torch.float32))
    rounded = {k: v.float() for k, v in fcos_losses(**_loss_inputs(BF16)).items()}  # no autocast
    with torch.autocast("cpu", dtype=BF16):
        losses = fcos_losses(**_loss_inputs(BF16))
    for name, value in losses.items():
        assert value.dtype == torch.float32 and torch.isfinite(value)
        # The only difference from float32 is the rounding of the head's outputs to bf16:
        # computed in float32 from the same rounded inputs, the losses agree to 1e-6; from
        # the unrounded inputs, within 1% (bf16's 2^-9 relative rounding, summed).
        assert torch.allclose(value, rounded[name], rtol=1e-6), name
        assert torch.allclose(value, reference[name], rtol=1e-2), name


def test_bf16_autocast_training_on_1px_boxes_gives_finite_losses_and_gradients():
    torch.manual_seed(0)
    model = build_model(_tiny_cfg()).train()
    # 1x1-px boxes around locations of P3 (centers at 4 + 8k): each is a positive whose
    # (l, t, r, b) is 0.5 px = 0.0625 strides.
    boxes = [[[11.5, 11.5, 12.5, 12.5], [35.5, 19.5, 36.5, 20.5]],
             [[3.5, 3.5, 4.5, 4.5], [59.5, 59.5, 60.5, 60.5]]]
    with torch.autocast("cpu", dtype=BF16):
        losses = model(_images(boxes))
    assert all(v.dtype == torch.float32 and torch.isfinite(v) for v in losses.values()), losses
    assert losses["loss_fcos_loc"] > 0  # the boxes did get positives
    sum(losses.values()).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_cpu_amp_trainer_runs_the_forward_in_bf16_and_keeps_float32_weights():
    torch.manual_seed(0)
    model = build_model(_tiny_cfg()).train()
    before = model.head.cls_logits.weight.detach().clone()
    stem_dtypes = []
    model.backbone.bottom_up.stem.register_forward_hook(
        lambda module, args, out: stem_dtypes.append(out.dtype))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = _images([[[10, 10, 40, 30]], [[5, 20, 60, 60]]])
    trainer = CPUAMPTrainer(model, itertools.repeat(batch), optimizer)
    trainer.train(0, 2)
    assert stem_dtypes == [BF16, BF16]
    assert model.head.cls_logits.weight.dtype == torch.float32
    assert not torch.equal(model.head.cls_logits.weight, before)
    assert torch.isfinite(torch.tensor(trainer.storage.history("total_loss").values())).all()


def test_train_net_trains_two_iterations_with_solver_amp_on_the_cpu(tmp_path, monkeypatch):
    register_two_images(tmp_path, "amp_tiny")
    cfg = _tiny_cfg()
    cfg.merge_from_list(["SOLVER.AMP.ENABLED", True, "SOLVER.IMS_PER_BATCH", 2,
                         "SOLVER.MAX_ITER", 2, "DATALOADER.NUM_WORKERS", 0,
                         "DATASETS.TRAIN", ("amp_tiny",), "DATASETS.TEST", ("amp_tiny",),
                         "OUTPUT_DIR", str(tmp_path / "output")])
    steps = []  # the iterations run by CPUAMPTrainer
    run_step = CPUAMPTrainer.run_step
    monkeypatch.setattr(CPUAMPTrainer, "run_step",
                        lambda self: steps.append(self.iter) or run_step(self))
    trainer = Trainer(cfg, skip_final_eval=True)
    trainer.train()
    assert steps == [0, 1]
    assert len(trainer.storage.history("total_loss").values()) == 2
    assert (tmp_path / "output" / "model_final.pth").is_file()
