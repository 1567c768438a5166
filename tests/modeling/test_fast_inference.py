"""The fast inference path (``inference_model``, MODEL.FCOS.FAST_INFERENCE): a copy with its
batch norms folded and channels_last memory, with the plain model's outputs within 1e-4,
used by evaluation, and never written into a checkpoint."""
from pathlib import Path

import pytest
import torch
from detectron2.config import get_cfg
from detectron2.layers import FrozenBatchNorm2d
from detectron2.modeling import build_model
from torch import nn

from fcos_d2 import add_fcos_config
from fcos_d2.modeling import fold_batchnorm, inference_model

REPO = Path(__file__).resolve().parents[2]


def _cfg(backbone_norm: str = "FrozenBN", **fcos):
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(str(REPO / "configs" / "FCOS-R50.yaml"))
    cfg.MODEL.DEVICE, cfg.MODEL.WEIGHTS = "cpu", ""
    cfg.MODEL.RESNETS.DEPTH, cfg.MODEL.RESNETS.RES2_OUT_CHANNELS = 18, 64
    cfg.MODEL.RESNETS.NORM = backbone_norm
    cfg.MODEL.FPN.OUT_CHANNELS, cfg.MODEL.FCOS.NUM_CONVS = 32, 2
    cfg.MODEL.FCOS.NUM_CLASSES, cfg.MODEL.FCOS.PRE_NMS_TOPK_TEST = 3, 50
    cfg.MODEL.FCOS.INFERENCE_TH_TEST = 0.0  # every candidate: detections of a random model
    for key, value in fcos.items():
        setattr(cfg.MODEL.FCOS, key, value)
    return cfg


def _model(backbone_norm: str = "FrozenBN", **fcos) -> nn.Module:
    """A small FCOS whose batch norms hold statistics far from the identity."""
    torch.manual_seed(0)
    model = build_model(_cfg(backbone_norm, **fcos))
    for module in model.modules():
        if isinstance(module, (FrozenBatchNorm2d, nn.BatchNorm2d)):
            for name in ("weight", "bias", "running_mean"):
                getattr(module, name).data.normal_(0.2, 0.5)
            module.running_var.data.uniform_(0.5, 2.0)
    return model.eval()


def _image() -> torch.Tensor:
    return torch.rand(3, 110, 150, generator=torch.Generator().manual_seed(0)) * 255


def _head_outputs(model, image):
    with torch.no_grad():
        return [x for level in model.forward_head(model.preprocess_image([{"image": image}]))
                for x in level]


def _assert_same_outputs(fast, plain):
    image = _image()
    for x, y in zip(_head_outputs(fast, image), _head_outputs(plain, image)):
        assert torch.allclose(x, y, rtol=1e-4, atol=1e-4 * y.abs().max())
    with torch.no_grad():
        ours, theirs = (m([{"image": image}])[0]["instances"] for m in (fast, plain))
    assert len(ours) == len(theirs) > 0
    assert torch.allclose(ours.scores, theirs.scores, atol=1e-4)
    # Detections whose scores tie within float error may come in either order (it differs
    # between CPUs): pair each with the nearest box of its class in the other list.
    distance = torch.cdist(ours.pred_boxes.tensor, theirs.pred_boxes.tensor, p=float("inf"))
    distance[ours.pred_classes[:, None] != theirs.pred_classes[None]] = float("inf")
    match = distance.argmin(dim=1)
    assert sorted(match.tolist()) == list(range(len(theirs)))  # one to one
    assert torch.equal(ours.pred_classes, theirs.pred_classes[match])
    assert torch.allclose(ours.scores, theirs.scores[match], atol=1e-4)
    assert torch.allclose(ours.pred_boxes.tensor, theirs.pred_boxes.tensor[match], atol=1e-3)


