"""Conversion of official FCOS (``fcos_core``) checkpoints to fcos-d2's parameter names.

Mapping (official -> fcos-d2), after removing a leading ``module.``:

| official                                   | fcos-d2                                        |
| ------------------------------------------ | ---------------------------------------------- |
| backbone.body.stem.conv1.weight            | backbone.bottom_up.stem.conv1.weight           |
| backbone.body.stem.bn1.*                   | backbone.bottom_up.stem.conv1.norm.*           |
| backbone.body.layer{k}.{i}.conv{j}.weight  | backbone.bottom_up.res{k+1}.{i}.conv{j}.weight |
| backbone.body.layer{k}.{i}.bn{j}.*         | backbone.bottom_up.res{k+1}.{i}.conv{j}.norm.* |
| backbone.body.layer{k}.{i}.downsample.0.*  | backbone.bottom_up.res{k+1}.{i}.shortcut.*     |
| backbone.body.layer{k}.{i}.downsample.1.*  | backbone.bottom_up.res{k+1}.{i}.shortcut.norm.*|
| backbone.body.layer{k}.{i}.conv2.conv.*    | backbone.bottom_up.res{k+1}.{i}.conv2.* (DCN)  |
| backbone.body.layer{k}.{i}.conv2.offset.*  | backbone.bottom_up.res{k+1}.{i}.conv2.offset.* |
| backbone.fpn.fpn_inner{n}.*                | backbone.fpn_lateral{n+1}.*                    |
| backbone.fpn.fpn_layer{n}.*                | backbone.fpn_output{n+1}.*                     |
| backbone.fpn.top_blocks.p6/p7.*            | backbone.top_block.p6/p7.*                     |
| rpn.head.*  (towers, predictors, scales)   | head.*  (same names; tower DCN: .conv. -> .)   |

The official frozen batch norm has no epsilon (``weight / sqrt(var)``) while detectron2's
adds 1e-5 (``weight / sqrt(var + 1e-5)``), so converted running variances are lowered by
1e-5 to compute exactly the same function.
"""
import re
from typing import Dict, List, Sequence, Tuple

import torch
from torch import Tensor

FROZEN_BN_EPS = 1e-5  # detectron2's FrozenBatchNorm2d default

_RULES: List[Tuple[str, str]] = [
    (r"^backbone\.body\.stem\.conv1\.(weight)$", r"backbone.bottom_up.stem.conv1.\1"),
    (r"^backbone\.body\.stem\.bn1\.(\w+)$", r"backbone.bottom_up.stem.conv1.norm.\1"),
    (r"^backbone\.body\.layer(\d)\.(\d+)\.conv(\d)\.(weight|bias)$",
     lambda m: f"backbone.bottom_up.res{int(m[1]) + 1}.{m[2]}.conv{m[3]}.{m[4]}"),
    (r"^backbone\.body\.layer(\d)\.(\d+)\.conv2\.conv\.(weight|bias)$",
     lambda m: f"backbone.bottom_up.res{int(m[1]) + 1}.{m[2]}.conv2.{m[3]}"),
    (r"^backbone\.body\.layer(\d)\.(\d+)\.conv2\.offset\.(weight|bias)$",
     lambda m: f"backbone.bottom_up.res{int(m[1]) + 1}.{m[2]}.conv2.offset.{m[3]}"),
    (r"^backbone\.body\.layer(\d)\.(\d+)\.bn(\d)\.(\w+)$",
     lambda m: f"backbone.bottom_up.res{int(m[1]) + 1}.{m[2]}.conv{m[3]}.norm.{m[4]}"),
    (r"^backbone\.body\.layer(\d)\.(\d+)\.downsample\.0\.(weight)$",
     lambda m: f"backbone.bottom_up.res{int(m[1]) + 1}.{m[2]}.shortcut.{m[3]}"),
    (r"^backbone\.body\.layer(\d)\.(\d+)\.downsample\.1\.(\w+)$",
     lambda m: f"backbone.bottom_up.res{int(m[1]) + 1}.{m[2]}.shortcut.norm.{m[3]}"),
    (r"^backbone\.fpn\.fpn_inner(\d)\.(weight|bias)$",
     lambda m: f"backbone.fpn_lateral{int(m[1]) + 1}.{m[2]}"),
    (r"^backbone\.fpn\.fpn_layer(\d)\.(weight|bias)$",
     lambda m: f"backbone.fpn_output{int(m[1]) + 1}.{m[2]}"),
    (r"^backbone\.fpn\.top_blocks\.(p6|p7)\.(weight|bias)$", r"backbone.top_block.\1.\2"),
    (r"^rpn\.head\.(cls_tower|bbox_tower|share_tower)\.(\d+)\.conv\.(weight|bias)$",
     r"head.\1.\2.\3"),
    (r"^rpn\.head\.((?:cls|bbox|share)_tower\.\d+\.(?:offset\.)?(?:weight|bias))$", r"head.\1"),
    (r"^rpn\.head\.((?:cls_logits|bbox_pred|centerness)\.(?:weight|bias))$", r"head.\1"),
    (r"^rpn\.head\.(scales\.\d+\.scale)$", r"head.\1"),
]


