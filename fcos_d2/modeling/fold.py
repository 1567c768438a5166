"""Inference-only speed-up: fold each frozen BatchNorm into the convolution before it.

A ``FrozenBatchNorm2d`` after a convolution computes ``conv(x) * s + t`` with fixed
``s = gamma / sqrt(var + eps)`` and ``t = beta - mean * s``; the same result comes from
one convolution with weights ``w * s`` (per output channel) and bias ``b * s + t``, which
saves a pass over every feature map of the backbone (53 of them in R-50).
"""
import torch
from detectron2.layers import Conv2d, FrozenBatchNorm2d
from torch import nn

__all__ = ["fold_frozen_batchnorm"]


@torch.no_grad()
def fold_frozen_batchnorm(model: nn.Module) -> int:
    """Folds every ``FrozenBatchNorm2d`` that is the ``norm`` of a detectron2 ``Conv2d``
    into that convolution's weight and bias, in place.

    For inference only, after the weights are loaded: the folded model has a ``bias`` and
    no ``norm.*`` entries in its state dict, so checkpoints no longer load into it, and
    training it would train the folded weights. Other norms (BN, GN) are left alone.

    Args:
        model: any module, e.g. an FCOS model built with MODEL.RESNETS.NORM "FrozenBN".

    Returns:
        The number of norms folded.
    """
    folded = 0
    for module in model.modules():
        if not (isinstance(module, Conv2d) and isinstance(module.norm, FrozenBatchNorm2d)):
            continue
        norm = module.norm
        scale = norm.weight * (norm.running_var + norm.eps).rsqrt()  # (C_out,)
        shift = norm.bias - norm.running_mean * scale
        bias = shift if module.bias is None else module.bias * scale + shift
        module.weight.mul_(scale.reshape(-1, 1, 1, 1))
        module.bias = nn.Parameter(bias, requires_grad=module.weight.requires_grad)
        module.norm = None
        folded += 1
    return folded
