"""fcos-d2 configs from AdelaiDet FCOS configs, so that a converted AdelaiDet checkpoint
runs with the settings it was trained with.

AdelaiDet configs are detectron2 configs plus AdelaiDet's ``MODEL.FCOS`` node (defaults in
``adet/config/defaults.py``) and a few AdelaiDet-only keys. detectron2's own keys (backbone,
FPN, input sizes, solver, ...) are taken as they are; ``MODEL.FCOS`` is translated:

| AdelaiDet MODEL.FCOS               | fcos-d2                                              |
| ---------------------------------- | ---------------------------------------------------- |
| NUM_CLASSES, IN_FEATURES, PRIOR_PROB, SIZES_OF_INTEREST, USE_SCALE, USE_DEFORMABLE, NUM_SHARE_CONVS, LOC_LOSS_TYPE, INFERENCE_TH_TEST, PRE_NMS_TOPK_TEST | same name |
| NUM_CLS_CONVS = NUM_BOX_CONVS      | NUM_CONVS (different counts: error)                  |
| TOP_LEVELS 2 / 0                   | TOP_BLOCKS_IN "p5" / "" (1, P6 only: error)          |
| NORM GN, NaiveGN / none            | NORM "GN" / "" (BN, SyncBN, one norm per level: error) |
| CENTER_SAMPLE, POS_RADIUS          | CENTER_SAMPLING_RADIUS (0 without center sampling)   |
| LOSS_ALPHA, LOSS_GAMMA             | FOCAL_LOSS_ALPHA, FOCAL_LOSS_GAMMA                   |
| LOSS_NORMALIZER_CLS fg / moving_fg | LOSS_NORMALIZER num_pos / ema (EMA from 100; "all": error) |
| LOSS_WEIGHT_CLS 1.0                | (other weights: error)                               |
| NMS_TH, POST_NMS_TOPK_TEST         | NMS_TH_TEST, TEST.DETECTIONS_PER_IMAGE               |
| THRESH_WITH_CTR                    | INFERENCE_TH_ON "final_score" with the threshold's square root (fcos-d2 thresholds sqrt(p * ctr)) |
| FPN_STRIDES                        | must be the strides of IN_FEATURES (error otherwise) |
| BOX_QUALITY "iou"                  | warning: inference is the same, but fcos-d2 trains that branch on centerness |
| YIELD_PROPOSAL, YIELD_BOX_FEATURES | warning: only for models built on FCOS (BlendMask, ...); the detector ignores them |
| *_TRAIN thresholds and top-k, USE_RELU | ignored: proposals in training only; AdelaiDet's head always uses ReLU |

Fixed in AdelaiDet and set so: regression in stride units through a ReLU, centerness on the
box branch, IoU smoothing 1. AdelaiDet-only keys: INPUT.HFLIP_TRAIN False becomes
INPUT.RANDOM_FLIP "none"; MODEL.BACKBONE.ANTI_ALIAS, MODEL.RESNETS.DEFORM_INTERVAL > 1,
MODEL.MOBILENET, INPUT.IS_ROTATE and backbones other than
``build_fcos_resnet_fpn_backbone`` (DLA, VoVNet) have no equivalent: error.
"""
import math
import os
from typing import Any, Dict, List, Tuple

import yaml
from detectron2.config import CfgNode, get_cfg

from ..config import add_fcos_config