OFFICIAL_RULES = tuple(_RULES)  # the mapping of the table above


class CheckpointMismatchError(ValueError):
    """Official keys no rule maps, or model keys the checkpoint does not fill."""


def rename_by_rules(key: str, rules: Sequence[Tuple[str, str]]) -> str:
    """``key`` without a leading ``module.`` (DistributedDataParallel's prefix), renamed
    by the first (regex, replacement) rule that matches; KeyError if none does."""
    key = key[len("module."):] if key.startswith("module.") else key
    for pattern, replacement in rules:
        converted, hits = re.subn(pattern, replacement, key)
        if hits:
            return converted
    raise KeyError(key)


def convert_official_key(key: str) -> str:
    """The fcos-d2 name of an official parameter name, or raises KeyError."""
    return rename_by_rules(key, _RULES)


def _is_frozen_bn_var(official_key: str) -> bool:
    return official_key.startswith(("backbone.body.", "module.backbone.body.")) and \
        official_key.endswith("running_var")


def convert_official_state_dict(state_dict: Dict[str, Tensor], *,
                                rules: Sequence[Tuple[str, str]] = OFFICIAL_RULES,
                                source: str = "official") -> Dict[str, Tensor]:
    """Renames every parameter of an official FCOS state dict (values as float32).
    ``rules``: (regex, replacement) pairs (models built on the official FCOS, such as
    SipMask-benchmark, add theirs); ``source``: how errors name the checkpoint.

    Raises:
        CheckpointMismatchError: listing every key that no rule maps.
    """
    converted, unknown = {}, []
    for key, value in state_dict.items():
        if key.endswith("num_batches_tracked"):
            continue  # BN bookkeeping, not a parameter of the function
        try:
            new_key = rename_by_rules(key, rules)
        except KeyError:
            unknown.append(key)
            continue
        value = value.float() if value.is_floating_point() else value
        if _is_frozen_bn_var(key):
            value = value - FROZEN_BN_EPS
        converted[new_key] = value
    if unknown:
        raise CheckpointMismatchError(
            f"{len(unknown)} keys of the {source} checkpoint have no fcos-d2 name: "
            + ", ".join(unknown))
    return converted


def check_matches_model(state_dict: Dict[str, Tensor], model: torch.nn.Module) -> None:
    """Raises CheckpointMismatchError listing missing and unexpected keys, if any."""
    expected = set(model.state_dict().keys())
    missing = sorted(expected - set(state_dict))
    unexpected = sorted(set(state_dict) - expected)
    if missing or unexpected:
        raise CheckpointMismatchError(
            f"converted checkpoint does not match the model built from the config:\n"
            f"  missing ({len(missing)}): {', '.join(missing) or '-'}\n"
            f"  unexpected ({len(unexpected)}): {', '.join(unexpected) or '-'}")
