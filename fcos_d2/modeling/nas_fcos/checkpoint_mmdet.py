"""mmdetection's NAS-FCOS checkpoints (``nas_fcos_{nashead,fcoshead}_r50_caffe_fpn_gn``),
converted strictly like the authors' (``checkpoint.py``).

mmdetection hard-codes the published genotype: its cells ``c22_1, c22_2, c32, c02, c42,
c36, c61`` are our cells 0-6 (its pool omits C2, so its indices are ours minus one), each
``op1``/``op2`` a DCNv2 + BN (``conv``) or the identity (``skip``), ``out_conv`` the grouped
``cat`` reduction; ``extra_downsamples.0/1`` are P6/P7. Its NAS head ``cls_convs.<i>`` /
``reg_convs.<i>`` are the published head's four layers with weights (the two trailing skips
have none). Its caffe ResNet's BN has eps 0, so variances are lowered by 1e-5 as well.

| mmdetection                               | fcos-d2                                    |
| ----------------------------------------- | ------------------------------------------ |
| backbone.conv1 / bn1                      | backbone.bottom_up.stem.conv1 (.norm)      |
| backbone.layer<k>.*                       | backbone.bottom_up.res<k+1>.* (official)   |
| neck.adapt_convs.<i>.conv / bn            | backbone.adapt.<i+1>.0 / 1                 |
| neck.fpn.<cell>.op<1/2>.conv(.conv_offset)| backbone.cells.<c>.ops.<0/1>(.offset)      |
| neck.fpn.<cell>.op<1/2>.bn                | backbone.cells.<c>.ops.<0/1>.norm          |
| neck.fpn.<cell>.out_conv.conv / bn        | backbone.cells.<c>.aggregate.conv / norm   |
| neck.extra_downsamples.<0/1>.conv         | backbone.top_block.p6 / p7                 |
| bbox_head.cls_convs.<i> (NAS head)        | head.cls_shared.<i> (reg_convs: reg_shared)|
| bbox_head.cls_convs.<i> (FCOS head)       | head.cls_tower.<3i> conv, <3i+1> GN        |
| bbox_head.conv_cls / conv_reg / conv_centerness | head.cls_logits / bbox_pred / centerness |
"""
import re
from typing import Dict, List, Set, Tuple

import torch
from torch import Tensor

from ...checkpoint.layouts import CheckpointLayout, register_checkpoint_layout
from ...checkpoint.official import OFFICIAL_RULES, rename_by_rules
from .checkpoint import finish_conversion, rename_all

MMDET_CELLS = ("c22_1", "c22_2", "c32", "c02", "c42", "c36", "c61")
_PREDICTORS = {"conv_cls": "cls_logits", "conv_reg": "bbox_pred",
               "conv_centerness": "centerness"}


def _conv_module(prefix: str, rest: str, deformable: bool) -> str:
    """An mmcv ConvModule's ``conv.*`` / ``bn.*`` / ``gn.*`` under our ``prefix``."""
    if rest.startswith("conv.conv_offset."):
        return prefix + "offset." + rest[len("conv.conv_offset."):]
    if rest.startswith("conv."):
        return prefix + ("" if deformable else "0.") + rest[len("conv."):]
    if rest.startswith(("bn.", "gn.")):
        return prefix + ("norm." if deformable else "1.") + rest[3:]
    raise KeyError(rest)


def _head_conv(branch: str, index: int, rest: str, model_keys: Set[str]) -> str:
    tower = "cls" if branch == "cls" else "reg"
    shared = f"head.{tower}_shared.{index}."
    if shared + "offset.weight" in model_keys or shared + "0.weight" in model_keys:
        return _conv_module(shared, rest, shared + "offset.weight" in model_keys)
    fcos_tower = "cls_tower" if branch == "cls" else "bbox_tower"  # FCOS head: conv, GN, ReLU
    if rest.startswith("conv."):
        return f"head.{fcos_tower}.{3 * index}.{rest[len('conv.'):]}"
    if rest.startswith("gn."):
        return f"head.{fcos_tower}.{3 * index + 1}.{rest[3:]}"
    raise KeyError(rest)


def _rules(model_keys: Set[str]):
    cells = {name: i for i, name in enumerate(MMDET_CELLS)}
    return [
        (r"^backbone\.conv1\.weight$", "backbone.bottom_up.stem.conv1.weight"),
        (r"^backbone\.bn1\.(\w+)$", r"backbone.bottom_up.stem.conv1.norm.\1"),
        (r"^backbone\.(layer.+)$", lambda m: rename_by_rules("backbone.body." + m[1],
                                                              OFFICIAL_RULES)),
        (r"^neck\.adapt_convs\.(\d)\.(.+)$",
         lambda m: _conv_module(f"backbone.adapt.{int(m[1]) + 1}.", m[2], False)),
        (r"^neck\.fpn\.(\w+?)\.op([12])\.(.+)$",
         lambda m: _conv_module(f"backbone.cells.{cells[m[1]]}.ops.{int(m[2]) - 1}.", m[3],
                                True)),
        (r"^neck\.fpn\.(\w+?)\.out_conv\.(conv|bn)\.(\w+)$",
         lambda m: f"backbone.cells.{cells[m[1]]}.aggregate."
                   f"{'conv' if m[2] == 'conv' else 'norm'}.{m[3]}"),
        (r"^neck\.extra_downsamples\.([01])\.conv\.(weight|bias)$",
         lambda m: f"backbone.top_block.p{int(m[1]) + 6}.{m[2]}"),
        (r"^bbox_head\.(cls|reg)_convs\.(\d+)\.(.+)$",
         lambda m: _head_conv(m[1], int(m[2]), m[3], model_keys)),
        (r"^bbox_head\.(conv_cls|conv_reg|conv_centerness)\.(weight|bias)$",
         lambda m: f"head.{_PREDICTORS[m[1]]}.{m[2]}"),
        (r"^bbox_head\.scales\.(\d)\.scale$", r"head.scales.\1.scale"),
    ]


def convert_mmdet_nas_fcos_state_dict(state_dict: Dict[str, Tensor], model: torch.nn.Module
                                      ) -> Tuple[Dict[str, Tensor], List[str]]:
    """mmdetection's NAS-FCOS state dict in fcos-d2's names, checked against ``model``.
    mmdetection's FCOS-head towers have no conv bias (GN follows): the model's tower
    biases are set to zero, which computes the same function."""
    model_keys = set(model.state_dict())
    renamed, unknown = rename_all(state_dict, _rules(model_keys))
    notes = ["frozen BN variances lowered by 1e-5 for detectron2's epsilon"]
    no_bias = [k for k in model_keys if re.fullmatch(r"head\.(cls|bbox)_tower\.\d+\.bias", k)
               and k.replace(".bias", ".weight") in renamed and k not in renamed]
    for key in no_bias:
        renamed[key] = torch.zeros_like(model.state_dict()[key])
    if no_bias:
        notes.append(f"{len(no_bias)} FCOS-head tower biases set to 0 (mmdetection has none)")
    converted, more = finish_conversion(renamed, unknown, model, "mmdetection NAS-FCOS")
    return converted, more + notes


def _is_mmdet(keys) -> bool:
    return any(k.startswith(("neck.adapt_convs.", "neck.fpn.c22_1.")) for k in keys)


register_checkpoint_layout(CheckpointLayout(
    "mmdet_nas_fcos", "an mmdetection NAS-FCOS checkpoint", _is_mmdet,
    convert_mmdet_nas_fcos_state_dict, priority=1))
