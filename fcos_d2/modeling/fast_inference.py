"""The fast inference path, on by default: a copy of the trained model with its batch norms
folded into the convolutions (``fold_batchnorm``) and its weights and input batch in
channels_last memory. Both are exact up to float rounding (outputs within 1e-4 of the
plain model's, tested) and together were worth about a quarter of the fp32 inference time
of R-50 FCOS (README "Speed").

Every inference entry point uses it (``train_net.py --eval-only`` and the periodic
evaluation, test-time augmentation, ``Predictor`` and so ``demo/demo.py``, and
``tools/export_onnx.py``), through :func:`inference_model`. It works on a copy: the model
being trained keeps its unfolded weights, and every checkpoint holds them. Training is
unchanged (channels_last there only with ``MODEL.FCOS.CHANNELS_LAST``).
"""
import copy

import torch
from detectron2.config import CfgNode as CN
from torch import nn

from ..parallel import unwrap_ddp
from .fold import fold_batchnorm

__all__ = ["inference_model", "fast_inference_enabled"]


def fast_inference_enabled(cfg: CN) -> bool:
    """``MODEL.FCOS.FAST_INFERENCE`` (True where the config has no FCOS node)."""
    return bool(cfg.MODEL.get("FCOS", CN()).get("FAST_INFERENCE", True))


def _detached_copy(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` without its hooks and gradients: training hooks hold the
    trainer (copying them would copy it), and gradients are of no use at inference."""
    memo = {}
    for module in model.modules():
        for name, value in vars(module).items():
            if name.endswith("hooks") or name.endswith("hooks_with_kwargs") \
                    or name.endswith("hooks_always_called"):
                memo[id(value)] = type(value)()
    for parameter in model.parameters():
        if parameter.grad is not None:
            memo[id(parameter.grad)] = None
    return copy.deepcopy(model, memo)


@torch.no_grad()
def inference_model(model: nn.Module, enabled: bool = True) -> nn.Module:
    """The model to run inference with.

    Args:
        model: a trained model (FCOS or any detectron2 model; DistributedDataParallel is
            unwrapped). Not changed.
        enabled: False returns ``model`` itself (``MODEL.FCOS.FAST_INFERENCE`` False).

    Returns:
        A copy in eval mode, without gradients, with every frozen or eval-mode batch norm
        folded into its convolution and, for FCOS models (those with a ``channels_last``
        option), weights and input batch in channels_last; ``model`` itself when disabled
        or when there is nothing to fold and nothing to convert.
    """
    if not enabled:
        return model
    model = unwrap_ddp(model)
    layout = hasattr(model, "channels_last") and not model.channels_last
    was_training = model.training
    model.eval()  # eval-mode BN is what folds; restored below
    try:
        fast = _detached_copy(model)
    finally:
        model.train(was_training)
    folded = fold_batchnorm(fast)
    if not folded and not layout:
        return model  # nothing gained by the copy
    fast.requires_grad_(False)
    if layout:
        fast.channels_last = True
        fast.to(memory_format=torch.channels_last)
    return fast
