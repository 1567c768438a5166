"""Conversion of AdelaiDet FCOS checkpoints (``adet/modeling/fcos``) to fcos-d2's names.

AdelaiDet runs FCOS as a proposal generator of a ``OneStageDetector`` (detectron2's
``ProposalNetwork``), so its head lives under ``proposal_generator.fcos_head``; its
backbone is detectron2's ResNet + FPN, named as fcos-d2 names it. Mapping (AdelaiDet ->
fcos-d2), after removing a leading ``module.``:

| AdelaiDet                                                   | fcos-d2                              |
| ----------------------------------------------------------- | ------------------------------------ |
| backbone.bottom_up.*, backbone.fpn_{lateral,output}{n}.*    | unchanged                            |
| backbone.top_block.p6/p7.*                                  | unchanged                            |
| backbone.bottom_up.res{k}.{i}.conv2_offset.* (DCN)          | backbone.bottom_up.res{k}.{i}.conv2.offset.* |
| proposal_generator.fcos_head.{cls,bbox,share}_tower.{i}.*   | head.{cls,bbox,share}_tower.{i}.*    |
| proposal_generator.fcos_head.{cls,bbox}_tower.{i}.conv.* (DCN) | head.{cls,bbox}_tower.{i}.*       |
| proposal_generator.fcos_head.{cls_logits,bbox_pred}.*       | head.{cls_logits,bbox_pred}.*        |
| proposal_generator.fcos_head.ctrness.*                      | head.centerness.*                    |
| proposal_generator.fcos_head.scales.{l}.scale               | head.scales.{l}.scale                |
| pixel_mean, pixel_std (checkpoints of older detectron2)     | returned apart: MODEL.PIXEL_MEAN/STD |

Not convertible, and named as such in the error: AdelaiDet's BN / SyncBN heads
(``MODEL.FCOS.NORM`` "BN"/"SyncBN") keep one norm per level (``..._tower.{i}.{level}.*``)
where fcos-d2 shares one norm over the levels; and the modules of models built on FCOS
(BlendMask, CondInst, MEInst, BAText: ``basis_module``, ``blender``, ``mask_head``,
``controller``, ``top_module``, ...), which are not part of the detector.

AdelaiDet's frozen batch norm is detectron2's, so unlike the official FCOS no epsilon
correction is needed.
"""
import re
from typing import Dict, List, Optional, Tuple

from torch import Tensor

from .official import CheckpointMismatchError, rename_by_rules

_HEAD = r"^proposal_generator\.fcos_head\."
_RULES: List[Tuple[str, str]] = [
    (r"^backbone\.bottom_up\.(res\d\.\d+)\.conv2_offset\.(weight|bias)$",
     r"backbone.bottom_up.\1.conv2.offset.\2"),
    (r"^(backbone\.bottom_up\.(?:stem|res\d\.\d+)\.[\w.]+)$", r"\1"),
    (r"^(backbone\.(?:fpn_lateral|fpn_output)\d\.(?:weight|bias))$", r"\1"),
    (r"^(backbone\.top_block\.p[67]\.(?:weight|bias))$", r"\1"),
    (_HEAD + r"((?:cls|bbox)_tower\.\d+)\.conv\.(weight|bias)$", r"head.\1.\2"),
    (_HEAD + r"((?:cls|bbox|share)_tower\.\d+\.(?:offset\.)?(?:weight|bias))$", r"head.\1"),
    (_HEAD + r"((?:cls_logits|bbox_pred)\.(?:weight|bias))$", r"head.\1"),
    (_HEAD + r"ctrness\.(weight|bias)$", r"head.centerness.\1"),
    (_HEAD + r"(scales\.\d+\.scale)$", r"head.\1"),
]
# One BatchNorm per level inside a tower: ModuleListDial in AdelaiDet's FCOSHead.
_PER_LEVEL_NORM = re.compile(_HEAD + r"(?:cls|bbox|share)_tower\.\d+\.\d+\.\w+$")
PIXEL_KEYS = ("pixel_mean", "pixel_std")


def convert_adelaidet_key(key: str) -> str:
    """The fcos-d2 name of an AdelaiDet FCOS parameter name, or raises KeyError."""
    return rename_by_rules(key, _RULES)


def _unknown_keys_message(unknown: List[str]) -> str:
    per_level = [k for k in unknown if _PER_LEVEL_NORM.match(k.replace("module.", "", 1))]
    lines = [f"{len(unknown)} keys of the AdelaiDet checkpoint have no fcos-d2 name: "
             + ", ".join(unknown)]
    if per_level:
        lines.append(f"({len(per_level)} of them are per-level norms of a BN/SyncBN head "
                     "(AdelaiDet MODEL.FCOS.NORM 'BN' or 'SyncBN'): fcos-d2 shares one norm "
                     "over the levels, so such a head has no fcos-d2 equivalent)")
    if len(per_level) < len(unknown):
        lines.append("(only the FCOS detector converts: backbone.* and "
                     "proposal_generator.fcos_head.*; modules of models built on FCOS, such "
                     "as BlendMask or CondInst, do not)")
    return "\n".join(lines)


def convert_adelaidet_state_dict(
    state_dict: Dict[str, Tensor],
) -> Tuple[Dict[str, Tensor], Dict[str, Optional[List[float]]]]:
    """Renames every parameter of an AdelaiDet FCOS state dict (values as float32).

    Returns:
        (the converted state dict, {"pixel_mean": [...] or None, "pixel_std": ...}): the
        normalization the checkpoint was trained with, where it stores one (detectron2
        before v0.3 saved it), to compare with MODEL.PIXEL_MEAN / PIXEL_STD.

    Raises:
        CheckpointMismatchError: listing every key that no rule maps.
    """
    converted, unknown = {}, []
    pixels: Dict[str, Optional[List[float]]] = {k: None for k in PIXEL_KEYS}
    for key, value in state_dict.items():
        plain_key = key[len("module."):] if key.startswith("module.") else key
        if plain_key in PIXEL_KEYS:
            pixels[plain_key] = value.flatten().tolist()
            continue
        if key.endswith("num_batches_tracked") and not _PER_LEVEL_NORM.match(plain_key):
            continue  # BN bookkeeping, not a parameter of the function
        try:
            new_key = convert_adelaidet_key(key)
        except KeyError:
            unknown.append(key)
            continue
        converted[new_key] = value.float() if value.is_floating_point() else value
    if unknown:
        raise CheckpointMismatchError(_unknown_keys_message(unknown))
    return converted, pixels
