"""Reads a reference case of the official FCOS (see ../shared/reference/README.md) and
builds the matching fcos-d2 config."""
import json
import os
import re
from pathlib import Path
from typing import List

from detectron2.config import CfgNode, get_cfg

from fcos_d2 import add_fcos_config

DEFAULT_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "reference"


def reference_dir() -> Path:
    return Path(os.environ.get("FCOS_REFERENCE_DIR", DEFAULT_DIR))


def case_dirs() -> List[Path]:
    root = reference_dir()
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if (p / "case.json").is_file())


def _set_backbone(cfg: CfgNode, backbone: str, case: dict) -> None:
    """'R-50-FPN-RETINANET' -> ResNet-50; 'X-101-32x8d-FPN...' -> ResNeXt-101 32x8d."""
    match = re.match(r"^(R|X)-(\d+)(?:-(\d+)x(\d+)d)?-FPN", backbone)
    if match is None:
        raise ValueError(f"case.json: backbone '{backbone}' is not a ResNet/ResNeXt FPN")
    cfg.MODEL.RESNETS.DEPTH = int(match[2])
    if match[1] == "X":
        cfg.MODEL.RESNETS.NUM_GROUPS = int(match[3])
        cfg.MODEL.RESNETS.WIDTH_PER_GROUP = int(match[4])
    cfg.MODEL.RESNETS.STRIDE_IN_1X1 = case.get("resnet_stride_in_1x1", match[1] == "R")
    stages = case.get("stage_with_dcn")
    if stages:
        cfg.MODEL.RESNETS.DEFORM_ON_PER_STAGE = [bool(s) for s in stages[1:]]
        cfg.MODEL.RESNETS.DEFORM_MODULATED = case.get("with_modulated_dcn", True)
        cfg.MODEL.RESNETS.DEFORM_NUM_GROUPS = case.get("deformable_groups", 1)


def config_for_case(case: dict) -> CfgNode:
    """The fcos-d2 config equivalent to the official settings of ``case``."""
    cfg = get_cfg()
    add_fcos_config(cfg)
    cfg.merge_from_file(str(Path(__file__).resolve().parents[1] / "configs" / "Base-FCOS.yaml"))
    cfg.MODEL.DEVICE = "cpu"
    cfg.MODEL.WEIGHTS = ""
    _set_backbone(cfg, case["backbone"], case)
    fcos = cfg.MODEL.FCOS
    fcos.TOP_BLOCKS_IN = {"P5": "p5", "C5": "res5"}[case["p6_p7_from"]]
    fcos.NUM_CLASSES = case["num_classes_including_background"] - 1
    ranges = case["object_sizes_of_interest"]
    fcos.SIZES_OF_INTEREST = [hi for _, hi in ranges[:-1]]
    fcos.CENTER_SAMPLING_RADIUS = case["center_sampling_radius"]
    fcos.LOC_LOSS_TYPE = case["iou_loss_type"]
    fcos.NORM_REG_TARGETS = case["norm_reg_targets"]
    fcos.CENTERNESS_ON_REG = case["centerness_on_reg"]
    fcos.NUM_CONVS = case["num_convs"]
    fcos.NORM = case.get("head_norm", "GN")
    fcos.USE_DEFORMABLE = case.get("use_dcn_in_tower", False)
    fcos.PRIOR_PROB = case["prior_prob"]
    fcos.FOCAL_LOSS_ALPHA = case["focal_loss_alpha"]
    fcos.FOCAL_LOSS_GAMMA = case["focal_loss_gamma"]
    fcos.INFERENCE_TH_TEST = case["inference_score_threshold"]
    fcos.PRE_NMS_TOPK_TEST = case["pre_nms_top_n"]
    fcos.NMS_TH_TEST = case["nms_threshold"]
    cfg.TEST.DETECTIONS_PER_IMAGE = case["detections_per_image"]
    cfg.MODEL.PIXEL_MEAN = case["pixel_mean_bgr"]
    cfg.MODEL.PIXEL_STD = case["pixel_std"]
    cfg.INPUT.FORMAT = "BGR"
    return cfg