# AdelaiDet's adet/config/defaults.py, MODEL.FCOS (the detector's keys).
ADELAIDET_FCOS_DEFAULTS: Dict[str, Any] = {
    "NUM_CLASSES": 80, "IN_FEATURES": ["p3", "p4", "p5", "p6", "p7"],
    "FPN_STRIDES": [8, 16, 32, 64, 128], "PRIOR_PROB": 0.01, "INFERENCE_TH_TRAIN": 0.05,
    "INFERENCE_TH_TEST": 0.05, "NMS_TH": 0.6, "PRE_NMS_TOPK_TRAIN": 1000,
    "PRE_NMS_TOPK_TEST": 1000, "POST_NMS_TOPK_TRAIN": 100, "POST_NMS_TOPK_TEST": 100,
    "TOP_LEVELS": 2, "NORM": "GN", "USE_SCALE": True, "BOX_QUALITY": "ctrness",
    "THRESH_WITH_CTR": False, "LOSS_ALPHA": 0.25, "LOSS_GAMMA": 2.0,
    "LOSS_NORMALIZER_CLS": "fg", "LOSS_WEIGHT_CLS": 1.0,
    "SIZES_OF_INTEREST": [64, 128, 256, 512], "USE_RELU": True, "USE_DEFORMABLE": False,
    "NUM_CLS_CONVS": 4, "NUM_BOX_CONVS": 4, "NUM_SHARE_CONVS": 0, "CENTER_SAMPLE": True,
    "POS_RADIUS": 1.5, "LOC_LOSS_TYPE": "giou", "YIELD_PROPOSAL": False,
    "YIELD_BOX_FEATURES": False,
}
_SAME_NAME = ("NUM_CLASSES", "IN_FEATURES", "PRIOR_PROB", "SIZES_OF_INTEREST", "USE_SCALE",
              "USE_DEFORMABLE", "NUM_SHARE_CONVS", "LOC_LOSS_TYPE", "INFERENCE_TH_TEST",
              "PRE_NMS_TOPK_TEST")


class AdelaiDetConfigError(ValueError):
    """An AdelaiDet config option that fcos-d2 cannot reproduce."""


def load_adelaidet_yaml(path: str) -> Dict[str, Any]:
    """The YAML at ``path`` merged over its ``_BASE_`` chain (paths relative to each file)."""
    with open(path) as f:
        raw = yaml.safe_load(f) or {}
    base = raw.pop("_BASE_", None)
    if base is None:
        return raw
    merged = load_adelaidet_yaml(os.path.join(os.path.dirname(path), base))
    _merge_into(merged, raw)
    return merged


def _merge_into(target: Dict[str, Any], update: Dict[str, Any]) -> None:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge_into(target[key], value)
        else:
            target[key] = value


def translate_fcos_options(adet: Dict[str, Any]) -> Tuple[Dict[str, Any], List[str], List[str]]:
    """AdelaiDet MODEL.FCOS values (defaults filled in) -> (fcos-d2 MODEL.FCOS values plus
    "TEST.DETECTIONS_PER_IMAGE", errors, warnings); see the module docstring."""
    o = {**ADELAIDET_FCOS_DEFAULTS, **adet}
    ours = {k: o[k] for k in _SAME_NAME}
    ours.update(NORM_REG_TARGETS=True, CENTERNESS_ON_REG=True, REG_ACTIVATION="relu",
                IOU_LOSS_SMOOTH=1.0, LOC_LOSS_WEIGHTING="centerness", NMS_TH_TEST=o["NMS_TH"],
                FOCAL_LOSS_ALPHA=o["LOSS_ALPHA"], FOCAL_LOSS_GAMMA=o["LOSS_GAMMA"],
                CENTER_SAMPLING_RADIUS=o["POS_RADIUS"] if o["CENTER_SAMPLE"] else 0.0)
    ours["TEST.DETECTIONS_PER_IMAGE"] = o["POST_NMS_TOPK_TEST"]
    errors = _translate_architecture(o, ours)
    warnings = _translate_training_and_inference(o, ours, errors)
    unknown = sorted(set(adet) - set(ADELAIDET_FCOS_DEFAULTS))
    errors += [f"{key}: not an AdelaiDet FCOS option this translation knows" for key in unknown]
    return ours, errors, warnings


