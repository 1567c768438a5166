"""The level-fit check of a config against its training data, as training starts and from
``tools/analyze_data.py``; and ``MODEL.FCOS.LEVELS_FROM_DATA``, the levels chosen from it.

The boxes are read from ``DATASETS.TRAIN`` (crowd boxes aside) and resized as the training
mapper resizes the images (``ResizeShortestEdge`` with the middle of
``INPUT.MIN_SIZE_TRAIN`` and ``INPUT.MAX_SIZE_TRAIN``); the assignment is the model's own
(``fcos_d2.modeling.level_fit``).
"""
import logging
from typing import List, Optional, Tuple

import numpy as np
from detectron2.data import DatasetCatalog
from detectron2.structures import BoxMode

from ..modeling.level_choice import choose_levels
from ..modeling.level_fit import (LEVEL_STRIDES, ImageBoxes, LevelFit, fit_warnings,
                                  format_fit_table, measure_fit)

logger = logging.getLogger("fcos_d2")
RESNET_FPN_BACKBONES = ("build_fcos_resnet_fpn_backbone",)


def resized_scale(height: int, width: int, short: float, max_size: float) -> float:
    """detectron2's ``ResizeShortestEdge`` scale: the short side to `short`, the long side
    at most `max_size` (0: no cap)."""
    scale = short / min(height, width)
    if max_size and max(height, width) * scale > max_size:
        scale = max_size / max(height, width)
    return scale