@pytest.mark.parametrize("backbone_norm, head", [
    ("FrozenBN", {"NORM": "GN"}),
    ("BN", {"NORM": "BN"}),  # eval-mode BN folds too (the quickstart's backbone and head)
    ("FrozenBN", {"NORM": "BN", "USE_DEFORMABLE": True}),  # DCN: the deformable conv folds
    ("FrozenBN", {"NORM": "GN", "USE_DEFORMABLE": True}),
])
def test_fast_copy_folds_every_batch_norm_runs_nhwc_and_keeps_the_outputs(backbone_norm, head):
    plain = _model(backbone_norm, **head)
    before = {k: v.clone() for k, v in plain.state_dict().items()}
    fast = inference_model(plain)
    assert fast is not plain and not fast.training
    assert not any(isinstance(m, (FrozenBatchNorm2d, nn.BatchNorm2d)) for m in fast.modules())
    assert fast.channels_last
    stem = fast.backbone.bottom_up.stem.conv1.weight
    assert stem.is_contiguous(memory_format=torch.channels_last)
    _assert_same_outputs(fast, plain)
    # the plain model is untouched: same weights, same layout, its norms in place
    after = plain.state_dict()
    assert after.keys() == before.keys()
    assert all(torch.equal(after[k], before[k]) for k in before)
    assert plain.backbone.bottom_up.stem.conv1.weight.is_contiguous()


def test_frozen_bn_in_a_sequential_head_folds_into_the_conv_before_it():
    torch.manual_seed(0)
    norm = FrozenBatchNorm2d(4)
    norm.weight.normal_(), norm.bias.normal_(), norm.running_mean.normal_()
    tower = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), norm, nn.ReLU())
    x = torch.randn(1, 3, 8, 8)
    expected = tower(x)
    assert fold_batchnorm(tower) == 1
    assert isinstance(tower[1], nn.Identity) and isinstance(tower[2], nn.ReLU)
    assert torch.allclose(tower(x), expected, atol=1e-5)


def test_a_training_bn_is_not_folded_and_a_gn_is_kept():
    tower = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Conv2d(4, 32, 1),
                          nn.GroupNorm(2, 32)).train()
    assert fold_batchnorm(tower) == 0
    assert fold_batchnorm(tower.eval()) == 1
    assert isinstance(tower[3], nn.GroupNorm)


def test_disabled_key_gives_the_model_itself():
    model = _model()
    assert inference_model(model, enabled=False) is model
    assert _cfg().MODEL.FCOS.FAST_INFERENCE is True


def test_copy_leaves_training_hooks_and_gradients_behind_and_the_mode_as_it_was():
    model = _model().train()
    calls = []
    model.register_forward_hook(lambda *args: calls.append(1))
    next(model.parameters()).grad = torch.ones_like(next(model.parameters()))
    fast = inference_model(model)
    with torch.no_grad():
        fast([{"image": _image()}])
    assert calls == [] and model.training
    assert all(p.grad is None and not p.requires_grad for p in fast.parameters())


def test_a_checkpoint_written_after_an_evaluation_holds_the_unfolded_weights(dataset, tmp_path):
    from detectron2.data import DatasetCatalog

    from fcos_d2.data.register import register_coco_dataset
    from fcos_d2.engine.trainer import Trainer

    if "fast_inference_tiny" not in DatasetCatalog.list():
        register_coco_dataset("fast_inference_tiny", str(dataset / "annotations.json"),
                              str(dataset / "images"))
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(str(REPO / "configs" / "quickstart.yaml"))  # BN backbone and head
    cfg.merge_from_list(["MODEL.FPN.OUT_CHANNELS", "32", "MODEL.FCOS.NUM_CONVS", "1",
                         "DATASETS.TRAIN", "('fast_inference_tiny',)",
                         "DATASETS.TEST", "('fast_inference_tiny',)", "SOLVER.IMS_PER_BATCH", "2",
                         "SOLVER.AMP.ENABLED", "False", "MODEL.DEVICE", "cpu",
                         "OUTPUT_DIR", str(tmp_path)])
    trainer = Trainer(cfg)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    Trainer.test(cfg, trainer.model)  # what the EvalHook runs
    assert trainer.model.training  # still training, as it was
    trainer.checkpointer.save("after_evaluation")
    saved = torch.load(tmp_path / "after_evaluation.pth", weights_only=False)["model"]
    assert saved.keys() == before.keys()
    assert any(".norm." in k for k in saved)
    assert all(torch.equal(saved[k], before[k]) for k in before)
