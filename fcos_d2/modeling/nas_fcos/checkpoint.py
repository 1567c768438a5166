"""NAS-FCOS checkpoints as published, loaded through ``MODEL.WEIGHTS``: the layout of the
authors' code (maskrcnn-benchmark based, ``encoder.*`` / ``decoder.*``) and mmdetection's
port (``neck.adapt_convs.*``, ``neck.fpn.c22_1.*``), each converted strictly: a key without
an fcos-d2 name, a model parameter left unfilled, or a tensor of another shape is an error
naming the keys.

Authors' layout (after a leading ``module.``):

| theirs                                         | fcos-d2                                   |
| ---------------------------------------------- | ----------------------------------------- |
| encoder.body.* (ResNet, fcos_core names)       | backbone.bottom_up.* (official FCOS rules) |
| encoder.body.features.<i>.conv.<k>.* (MobileNet)| backbone.bottom_up.features.<i>.conv.*   |
| decoder.fpn.adapt<n>.<0/1>.*                   | backbone.adapt.<n-1>.<0/1>.*              |
| decoder.fpn._ops.<c>.<0/1>.*                   | backbone.cells.<c>.ops.<0/1>.*            |
| decoder.fpn._ops.<c>.2.*                       | backbone.cells.<c>.aggregate.*            |
| decoder.fpn.top_blocks.p6/p7.*                 | backbone.top_block.p6/p7.*                |
| decoder.rpn.head._cls_head_global_ops.<j>.*    | head.cls_shared.<j>.* (reg: reg_shared)   |
| decoder.rpn.head._cls_head_split_ops.<l>.<j>.* | head.cls_split.<l>.<j>.*                  |
| decoder.rpn.head.<tower or predictor>.*        | head.* (the FCOS head of FPN-only models) |

Inside an operation: ``op.sep_0.0/1/2`` -> ``depthwise``/``pointwise``/``norm``;
``dcn.0.conv_offset_mask`` -> ``offset``; ``dcn.0.weight/bias`` -> ``weight/bias``;
``dcn.1`` -> ``norm``; ``cat``'s ``conv1x1.0``/``conv1x1.2`` -> ``norm``/``conv``.
Frozen-BN ResNet variances are lowered by 1e-5 (their BN has no epsilon, detectron2's
has 1e-5). An adapter of a backbone input no cell reads (C2 in the published genotype) is
dropped, and the log says so.
"""
import re
from typing import Callable, Dict, List, Tuple

import torch
from torch import Tensor

from ...checkpoint.layouts import CheckpointLayout, register_checkpoint_layout
from ...checkpoint.official import (FROZEN_BN_EPS, OFFICIAL_RULES, CheckpointMismatchError,
                                    rename_by_rules)

# Inside one operation of the authors' code -> ours.
_OP_RULES = [
    (r"^op\.sep_0\.0\.weight$", "depthwise.weight"),
    (r"^op\.sep_0\.1\.weight$", "pointwise.weight"),
    (r"^op\.sep_0\.2\.(\w+)$", r"norm.\1"),
    (r"^dcn\.0\.conv_offset_mask\.(weight|bias)$", r"offset.\1"),
    (r"^dcn\.0\.(weight|bias)$", r"\1"),
    (r"^dcn\.1\.(\w+)$", r"norm.\1"),
    (r"^conv1x1\.0\.(\w+)$", r"norm.\1"),
    (r"^conv1x1\.2\.weight$", "conv.weight"),
    (r"^(a|b)$", r"\1"),
    (r"^([01]\.\w+)$", r"\1"),  # head conv1x1 / conv3x3: Sequential(conv, GN, ReLU)
]

# MobileNetV2 inverted residuals: their flat Sequential index -> torchvision's nested one.
_MOBILENET_EXPAND_1 = {"0": "0.0", "1": "0.1", "3": "1", "4": "2"}
_MOBILENET = {"0": "0.0", "1": "0.1", "3": "1.0", "4": "1.1", "6": "2", "7": "3"}


def _op(prefix: str, rest: str) -> str:
    return prefix + rename_by_rules(rest, _OP_RULES)


def _mobilenet(block: str, rest: str) -> str:
    match = re.fullmatch(r"conv\.(\d+)\.(\w+)", rest)
    if block == "0" or not match:  # the stem conv keeps torchvision's names
        return f"backbone.bottom_up.features.{block}.{rest}"
    table = _MOBILENET_EXPAND_1 if block == "1" else _MOBILENET
    return f"backbone.bottom_up.features.{block}.conv.{table[match[1]]}.{match[2]}"


