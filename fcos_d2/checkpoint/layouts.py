"""Checkpoints of the official FCOS, of SipMask-benchmark and of AdelaiDet, loaded as they are.

``MODEL.WEIGHTS`` may name an official FCOS (``fcos_core``), a SipMask-benchmark or an
AdelaiDet FCOS checkpoint, a file or a URL, without converting it first:
``checkpoint_layout`` recognises the layout by its keys, and ``convert_foreign_checkpoint``
renames it in memory with the converters of ``official.py``, ``sipmask.py`` and
``adelaidet.py``, with their strict checks (a key without an fcos-d2 name, or a model
parameter left unfilled, is an error listing them).

Layouts, recognised after a leading ``module.``:

| layout      | keys                                               |
| ----------- | -------------------------------------------------- |
| "sipmask"   | the official ones and ``rpn.head.sip_cof.*``       |
| "official"  | ``backbone.body.*``, ``rpn.head.*`` (fcos_core)    |
| "adelaidet" | ``proposal_generator.fcos_head.*``                 |
| "fcos_d2"   | anything else (fcos-d2 and detectron2 checkpoints) |
"""
from typing import Any, Dict, Iterable, List, Optional, Tuple

import torch

from .adelaidet import convert_adelaidet_state_dict
from .official import (CheckpointMismatchError, check_matches_model,
                       convert_official_state_dict)
from .sipmask import convert_sipmask_state_dict

__all__ = ["checkpoint_layout", "convert_foreign_checkpoint"]

_OFFICIAL_PREFIXES = ("backbone.body.", "rpn.head.")
_ADELAIDET_PREFIX = "proposal_generator.fcos_head."
_SIPMASK_PREFIX = "rpn.head.sip_cof."  # SipMask-benchmark's head under fcos_core's names
_BOOKKEEPING = "num_batches_tracked"  # BatchNorm's counter, not a parameter


def checkpoint_layout(keys: Iterable[str]) -> str:
    """"sipmask", "official", "adelaidet" or "fcos_d2": whose names a state dict's keys are.

    >>> checkpoint_layout(["module.rpn.head.cls_logits.weight"])
    'official'
    """
    plain = [key[len("module."):] if key.startswith("module.") else key for key in keys]
    if any(key.startswith(_SIPMASK_PREFIX) for key in plain):
        return "sipmask"
    if any(key.startswith(_OFFICIAL_PREFIXES) for key in plain):
        return "official"
    if any(key.startswith(_ADELAIDET_PREFIX) for key in plain):
        return "adelaidet"
    return "fcos_d2"


def convert_foreign_checkpoint(checkpoint: Dict[str, Any], model: torch.nn.Module, *,
                               source: str) -> Optional[Dict[str, Any]]:
    """An official, SipMask-benchmark or AdelaiDet checkpoint as fcos-d2 loads it, or None
    for other layouts.

    Args:
        checkpoint: as loaded, ``{"model": state dict, ...}``.
        model: the model it is for; its keys must all be filled, none left over.
        source: the file or URL, named in errors and in the log line.

    Returns:
        ``{"model": converted state dict, "__author__": ..., "matching_heuristics": False}``
        (the source's optimizer and iteration are dropped: they belong to another program),
        and ``"__converted__"``: the line to log.

    Raises:
        CheckpointMismatchError: naming ``source`` and every key that does not fit.
    """
    state_dict = checkpoint.get("model", checkpoint)
    layout = checkpoint_layout(state_dict)
    if layout == "fcos_d2":
        return None
    try:
        converted, what, notes = _convert(layout, state_dict, model)
    except CheckpointMismatchError as error:
        raise CheckpointMismatchError(f"MODEL.WEIGHTS {source}: {error}") from None
    message = (f"{source} is {what}: converted to fcos-d2's names in memory "
               f"({len(converted)} tensors{''.join('; ' + n for n in notes)})")
    return {"model": converted, "__author__": f"{what}, converted by fcos-d2",
            "matching_heuristics": False, "__converted__": message}


def _convert(layout: str, state_dict: Dict[str, torch.Tensor], model: torch.nn.Module
             ) -> Tuple[Dict[str, torch.Tensor], str, List[str]]:
    """(converted state dict checked against ``model``, what it was, notes for the log)."""
    notes: List[str] = []
    if layout in ("official", "sipmask"):
        convert = convert_official_state_dict if layout == "official" \
            else convert_sipmask_state_dict
        converted = convert(state_dict)
        notes.append("frozen BN variances lowered by 1e-5 for detectron2's epsilon")
        what = ("an official FCOS (fcos_core) checkpoint" if layout == "official"
                else "a SipMask-benchmark checkpoint")
    else:
        converted, pixels = convert_adelaidet_state_dict(state_dict)
        notes += _pixel_notes(pixels, model)
        what = "an AdelaiDet FCOS checkpoint"
    _fill_bookkeeping(converted, model)
    check_matches_model(converted, model)
    return converted, what, notes


def _fill_bookkeeping(converted: Dict[str, torch.Tensor], model: torch.nn.Module) -> None:
    """BatchNorm counters the converters skip: the model's own values, so that a model
    with BN (not FrozenBN) loads converted weights without missing keys."""
    for key, value in model.state_dict().items():
        if key.endswith(_BOOKKEEPING) and key not in converted:
            converted[key] = value.detach().cpu().clone()


def _pixel_notes(pixels: Dict[str, Optional[List[float]]], model: torch.nn.Module) -> List[str]:
    """Warnings where the checkpoint stores an input normalisation the model does not use."""
    notes = []
    for key, values in pixels.items():
        ours = getattr(model, key, None)
        if values is None or ours is None:
            continue
        ours = ours.flatten().tolist()
        if any(abs(a - b) > 1e-3 for a, b in zip(values, ours)):
            notes.append(f"WARNING: the checkpoint normalises input with {key} {values}, the "
                         f"config with {ours}: evaluate with MODEL.{key.upper()} '{values}'")
    return notes
