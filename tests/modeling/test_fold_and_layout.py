"""Inference speed-ups that must not change results: frozen-BN folding
(``fold_frozen_batchnorm``) and MODEL.FCOS.CHANNELS_LAST."""
from pathlib import Path

import torch
from detectron2.config import get_cfg
from detectron2.layers import FrozenBatchNorm2d
from detectron2.modeling import build_model

from fcos_d2 import add_fcos_config, fold_frozen_batchnorm

REPO = Path(__file__).resolve().parents[2]


def _model(**fcos):
    """An R-18 FCOS with frozen BN (as a pretrained backbone) and random BN statistics."""
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(str(REPO / "configs" / "FCOS-R50.yaml"))
    cfg.MODEL.DEVICE, cfg.MODEL.WEIGHTS = "cpu", ""
    cfg.MODEL.RESNETS.DEPTH, cfg.MODEL.RESNETS.RES2_OUT_CHANNELS = 18, 64
    cfg.MODEL.FPN.OUT_CHANNELS, cfg.MODEL.FCOS.NUM_CONVS = 32, 1
    for key, value in fcos.items():
        setattr(cfg.MODEL.FCOS, key, value)
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    for module in model.modules():
        if isinstance(module, FrozenBatchNorm2d):  # statistics far from the identity
            for name in ("weight", "bias", "running_mean"):
                getattr(module, name).normal_(0.2, 0.5)
            module.running_var.uniform_(0.5, 2.0)
    return model


def _head_outputs(model, image):
    with torch.no_grad():
        return model.forward_head(model.preprocess_image([{"image": image}]))


def test_folding_frozen_bn_removes_every_norm_and_keeps_the_outputs():
    model = _model()
    image = torch.rand(3, 160, 224, generator=torch.Generator().manual_seed(0)) * 255
    reference = _head_outputs(model, image)
    num_frozen = sum(isinstance(m, FrozenBatchNorm2d) for m in model.modules())
    assert fold_frozen_batchnorm(model) == num_frozen == 20  # stem + 8 blocks x 2 + 3 shortcuts
    assert not any(isinstance(m, FrozenBatchNorm2d) for m in model.modules())
    for ours, theirs in zip(_head_outputs(model, image), reference):
        for x, y in zip(ours, theirs):  # float32 reassociation only
            assert torch.allclose(x, y, rtol=1e-4, atol=1e-4 * y.abs().max())


def test_channels_last_model_keeps_nhwc_weights_and_input_and_the_same_outputs():
    model, nchw = _model(CHANNELS_LAST=True), _model()
    conv = model.backbone.bottom_up.stem.conv1.weight
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
    image = torch.rand(3, 160, 224, generator=torch.Generator().manual_seed(0)) * 255
    batch = model.preprocess_image([{"image": image}]).tensor
    assert batch.is_contiguous(memory_format=torch.channels_last)
    for ours, theirs in zip(_head_outputs(model, image), _head_outputs(nchw, image)):
        for x, y in zip(ours, theirs):
            assert torch.allclose(x, y, rtol=1e-4, atol=1e-4 * y.abs().max())
