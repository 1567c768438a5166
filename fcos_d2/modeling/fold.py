"""Inference-only speed-up: fold each batch norm with fixed statistics into the
convolution before it.

A ``FrozenBatchNorm2d`` (or a ``BatchNorm2d`` in eval mode, which uses its running
statistics) after a convolution computes ``conv(x) * s + t`` with fixed
``s = gamma / sqrt(var + eps)`` and ``t = beta - mean * s``; the same result comes from
one convolution with weights ``w * s`` (per output channel) and bias ``b * s + t``, which
saves a pass over every feature map of the backbone (53 of them in R-50). A deformable
convolution is linear in its weight per output channel too, so it folds the same way.
"""
from typing import Optional

import torch
from detectron2.layers import Conv2d, FrozenBatchNorm2d
from torch import nn

from .layers import DeformConv2d

__all__ = ["fold_frozen_batchnorm", "fold_batchnorm"]


def _fold_into(conv: nn.Module, norm: nn.Module) -> None:
    """Folds ``norm``'s affine map into ``conv``'s 4-D ``weight`` and ``bias`` in place."""
    weight = norm.weight if norm.weight is not None else torch.ones_like(norm.running_var)
    beta = norm.bias if norm.bias is not None else torch.zeros_like(norm.running_mean)
    scale = weight * (norm.running_var + norm.eps).rsqrt()  # (C_out,)
    shift = beta - norm.running_mean * scale
    bias = shift if conv.bias is None else conv.bias * scale + shift
    conv.weight.mul_(scale.reshape(-1, 1, 1, 1))
    conv.bias = nn.Parameter(bias, requires_grad=conv.weight.requires_grad)


def _fixed_norm(module: Optional[nn.Module], eval_batchnorm: bool) -> bool:
    """Whether ``module`` is a norm with fixed statistics that can be folded."""
    if isinstance(module, FrozenBatchNorm2d):
        return True
    # BatchNorm2d in eval mode normalizes with its running statistics (SyncBatchNorm and
    # detectron2's NaiveSyncBatchNorm subclass _BatchNorm); without them it cannot fold.
    return (eval_batchnorm and isinstance(module, nn.modules.batchnorm._BatchNorm)
            and not module.training and module.running_mean is not None)


def _plain_conv(module: nn.Module) -> bool:
    """A convolution whose output is its weight's linear map plus bias, nothing after."""
    if isinstance(module, DeformConv2d):
        return module.norm is None and module.activation is None
    return type(module) is nn.Conv2d  # detectron2's Conv2d may apply a norm and activation


@torch.no_grad()
def fold_batchnorm(model: nn.Module, *, eval_batchnorm: bool = True) -> int:
    """Folds every frozen batch norm, and every ``BatchNorm2d`` in eval mode when
    ``eval_batchnorm``, into the convolution before it, in place: the ``norm`` of a
    detectron2 ``Conv2d`` or of fcos-d2's ``DeformConv2d``, and a norm that directly
    follows an ``nn.Conv2d`` or a ``DeformConv2d`` in an ``nn.Sequential`` (the FCOS
    towers; it becomes an ``nn.Identity`` there, so that the other layers keep their
    indices).

    For inference only, after the weights are loaded: the folded model has other
    parameters (a ``bias`` per folded conv, no ``norm.*``), so checkpoints no longer load
    into it and must never be written from it (``fcos_d2.modeling.fast_inference`` folds a
    copy). Other norms (GN) are left alone.

    Returns:
        The number of norms folded.
    """
    folded = 0
    for module in list(model.modules()):
        if isinstance(module, (Conv2d, DeformConv2d)) and _fixed_norm(module.norm, eval_batchnorm):
            _fold_into(module, module.norm)
            module.norm = None
            folded += 1
        elif isinstance(module, nn.Sequential):
            layers = list(module)
            for i in range(1, len(layers)):
                if _plain_conv(layers[i - 1]) and _fixed_norm(layers[i], eval_batchnorm):
                    _fold_into(layers[i - 1], layers[i])
                    module[i] = nn.Identity()
                    folded += 1
    return folded


def fold_frozen_batchnorm(model: nn.Module) -> int:
    """Folds every ``FrozenBatchNorm2d`` (only those) into the convolution before it, in
    place: :func:`fold_batchnorm` with ``eval_batchnorm=False``.

    Args:
        model: any module, e.g. an FCOS model built with MODEL.RESNETS.NORM "FrozenBN".

    Returns:
        The number of norms folded.
    """
    return fold_batchnorm(model, eval_batchnorm=False)
