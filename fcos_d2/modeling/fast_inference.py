"""The fast inference path, on by default: a copy of the trained model with its batch norms
folded into the convolutions (``fold_batchnorm``) and its weights and input batch in
channels_last memory. Both are exact up to float rounding (outputs within 1e-4 of the
plain model's, tested) and together were worth about a quarter of the fp32 inference time
of R-50 FCOS (docs/speed.md).

Every inference entry point uses it (``train_net.py --eval-only`` and the periodic
evaluation, test-time augmentation, ``Predictor`` and so ``demo/demo.py``, and
``tools/export_onnx.py``), through :func:`inference_model`. So does the model itself: an
``FCOS`` in eval mode runs such a copy, kept by an :class:`InferenceCopy` outside its
modules (not in its ``state_dict``, parameters or deep copies) and rebuilt whenever its
weights change (``load_state_dict``, a checkpointer's load, an optimizer step, ``.to()``),
so that detectron2's ``DefaultPredictor`` and a hand-written ``model.eval()`` loop are as
fast as our entry points. The copy takes the model's plain settings (``score_thresh``,
``nms_thresh``, ...) at every call, so that one set on the model later holds. It works on
a copy: the model being trained keeps its unfolded weights, and every checkpoint holds
them. Training is unchanged (channels_last there only with ``MODEL.FCOS.CHANNELS_LAST``).
"""
import copy
from typing import Optional, Tuple

import torch
from detectron2.config import CfgNode as CN
from torch import nn

from ..parallel import unwrap_ddp
from .fold import fold_batchnorm

__all__ = ["InferenceCopy", "inference_model", "fast_inference_enabled", "weights_signature"]


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
    if hasattr(fast, "fast_inference"):
        fast.fast_inference = False  # already folded: it runs itself, it keeps no copy
    return fast


def weights_signature(model: nn.Module) -> Tuple[Tuple[int, int, int], ...]:
    """Per parameter and buffer: (object id, storage address, version counter). Every way
    weights change moves one of them: in-place writes (``load_state_dict``'s copy,
    optimizer steps, running statistics) bump the version, ``.to()`` and
    ``load_state_dict(assign=True)`` put new tensors in place. Writes through ``.data``
    bypass the version counter: call :meth:`InferenceCopy.clear` after those."""
    tensors = list(model.parameters()) + list(model.buffers())
    return tuple((id(t), t.data_ptr(), t._version) for t in tensors)


def has_submodule_hooks(model: nn.Module) -> bool:
    """Whether a submodule of ``model`` has forward (pre-)hooks, which a copy would not run."""
    return any(m._forward_hooks or m._forward_pre_hooks
               for m in model.modules() if m is not model)


class InferenceCopy:
    """The folded, channels_last copy an eval-mode model runs (see the module docstring).

    Held as a plain attribute, it is no submodule: the model's ``state_dict``, parameters
    and ``.to()`` ignore it; deep copies and pickles of the model hold an empty one.
    """

    def __init__(self):
        self._copy: Optional[nn.Module] = None
        self._signature: Optional[tuple] = None

    def __deepcopy__(self, memo) -> "InferenceCopy":
        return InferenceCopy()

    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__init__()

    def clear(self) -> None:
        """Drops the copy (freeing its memory); the next :meth:`of` builds a new one."""
        self._copy, self._signature = None, None

    def of(self, model: nn.Module) -> Optional[nn.Module]:
        """The copy to run in place of ``model`` (in eval mode), rebuilt if ``model``'s
        weights changed since it was made; None where ``model`` must run itself: a
        submodule has forward hooks, or there is nothing to fold and nothing to convert."""
        if has_submodule_hooks(model):
            return None
        signature = weights_signature(model)
        if signature != self._signature:
            self.clear()
            fast = inference_model(model)
            self._copy = None if fast is model else fast
            self._signature = signature
        if self._copy is not None:
            follow_settings(self._copy, model)
        return self._copy


# what the copy holds as its own: its layout and that it keeps no copy itself
COPY_OWN_SETTINGS = ("channels_last", "fast_inference", "training")
# plain values only: None is what a model holds for state built lazily (its compiled-backend
# runner), which the copy builds for itself
SETTING_TYPES = (bool, int, float, str, tuple, list, torch.dtype)


def follow_settings(fast: nn.Module, model: nn.Module) -> None:
    """Gives ``fast`` the model's current plain settings (``score_thresh``, ``nms_thresh``,
    ``max_detections_per_image``, ``inference_dtype``, ...), so that one changed on the
    model after the copy was made, as detectron2 users set ``model.score_thresh``, holds.
    The model's own attributes only: settings of its submodules (``model.head.*``) are not
    followed."""
    for name, value in vars(model).items():
        if isinstance(value, SETTING_TYPES) and name not in COPY_OWN_SETTINGS \
                and not name.startswith("_") and getattr(fast, name, None) != value:
            setattr(fast, name, value)  # only what changed: this runs at every eval call