def _translate_architecture(o: Dict[str, Any], ours: Dict[str, Any]) -> List[str]:
    """Towers, norms, levels: sets ``ours``; returns the errors."""
    errors = []
    if o["NUM_CLS_CONVS"] != o["NUM_BOX_CONVS"]:
        errors.append(f"NUM_CLS_CONVS {o['NUM_CLS_CONVS']} != NUM_BOX_CONVS {o['NUM_BOX_CONVS']}:"
                      " fcos-d2's towers have one depth (MODEL.FCOS.NUM_CONVS)")
    ours["NUM_CONVS"] = o["NUM_CLS_CONVS"]
    tops = {2: "p5", 0: ""}
    if o["TOP_LEVELS"] not in tops:
        errors.append(f"TOP_LEVELS {o['TOP_LEVELS']}: fcos-d2 builds P6 and P7 or neither")
    ours["TOP_BLOCKS_IN"] = tops.get(o["TOP_LEVELS"], "p5")
    norms = {"GN": "GN", "NaiveGN": "GN", "none": "", "": ""}
    if o["NORM"] not in norms:
        errors.append(f"NORM {o['NORM']!r}: AdelaiDet keeps one norm per level, fcos-d2 one "
                      "norm for all levels")
    ours["NORM"] = norms.get(o["NORM"], "GN")
    strides = [2 ** int(f[1:]) if f[:1] == "p" and f[1:].isdigit() else None
               for f in o["IN_FEATURES"]]
    if list(o["FPN_STRIDES"]) != strides:
        errors.append(f"FPN_STRIDES {list(o['FPN_STRIDES'])} are not the strides of IN_FEATURES "
                      f"{list(o['IN_FEATURES'])}")
    return errors


def _translate_training_and_inference(o: Dict[str, Any], ours: Dict[str, Any],
                                      errors: List[str]) -> List[str]:
    """Loss normalizer and weights, thresholds, flags: sets ``ours``, appends to ``errors``;
    returns the warnings."""
    warnings = []
    normalizers = {"fg": "num_pos", "moving_fg": "ema"}
    if o["LOSS_NORMALIZER_CLS"] not in normalizers:
        errors.append(f"LOSS_NORMALIZER_CLS {o['LOSS_NORMALIZER_CLS']!r}: fcos-d2 normalizes "
                      "by the positives only ('fg' or 'moving_fg')")
    ours["LOSS_NORMALIZER"] = normalizers.get(o["LOSS_NORMALIZER_CLS"], "num_pos")
    if ours["LOSS_NORMALIZER"] == "ema":
        ours.update(LOSS_NORMALIZER_EMA_INIT=100.0, LOSS_NORMALIZER_EMA_MOMENTUM=0.9)
        warnings.append("LOSS_NORMALIZER_CLS 'moving_fg' -> LOSS_NORMALIZER 'ema', which also "
                        "smooths the box and centerness normalizers")
    if o["LOSS_WEIGHT_CLS"] != 1.0:
        errors.append(f"LOSS_WEIGHT_CLS {o['LOSS_WEIGHT_CLS']}: fcos-d2 has no loss weights")
    if o["THRESH_WITH_CTR"]:  # AdelaiDet: p * ctr > t; fcos-d2: sqrt(p * ctr) > t'
        ours.update(INFERENCE_TH_ON="final_score",
                    INFERENCE_TH_TEST=math.sqrt(o["INFERENCE_TH_TEST"]))
    if o["BOX_QUALITY"] != "ctrness":
        warnings.append(f"BOX_QUALITY {o['BOX_QUALITY']!r}: inference is the same, but fcos-d2 "
                        "trains that branch to predict centerness")
    for key in ("YIELD_PROPOSAL", "YIELD_BOX_FEATURES"):
        if o[key]:
            warnings.append(f"{key}: only models built on FCOS use it; the detector ignores it")
    return warnings


