"""Loading a part of a trained detector: its bottom-up network, for a search that starts
from it (NAS-FCOS's proxy task, FAD's supernet) while the rest of the model is new."""
import torch
from torch import nn

from .safe_load import load_model_state_dict

BOTTOM_UP_PREFIX = "backbone.bottom_up."  # fcos-d2 detectors' bottom-up (FCOS, NASFCOS, FAD)


def load_bottom_up(bottom_up: nn.Module, path: str) -> int:
    """Loads the ``backbone.bottom_up.*`` weights and buffers of a detector checkpoint
    (``{"model": state}`` or a bare state dict, read as data only) into ``bottom_up``,
    every key and shape matched; returns how many tensors it loaded.

    Raises:
        ValueError: naming the file, when it has no bottom-up entries or they do not fit
            (the first missing, unexpected and differently shaped keys).
    """
    state = load_model_state_dict(path)
    found = {k[len(BOTTOM_UP_PREFIX):]: torch.as_tensor(v) for k, v in state.items()
             if k.startswith(BOTTOM_UP_PREFIX)}
    if not found:
        raise ValueError(f"{path}: no '{BOTTOM_UP_PREFIX}*' entries; give a checkpoint of an "
                         f"fcos-d2 detector (e.g. a training's model_final.pth)")
    expected = bottom_up.state_dict()
    missing, extra = sorted(set(expected) - set(found)), sorted(set(found) - set(expected))
    shapes = [k for k in expected if k in found and found[k].shape != expected[k].shape]
    if missing or extra or shapes:
        raise ValueError(f"{path}: its bottom-up does not fit the config's (MODEL.RESNETS, "
                         f"MODEL.BACKBONE): missing {missing[:5]}, unexpected {extra[:5]}, "
                         f"other shapes {shapes[:5]}")
    bottom_up.load_state_dict(found, strict=True)
    return len(found)
