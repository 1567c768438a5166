"""Checkpoints of other code bases (the official FCOS, AdelaiDet, and the layouts members
of the family register: SipMask-benchmark, ...), loaded as they are.

``MODEL.WEIGHTS`` may name such a checkpoint, a file or a URL, without converting it first:
``checkpoint_layout`` recognises the layout by its keys, and ``convert_foreign_checkpoint``
renames it in memory with the layout's converter, with its strict checks (a key without an
fcos-d2 name, or a model parameter left unfilled, is an error listing them).

A layout is a :class:`CheckpointLayout` registered with :func:`register_checkpoint_layout`;
layouts are tried by descending ``priority`` after a leading ``module.`` is stripped from
the keys (a layout that extends another, as SipMask-benchmark extends the official FCOS,
takes a higher priority). Built in:

| layout      | keys                                               | priority |
| ----------- | -------------------------------------------------- | -------- |
| "official"  | ``backbone.body.*``, ``rpn.head.*`` (fcos_core)    | 0        |
| "adelaidet" | ``proposal_generator.fcos_head.*``                 | 0        |
| "fcos_d2"   | anything else (fcos-d2 and detectron2 checkpoints) | (last)   |
"""
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from .adelaidet import convert_adelaidet_state_dict
from .official import (CheckpointMismatchError, check_matches_model,
                       convert_official_state_dict)

__all__ = ["CheckpointLayout", "checkpoint_layout", "convert_foreign_checkpoint",
           "register_checkpoint_layout", "registered_checkpoint_layouts",
           "unregister_checkpoint_layout"]

_BOOKKEEPING = "num_batches_tracked"  # BatchNorm's counter, not a parameter

# (state dict as stored, model) -> (converted state dict, notes for the log)
Converter = Callable[[Dict[str, torch.Tensor], torch.nn.Module],
                     Tuple[Dict[str, torch.Tensor], List[str]]]


@dataclass(frozen=True)
class CheckpointLayout:
    """A foreign checkpoint layout.

    Attributes:
        name: short name, e.g. "official".
        description: what such a checkpoint is, for the log line ("an official FCOS
            (fcos_core) checkpoint").
        matches: True where the keys (``module.`` stripped) are of this layout.
        convert: the converter; raises ``CheckpointMismatchError`` listing unmapped keys.
        priority: layouts with a higher priority are tried first.
    """
    name: str
    description: str
    matches: Callable[[Sequence[str]], bool]
    convert: Converter
    priority: int = 0


_LAYOUTS: Dict[str, CheckpointLayout] = {}


def register_checkpoint_layout(layout: CheckpointLayout) -> CheckpointLayout:
    """Registers ``layout`` (replacing one of the same name) and returns it."""
    if layout.name == "fcos_d2":
        raise ValueError("checkpoint layout 'fcos_d2' is fcos-d2's own; choose another name")
    _LAYOUTS[layout.name] = layout
    return layout


def unregister_checkpoint_layout(name: str) -> None:
    """Removes the layout registered as ``name`` (nothing if there is none)."""
    _LAYOUTS.pop(name, None)


def registered_checkpoint_layouts() -> List[CheckpointLayout]:
    """The registered layouts, in the order they are tried."""
    return sorted(_LAYOUTS.values(), key=lambda layout: -layout.priority)


def _strip_module(keys: Iterable[str]) -> List[str]:
    return [key[len("module."):] if key.startswith("module.") else key for key in keys]


def checkpoint_layout(keys: Iterable[str]) -> str:
    """The name of the registered layout whose names a state dict's keys are, or "fcos_d2".

    >>> checkpoint_layout(["module.rpn.head.cls_logits.weight"])
    'official'
    """
    plain = _strip_module(keys)
    for layout in registered_checkpoint_layouts():
        if layout.matches(plain):
            return layout.name
    return "fcos_d2"


def convert_foreign_checkpoint(checkpoint: Dict[str, Any], model: torch.nn.Module, *,
                               source: str) -> Optional[Dict[str, Any]]:
    """A checkpoint of a registered foreign layout as fcos-d2 loads it, or None for
    fcos-d2's own layout.

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
    found = _LAYOUTS[layout]
    converted, notes = found.convert(state_dict, model)
    _fill_bookkeeping(converted, model)
    check_matches_model(converted, model)
    return converted, found.description, notes


def _fill_bookkeeping(converted: Dict[str, torch.Tensor], model: torch.nn.Module) -> None:
    """BatchNorm counters the converters skip: the model's own values, so that a model
    with BN (not FrozenBN) loads converted weights without missing keys."""
    for key, value in model.state_dict().items():
        if key.endswith(_BOOKKEEPING) and key not in converted:
            converted[key] = value.detach().cpu().clone()


def _pixel_notes(pixels: Dict[str, Optional[List[float]]], model: torch.nn.Module) -> List[str]:
    """Warnings where the checkpoint stores an input normalization the model does not use."""
    notes = []
    for key, values in pixels.items():
        ours = getattr(model, key, None)
        if values is None or ours is None:
            continue
        ours = ours.flatten().tolist()
        if any(abs(a - b) > 1e-3 for a, b in zip(values, ours)):
            notes.append(f"WARNING: the checkpoint normalizes input with {key} {values}, the "
                         f"config with {ours}: evaluate with MODEL.{key.upper()} '{values}'")
    return notes


_OFFICIAL_PREFIXES = ("backbone.body.", "rpn.head.")
_ADELAIDET_PREFIX = "proposal_generator.fcos_head."


def _convert_official(state_dict: Dict[str, torch.Tensor], model: torch.nn.Module
                      ) -> Tuple[Dict[str, torch.Tensor], List[str]]:
    return (convert_official_state_dict(state_dict),
            ["frozen BN variances lowered by 1e-5 for detectron2's epsilon"])


def _convert_adelaidet(state_dict: Dict[str, torch.Tensor], model: torch.nn.Module
                       ) -> Tuple[Dict[str, torch.Tensor], List[str]]:
    converted, pixels = convert_adelaidet_state_dict(state_dict)
    return converted, _pixel_notes(pixels, model)


register_checkpoint_layout(CheckpointLayout(
    "official", "an official FCOS (fcos_core) checkpoint",
    lambda keys: any(key.startswith(_OFFICIAL_PREFIXES) for key in keys), _convert_official))
register_checkpoint_layout(CheckpointLayout(
    "adelaidet", "an AdelaiDet FCOS checkpoint",
    lambda keys: any(key.startswith(_ADELAIDET_PREFIX) for key in keys), _convert_adelaidet))