def _pop_adelaidet_only_keys(raw: Dict[str, Any], errors: List[str]) -> Dict[str, Any]:
    """Removes the AdelaiDet-only keys from ``raw``; returns detectron2 overrides for them."""
    model, inputs = raw.setdefault("MODEL", {}), raw.setdefault("INPUT", {})
    overrides = {}
    if not inputs.pop("HFLIP_TRAIN", True):
        overrides["INPUT.RANDOM_FLIP"] = "none"
    inputs.get("CROP", {}).pop("CROP_INSTANCE", None)
    checks = [("MODEL.BACKBONE.ANTI_ALIAS", model.get("BACKBONE", {}), "ANTI_ALIAS", False),
              ("MODEL.RESNETS.DEFORM_INTERVAL", model.get("RESNETS", {}), "DEFORM_INTERVAL", 1),
              ("MODEL.MOBILENET", model, "MOBILENET", False),
              ("INPUT.IS_ROTATE", inputs, "IS_ROTATE", False)]
    for name, node, key, default in checks:
        value = node.pop(key, default)
        if value != default:
            errors.append(f"{name} {value!r}: no fcos-d2 equivalent (needs {default!r})")
    return overrides


def fcos_d2_config_from_adelaidet(path: str) -> Tuple[CfgNode, List[str]]:
    """The fcos-d2 config equivalent to the AdelaiDet FCOS config at ``path``.

    Returns:
        (the config, warnings about options that change nothing at inference).

    Raises:
        AdelaiDetConfigError: naming the file and every option fcos-d2 cannot reproduce.
    """
    raw, errors = load_adelaidet_yaml(path), []
    model = raw.setdefault("MODEL", {})
    arch = (model.pop("META_ARCHITECTURE", None), model.pop("PROPOSAL_GENERATOR", {}).get("NAME"))
    if arch != ("OneStageDetector", "FCOS"):
        errors.append(f"MODEL.META_ARCHITECTURE/PROPOSAL_GENERATOR.NAME {arch}: not an FCOS "
                      "detector (expected ('OneStageDetector', 'FCOS'))")
    backbone = model.setdefault("BACKBONE", {}).pop("NAME", "build_fcos_resnet_fpn_backbone")
    if backbone != "build_fcos_resnet_fpn_backbone":
        errors.append(f"MODEL.BACKBONE.NAME {backbone!r}: fcos-d2 builds ResNet/ResNeXt-FPN only")
    overrides = _pop_adelaidet_only_keys(raw, errors)
    fcos, fcos_errors, warnings = translate_fcos_options(model.pop("FCOS", {}))
    errors += [f"MODEL.FCOS.{e}" for e in fcos_errors]
    cfg = get_cfg()
    add_fcos_config(cfg)
    try:
        cfg.merge_from_other_cfg(CfgNode(raw))
    except (KeyError, AssertionError) as e:
        errors.append(f"detectron2 keys: {e}")
    if errors:
        raise AdelaiDetConfigError(f"{path}: {len(errors)} options have no fcos-d2 equivalent:\n  "
                                   + "\n  ".join(errors))
    overrides["TEST.DETECTIONS_PER_IMAGE"] = fcos.pop("TEST.DETECTIONS_PER_IMAGE")
    overrides.update({f"MODEL.FCOS.{k}": v for k, v in fcos.items()})
    overrides.update({"MODEL.META_ARCHITECTURE": "FCOS",
                      "MODEL.BACKBONE.NAME": "build_fcos_resnet_fpn_backbone"})
    _set_keys(cfg, overrides)
    return cfg, [f"{path}: MODEL.FCOS.{w}" for w in warnings]


def _set_keys(cfg: CfgNode, values: Dict[str, Any]) -> None:
    """Sets each dotted key of ``values`` ("MODEL.FCOS.NORM") in ``cfg``."""
    for key, value in values.items():
        node, parts = cfg, key.split(".")
        for part in parts[:-1]:
            node = node[part]
        node[parts[-1]] = value