def training_images(cfg, max_images: int) -> List[ImageBoxes]:
    """Up to `max_images` images of ``DATASETS.TRAIN`` (evenly spread over them) with their
    non-crowd boxes, resized as training resizes them."""
    records = [r for name in cfg.DATASETS.TRAIN for r in DatasetCatalog.get(name)]
    if max_images and len(records) > max_images:
        records = [records[i] for i in np.linspace(0, len(records) - 1, max_images).astype(int)]
    sizes = sorted(cfg.INPUT.MIN_SIZE_TRAIN)
    short = float(sizes[len(sizes) // 2]) if sizes else 0.0
    images = []
    for record in records:
        height, width = record.get("height"), record.get("width")
        if not height or not width:
            continue  # unknown size: the resize cannot be known without reading the image
        scale = resized_scale(height, width, short, cfg.INPUT.MAX_SIZE_TRAIN) if short else 1.0
        boxes = [BoxMode.convert(a["bbox"], a["bbox_mode"], BoxMode.XYXY_ABS)
                 for a in record.get("annotations", []) if not a.get("iscrowd", 0)]
        images.append(ImageBoxes(int(height * scale + 0.5), int(width * scale + 0.5),
                                 np.asarray(boxes, dtype=np.float64).reshape(-1, 4) * scale))
    return images


def model_fit(model, images: List[ImageBoxes]) -> Optional[LevelFit]:
    """The fit of `model`'s levels (an FCOS model: ``strides``, ``size_ranges``, ...) to
    `images`; None for a model without FCOS's assignment (ATSS too: it ignores the ranges)."""
    model = getattr(model, "module", model)  # DDP
    if not hasattr(model, "size_ranges") or getattr(model, "assigner", "fcos") != "fcos":
        return None
    sizes = [high for _, high in model.size_ranges[:-1]]
    divisibility = getattr(getattr(model, "backbone", None), "size_divisibility", 0)
    return measure_fit(images, levels=model.head_in_features, strides=model.strides,
                       sizes_of_interest=sizes,
                       center_sampling_radius=model.center_sampling_radius,
                       size_divisibility=divisibility)


def fit_table_and_warnings(cfg, model) -> Optional[Tuple[str, List[str]]]:
    """The table for `model` on ``DATASETS.TRAIN`` and its warnings; None without one
    (``MODEL.FCOS.LEVEL_FIT_IMAGES`` 0, or no FCOS assignment)."""
    max_images = cfg.MODEL.FCOS.LEVEL_FIT_IMAGES
    if max_images <= 0:
        return None
    images = training_images(cfg, max_images)
    fit = model_fit(model, images)
    if fit is None:
        return None
    names = ", ".join(cfg.DATASETS.TRAIN)
    return (f"Level fit on {names} ({len(images)} images): " + format_fit_table(fit),
            fit_warnings(fit))


def fit_report(cfg, model) -> Optional[str]:
    """:func:`fit_table_and_warnings` as text (each warning on a line "WARNING: ...")."""
    found = fit_table_and_warnings(cfg, model)
    if found is None:
        return None
    table, warnings = found
    return table + "".join(f"\nWARNING: {w}" for w in warnings)


def log_level_fit(cfg, model) -> None:
    """Logs :func:`fit_table_and_warnings` (its warnings as warnings)."""
    found = fit_table_and_warnings(cfg, model)
    if found is None:
        return
    table, warnings = found
    logger.info(table)
    for warning in warnings:
        logger.warning(f"Level fit: {warning}")


def apply_levels_from_data(cfg) -> Optional[str]:
    """With ``MODEL.FCOS.LEVELS_FROM_DATA``, sets ``MODEL.FCOS.IN_FEATURES``,
    ``SIZES_OF_INTEREST`` and the backbone's stages from the training boxes (unfrozen
    `cfg`, in place) and turns the key off, so that the saved config holds the result.
    Returns a line saying what was chosen, or None when the key is off."""
    fcos = cfg.MODEL.FCOS
    if not fcos.LEVELS_FROM_DATA:
        return None
    if cfg.MODEL.BACKBONE.NAME not in RESNET_FPN_BACKBONES:
        raise ValueError(f"MODEL.FCOS.LEVELS_FROM_DATA: chooses the levels of a ResNet-FPN "
                         f"backbone ({RESNET_FPN_BACKBONES}), not of MODEL.BACKBONE.NAME "
                         f"{cfg.MODEL.BACKBONE.NAME}; set MODEL.FCOS.IN_FEATURES instead")
    images = training_images(cfg, fcos.LEVEL_FIT_IMAGES or 2000)
    sides = [s for image in images for s in
             np.maximum(image.boxes[:, 2] - image.boxes[:, 0], image.boxes[:, 3] - image.boxes[:, 1])]
    if not sides:
        raise ValueError(f"MODEL.FCOS.LEVELS_FROM_DATA: DATASETS.TRAIN {cfg.DATASETS.TRAIN} "
                         f"has no boxes to choose the levels from")
    levels, sizes = choose_levels(sides, available=LEVEL_STRIDES)
    set_resnet_fpn_levels(cfg, levels)
    fcos.SIZES_OF_INTEREST = [int(s) if float(s).is_integer() else s for s in sizes]
    fcos.LEVELS_FROM_DATA = False
    return (f"MODEL.FCOS.LEVELS_FROM_DATA: levels {levels}, SIZES_OF_INTEREST "
            f"{list(fcos.SIZES_OF_INTEREST)} from {len(sides)} boxes of {len(images)} "
            f"training images (longer sides {np.min(sides):.0f}-{np.max(sides):.0f} px, "
            f"median {np.median(sides):.0f})")


def set_resnet_fpn_levels(cfg, levels: List[str]) -> None:
    """The backbone keys for FCOS levels `levels` (finest first) on a ResNet-FPN: FPN
    stages res2..res5 up to P5, P6/P7 from P5 above it."""
    stages = [f"res{int(level[1:])}" for level in levels if int(level[1:]) <= 5]
    if any(int(level[1:]) > 5 for level in levels):  # P6/P7 are built from P5
        stages = sorted(set(stages) | {"res5"})
    first = min(int(s[-1]) for s in stages)
    stages = [f"res{i}" for i in range(first, int(max(s[-1] for s in stages)) + 1)]
    cfg.MODEL.RESNETS.OUT_FEATURES = stages
    cfg.MODEL.FPN.IN_FEATURES = stages
    cfg.MODEL.FCOS.IN_FEATURES = list(levels)
    cfg.MODEL.FCOS.TOP_BLOCKS_IN = "p5" if any(int(lv[1:]) > 5 for lv in levels) else ""
