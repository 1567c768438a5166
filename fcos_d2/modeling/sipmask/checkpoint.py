"""Conversion of SipMask-benchmark checkpoints (``SipMask_R50_1x.pth``,
``SipMask_R101_3x.pth``) to fcos-d2's ``SipMask`` names.

SipMask-benchmark is the official FCOS (``fcos_core``) with the FCOS head replaced by
``SipMaskHead`` under the same ``rpn.head.`` prefix, so the backbone and the FCOS parts of
the head convert as in ``official.py`` (with its frozen-BN epsilon correction), and the
SipMask parts keep their names under ``head.``:

| SipMask-benchmark                                   | fcos-d2                                |
| --------------------------------------------------- | -------------------------------------- |
| backbone.*, rpn.head.{cls,bbox}_tower / cls_logits / bbox_pred / centerness / scales | as official.py |
| rpn.head.feat_align.conv_offset.weight              | head.feat_align.conv_offset.weight     |
| rpn.head.feat_align.conv_adaption.{weight,bias}     | head.feat_align.conv_adaption.*        |
| rpn.head.feat_align.norm.{weight,bias}              | head.feat_align.norm.*                 |
| rpn.head.sip_cof.{weight,bias}                      | head.sip_cof.*                         |
| rpn.head.sip_mask_lat0.{weight,bias}                | head.sip_mask_lat0.*                   |
| rpn.head.sip_mask_lat.{weight,bias}                 | head.sip_mask_lat.*                    |

Their classification tower has one conv fewer than the box tower (``cls_tower.0-8``
against ``bbox_tower.0-11`` for NUM_CONVS 4), as fcos-d2's SipMaskHead.
"""
from typing import Dict, List, Sequence, Tuple

from torch import Tensor, nn

from ...checkpoint.layouts import CheckpointLayout, register_checkpoint_layout
from ...checkpoint.official import (OFFICIAL_RULES, CheckpointMismatchError,
                                    convert_official_state_dict, rename_by_rules)

_SIPMASK_RULES: List[Tuple[str, str]] = [
    (r"^rpn\.head\.(feat_align\.(?:conv_offset\.weight|conv_adaption\.(?:weight|bias)|"
     r"norm\.(?:weight|bias)))$", r"head.\1"),
    (r"^rpn\.head\.((?:sip_cof|sip_mask_lat0|sip_mask_lat)\.(?:weight|bias))$", r"head.\1"),
]
SIPMASK_RULES = (*OFFICIAL_RULES, *_SIPMASK_RULES)
_MARKER = "rpn.head.sip_cof.weight"  # every SipMask-benchmark checkpoint has it


def convert_sipmask_key(key: str) -> str:
    """The fcos-d2 name of a SipMask-benchmark parameter name, or raises KeyError."""
    return rename_by_rules(key, SIPMASK_RULES)


def convert_sipmask_state_dict(state_dict: Dict[str, Tensor]) -> Dict[str, Tensor]:
    """Renames every parameter of a SipMask-benchmark state dict (values as float32).

    Raises:
        CheckpointMismatchError: listing every key that no rule maps, or saying that the
            state dict is no SipMask checkpoint (an official FCOS one has no SipMask head).
    """
    plain = {k[len("module."):] if k.startswith("module.") else k for k in state_dict}
    if _MARKER not in plain:
        raise CheckpointMismatchError(
            f"not a SipMask-benchmark checkpoint: it has no {_MARKER} (an official FCOS "
            "checkpoint converts with tools/convert_official_fcos.py)")
    return convert_official_state_dict(state_dict, rules=SIPMASK_RULES,
                                       source="SipMask-benchmark")


def _is_sipmask(keys: Sequence[str]) -> bool:
    return any(key.startswith("rpn.head.sip_cof.") for key in keys)


def _convert(state_dict: Dict[str, Tensor], model: nn.Module
             ) -> Tuple[Dict[str, Tensor], List[str]]:
    return (convert_sipmask_state_dict(state_dict),
            ["frozen BN variances lowered by 1e-5 for detectron2's epsilon"])


# Before "official" (priority 0): a SipMask-benchmark checkpoint has the official keys too.
register_checkpoint_layout(CheckpointLayout(
    "sipmask", "a SipMask-benchmark checkpoint", _is_sipmask, _convert, priority=10))