_AUTHORS_RULES: List[Tuple[str, Callable]] = [
    (r"^encoder\.body\.features\.(\d+)\.(.+)$", lambda m: _mobilenet(m[1], m[2])),
    (r"^encoder\.body\.(.+)$", lambda m: rename_by_rules("backbone.body." + m[1],
                                                          OFFICIAL_RULES)),
    (r"^decoder\.fpn\.adapt(\d)\.([01]\.\w+)$",
     lambda m: f"backbone.adapt.{int(m[1]) - 1}.{m[2]}"),
    (r"^decoder\.fpn\._ops\.(\d+)\.([01])\.(.+)$",
     lambda m: _op(f"backbone.cells.{m[1]}.ops.{m[2]}.", m[3])),
    (r"^decoder\.fpn\._ops\.(\d+)\.2\.(.+)$",
     lambda m: _op(f"backbone.cells.{m[1]}.aggregate.", m[2])),
    (r"^decoder\.fpn\.top_blocks\.(p6|p7)\.(weight|bias)$",
     lambda m: f"backbone.top_block.{m[1]}.{m[2]}"),
    (r"^decoder\.rpn\.head\._(cls|reg)_head_(?:(split)_ops\.(\d+)\.|(global)_ops\.)(\d+)\.(.+)$",
     lambda m: _op(f"head.{m[1]}_{'split' if m[2] else 'shared'}."
                   f"{m[3] + '.' if m[2] else ''}{m[5]}.", m[6])),
    (r"^decoder\.rpn\.head\.(.+)$", lambda m: rename_by_rules("rpn.head." + m[1],
                                                               OFFICIAL_RULES)),
]


def _is_frozen_resnet_var(key: str) -> bool:
    return key.startswith("backbone.bottom_up.") and ".features." not in key \
        and key.endswith("running_var")


def finish_conversion(renamed: Dict[str, Tensor], unknown: List[str], model: torch.nn.Module,
            source: str) -> Tuple[Dict[str, Tensor], List[str]]:
    """The end of a strict conversion: raises on ``unknown`` keys, drops adapters the
    model does not have, lowers frozen-BN variances, checks shapes."""
    if unknown:
        raise CheckpointMismatchError(f"{len(unknown)} keys of the {source} checkpoint have no "
                                      f"fcos-d2 name: {', '.join(unknown)}")
    expected = model.state_dict()
    notes = []
    dropped = sorted({k.split(".")[2] for k in renamed
                      if k.startswith("backbone.adapt.") and k not in expected})
    if dropped:
        notes.append(f"dropped the adapters of backbone inputs {dropped}, read by no cell")
    converted = {}
    for key, value in renamed.items():
        if key.startswith("backbone.adapt.") and key not in expected:
            continue
        value = value.float() if value.is_floating_point() else value
        converted[key] = value - FROZEN_BN_EPS if _is_frozen_resnet_var(key) else value
    wrong = [f"{k} {tuple(v.shape)} (model: {tuple(expected[k].shape)})"
             for k, v in converted.items() if k in expected and v.shape != expected[k].shape]
    if wrong:
        raise CheckpointMismatchError(f"{len(wrong)} tensors of the {source} checkpoint have "
                                      f"another shape than the config's model: "
                                      + ", ".join(wrong))
    return converted, notes


def rename_all(state_dict: Dict[str, Tensor], rules) -> Tuple[Dict[str, Tensor], List[str]]:
    """(every key renamed by ``rules``, the keys no rule maps); BN counters skipped."""
    renamed, unknown = {}, []
    for key, value in state_dict.items():
        if key.endswith("num_batches_tracked"):
            continue
        try:
            renamed[rename_by_rules(key, rules)] = value
        except KeyError:
            unknown.append(key)
    return renamed, unknown


def convert_nas_fcos_state_dict(state_dict: Dict[str, Tensor], model: torch.nn.Module
                                ) -> Tuple[Dict[str, Tensor], List[str]]:
    """The authors' NAS-FCOS state dict in fcos-d2's names, checked against ``model``."""
    renamed, unknown = rename_all(state_dict, _AUTHORS_RULES)
    converted, notes = finish_conversion(renamed, unknown, model, "NAS-FCOS")
    if any(_is_frozen_resnet_var(k) for k in converted):  # MobileNet's BN has an epsilon
        notes.append("frozen BN variances lowered by 1e-5 for detectron2's epsilon")
    return converted, notes


def _is_authors(keys) -> bool:
    return any(k.startswith(("encoder.body.", "decoder.fpn.")) for k in keys)


register_checkpoint_layout(CheckpointLayout(
    "nas_fcos", "a NAS-FCOS checkpoint (the authors' code)", _is_authors,
    convert_nas_fcos_state_dict, priority=1))
