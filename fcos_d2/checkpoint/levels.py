"""Weights of a model with other FPN levels: per-level tensors matched by level name.

FCOS's head is shared by its levels except for one learnable scale a level
(``head.scales.<i>.scale``, i counted from the finest level). The scales all have the same
shape, so weights of a P3-P7 model would load into a P2-P7 model with every scale one level
off, silently. fcos-d2's checkpoints therefore record their levels (``"fcos_levels"``), and
loading moves each per-level tensor to the index of its level in the model: levels the
weights lack stay missing (a training keeps their fresh initialisation; an evaluation
refuses, naming them), levels the model lacks are dropped.

Files without the record (official and AdelaiDet checkpoints, ``torch.save(state_dict)``)
say their levels through their FPN: a lateral conv per ResNet stage (``fpn_lateral<k>``
gives ``p<k>``) and P6/P7 (``top_block.p6``, ``.p7``). Where that count does not match the
scales either, the levels are unknown and loading into a model with another number of
levels stops with :class:`LevelsMismatchError`.
"""
import re
from typing import Dict, List, Optional, Tuple

from torch import Tensor

LEVELS_KEY = "fcos_levels"
_PER_LEVEL = re.compile(r"^(.*\bhead\.scales\.)(\d+)(\..*)$")
_LATERAL = re.compile(r"\bfpn_lateral(\d+)\.")
_TOP = re.compile(r"\btop_block\.(p\d+)\.")


class LevelsMismatchError(ValueError):
    """Weights whose levels cannot be matched to the model's."""


def model_levels(model) -> Optional[List[str]]:
    """The FCOS levels of `model` (``head_in_features``; DDP unwrapped), None for others."""
    model = getattr(model, "module", model)
    levels = getattr(model, "head_in_features", None)
    return list(levels) if levels else None


def per_level_indices(state: Dict[str, Tensor]) -> List[int]:
    """The level indices that have per-level tensors in `state`, sorted."""
    return sorted({int(m.group(2)) for m in map(_PER_LEVEL.match, state) if m})


def levels_from_fpn(state: Dict[str, Tensor]) -> List[str]:
    """The FPN outputs that `state`'s keys imply, finest first (``[]`` without an FPN)."""
    found = {f"p{m.group(1)}" for key in state for m in [_LATERAL.search(key)] if m}
    found |= {m.group(1) for key in state for m in [_TOP.search(key)] if m}
    return sorted(found, key=lambda level: int(level[1:]))


def checkpoint_levels(checkpoint: dict) -> Optional[List[str]]:
    """The levels of the weights: their record, else their FPN's when its count matches
    their per-level tensors; None when neither says."""
    if checkpoint.get(LEVELS_KEY):
        return list(checkpoint[LEVELS_KEY])
    count = len(per_level_indices(checkpoint["model"]))
    inferred = levels_from_fpn(checkpoint["model"])
    return inferred if count and len(inferred) == count else None


def remap_levels(state: Dict[str, Tensor], theirs: List[str], ours: List[str]
                 ) -> Tuple[Dict[str, Tensor], List[str]]:
    """`state` with each per-level tensor moved from its index in `theirs` to its level's
    index in `ours` (dropped where `ours` lacks the level); and notes on what changed."""
    out, dropped = {}, set()
    for key, value in state.items():
        match = _PER_LEVEL.match(key)
        if not match:
            out[key] = value
            continue
        level = theirs[int(match.group(2))]
        if level not in ours:
            dropped.add(level)
            continue
        out[f"{match.group(1)}{ours.index(level)}{match.group(3)}"] = value
    notes = []
    if dropped:
        notes.append(f"levels {sorted(dropped)} of the weights are not in the model: dropped")
    new = [level for level in ours if level not in theirs]
    if new:
        notes.append(f"levels {new} of the model are not in the weights")
    return out, notes


def fit_levels(checkpoint: dict, model) -> List[str]:
    """Moves `checkpoint["model"]`'s per-level tensors to `model`'s levels in place;
    returns notes for the log ([] when the levels agree).

    Raises:
        LevelsMismatchError: the weights' levels are unknown and their count differs.
    """
    ours = model_levels(model)
    state = checkpoint.get("model")
    if not ours or not isinstance(state, dict) or not per_level_indices(state):
        return []
    theirs = checkpoint_levels(checkpoint)
    if theirs is None:
        count = len(per_level_indices(state))
        if count == len(ours):
            return []  # as before the record existed: the same levels, index by index
        raise LevelsMismatchError(
            f"the weights have per-level tensors for {count} levels (head.scales.0-"
            f"{count - 1}) and do not say which, but the model has {len(ours)} "
            f"(MODEL.FCOS.IN_FEATURES {ours}); set MODEL.FCOS.IN_FEATURES to the levels "
            f"the weights were trained with")
    if theirs == ours:
        return []
    checkpoint["model"], notes = remap_levels(state, theirs, ours)
    return [f"weights of levels {theirs} loaded into a model of levels {ours}, per-level "
            f"tensors matched by level", *notes]
