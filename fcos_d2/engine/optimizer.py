"""``SOLVER.OPTIMIZER``: SGD (the default) or AdamW, for the yaml configs.

Both take detectron2's parameter groups (``get_default_optimizer_params``:
``SOLVER.BASE_LR``, ``WEIGHT_DECAY_NORM``, ``BIAS_LR_FACTOR``, ``WEIGHT_DECAY_BIAS``) and
detectron2's ``SOLVER.CLIP_GRADIENTS``. SGD is detectron2's (``SOLVER.MOMENTUM``,
``NESTEROV``, ``WEIGHT_DECAY``) run by torch's fused kernel; AdamW has
``SOLVER.WEIGHT_DECAY`` as its decoupled weight decay and ``SOLVER.ADAMW_BETAS``.
``SOLVER.DEFORM_OFFSET_LR_FACTOR`` scales the lr of the deformable convs' offset predictors
(mmcv's ``dcn_offset_lr_mult``).
"""
import functools
import logging
from typing import List, Optional

import torch
from detectron2.config import CfgNode as CN
from detectron2.solver.build import get_default_optimizer_params, maybe_add_gradient_clipping

from ..modeling.layers import DeformConv2d, scale_offset_lr

OPTIMIZERS = ("SGD", "ADAMW")  # SOLVER.OPTIMIZER (fcos_d2.config.add_solver_config)


def build_optimizer(cfg: CN, model: torch.nn.Module) -> torch.optim.Optimizer:
    """The optimizer ``SOLVER.OPTIMIZER`` names, for ``model``'s parameters.

    Raises:
        ValueError: naming ``SOLVER.OPTIMIZER`` or ``SOLVER.ADAMW_BETAS`` and the bad value.
    """
    name = cfg.SOLVER.OPTIMIZER
    if name not in OPTIMIZERS:
        raise ValueError(f"SOLVER.OPTIMIZER: unknown {name!r}, expected one of {OPTIMIZERS}")
    params = get_default_optimizer_params(
        model, base_lr=cfg.SOLVER.BASE_LR, weight_decay_norm=cfg.SOLVER.WEIGHT_DECAY_NORM,
        bias_lr_factor=cfg.SOLVER.BIAS_LR_FACTOR, weight_decay_bias=cfg.SOLVER.WEIGHT_DECAY_BIAS)
    params = scale_offset_lr(params, model, cfg.SOLVER.DEFORM_OFFSET_LR_FACTOR)
    warn_full_lr_offsets(name, cfg.SOLVER.DEFORM_OFFSET_LR_FACTOR, model)
    # None, not False, without the fused kernel: torch then picks foreach where it can (CUDA)
    fused = True if use_fused_kernel(cfg, params) else None
    if name == "SGD":
        # detectron2's build_optimizer, with the fused kernel where it applies
        optimizer = maybe_add_gradient_clipping(cfg, torch.optim.SGD)(
            params, lr=cfg.SOLVER.BASE_LR, momentum=cfg.SOLVER.MOMENTUM,
            nesterov=cfg.SOLVER.NESTEROV, weight_decay=cfg.SOLVER.WEIGHT_DECAY, fused=fused)
    else:
        betas = tuple(cfg.SOLVER.ADAMW_BETAS)
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"SOLVER.ADAMW_BETAS: two numbers in [0, 1) expected, got {betas}")
        optimizer = maybe_add_gradient_clipping(cfg, torch.optim.AdamW)(
            params, lr=cfg.SOLVER.BASE_LR, betas=betas, weight_decay=cfg.SOLVER.WEIGHT_DECAY,
            fused=fused)
    optimizer.register_load_state_dict_post_hook(functools.partial(keep_kernel, fused=fused))
    return optimizer


def warn_full_lr_offsets(name: str, factor: float, model: torch.nn.Module) -> None:
    """A warning when AdamW trains deformable convs' offsets at the full lr: there they
    outgrew small feature maps (issue 62: the published NAS-FCOS fell from 54.0 AP to
    20.5)."""
    if name == "ADAMW" and factor == 1.0 and any(
            isinstance(m, DeformConv2d) for m in model.modules()):
        logging.getLogger(__name__).warning(
            "SOLVER.OPTIMIZER ADAMW trains the deformable convs' offsets at the full lr "
            "(SOLVER.DEFORM_OFFSET_LR_FACTOR 1.0); 0.1 trained NAS-FCOS far better here "
            "(configs/NAS-FCOS/README.md)")


def keep_kernel(optimizer: torch.optim.Optimizer, *, fused: Optional[bool]) -> None:
    """After ``load_state_dict``: the kernel chosen at build time, not the checkpoint's. A
    checkpoint from before the fused kernel (or from detectron2's SGD) holds ``fused`` False,
    and torch would restore it while the optimizer still tells a gradient scaler it
    unscales inside its step (under fp16 AMP the loop kernel then refuses the scale)."""
    for group in optimizer.param_groups:
        group["fused"] = fused


def use_fused_kernel(cfg: CN, params: List[dict]) -> bool:
    """Whether the optimizer runs torch's fused kernel (one pass over all parameters) instead
    of the loop over parameters: where every parameter is on a CPU or a CUDA device, and
    without ``SOLVER.CLIP_GRADIENTS``.

    One thread, one step: SGD with momentum on ResNet-18's 11.4 M parameters 9.2 ms fused
    against 23.1 ms looped (foreach 23.0); AdamW on the quickstart's 3.7 M 7.2 against 16.8.
    Not with clipping: detectron2 clips in a subclass's ``step``, and under fp16 AMP the
    gradient scaler leaves a fused optimizer's gradients scaled (the kernel undoes the
    scale), so the clipping would see them scaled.
    """
    devices = {p.device.type for group in params for p in group["params"]}
    return devices <= {"cpu", "cuda"} and not cfg.SOLVER.CLIP_GRADIENTS.ENABLED
